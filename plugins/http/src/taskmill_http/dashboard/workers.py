"""The dashboard's workers page, and which task types no live worker serves.

Both read the store's worker registry (``tm.workers()``, docs/workers.md) through the
host ``Taskmill``; on a store that keeps none (capability ``worker_registry``) the page
says so and no type is flagged.

What an app token sees: the workers that serve its app, that is those with a handler of
its app or a host handler (app None, which serves every app's tasks of its type) other
than the built-in ``taskmill.group`` every worker serves; of each, only the handlers of
its app and the host's, and only the running tasks of its app. Slots busy of total are
the worker's own, shared by every app it serves.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
from taskmill.app import Taskmill
from taskmill.canvas import GROUP_TYPE
from taskmill.model import Task, TaskFilter, TaskStatus
from taskmill.operations import TaskOperations
from taskmill.storage import HandlerKey, utcnow
from taskmill.workers import WorkerHandler, WorkerStatus, unserved

from taskmill_http.tokens import Caller

SHOWN_TASKS = 20
"""The running tasks the page lists per worker (the count is always whole)."""
PENDING_SCAN = 200
"""Pending tasks of a type the overview reads to find the apps they belong to."""


@attrs.frozen
class WorkerRow:
    """One worker as the page shows it to a caller."""

    status: WorkerStatus
    handlers: tuple[WorkerHandler, ...]
    tasks: tuple[Task, ...]
    """Its running tasks the caller may see (at most :data:`SHOWN_TASKS`)."""
    more_tasks: int
    """Running tasks listed beyond those shown (the caller's, when an app token)."""
    heartbeat_age: float
    """Seconds since its last heartbeat."""

    @property
    def apps(self) -> list[str]:
        """The apps whose tasks it serves (``(every app)`` for a host handler)."""
        found = {h.app_id for h in self.handlers if h.task_type != GROUP_TYPE}
        names = sorted(a for a in found if a is not None)
        return (["(every app)"] if None in found else []) + names

    @property
    def task_types(self) -> list[str]:
        """The task types it serves (``app/type`` for an app's handler)."""
        return [
            h.task_type if h.app_id is None else f"{h.app_id}/{h.task_type}" for h in self.handlers
        ]


def serves_app(worker: WorkerStatus, app_id: str) -> bool:
    """Whether ``worker`` serves tasks of ``app_id`` (see the module's docstring)."""
    return any(
        h.app_id == app_id or (h.app_id is None and h.task_type != GROUP_TYPE)
        for h in worker.record.handlers
    )


def has_registry(tm: Taskmill) -> bool:
    """Whether the store keeps a worker registry."""
    return bool(tm.storage.capabilities.worker_registry)


async def worker_rows(tm: Taskmill, ops: TaskOperations, caller: Caller) -> list[WorkerRow]:
    """The workers ``caller`` may see, live ones first, with their running tasks."""
    now = utcnow()
    rows: list[WorkerRow] = []
    for worker in await tm.workers():
        handlers = worker.record.handlers
        if caller.app_id is not None:
            if not serves_app(worker, caller.app_id):
                continue
            handlers = tuple(h for h in handlers if h.app_id in (None, caller.app_id))
        tasks: list[Task] = []
        hidden = 0
        for task_id in worker.record.running:
            if len(tasks) >= SHOWN_TASKS:
                hidden += 1
                continue
            task = await ops.get(task_id)  # None: another app's, or finished and deleted
            if task is not None:
                tasks.append(task)
        more = hidden if caller.app_id is not None else worker.record.busy - len(tasks)
        rows.append(
            WorkerRow(
                status=worker,
                handlers=handlers,
                tasks=tuple(tasks),
                more_tasks=max(0, more),
                heartbeat_age=max(0.0, (now - worker.heartbeat_at).total_seconds()),
            )
        )
    return rows


async def unserved_keys(tm: Taskmill, keys: Iterable[HandlerKey]) -> set[HandlerKey]:
    """The ``(app_id, task_type)`` keys among ``keys`` that no live worker serves; none
    on a store without a worker registry."""
    wanted = set(keys)
    if not wanted or not has_registry(tm):
        return set()
    return unserved(wanted, await tm.workers())


async def pending_keys_of(ops: TaskOperations, task_type: str) -> set[HandlerKey]:
    """The ``(app_id, task_type)`` keys of the pending tasks of ``task_type`` (among
    the first :data:`PENDING_SCAN`)."""
    pending = TaskFilter(task_types=(task_type,), statuses=(TaskStatus.PENDING,))
    return {(t.app_id, t.task_type) for t in await ops.query(pending, limit=PENDING_SCAN)}
