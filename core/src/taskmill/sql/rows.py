"""Task snapshots from SQL rows, mapped by column name in one place.

Every SQL backend selects the snapshot columns :data:`TASK_COLUMN_NAMES` (in any order
it likes) and builds one reader with :func:`task_reader` when it is imported; the reader
resolves each column's position from its name once, so reading a row costs what the
positional ``r[22]`` code it replaces cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final, Protocol, TypeAlias

import attrs

from taskmill.cursors import position_token
from taskmill.lifecycle import settles_aliases
from taskmill.model import (
    NO_PROGRESS,
    Attempt,
    AttemptOutcome,
    CancelReason,
    EventKind,
    Progress,
    Task,
    TaskEvent,
    TaskStatus,
    task_from_values,
)
from taskmill.serialization import loads
from taskmill.storage import LEASE_FENCE, LEASED_STATUS

__all__ = [
    "ATTEMPT_COLUMN_NAMES",
    "EVENT_COLUMN_NAMES",
    "KIND",
    "OUTCOME",
    "REASON",
    "STATUS",
    "TASK_COLUMN_NAMES",
    "Row",
    "TaskColumn",
    "attempt_reader",
    "attempt_row",
    "claim_order",
    "column_index",
    "events_of_rows",
    "fence_clause",
    "leads_aliases",
    "loads",
    "task_reader",
]


class Row(Protocol):
    """A driver's row: anything indexable by position (a tuple, an asyncpg Record)."""

    def __getitem__(self, index: int, /) -> Any: ...


TASK_COLUMN_NAMES: Final = (
    "seq", "id", "task_type", "status", "created_at", "run_at", "updated_at", "app_id",
    "params", "data", "priority", "attempts", "max_retries", "result", "error",
    "progress_done", "progress_total", "progress_message", "dedupe_key", "alias_of",
    "parent_id", "user_id", "cancel_reason", "started_at", "finished_at", "worker_id",
    "lease_expires_at",
)  # fmt: skip
"""The columns of a task snapshot: ``seq`` (the creation order) and one per field of
:class:`~taskmill.model.Task`, progress as three columns."""


def column_index(columns: Sequence[str]) -> dict[str, int]:
    """Each column name's position in ``columns``."""
    return {name: i for i, name in enumerate(columns)}


class TaskColumn:
    """Positions in :data:`TASK_COLUMN_NAMES` of the columns stores read themselves."""

    _AT: Final = column_index(TASK_COLUMN_NAMES)
    SEQ: Final = _AT["seq"]
    ID: Final = _AT["id"]
    STATUS: Final = _AT["status"]
    PRIORITY: Final = _AT["priority"]
    RESULT: Final = _AT["result"]
    ERROR: Final = _AT["error"]
    DEDUPE_KEY: Final = _AT["dedupe_key"]
    ALIAS_OF: Final = _AT["alias_of"]
    CANCEL_REASON: Final = _AT["cancel_reason"]


ATTEMPT_COLUMN_NAMES: Final = (
    "number", "worker_id", "started_at", "finished_at", "outcome", "error",
)  # fmt: skip
"""The columns of an execution-log row (its task id is known to the caller)."""

STATUS: Final = {s.value: s for s in TaskStatus}
REASON: Final = {r.value: r for r in CancelReason}
OUTCOME: Final = {o.value: o for o in AttemptOutcome}
KIND: Final = {k.value: k for k in EventKind}


Timestamp: TypeAlias = Callable[[Any], datetime]
"""A stored timestamp (never NULL) as a tz-aware datetime."""


def task_reader(
    columns: Sequence[str] = TASK_COLUMN_NAMES, *, timestamp: Timestamp | None = None
) -> Callable[[Row], Task]:
    """A function reading the :class:`~taskmill.model.Task` of a row selected as
    ``columns`` (which must include every name in :data:`TASK_COLUMN_NAMES`).

    :param timestamp: converts a stored timestamp; None when the driver already returns
        tz-aware datetimes.
    :raises KeyError: a snapshot column is missing from ``columns``.
    """
    at = column_index(columns)
    i_id, i_type, i_status = at["id"], at["task_type"], at["status"]
    i_created, i_run, i_updated = at["created_at"], at["run_at"], at["updated_at"]
    i_app, i_params, i_data, i_priority = at["app_id"], at["params"], at["data"], at["priority"]
    i_attempts, i_max, i_result, i_error = (
        at["attempts"], at["max_retries"], at["result"], at["error"],
    )  # fmt: skip
    i_done, i_total, i_message = at["progress_done"], at["progress_total"], at["progress_message"]
    i_key, i_alias = at["dedupe_key"], at["alias_of"]
    i_parent, i_user = at["parent_id"], at["user_id"]
    i_reason, i_started, i_finished = at["cancel_reason"], at["started_at"], at["finished_at"]
    i_worker, i_lease = at["worker_id"], at["lease_expires_at"]
    status_of, reason_of = STATUS, REASON
    decode = loads
    ts: Timestamp = timestamp if timestamp is not None else _as_stored

    def read(r: Row) -> Task:
        # Positional (the field order of Task), unchecked: the store wrote these values.
        data = r[i_data]
        result = r[i_result]
        done, total, message = r[i_done], r[i_total], r[i_message]
        reason = r[i_reason]
        started, finished, lease = r[i_started], r[i_finished], r[i_lease]
        return task_from_values(
            r[i_id],
            r[i_type],
            status_of[r[i_status]],
            ts(r[i_created]),
            ts(r[i_run]),
            ts(r[i_updated]),
            r[i_app],
            decode(r[i_params]),
            {} if data == "{}" else decode(data),
            r[i_priority],
            r[i_attempts],
            r[i_max],
            None if result is None or result == "null" else decode(result),
            r[i_error],
            (
                NO_PROGRESS
                if done == 0 and total is None and message is None
                else Progress(done, total, message)
            ),
            r[i_key],
            r[i_alias],
            r[i_parent],
            r[i_user],
            None if reason is None else reason_of[reason],
            None if started is None else ts(started),
            None if finished is None else ts(finished),
            r[i_worker],
            None if lease is None else ts(lease),
        )

    return read


_READ_ORDER: Final = (
    "id", "task_type", "status", "created_at", "run_at", "updated_at", "app_id", "params",
    "data", "priority", "attempts", "max_retries", "result", "error", "progress",
    "dedupe_key", "alias_of", "parent_id", "user_id", "cancel_reason", "started_at",
    "finished_at", "worker_id", "lease_expires_at",
)  # fmt: skip
"""The field order :func:`task_reader` builds a ``Task`` in (positionally)."""
if tuple(a.name for a in attrs.fields(Task)) != _READ_ORDER:  # pragma: no cover
    raise RuntimeError("taskmill.sql.rows builds Task positionally: its field order changed")


def _as_stored(value: Any) -> datetime:
    return value  # type: ignore[no-any-return]


def attempt_reader(
    columns: Sequence[str] = ATTEMPT_COLUMN_NAMES, *, timestamp: Timestamp | None = None
) -> Callable[[str, Row], Attempt]:
    """A function reading the :class:`~taskmill.model.Attempt` of ``task_id`` from a
    row selected as ``columns`` (:data:`ATTEMPT_COLUMN_NAMES`, in any order)."""
    at = column_index(columns)
    i_number, i_worker, i_started = at["number"], at["worker_id"], at["started_at"]
    i_finished, i_outcome, i_error = at["finished_at"], at["outcome"], at["error"]
    ts: Timestamp = timestamp if timestamp is not None else _as_stored

    def read(task_id: str, r: Row) -> Attempt:
        return Attempt(
            task_id=task_id,
            number=r[i_number],
            worker_id=r[i_worker],
            started_at=ts(r[i_started]),
            finished_at=ts(r[i_finished]),
            outcome=OUTCOME[r[i_outcome]],
            error=r[i_error],
        )

    return read


def claim_order(rows: list[Any], read: Callable[[Row], Task], columns: Sequence[str]) -> list[Task]:
    """Snapshots of claimed rows (``RETURNING`` leaves their order unspecified) in
    claim order: priority DESC, then creation (``seq``). Sorts ``rows`` in place."""
    at = column_index(columns)
    i_priority, i_seq = at["priority"], at["seq"]
    rows.sort(key=lambda r: (-r[i_priority], r[i_seq]))
    return [read(r) for r in rows]


def leads_aliases(row: Row) -> bool:
    """Whether the task of ``row`` (selected as :data:`TASK_COLUMN_NAMES`) settles its
    aliases now (:func:`taskmill.lifecycle.settles_aliases`); the key is tested first,
    since most tasks have none."""
    key = row[TaskColumn.DEDUPE_KEY]
    return key is not None and settles_aliases(
        STATUS[row[TaskColumn.STATUS]], key, row[TaskColumn.ALIAS_OF]
    )


def fence_clause(
    value: Callable[[str], str],
    *,
    status: str = f"'{LEASED_STATUS}'",
    column: Callable[[str], str] = str,
) -> str:
    """:data:`~taskmill.storage.LEASE_FENCE` as a SQL condition: each fenced column
    (as ``column`` names it) equal to ``value`` of the lease attribute it is fenced by,
    and the status column to ``status`` (the literal ``'running'`` unless a store's
    planner needs another spelling). Bind :meth:`~taskmill.storage.Lease.fence_args`
    when the values are parameters."""
    return " AND ".join(
        f"{column(name)} = {status if attribute is None else value(attribute)}"
        for name, attribute in LEASE_FENCE
    )


EVENT_COLUMN_NAMES: Final = ("seq", "kind", "status", "at")
"""The columns an event row starts with; its task's snapshot columns follow."""


def events_of_rows(
    rows: Sequence[Any], *, task: Callable[[Any], Task], timestamp: Callable[[Any], datetime]
) -> list[TaskEvent]:
    """The events of rows selected as :data:`EVENT_COLUMN_NAMES` followed by the task's
    snapshot columns (NULL for a task deleted since, whose events are skipped); each
    task's snapshot built once, by ``task``, and shared by its events; ``at`` read by
    ``timestamp``, the seq written as the cursor (:func:`taskmill.cursors.position_token`)."""
    start = len(EVENT_COLUMN_NAMES)
    snapshots: dict[str, Task] = {}
    events: list[TaskEvent] = []
    for row in rows:
        task_id = row[start + TaskColumn.ID]
        if task_id is None:
            continue  # the task was deleted since (cleanup): skipped, cursor moves on
        snapshot = snapshots.get(task_id)
        if snapshot is None:
            snapshot = snapshots[task_id] = task(row[start:])
        events.append(
            TaskEvent(
                kind=KIND[row[1]],
                task=snapshot,
                status=STATUS[row[2]],
                at=timestamp(row[3]),
                cursor=position_token(int(row[0])),
            )
        )
    return events


def attempt_row(seq: int, attempt: Attempt, stored: Callable[[datetime], Any]) -> tuple[Any, ...]:
    """The execution-log row of ``attempt`` of the task ``seq``: (task_seq, task_id,
    number, worker_id, started_at, finished_at, outcome, error), its times as the store
    keeps them (``stored``)."""
    return (
        seq, attempt.task_id, attempt.number, attempt.worker_id, stored(attempt.started_at),
        stored(attempt.finished_at), attempt.outcome.value, attempt.error,
    )  # fmt: skip
