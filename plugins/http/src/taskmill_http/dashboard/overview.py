"""The dashboard's overview: counts per status, app and task type, suspensions, and
the throughput of the last minutes.

The store counts (one summary per app and per task type, each computed by the store);
which apps and types there are comes from the handlers this process knows, the handlers
registered in the store, the suspensions and the newest tasks. Throughput is the
service's metrics collector's (:mod:`taskmill_http.metrics`): counted from the store's
event log, every process's tasks, since the service started (and the hour before,
backfilled from the stored tasks).
"""

from __future__ import annotations

import logging

import attrs
from taskmill.app import Taskmill
from taskmill.model import ProgressSummary, SuspensionScope, TaskFilter, TaskStatus
from taskmill.operations import TaskOperations
from taskmill.workers import WorkerStatus, unserved

from taskmill_http.dashboard.workers import has_registry, pending_keys_of
from taskmill_http.metrics import MetricsCollector
from taskmill_http.tokens import Caller

log = logging.getLogger("taskmill.http.dashboard")

RECENT_TASKS = 500
"""How many of the newest tasks the overview reads to find the apps and types in use."""
THROUGHPUT_MINUTES = 10
"""Minutes of throughput the overview shows."""
MAX_APPS = 100
"""The most apps the app picker lists and the overview counts (the first, by name)."""
SPLIT_APPS = 20
"""The most apps the "by task type" table is split by (beyond: totals per type only)."""


@attrs.frozen
class Count:
    """The counts of one row of the overview: an app, or a task type (across the apps
    the caller sees)."""

    app_id: str | None
    task_type: str | None
    summary: ProgressSummary
    unserved: tuple[str | None, ...] = ()
    """(a task type's row) The apps (None: the host's) of its pending tasks that no
    live worker serves."""
    served_too: bool = False
    """(a task type's row) Some of its pending tasks are of apps a live worker serves."""


@attrs.frozen
class Minute:
    """Tasks that finished during one minute, by outcome."""

    started: float
    """The minute's start (Unix seconds)."""
    completed: int
    failed: int
    cancelled: int

    @property
    def total(self) -> int:
        """Every task that finished that minute."""
        return self.completed + self.failed + self.cancelled


@attrs.frozen
class Overview:
    """Everything the overview page shows."""

    totals: ProgressSummary
    apps: list[Count]
    types: list[Count]
    type_apps: dict[str, list[Count]]
    """Per task type: its counts per app (the host's, ``app_id`` None, last: what the
    listed apps do not account for), when the split applies (an admin, at most
    :data:`SPLIT_APPS` apps)."""
    apps_capped: bool
    """More apps were found than :data:`MAX_APPS`: only the first are counted."""
    suspensions: list[SuspensionScope]
    throughput: list[Minute]
    watching_since: float | None
    """When the metrics collector started counting live (Unix seconds), or None."""


async def _in_use(
    tm: Taskmill, ops: TaskOperations, caller: Caller, suspensions: list[SuspensionScope]
) -> tuple[set[str], set[str]]:
    """The apps and the task types the caller's overview has rows for."""
    apps: set[str] = set()
    types: set[str] = set()
    for handler in tm.registry:
        app_id, task_type = handler.key
        # A host handler (app None) serves every app's tasks of its type.
        if caller.app_id is None or app_id in (None, caller.app_id):
            types.add(task_type)
            if app_id is not None:
                apps.add(app_id)
    for scope in suspensions:
        if scope.task_type is not None:
            types.add(scope.task_type)
        if scope.app_id is not None:
            apps.add(scope.app_id)
    for task in await ops.query(None, limit=RECENT_TASKS, newest_first=True):
        types.add(task.task_type)
        if task.app_id is not None:
            apps.add(task.app_id)
    return apps, types


@attrs.frozen
class AppChoices:
    """The apps an admin's picker lists."""

    apps: list[str]
    capped: bool
    """More than :data:`MAX_APPS` were found; ``apps`` holds the first by name."""


async def app_choices(tm: Taskmill, ops: TaskOperations, caller: Caller) -> AppChoices:
    """The apps that exist as far as the dashboard can tell cheaply: the apps of the
    handlers this process knows, of the suspensions, of the live workers' handlers and
    of the newest :data:`RECENT_TASKS` tasks (an app whose every task is older, and that
    nothing serves, is not listed: type it in the URL). None for an app token."""
    if caller.app_id is not None:
        return AppChoices([], False)
    apps, _ = await _in_use(tm, ops, caller, await ops.suspensions())
    if has_registry(tm):
        for worker in await tm.workers():
            apps.update(h.app_id for h in worker.record.handlers if h.app_id is not None)
    ordered = sorted(apps)
    return AppChoices(ordered[:MAX_APPS], len(ordered) > MAX_APPS)


def _minus(whole: ProgressSummary, parts: list[Count]) -> ProgressSummary:
    counts = {
        s.value: getattr(whole, s.value) - sum(getattr(p.summary, s.value) for p in parts)
        for s in TaskStatus
    }
    waiting = whole.waiting - sum(p.summary.waiting for p in parts)
    return ProgressSummary.from_counts(
        {k: max(v, 0) for k, v in counts.items()}, waiting=max(waiting, 0)
    )


async def _flagged(ops: TaskOperations, row: Count, workers: list[WorkerStatus] | None) -> Count:
    """``row`` with the apps of its pending tasks that no live worker serves (none
    flagged without a worker registry: ``workers`` None)."""
    if workers is None or not row.summary.pending or row.task_type is None:
        return row
    keys = await pending_keys_of(ops, row.task_type)
    missing = unserved(keys, workers)
    if not missing:
        return row
    apps = tuple(sorted({app for app, _ in missing}, key=lambda a: a or ""))
    return attrs.evolve(row, unserved=apps, served_too=len(missing) < len(keys))


def throughput(metrics: MetricsCollector, caller: Caller) -> list[Minute]:
    """The last :data:`THROUGHPUT_MINUTES` minutes of finished tasks, oldest first,
    counting only what ``caller`` may see."""
    timeline = metrics.timeline(caller.app_id, THROUGHPUT_MINUTES)
    return [
        Minute(
            started=b.start.timestamp(),
            completed=b.completed,
            failed=b.failed,
            cancelled=b.cancelled,
        )
        for b in timeline.buckets
    ]


async def overview(
    tm: Taskmill, ops: TaskOperations, caller: Caller, metrics: MetricsCollector
) -> Overview:
    """The overview as ``caller`` (through ``ops``, its scoped operations) may see it."""
    suspensions = await ops.suspensions()
    apps_in_use, types_in_use = await _in_use(tm, ops, caller, suspensions)
    totals = await ops.progress_summary()
    apps: list[Count] = []
    app_ids = sorted(apps_in_use)[:MAX_APPS] if caller.app_id is None else []
    for app_id in app_ids:
        found = await ops.progress_summary(TaskFilter(app_id=app_id))
        apps.append(Count(app_id, None, found))
    workers = await tm.workers() if has_registry(tm) else None
    types: list[Count] = []
    type_apps: dict[str, list[Count]] = {}
    split = caller.app_id is None and len(apps) <= SPLIT_APPS
    for task_type in sorted(types_in_use):
        found = await ops.progress_summary(TaskFilter(task_types=(task_type,)))
        if not found.total:
            continue
        types.append(await _flagged(ops, Count(None, task_type, found), workers))
        if not split:
            continue
        rows: list[Count] = []
        for row in apps:
            each = await ops.progress_summary(
                TaskFilter(app_id=row.app_id, task_types=(task_type,))
            )
            if each.total:
                rows.append(Count(row.app_id, task_type, each))
        rest = _minus(found, rows)
        if rest.total:
            rows.append(Count(None, task_type, rest))
        type_apps[task_type] = rows
    return Overview(
        totals=totals,
        apps=apps,
        types=types,
        type_apps=type_apps,
        apps_capped=caller.app_id is None and len(apps_in_use) > MAX_APPS,
        suspensions=suspensions,
        throughput=throughput(metrics, caller),
        watching_since=metrics.started_at,
    )
