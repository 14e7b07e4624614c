"""Batches as the statements' arguments: one array (or JSON array) per column, which
the batch statements of :mod:`taskmill_postgres.statements` read back with ``unnest``.

The reverse of :mod:`taskmill_postgres.rows`. Where a statement allows it, a column that
holds nothing but NULLs is sent as one NULL instead: the statement reads its missing
elements as NULL, and asyncpg does not encode a thousand NULLs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from taskmill.model import CancelReason
from taskmill.serialization import dumps
from taskmill.storage import Finish, FinishKind, Lease, NewTask, ProgressUpdate

__all__ = [
    "delete_flags",
    "enqueue_arguments",
    "finish_arrays",
    "lease_arrays",
    "progress_arrays",
]

_FINISH_KIND: Final = {
    FinishKind.COMPLETE: "complete",
    FinishKind.RETRY: "retry",
    FinishKind.FAIL: "fail",
    FinishKind.RELEASE: "release",
    FinishKind.CANCEL: "cancel",
}
_NO_PROGRESS: Final = (False, None, None, None)


def _json_or_null(values: list[str | None], n: int) -> str | None:
    """``values`` (``n`` of them) as a JSON array, or None when every one is None."""
    return None if values.count(None) == n else dumps(values)


def enqueue_arguments(
    tasks: Sequence[NewTask], waiting: list[int], lock: int, channel: str
) -> tuple[object, ...]:
    """The arguments of the enqueue statement for ``tasks``: ten JSON arrays (one per
    column, the fourth of the params objects), the events lock and the channel
    prefix, then each task's count of unfinished dependencies (``waiting``)."""
    n = len(tasks)
    apps = [new.app_id for new in tasks]
    run_ats = [new.run_at for new in tasks]
    keys = [new.dedupe_key for new in tasks]
    parents = [new.parent_id for new in tasks]
    users = [new.user_id for new in tasks]
    # A column of nothing but NULLs (zeros for waiting) is sent as NULL: the
    # statement reads the missing elements as NULL (NULL waiting as 0).
    return (
        dumps([new.id for new in tasks]),
        dumps([new.task_type for new in tasks]),
        _json_or_null(apps, n),
        "[" + ",".join([new.params_json for new in tasks]) + "]",
        dumps([int(new.priority) for new in tasks]),
        dumps([new.max_retries for new in tasks]),
        None if run_ats.count(None) == n else dumps(
            [None if at is None else at.isoformat() for at in run_ats]
        ),
        _json_or_null(keys, n), _json_or_null(parents, n), _json_or_null(users, n),
        lock, channel, None if waiting.count(0) == n else dumps(waiting),
    )  # fmt: skip


def lease_arrays(leases: Sequence[Lease]) -> tuple[list[str], list[str], list[int]]:
    """The task ids, worker ids and attempts of ``leases``."""
    return (
        [x.task_id for x in leases],
        [x.worker_id for x in leases],
        [x.attempt for x in leases],
    )


def progress_arrays(updates: Sequence[ProgressUpdate]) -> tuple[list[Any], ...]:
    """The eight array arguments of ``Statements.save_progress`` (task ids, worker ids,
    attempts, whether progress is saved, done, total, message, data): one element per
    task, its last update in ``updates``."""
    last = {u.lease.task_id: u for u in updates}  # one write per task: the last
    ids: list[str] = []
    workers: list[str] = []
    attempts: list[int] = []
    has: list[bool] = []
    done: list[float | None] = []
    total: list[float | None] = []
    message: list[str | None] = []
    data: list[str | None] = []
    for update in last.values():
        lease = update.lease
        ids.append(lease.task_id)
        workers.append(lease.worker_id)
        attempts.append(lease.attempt)
        progress = update.progress
        if progress is None:
            has.append(False)
            done.append(None)
            total.append(None)
            message.append(None)
        else:
            has.append(True)
            done.append(float(progress.done))
            total.append(None if progress.total is None else float(progress.total))
            message.append(progress.message)
        data.append(None if update.data is None else dumps(update.data))
    return ids, workers, attempts, has, done, total, message, data


def finish_arrays(finishes: Sequence[Finish], indexes: list[int]) -> list[list[Any] | None]:
    """The 16 array arguments of ``Statements.finish`` for ``finishes[indexes]`` (some
    may be NULL, see :data:`NULLABLE_FINISH_COLUMNS`)."""
    built: list[list[Any]] = [[] for _ in range(16)]
    (
        ids, workers, attempts, kinds, results, retry_in, errors, reasons, data,
        has_progress, done, total, message, outcomes, started, finished,
    ) = built  # fmt: skip
    for index in indexes:
        finish = finishes[index]
        lease = finish.lease
        ids.append(lease.task_id)
        workers.append(lease.worker_id)
        attempts.append(lease.attempt)
        kinds.append(_FINISH_KIND[finish.kind])
        results.append(finish.result_json if finish.kind is FinishKind.COMPLETE else None)
        retry_in.append(float(finish.retry_in))
        errors.append(finish.error)
        reasons.append(
            (finish.cancel_reason or CancelReason.USER).value
            if finish.kind is FinishKind.CANCEL
            else None
        )
        data.append(None if finish.data is None else dumps(finish.data))
        progress = finish.progress
        if progress is None:
            has, d, t, m = _NO_PROGRESS
        else:
            has = True
            d = float(progress.done)
            t = None if progress.total is None else float(progress.total)
            m = progress.message
        has_progress.append(has)
        done.append(d)
        total.append(t)
        message.append(m)
        outcomes.append(finish.outcome.value)
        started.append(finish.started_at)
        finished.append(finish.finished_at)
    n = len(ids)
    columns: list[list[Any] | None] = list(built)
    if has_progress.count(False) == n:
        # No finish saves progress: done, total and message are never read.
        columns[9] = columns[10] = columns[11] = columns[12] = None
    for position in NULLABLE_FINISH_COLUMNS:
        if built[position].count(None) == n:
            columns[position] = None
    return columns


NULLABLE_FINISH_COLUMNS: Final = (4, 6, 7, 8)
"""Positions in :func:`finish_arrays` of the arrays (result, error, reason, data) sent
as NULL when they hold nothing but NULLs: ``unnest`` of several arrays pads a NULL one
with NULLs, so the statement reads the same values, and asyncpg does not encode a
thousand NULLs (it checks each element of an array for being a nested array)."""


def delete_flags(finishes: Sequence[Finish], indexes: list[int]) -> list[bool] | None:
    """The delete flags of ``finishes[indexes]`` (``Finish.delete``), the argument $19
    of ``Statements.finish_deleting``; None when no finish deletes: the batch is for
    ``Statements.finish``, which has no such argument."""
    flags = [finishes[index].delete for index in indexes]
    return flags if True in flags else None
