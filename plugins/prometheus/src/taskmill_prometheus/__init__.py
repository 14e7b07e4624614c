"""taskmill-prometheus: Prometheus metrics for taskmill, from its lifecycle hooks.

Installed, the plugin counts what happens to tasks in every process that loads plugins,
in prometheus-client's default registry:

=========================================  ========================================
``taskmill_tasks_enqueued_total``          tasks enqueued (app_id, task_type)
``taskmill_attempts_total``                attempts finished (app_id, task_type, outcome)
``taskmill_attempt_duration_seconds``      histogram of attempt wall time (app_id, task_type)
``taskmill_handlers_running``              handlers running in this process (app_id, task_type)
``taskmill_retries_total``                 failed attempts that will be retried (app_id, task_type)
``taskmill_dead_letters_total``            tasks that ended FAILED (app_id, task_type)
``taskmill_cancellations_total``           tasks cancelled (app_id, task_type, reason)
``taskmill_tasks``                         tasks in the store by status (status); ``pending``
                                           is the queue depth
=========================================  ========================================

``app_id`` is empty for the host's tasks. ``taskmill_tasks`` counts the whole store, as
``Taskmill.progress_summary()`` does; every running worker refreshes it every
``$TASKMILL_PROMETHEUS_REFRESH`` seconds (default 5), so with several workers take the
``max`` of it across them.

A worker serves the metrics over HTTP (``/metrics``) when ``$TASKMILL_PROMETHEUS_PORT``
is set: the server starts with the first worker of the process and stops with the
last, on ``$TASKMILL_PROMETHEUS_ADDR`` (default ``0.0.0.0``). Without the port the
metrics are still collected, for an application that serves the default registry
itself.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import prometheus_client
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from taskmill import AttemptOutcome, CancelReason, Task, Worker, hookimpl

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from taskmill import Taskmill

PORT_ENV = "TASKMILL_PROMETHEUS_PORT"
ADDR_ENV = "TASKMILL_PROMETHEUS_ADDR"
REFRESH_ENV = "TASKMILL_PROMETHEUS_REFRESH"
DEFAULT_ADDR = "0.0.0.0"
DEFAULT_REFRESH = 5.0
DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, float("inf"),
)  # fmt: skip
STATUSES = ("pending", "running", "completed", "failed", "cancelled")

log = logging.getLogger("taskmill.prometheus")


class _Series:
    """One task type's metric children, looked up once: ``labels()`` is slow."""

    def __init__(self, exporter: PrometheusExporter, app_id: str, task_type: str) -> None:
        self.key = (app_id, task_type)
        self.exporter = exporter
        self.running = exporter.running.labels(*self.key)
        self.duration = exporter.duration.labels(*self.key)
        self.attempts: dict[AttemptOutcome, Any] = {}

    def attempt(self, outcome: AttemptOutcome) -> Any:
        counter = self.attempts.get(outcome)
        if counter is None:
            counter = self.attempts[outcome] = self.exporter.attempts.labels(
                *self.key, outcome.value
            )
        return counter


class PrometheusExporter:
    """The plugin: taskmill's lifecycle hooks turned into Prometheus metrics.

    The installed entry point is the module's :data:`exporter`, on the default
    registry and configured by environment variables. To configure it in code instead,
    skip the entry point (``TASKMILL_DISABLE_PLUGINS=prometheus``) and pass your own:
    ``Taskmill(plugins=[PrometheusExporter(registry=..., port=9464)])``.

    :param registry: where the metrics live (default: prometheus-client's global one).
    :param port: serve ``/metrics`` on this port while a worker runs (default:
        ``$TASKMILL_PROMETHEUS_PORT``; unset: do not serve).
    :param addr: the address to serve on (default: ``$TASKMILL_PROMETHEUS_ADDR``, else
        ``0.0.0.0``).
    :param refresh_interval: seconds between refreshes of ``taskmill_tasks`` (default:
        ``$TASKMILL_PROMETHEUS_REFRESH``, else 5).
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry = REGISTRY,
        port: int | None = None,
        addr: str | None = None,
        refresh_interval: float | None = None,
    ) -> None:
        self.registry = registry
        self.port = port
        self.addr = addr
        self.refresh_interval = refresh_interval
        task = ("app_id", "task_type")
        self.enqueued = Counter(
            "taskmill_tasks_enqueued", "Tasks enqueued.", task, registry=registry
        )
        self.attempts = Counter(
            "taskmill_attempts",
            "Attempts finished, by outcome.",
            (*task, "outcome"),
            registry=registry,
        )
        self.duration = Histogram(
            "taskmill_attempt_duration_seconds",
            "Wall time of finished attempts, from claim to stored outcome.",
            task,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.running = Gauge(
            "taskmill_handlers_running", "Handlers running in this process.", task,
            registry=registry,
        )  # fmt: skip
        self.retries = Counter(
            "taskmill_retries", "Failed attempts that will be retried.", task, registry=registry
        )
        self.dead_letters = Counter(
            "taskmill_dead_letters", "Tasks that ended FAILED (dead letters).", task,
            registry=registry,
        )  # fmt: skip
        self.cancellations = Counter(
            "taskmill_cancellations", "Tasks cancelled, by reason.", (*task, "reason"),
            registry=registry,
        )  # fmt: skip
        self.tasks = Gauge(
            "taskmill_tasks",
            "Tasks in the store by status; pending is the queue depth.",
            ("status",),
            registry=registry,
        )
        self._lock = threading.Lock()
        self._serving = 0
        self._server: tuple[WSGIServer, threading.Thread] | None = None
        self._refreshers: dict[int, asyncio.Task[None]] = {}
        self._series: dict[tuple[str | None, str], _Series] = {}
        self._started: collections.Counter[str] = collections.Counter()
        """The ids of the tasks whose handlers run in this process."""

    def _of(self, task: Task) -> _Series:
        series = self._series.get((task.app_id, task.task_type))
        if series is None:
            series = _Series(self, task.app_id or "", task.task_type)
            self._series[(task.app_id, task.task_type)] = series
        return series

    # -- lifecycle hooks -----------------------------------------------------------

    @hookimpl
    def taskmill_task_enqueued(self, task: Task) -> None:
        """Count the enqueue."""
        self.enqueued.labels(*self._of(task).key).inc()

    @hookimpl
    def taskmill_task_started(self, task: Task) -> None:
        """One more handler running."""
        self._of(task).running.inc()
        self._started[task.id] += 1

    @hookimpl
    def taskmill_task_finished(
        self, task: Task, outcome: AttemptOutcome, elapsed_ms: float
    ) -> None:
        """Count the attempt by outcome and record its duration."""
        series = self._of(task)
        self._stopped_running(task, series)
        series.attempt(outcome).inc()
        series.duration.observe(elapsed_ms / 1000.0)

    @hookimpl
    def taskmill_task_detached(self, task: Task) -> None:
        """The handler handed its attempt over: one handler fewer running here (the
        outcome is counted where the new owner reports it)."""
        self._stopped_running(task, self._of(task))

    def _stopped_running(self, task: Task, series: _Series) -> None:
        # Only an attempt started in this process ran here: the outcome of a detached
        # one is reported in the process that stored it (the taskmill-http service).
        if self._started[task.id] > 0:
            self._started[task.id] -= 1
            if not self._started[task.id]:
                del self._started[task.id]
            series.running.dec()

    @hookimpl
    def taskmill_task_retried(self, task: Task) -> None:
        """Count the retry."""
        self.retries.labels(*self._of(task).key).inc()

    @hookimpl
    def taskmill_task_dead_lettered(self, task: Task) -> None:
        """Count the dead letter."""
        self.dead_letters.labels(*self._of(task).key).inc()

    @hookimpl
    def taskmill_task_cancelled(self, task: Task, reason: CancelReason) -> None:
        """Count the cancellation by reason."""
        self.cancellations.labels(*self._of(task).key, reason.value).inc()

    # -- worker hooks ------------------------------------------------------------------

    @hookimpl
    async def taskmill_worker_started(self, worker: Worker) -> None:
        """Start refreshing the queue gauges, and the HTTP server if configured."""
        self._refreshers[id(worker)] = asyncio.create_task(
            self._refresh_tasks(worker.taskmill), name="taskmill-prometheus-refresh"
        )
        port = self._port()
        if port is None:
            return
        with self._lock:
            self._serving += 1
            if self._server is not None:
                return
            addr = self.addr or os.environ.get(ADDR_ENV) or DEFAULT_ADDR
            try:
                self._server = prometheus_client.start_http_server(
                    port, addr=addr, registry=self.registry
                )
            except OSError as exc:
                log.error("cannot serve Prometheus metrics on %s:%d: %s", addr, port, exc)
                return
        log.info("serving Prometheus metrics on http://%s:%d/metrics", addr, port)

    @hookimpl
    async def taskmill_worker_stopped(self, worker: Worker) -> None:
        """Stop the refresher, and the HTTP server with the last worker."""
        refresher = self._refreshers.pop(id(worker), None)
        if refresher is not None:
            refresher.cancel()
            await asyncio.gather(refresher, return_exceptions=True)
        if self._port() is None:
            return
        with self._lock:
            self._serving = max(0, self._serving - 1)
            if self._serving or self._server is None:
                return
            server, thread = self._server
            self._server = None
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        thread.join(timeout=5)

    # -- helpers -----------------------------------------------------------------------

    def _port(self) -> int | None:
        if self.port is not None:
            return self.port
        text = os.environ.get(PORT_ENV, "").strip()
        if not text:
            return None
        try:
            return int(text)
        except ValueError:
            log.error("%s=%r is not a port number; not serving metrics", PORT_ENV, text)
            return None

    def _refresh_seconds(self) -> float:
        if self.refresh_interval is not None:
            return self.refresh_interval
        text = os.environ.get(REFRESH_ENV, "").strip()
        try:
            return max(0.05, float(text)) if text else DEFAULT_REFRESH
        except ValueError:
            log.error(
                "%s=%r is not a number of seconds; using %s", REFRESH_ENV, text, DEFAULT_REFRESH
            )
            return DEFAULT_REFRESH

    async def _refresh_tasks(self, tm: Taskmill) -> None:
        while True:
            try:
                summary = await tm.progress_summary()
            except Exception:
                log.warning("reading the task counts failed", exc_info=True)
            else:
                for status in STATUSES:
                    self.tasks.labels(status).set(getattr(summary, status))
            await asyncio.sleep(self._refresh_seconds())


exporter = PrometheusExporter()
"""The plugin the ``prometheus`` entry point loads: default registry, environment
configuration."""
