"""Building blocks for contract tests: tasks, claims, finishes, waiting on conditions."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from taskmill.model import AttemptOutcome, Priority, Task
from taskmill.serialization import dumps
from taskmill.storage import ClaimRequest, Finish, FinishKind, HandlerKey, Lease, NewTask, utcnow

__all__ = ["claim", "finish", "lease_of", "moment_after", "new_task", "wait_until"]

T = TypeVar("T")


def new_task(
    task_type: str = "job",
    params: dict[str, Any] | None = None,
    *,
    app_id: str | None = None,
    priority: int = Priority.NORMAL,
    max_retries: int = 3,
    run_at: datetime | None = None,
    dedupe_key: str | None = None,
    parent_id: str | None = None,
    user_id: str | None = None,
    after: tuple[str, ...] = (),
    after_always: bool = False,
) -> NewTask:
    """A ``NewTask`` with a fresh id, for tests."""
    params = params or {}
    return NewTask(
        id=str(uuid.uuid4()),
        task_type=task_type,
        params=params,
        params_json=dumps(params),
        app_id=app_id,
        priority=priority,
        max_retries=max_retries,
        run_at=run_at,
        dedupe_key=dedupe_key,
        parent_id=parent_id,
        user_id=user_id,
        after=after,
        after_always=after_always,
    )


def lease_of(task: Task) -> Lease:
    """The lease a claimed snapshot carries."""
    assert task.worker_id is not None, f"task {task.id} is not held by a worker"
    return Lease(task_id=task.id, worker_id=task.worker_id, attempt=task.attempts)


async def wait_until(
    probe: Callable[[], Awaitable[T | None]], *, timeout: float = 10.0, interval: float = 0.02
) -> T:
    """Await ``probe`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


async def moment_after(instant: datetime, *, timeout: float = 10.0) -> datetime:
    """Wait until the clock has passed ``instant`` (it may not have moved since a store
    stamped it); return the current time, strictly later than ``instant``."""

    async def later() -> datetime | None:
        now = utcnow()
        return now if now > instant else None

    return await wait_until(later, timeout=timeout, interval=0.001)


def claim(
    *types: str | HandlerKey,
    worker: str = "w1",
    limit: int = 10,
    lease: float = 30.0,
    min_priority: int | None = None,
    caps: dict[HandlerKey, int] | None = None,
) -> ClaimRequest:
    """A ``ClaimRequest`` for handlers of ``types`` (task types of the host, or
    ``(app_id, task_type)`` keys; default ``"job"``), each capped as ``caps`` says."""
    keys: dict[HandlerKey, int | None] = {}
    for t in types or ("job",):
        key: HandlerKey = (None, t) if isinstance(t, str) else t
        keys[key] = (caps or {}).get(key)
    return ClaimRequest(
        worker_id=worker,
        handlers=keys,
        limit=limit,
        lease_seconds=lease,
        min_priority=min_priority,
    )


def finish(
    task: Task,
    kind: FinishKind = FinishKind.COMPLETE,
    *,
    result: Any = None,
    error: str | None = None,
    retry_in: float = 0.0,
    outcome: AttemptOutcome | None = None,
    **extra: Any,
) -> Finish:
    """The ``Finish`` of ``task``'s current attempt (fenced by its lease) of ``kind``,
    with the outcome that kind usually logs unless ``outcome`` is given."""
    default_outcome = {
        FinishKind.COMPLETE: AttemptOutcome.COMPLETED,
        FinishKind.CANCEL: AttemptOutcome.CANCELLED,
        FinishKind.RELEASE: AttemptOutcome.INTERRUPTED,
    }.get(kind, AttemptOutcome.FAILED)
    now = utcnow()
    return Finish(
        lease=lease_of(task),
        kind=kind,
        outcome=outcome or default_outcome,
        started_at=task.started_at or now,
        finished_at=now,
        result_json=dumps(result) if kind is FinishKind.COMPLETE else None,
        error=error,
        retry_in=retry_in,
        **extra,
    )
