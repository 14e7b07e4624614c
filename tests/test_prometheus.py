"""The taskmill-prometheus plugin, installed in the workspace and found through its entry
point: a worker with the port configured serves /metrics over real HTTP while it runs,
with the counts of what it did."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from taskmill import AttemptOutcome, Context, Detached, Fail, Taskmill, TaskStatus
from taskmill.storage import Finish, FinishKind, Lease, utcnow
from taskmill.testing import wait_until
from taskmill_prometheus import PrometheusExporter

from tests.test_worker import Background

STATUSES = ("pending", "running", "completed", "failed", "cancelled")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def scrape(port: int) -> Samples:
    """GET /metrics and return every sample by (name, labels)."""

    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert reply.status == 200
            return reply.read().decode()

    text = await asyncio.to_thread(get)
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def test_a_worker_serves_counters_durations_and_queue_depth_on_the_configured_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv("TASKMILL_PROMETHEUS_PORT", str(port))
    monkeypatch.setenv("TASKMILL_PROMETHEUS_ADDR", "127.0.0.1")
    monkeypatch.setenv("TASKMILL_PROMETHEUS_REFRESH", "0.05")
    monkeypatch.delenv("TASKMILL_DISABLE_PLUGINS", raising=False)
    # The metrics live in the process-wide registry: an app of its own keeps this
    # test's labels apart from anything else this process counted.
    app = f"metrics-{uuid.uuid4().hex[:8]}"

    async with Taskmill(f"sqlite:///{tmp_path / 'tasks.db'}") as tm:
        plugin = tm.plugins.get("prometheus")
        assert plugin is not None and plugin.distribution == "taskmill-prometheus"

        @tm.handler("resize", app_id=app)
        async def resize(ctx: Context, params: dict) -> str:
            await asyncio.sleep(0.02)
            return "ok"

        @tm.handler("fetch", app_id=app, max_retries=2)
        async def fetch(ctx: Context, params: dict) -> str:
            if ctx.task.attempts == 1:
                raise ConnectionError("reset by peer")
            return "fetched"

        @tm.handler("validate", app_id=app)
        def validate(ctx: Context, params: dict) -> None:
            raise Fail("bad record")

        app_tasks = tm.for_app(app)
        handled = await app_tasks.enqueue_many(
            [{"task_type": "resize"}] * 4 + [{"task_type": "fetch"}, {"task_type": "validate"}]
        )
        await app_tasks.enqueue_many([{"task_type": "unhandled"}] * 2)

        with pytest.raises(urllib.error.URLError):
            await scrape(port)  # nothing serves before a worker starts

        async with Background(tm):
            for task in handled:
                await tm.wait(task.id, timeout=30)

            async def refreshed() -> Samples | None:
                # The gauges catch up with the store at the next refresh.
                samples = await scrape(port)
                counts = [value(samples, "taskmill_tasks", status=s) for s in STATUSES]
                return samples if counts == [2, 0, 5, 1, 0] else None

            samples = await wait_until(refreshed)
            assert samples is not None

        statuses = [(await tm.wait(t.id)).status for t in handled]
        assert statuses == [TaskStatus.COMPLETED] * 5 + [TaskStatus.FAILED]

    def attempts(task_type: str, outcome: str) -> float | None:
        return value(
            samples, "taskmill_attempts_total", app_id=app, task_type=task_type, outcome=outcome
        )

    assert attempts("resize", "completed") == 4
    assert attempts("fetch", "failed") == 1
    assert attempts("fetch", "completed") == 1
    assert attempts("validate", "failed") == 1
    assert attempts("resize", "failed") is None
    assert value(samples, "taskmill_retries_total", app_id=app, task_type="fetch") == 1
    assert value(samples, "taskmill_dead_letters_total", app_id=app, task_type="validate") == 1
    assert value(samples, "taskmill_tasks_enqueued_total", app_id=app, task_type="resize") == 4
    assert value(samples, "taskmill_tasks_enqueued_total", app_id=app, task_type="unhandled") == 2
    assert value(samples, "taskmill_handlers_running", app_id=app, task_type="resize") == 0

    duration = "taskmill_attempt_duration_seconds"
    assert value(samples, f"{duration}_count", app_id=app, task_type="resize") == 4
    total = value(samples, f"{duration}_sum", app_id=app, task_type="resize")
    assert total is not None and total >= 4 * 0.02
    assert value(samples, f"{duration}_bucket", app_id=app, task_type="resize", le="+Inf") == 4
    assert value(samples, f"{duration}_bucket", app_id=app, task_type="resize", le="0.005") == 0

    # The whole store, refreshed from progress_summary: 2 unhandled tasks are the queue.
    assert value(samples, "taskmill_tasks", status="pending") == 2
    assert value(samples, "taskmill_tasks", status="completed") == 5
    assert value(samples, "taskmill_tasks", status="failed") == 1
    assert value(samples, "taskmill_tasks", status="running") == 0

    # The server stopped with the worker.
    with pytest.raises(urllib.error.URLError):
        await scrape(port)


async def test_a_detached_attempt_stops_counting_as_running_and_is_counted_where_it_is_stored(
    tmp_path: Path,
) -> None:
    """The worker's process hands the attempt over; a second process (the service, in
    production) stores the owner's outcome: neither gauge goes wrong."""
    worker_registry, service_registry = CollectorRegistry(), CollectorRegistry()
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    async with (
        Taskmill(url, plugins=[PrometheusExporter(registry=worker_registry)]) as worker_tm,
        Taskmill(url, plugins=[PrometheusExporter(registry=service_registry)]) as service_tm,
    ):

        @worker_tm.handler("handoff")
        async def handoff(ctx: Context, params: dict) -> None:
            raise Detached("the receiver took it over")

        task = await worker_tm.enqueue("handoff")
        async with Background(worker_tm) as worker:

            async def handed_over() -> bool:
                return worker.detached == 1

            await wait_until(handed_over)
        running = await worker_tm.get(task.id)
        assert running is not None and running.started_at is not None
        lease = Lease(task_id=task.id, worker_id=worker.worker_id, attempt=1)
        finish = Finish(
            lease=lease,
            kind=FinishKind.COMPLETE,
            outcome=AttemptOutcome.COMPLETED,
            started_at=running.started_at,
            finished_at=utcnow(),
            result_json="null",
        )
        (stored,) = await service_tm.storage.finish_batch([finish])
        assert stored is not None
        await service_tm.plugins.attempt_finished(finish, stored)

    labels = {"app_id": "", "task_type": "handoff"}
    assert worker_registry.get_sample_value("taskmill_handlers_running", labels) == 0
    assert (
        worker_registry.get_sample_value(
            "taskmill_attempts_total", {**labels, "outcome": "completed"}
        )
        is None
    )
    assert service_registry.get_sample_value("taskmill_handlers_running", labels) in (None, 0)
    assert (
        service_registry.get_sample_value(
            "taskmill_attempts_total", {**labels, "outcome": "completed"}
        )
        == 1
    )
