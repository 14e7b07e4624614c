"""The service's own metrics of the last hour: throughput per status, queue depth and
the latency from due to start, per app (``GET /v1/metrics/timeline``, the dashboard's
charts).

One :class:`MetricsCollector` per service process, started and stopped with the app,
keeps them in memory, as Oban Web's ``Oban.Met`` does:

- it taps the service's :class:`~taskmill_http.events.EventHub` (the one reader of the
  store's event log that also feeds the event streams; no poller of its own) and counts
  each event in its minute and app: tasks enqueued, started, retried (an attempt failed
  and another is due) and finished (completed, failed, cancelled), and for each start
  the latency from the task's ``run_at`` (its due time: ``created_at``, or later for a
  delayed task or a retry) to the start. Events of tasks deleted by their finish carry
  their tombstone, so those tasks count too. A minute is kept for :data:`WINDOW_MINUTES`;
- it samples the queue depth (pending, of them waiting for a dependency, and running)
  from the store's summary counts every ``depth_sample_seconds``: the whole store, and
  per app for the apps someone asked for in the last hour (the most recent
  :data:`DEPTH_APPS_MAX`): each is a count over the store's tasks, so only what is being
  looked at is counted, and an app's depth line starts when it is first asked for;
- at startup it backfills the hour it did not see from the stored tasks: one read of the
  tasks created in the last hour, newest first, at most :data:`BACKFILL_MAX` of them,
  each counted as enqueued at ``created_at``, started at ``started_at`` (its last start,
  with its latency) and finished at ``finished_at``. What that read cannot see is not
  backfilled: tasks created more than an hour ago, tasks already deleted, retries, and
  the queue depth (which starts with the first sample).

A reader sees only what its token may: an app token its own app's counts, an admin the
sum over every app (the host's tasks included) or one app.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import attrs
from taskmill.app import Taskmill
from taskmill.model import EventKind, ProgressSummary, Task, TaskEvent, TaskFilter

if TYPE_CHECKING:
    from taskmill_http.events import EventHub
    from taskmill_http.tokens import Tokens

log = logging.getLogger("taskmill.http.metrics")

BUCKET_SECONDS = 60
"""The width of one bucket of the timeline."""
WINDOW_MINUTES = 60
"""How many minutes the collector keeps (and the timeline shows at most)."""
BACKFILL_MAX = 10_000
"""The most stored tasks the startup backfill reads (the newest of the last hour)."""
BACKFILL_PAGE = 1000
"""Tasks read per query of the backfill."""
DEPTH_APPS_MAX = 20
"""The most apps whose queue depth is sampled one by one (the whole store's always is)."""
LATENCY_BOUNDS: tuple[float, ...] = tuple(0.001 * 2**i for i in range(25))
"""The upper bounds (seconds) of the latency histogram's bins: 1 ms, doubling, to about
4.7 hours; a p95 is read as the bound of the bin that holds it (at most twice the true
value), and never more than the minute's maximum."""

_FINISHED = {
    EventKind.COMPLETED: "completed",
    EventKind.FAILED: "failed",
    EventKind.CANCELLED: "cancelled",
}


@attrs.define
class Counts:
    """What one minute holds, for one app (or summed over several)."""

    enqueued: int = 0
    started: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    retried: int = 0
    latency_count: int = 0
    latency_sum: float = 0.0
    latency_max: float = 0.0
    latency_bins: list[int] = attrs.Factory(lambda: [0] * (len(LATENCY_BOUNDS) + 1))

    def finish(self, status: str) -> None:
        setattr(self, status, getattr(self, status) + 1)

    def start(self, latency: float | None) -> None:
        """One start, with its latency when it is known."""
        self.started += 1
        if latency is None:
            return
        latency = max(0.0, latency)
        self.latency_count += 1
        self.latency_sum += latency
        self.latency_max = max(self.latency_max, latency)
        self.latency_bins[bisect.bisect_left(LATENCY_BOUNDS, latency)] += 1

    def add(self, other: Counts) -> None:
        """Add ``other``'s counts to these."""
        for name in ("enqueued", "started", "completed", "failed", "cancelled", "retried"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.latency_count += other.latency_count
        self.latency_sum += other.latency_sum
        self.latency_max = max(self.latency_max, other.latency_max)
        pairs = zip(self.latency_bins, other.latency_bins, strict=True)
        self.latency_bins = [a + b for a, b in pairs]

    def p95(self) -> float | None:
        """The 95th percentile of the latencies, by the histogram's bins."""
        if not self.latency_count:
            return None
        wanted = 0.95 * self.latency_count
        seen = 0
        for index, count in enumerate(self.latency_bins):
            seen += count
            if seen >= wanted:
                bound = LATENCY_BOUNDS[index] if index < len(LATENCY_BOUNDS) else self.latency_max
                return min(bound, self.latency_max)
        return self.latency_max  # pragma: no cover - the bins hold every latency


# -- what a reader gets ---------------------------------------------------------------


@attrs.frozen
class Latency:
    """The latencies (seconds from a task's ``run_at`` to its start) of the starts of
    one minute; null without a start whose latency is known."""

    count: int
    avg_seconds: float | None
    p95_seconds: float | None
    """The 95th percentile, as the upper bound of the histogram bin that holds it
    (bins double from 1 ms; at most the maximum)."""
    max_seconds: float | None


@attrs.frozen
class TimelineBucket:
    """One minute of the timeline: tasks enqueued, started, retried and finished (by
    status) during it, and the latency of its starts."""

    start: datetime
    """The minute's start (UTC)."""
    enqueued: int
    started: int
    completed: int
    failed: int
    cancelled: int
    retried: int
    """Attempts that failed with another attempt due (the task went back to pending)."""
    latency: Latency

    @property
    def finished(self) -> int:
        """Tasks finished in this minute, whatever their status."""
        return self.completed + self.failed + self.cancelled


@attrs.frozen
class DepthSample:
    """The queue depth at one moment: tasks pending (of them ``waiting`` for a
    dependency) and running."""

    at: datetime
    pending: int
    waiting: int
    running: int


@attrs.frozen
class Backfill:
    """What the startup read of stored tasks added to the hour before the collector
    started."""

    tasks: int
    """Stored tasks read (created in the hour before the start)."""
    capped: bool
    """The read stopped at its cap (``BACKFILL_MAX``): older tasks of that hour are not
    counted."""
    until: datetime | None
    """Where the backfill ends and the live count begins; null until it ran."""


@attrs.frozen
class Timeline:
    """``GET /v1/metrics/timeline``: the last minutes, oldest first, counted from the
    store's event log by this service process (docs/service.md, "Metrics")."""

    app_id: str | None
    """The app counted; null: every app the token may see (an admin: the whole store)."""
    bucket_seconds: int
    buckets: list[TimelineBucket]
    queue_depth: list[DepthSample]
    """Samples in the timeline's span, oldest first (empty for an app whose depth is
    not sampled yet: it is from the first request that names it)."""
    depth_sample_seconds: float
    collecting_since: datetime | None
    """When this service started counting live (null: not started)."""
    backfill: Backfill


# -- the collector ------------------------------------------------------------------------


def _minute(at: datetime | float) -> int:
    seconds = at if isinstance(at, float) else at.timestamp()
    return int(seconds // BUCKET_SECONDS)


def start_latency(task: Task, started: datetime) -> float | None:
    """Seconds from ``task``'s due time to ``started``; None when the snapshot is of a
    later attempt (its ``run_at`` is after that start)."""
    if task.run_at > started:
        return None
    return (started - task.run_at).total_seconds()


class MetricsCollector:
    """Counts the store's events per minute and app, and samples the queue depth (see
    the module docstring). :meth:`start` starts it (with the app); :meth:`close` stops it."""

    def __init__(
        self,
        tm: Taskmill,
        hub: EventHub,
        tokens: Tokens,
        *,
        depth_sample_seconds: float = 10.0,
    ) -> None:
        self.tm = tm
        self.hub = hub
        self.tokens = tokens
        self.depth_sample_seconds = depth_sample_seconds
        self.started_at: float | None = None
        self.backfill = Backfill(tasks=0, capped=False, until=None)
        self._minutes: dict[int, dict[str | None, Counts]] = {}
        samples = int(WINDOW_MINUTES * 60 / max(depth_sample_seconds, 0.1)) + 2
        # (at, the whole store's (pending, waiting, running), the sampled apps' ones)
        self._depth: deque[tuple[float, tuple[int, int, int], dict[str, tuple[int, int, int]]]] = (
            deque(maxlen=samples)
        )
        self._asked: dict[str, float] = {}
        """Apps a reader named, and when (their depth is sampled for an hour after)."""
        self._untap: Callable[[], None] | None = None
        self._runner: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Tap the event hub, start it, and start the backfill and the depth samples
        in the background (once). A store that cannot be read now is logged: the
        service starts anyway, without metrics until it can."""
        if self._runner is not None:
            return
        self._minutes.clear()  # a restart counts afresh: its backfill covers the hour
        self._depth.clear()
        self._untap = self.hub.tap(self._count)
        boundary = time.time()
        try:
            await self.hub.start()
        except Exception:
            log.exception("the metrics collector cannot read the event log")
            self._untap()
            self._untap = None
            return
        self.started_at = boundary
        self._runner = asyncio.create_task(self._run(boundary), name="taskmill-http-metrics")

    async def close(self) -> None:
        """Stop counting and sampling."""
        if self._untap is not None:
            self._untap()
            self._untap = None
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner

    async def _run(self, boundary: float) -> None:
        try:
            await self._backfill(boundary)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the metrics backfill failed; the charts start now")
            self.backfill = Backfill(tasks=0, capped=False, until=_utc(boundary))
        while True:
            try:
                await self.sample_depth()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sampling the queue depth failed; retrying")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.depth_sample_seconds):
                    await self._wake.wait()

    # -- counting ---------------------------------------------------------------------

    def _bucket(self, minute: int, app_id: str | None) -> Counts:
        per_app = self._minutes.get(minute)
        if per_app is None:
            per_app = self._minutes[minute] = {}
            horizon = minute - WINDOW_MINUTES
            for old in [m for m in self._minutes if m <= horizon]:
                del self._minutes[old]
        found = per_app.get(app_id)
        if found is None:
            found = per_app[app_id] = Counts()
        return found

    def _count(self, batch: list[TaskEvent]) -> None:
        """Count a batch of events (the hub's tap)."""
        horizon = _minute(time.time()) - WINDOW_MINUTES
        for event in batch:
            minute = _minute(event.at)
            if minute <= horizon:
                continue
            kind = event.kind
            if kind is EventKind.ENQUEUED:
                self._bucket(minute, event.task.app_id).enqueued += 1
            elif kind is EventKind.STARTED:
                latency = start_latency(event.task, event.at)
                self._bucket(minute, event.task.app_id).start(latency)
            elif kind is EventKind.RETRYING:
                self._bucket(minute, event.task.app_id).retried += 1
            elif kind in _FINISHED:
                self._bucket(minute, event.task.app_id).finish(_FINISHED[kind])

    async def _backfill(self, boundary: float) -> None:
        """Count the stored tasks of the hour before ``boundary`` (see the module)."""
        since = _utc(boundary) - timedelta(minutes=WINDOW_MINUTES)
        horizon = _minute(boundary) - WINDOW_MINUTES
        until = _utc(boundary)
        read = 0
        after: str | None = None
        capped = False
        while True:
            tasks = await self.tm.query(
                TaskFilter(created_after=since),
                limit=min(BACKFILL_PAGE, BACKFILL_MAX - read),
                newest_first=True,
                after=after,
            )
            for task in tasks:
                self._count_stored(task, until, horizon)
            read += len(tasks)
            if len(tasks) < BACKFILL_PAGE or read >= BACKFILL_MAX:
                capped = read >= BACKFILL_MAX and len(tasks) > 0
                break
            after = tasks[-1].id
            await asyncio.sleep(0)  # let requests in between the pages
        self.backfill = Backfill(tasks=read, capped=capped, until=until)

    def _count_stored(self, task: Task, until: datetime, horizon: int) -> None:
        app_id = task.app_id
        if task.alias_of is None and task.created_at < until:
            minute = _minute(task.created_at)
            if minute > horizon:
                self._bucket(minute, app_id).enqueued += 1
        if task.started_at is not None and task.started_at < until:
            minute = _minute(task.started_at)
            if minute > horizon:
                self._bucket(minute, app_id).start(start_latency(task, task.started_at))
        finished = task.finished_at
        if finished is not None and finished < until and task.status.value in _FINISHED.values():
            minute = _minute(finished)
            if minute > horizon:
                self._bucket(minute, app_id).finish(task.status.value)

    # -- queue depth ------------------------------------------------------------------

    def depth_apps(self) -> list[str]:
        """The apps whose depth the next sample takes (see the module docstring)."""
        now = time.time()
        for app_id, at in list(self._asked.items()):
            if now - at > WINDOW_MINUTES * 60:
                del self._asked[app_id]
        return sorted(self._asked, key=lambda a: -self._asked[a])[:DEPTH_APPS_MAX]

    async def sample_depth(self) -> None:
        """Take one sample of the queue depth (the collector does every
        ``depth_sample_seconds``)."""
        at = time.time()
        whole = _depth(await self.tm.progress_summary())
        apps: dict[str, tuple[int, int, int]] = {}
        for app_id in self.depth_apps():
            apps[app_id] = _depth(await self.tm.progress_summary(TaskFilter(app_id=app_id)))
        self._depth.append((at, whole, apps))

    # -- reading ----------------------------------------------------------------------

    def timeline(self, app_id: str | None, minutes: int = WINDOW_MINUTES) -> Timeline:
        """The last ``minutes`` (at most :data:`WINDOW_MINUTES`, the current one last)
        of ``app_id``, or of every app (None). The caller checks that its reader may
        see ``app_id`` (an app token: its own app only, never None)."""
        minutes = max(1, min(minutes, WINDOW_MINUTES))
        if app_id is not None and app_id not in self._asked:
            self._asked[app_id] = time.time()
            self._wake.set()  # sample it now rather than in up to a period
        elif app_id is not None:
            self._asked[app_id] = time.time()
        now = _minute(time.time())
        first = now - minutes + 1
        buckets = []
        for minute in range(first, now + 1):
            total = Counts()
            for owner, counts in self._minutes.get(minute, {}).items():
                if app_id is None or owner == app_id:
                    total.add(counts)
            buckets.append(_bucket_of(minute, total))
        depth = []
        for at, whole, apps in self._depth:
            if at < first * BUCKET_SECONDS:
                continue
            found = whole if app_id is None else apps.get(app_id)
            if found is not None:
                depth.append(DepthSample(_utc(at), *found))
        return Timeline(
            app_id=app_id,
            bucket_seconds=BUCKET_SECONDS,
            buckets=buckets,
            queue_depth=depth,
            depth_sample_seconds=self.depth_sample_seconds,
            collecting_since=None if self.started_at is None else _utc(self.started_at),
            backfill=self.backfill,
        )


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _depth(summary: ProgressSummary) -> tuple[int, int, int]:
    return (summary.pending, summary.waiting, summary.running)


def _bucket_of(minute: int, counts: Counts) -> TimelineBucket:
    latency = Latency(
        count=counts.latency_count,
        avg_seconds=counts.latency_sum / counts.latency_count if counts.latency_count else None,
        p95_seconds=counts.p95(),
        max_seconds=counts.latency_max if counts.latency_count else None,
    )
    return TimelineBucket(
        start=_utc(float(minute * BUCKET_SECONDS)),
        enqueued=counts.enqueued,
        started=counts.started,
        completed=counts.completed,
        failed=counts.failed,
        cancelled=counts.cancelled,
        retried=counts.retried,
        latency=latency,
    )
