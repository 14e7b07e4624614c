"""A claim: per handler key a ``SELECT ... FOR UPDATE SKIP LOCKED`` over the
``tasks_claim`` index, then one ``UPDATE`` by seq, in one transaction.

Concurrent claimers skip each other's rows, so no task is claimed twice. The stored
suspensions and the store clock are read first (the claim prelude), and global rate and
concurrency limits are applied and spent in the same transaction
(:mod:`taskmill_mysql.limits`). The claimed snapshots are built from the locked rows,
not read back (:func:`~taskmill_mysql.rows.claimed_row`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Final

from taskmill.limiting import limit_claim, spend_claimed
from taskmill.model import EventKind, SuspensionScope, Task
from taskmill.storage import ClaimRequest

from taskmill_mysql import statements as sql
from taskmill_mysql.connection import Session
from taskmill_mysql.events import append_events
from taskmill_mysql.limits import MySQLBuckets
from taskmill_mysql.readback import snapshot_rows
from taskmill_mysql.rows import ID, PRIORITY, SEQ, Row, claimed_row, task

__all__ = ["claim"]

_STARTED: Final = EventKind.STARTED.value


def _claim_branches(
    request: ClaimRequest, suspended: Sequence[SuspensionScope]
) -> list[tuple[str, list[Any]]]:
    """One locking SELECT per handler key that may claim (see
    :func:`~taskmill_mysql.statements.claim_select`): a key whose whole scope is
    suspended is left out, apps suspended one by one (and apps with a key of their own)
    are excluded from a host key."""
    limit = request.limit
    own_keys: dict[str, list[str]] = {}
    for app_id, task_type in request.handlers:
        if app_id is not None:
            own_keys.setdefault(task_type, []).append(app_id)
    min_priority = request.min_priority
    branches: list[tuple[str, list[Any]]] = []
    for (app_id, task_type), cap in request.handlers.items():
        take = limit if cap is None else min(cap, limit)
        if take <= 0:
            continue
        if any(scope.covers(app_id, task_type) for scope in suspended):
            continue
        args: list[Any] = [task_type]
        if app_id is not None:
            text = sql.claim_select(True, 0, min_priority is not None)
            args.append(app_id)
        else:
            apps = dict.fromkeys(own_keys.get(task_type, ()))
            for scope in suspended:
                if scope.app_id is not None and scope.task_type in (None, task_type):
                    apps[scope.app_id] = None
            text = sql.claim_select(False, len(apps), min_priority is not None)
            args += apps
        args.append(None)  # now, filled in by claim()
        if min_priority is not None:
            args.append(int(min_priority))
        args.append(take)
        branches.append((text, args))
    return branches


async def claim(s: Session, request: ClaimRequest) -> list[Task]:
    prelude = await s.fetchall(sql.CLAIM_PRELUDE)
    at = prelude[0][0]
    suspended = [
        SuspensionScope(task_type=t, app_id=a) for _, stored, t, a in prelude if stored is not None
    ]
    limited = None
    if request.limits:
        ledger = MySQLBuckets(s, at)
        limited = await limit_claim(ledger, request)
        request = limited.request
    picked: list[Row] = []
    for text, args in _claim_branches(request, suspended):
        args[args.index(None, 1)] = at
        picked += await snapshot_rows(s, text, args)
    if not picked:
        return []
    # Claim order (priority DESC, then creation) across the keys; what a key locked
    # beyond the limit stays as it is (locked until the commit, not updated).
    picked.sort(key=lambda r: (-r[PRIORITY], r[SEQ]))
    del picked[request.limit :]
    lease = at + timedelta(seconds=request.lease_seconds)
    s.defer(
        sql.CLAIM_UPDATE.format(sql.seq_list(r[SEQ] for r in picked)),
        [request.worker_id, at, at, lease],
    )
    rows = [claimed_row(r, request.worker_id, at, lease) for r in picked]
    snapshots = [task(r) for r in rows]
    await append_events(
        s, [(r[SEQ], r[ID], _STARTED, "running", at) for r in sorted(rows, key=_seq_of)]
    )
    if limited is not None:
        await spend_claimed(ledger, limited, ((t.app_id, t.task_type) for t in snapshots))
    return snapshots


def _seq_of(row: Row) -> int:
    seq: int = row[SEQ]
    return seq
