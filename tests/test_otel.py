"""taskmill-otel (plugins/otel): the spans of a task's life and their attributes, the
trace carried from the enqueuer to the handler and on to the tasks the handler
enqueues, a failed attempt marked on its span, and the metrics; recorded with the
OpenTelemetry SDK's in-memory exporter and reader (docs/otel.md)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import taskmill_otel
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from taskmill import Context, Fail, InvalidParams, RetryPolicy, Taskmill, TaskStatus, headers_of
from taskmill_otel import OtelInstrumentation


class Recorder:
    """An :class:`OtelInstrumentation` on SDK providers of its own, and what they
    recorded."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.plugin = OtelInstrumentation(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider
        )
        self.tracer = self.tracer_provider.get_tracer("tests")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def span(self, name: str, **attributes: Any) -> ReadableSpan:
        """The one finished span named ``name`` with these attributes."""
        found = [
            s
            for s in self.spans(name)
            if all(
                (s.attributes or {}).get(k.replace("__", ".")) == v for k, v in attributes.items()
            )
        ]
        assert len(found) == 1, (name, attributes, [(s.name, s.attributes) for s in self.spans()])
        return found[0]

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """Every data point by instrument name: (attributes, point)."""
        data = self.reader.get_metrics_data()
        found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        found.setdefault(metric.name, []).append(
                            (dict(point.attributes or {}), point)
                        )
        return found

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture
def otel() -> Iterator[Recorder]:
    recorder = Recorder()
    yield recorder
    recorder.shutdown()


def instrumented(url: str, otel: Recorder) -> Taskmill:
    tm = Taskmill(url, plugins=False)
    tm.add_plugin(otel.plugin, name="otel")
    return tm


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tasks.db'}"


def attrs_of(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_the_spans_of_a_task_and_their_attributes(tmp_path: Path, otel: Recorder) -> None:
    seen: dict[str, Any] = {}

    async def resize(ctx: Context, params: dict[str, Any]) -> int:
        seen["params"] = params
        seen["headers"] = headers_of(ctx.task)
        seen["current"] = trace.get_current_span().get_span_context()
        return 1

    async with instrumented(sqlite_url(tmp_path), otel) as tm:
        tm.register("resize", resize, app_id="photos")
        with otel.tracer.start_as_current_span("GET /upload") as request:
            task = await tm.for_app("photos").enqueue("resize", {"w": 10}, priority=5)
        assert otel.plugin.telemetry.pending() == 0
        await tm.run_worker(until_idle=True, handle_signals=False)
        done = await tm.wait(task.id, timeout=10)
        assert done.status is TaskStatus.COMPLETED

    trace_id = request.get_span_context().trace_id
    send = otel.span("send resize")
    claim = otel.span("claim resize")
    process = otel.span("process resize")
    settle = otel.span("settle resize")
    assert [s.kind for s in (send, claim, process, settle)] == [
        SpanKind.PRODUCER,
        SpanKind.CLIENT,
        SpanKind.CONSUMER,
        SpanKind.CLIENT,
    ]
    for span in (send, claim, process, settle):
        assert span.context is not None and span.context.trace_id == trace_id
        attributes = attrs_of(span)
        assert attributes["messaging.system"] == "taskmill"
        assert attributes["messaging.destination.name"] == "resize"
        assert attributes["messaging.message.id"] == task.id
        assert attributes["taskmill.app_id"] == "photos"
        assert attributes["taskmill.priority"] == 5
    # The producer span is the request's child; the worker's spans are the producer's.
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert send.context is not None
    for span in (claim, process):
        assert span.parent is not None and span.parent.span_id == send.context.span_id
    assert process.context is not None
    assert settle.parent is not None and settle.parent.span_id == process.context.span_id
    assert attrs_of(send)["messaging.operation.type"] == "send"
    assert attrs_of(claim)["messaging.operation.type"] == "receive"
    assert attrs_of(claim)["messaging.operation.name"] == "claim"
    assert attrs_of(process)["messaging.operation.type"] == "process"
    assert attrs_of(settle)["messaging.operation.type"] == "settle"
    for span in (claim, process, settle):
        assert attrs_of(span)["taskmill.attempt"] == 1
        assert attrs_of(span)["taskmill.worker_id"]
    assert attrs_of(settle)["taskmill.outcome"] == "completed"
    assert process.status.status_code is StatusCode.UNSET
    assert settle.status.status_code is StatusCode.UNSET
    # In time order: claimed, then run, then settled.
    assert claim.end_time is not None and process.start_time is not None
    assert claim.end_time <= process.start_time
    assert process.end_time is not None and settle.start_time is not None
    assert process.end_time <= settle.start_time
    # The handler ran in the process span; its params lack the headers.
    assert seen["current"] == process.context
    assert seen["params"] == {"w": 10}
    assert "traceparent" in seen["headers"]
    assert f"{trace_id:032x}" in seen["headers"]["traceparent"]
    assert otel.plugin.telemetry.running() == 0


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_child_enqueued_by_the_handler_continues_the_trace(
    tmp_path: Path, otel: Recorder, kind: str
) -> None:
    async def parent_async(ctx: Context, params: dict[str, Any]) -> str:
        child = await ctx.spawn("child", {"n": 1})
        return child.id

    def parent_sync(ctx: Context, params: dict[str, Any]) -> str:
        return ctx.spawn("child", {"n": 1}).result().id

    async def child(ctx: Context, params: dict[str, Any]) -> int:
        return int(params["n"])

    async with instrumented(sqlite_url(tmp_path), otel) as tm:
        tm.register("parent", parent_async if kind == "async" else parent_sync)
        tm.register("child", child)
        with otel.tracer.start_as_current_span("POST /jobs") as request:
            task = await tm.enqueue("parent")
        await tm.run_worker(until_idle=True, handle_signals=False)
        done = await tm.wait(task.id, timeout=10)
        assert done.status is TaskStatus.COMPLETED
        child_task = await tm.wait(str(done.result), timeout=10)
        assert child_task.status is TaskStatus.COMPLETED

    trace_id = request.get_span_context().trace_id
    parent_process = otel.span("process parent")
    child_send = otel.span("send child")
    child_process = otel.span("process child")
    assert {s.context.trace_id for s in otel.spans() if s.context is not None} == {trace_id}
    assert parent_process.context is not None and child_send.context is not None
    assert child_send.parent is not None
    assert child_send.parent.span_id == parent_process.context.span_id
    assert attrs_of(child_send)["taskmill.parent_id"] == task.id
    assert child_process.parent is not None
    assert child_process.parent.span_id == child_send.context.span_id


async def test_a_failed_attempt_marks_its_spans(tmp_path: Path, otel: Recorder) -> None:
    attempts: list[int] = []

    async def flaky(ctx: Context, params: dict[str, Any]) -> None:
        attempts.append(ctx.task.attempts)
        if ctx.task.attempts == 1:
            raise ValueError("first try fails")
        raise Fail("second try gives up")

    async with instrumented(sqlite_url(tmp_path), otel) as tm:
        tm.register("flaky", flaky, max_retries=1)
        task = await tm.enqueue("flaky")
        await tm.run_worker(
            until_idle=True, handle_signals=False, retry_policy=RetryPolicy(base=0, jitter=0)
        )
        done = await tm.wait(task.id, timeout=10)
        assert done.status is TaskStatus.FAILED
        assert attempts == [1, 2]

    first = otel.span("process flaky", taskmill__attempt=1)
    second = otel.span("process flaky", taskmill__attempt=2)
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "ValueError: first try fails"
    assert attrs_of(first)["error.type"] == "ValueError"
    (event,) = [e for e in first.events if e.name == "exception"]
    assert (event.attributes or {})["exception.type"] == "ValueError"
    assert second.status.status_code is StatusCode.ERROR
    assert attrs_of(second)["error.type"] == "taskmill.errors.Fail"
    settled = {attrs_of(s)["taskmill.attempt"]: s for s in otel.spans("settle flaky")}
    assert attrs_of(settled[1])["taskmill.outcome"] == "failed"
    assert settled[1].status.status_code is StatusCode.ERROR
    assert settled[1].status.description is not None
    assert "first try fails" in settled[1].status.description
    assert attrs_of(settled[2])["taskmill.outcome"] == "failed"
    # Both attempts continue the trace the task was enqueued in.
    send = otel.span("send flaky")
    assert send.context is not None
    for span in (first, second):
        assert span.parent is not None and span.parent.span_id == send.context.span_id
    durations = otel.metrics()["messaging.process.duration"]
    assert {a.get("error.type") for a, _ in durations} == {"ValueError", "taskmill.errors.Fail"}


async def test_a_timed_out_attempt_is_an_error(tmp_path: Path, otel: Recorder) -> None:
    async def slow(ctx: Context, params: dict[str, Any]) -> None:
        await asyncio.sleep(30)

    async with instrumented(sqlite_url(tmp_path), otel) as tm:
        tm.register("slow", slow, timeout=0.05, max_retries=0)
        task = await tm.enqueue("slow")
        await tm.run_worker(until_idle=True, handle_signals=False)
        assert (await tm.wait(task.id, timeout=10)).status is TaskStatus.FAILED
    process = otel.span("process slow")
    assert process.status.status_code is StatusCode.ERROR
    assert attrs_of(process)["error.type"] == "TimeoutError"
    settle = otel.span("settle slow")
    assert attrs_of(settle)["taskmill.outcome"] == "timed_out"
    assert settle.status.status_code is StatusCode.ERROR


async def test_the_metrics(tmp_path: Path, otel: Recorder) -> None:
    async def ok(ctx: Context, params: dict[str, Any]) -> None:
        return None

    async def bad(ctx: Context, params: dict[str, Any]) -> None:
        raise Fail("no")

    async with instrumented(sqlite_url(tmp_path), otel) as tm:
        tm.register("ok", ok)
        tm.register("bad", bad, app_id="photos")
        await tm.enqueue_many([{"task_type": "ok"}] * 3)
        await tm.for_app("photos").enqueue("bad")
        await tm.run_worker(until_idle=True, handle_signals=False)
        # run_until_idle returns once every attempt was reported (settled).
        assert otel.plugin.telemetry.running() == 0
    metrics = otel.metrics()

    def total(name: str, **attributes: Any) -> float:
        return sum(
            p.value if hasattr(p, "value") else p.count
            for a, p in metrics[name]
            if all(a.get(k.replace("__", ".")) == v for k, v in attributes.items())
        )

    assert total("messaging.client.sent.messages", messaging__destination__name="ok") == 3
    sent_bad = total(
        "messaging.client.sent.messages",
        messaging__destination__name="bad",
        taskmill__app_id="photos",
        messaging__system="taskmill",
        messaging__operation__name="send",
    )
    assert sent_bad == 1
    assert total("messaging.client.consumed.messages") == 4
    assert total("taskmill.attempts.finished", taskmill__outcome="completed") == 3
    assert total("taskmill.attempts.finished", taskmill__outcome="failed") == 1
    assert total("messaging.process.duration") == 4
    assert total("messaging.process.duration", messaging__destination__name="ok") == 3
    assert total("taskmill.queue.duration") == 4
    assert total("messaging.client.operation.duration", messaging__operation__name="send") == 4
    assert total("messaging.client.operation.duration", messaging__operation__name="claim") == 4
    assert total("messaging.client.operation.duration", messaging__operation__name="settle") == 4
    (queue,) = [
        p for a, p in metrics["taskmill.queue.duration"] if a["messaging.destination.name"] == "bad"
    ]
    assert queue.min >= 0


async def test_every_task_of_a_bulk_enqueue_has_its_own_send_span(
    tmp_path: Path, otel: Recorder
) -> None:
    async with instrumented(sqlite_url(tmp_path), otel) as tm:
        with otel.tracer.start_as_current_span("import") as request:
            tasks = await tm.enqueue_many(
                [{"task_type": "row", "params": {"i": i}} for i in range(5)]
            )
            chain = await tm.chain({"task_type": "a"}, {"task_type": "b"})
    sends = otel.spans("send row")
    assert sorted(attrs_of(s)["messaging.message.id"] for s in sends) == sorted(t.id for t in tasks)
    trace_id = f"{request.get_span_context().trace_id:032x}"
    parents = set()
    by_id = {attrs_of(s)["messaging.message.id"]: s for s in sends}
    for task in tasks:
        send = by_id[task.id]
        traceparent = headers_of(task)["traceparent"]
        assert traceparent.split("-")[1] == trace_id
        assert send.context is not None
        assert traceparent.split("-")[2] == f"{send.context.span_id:016x}"
        parents.add(traceparent)
    assert len(parents) == 5
    assert [attrs_of(otel.span(f"send {t}"))["messaging.message.id"] for t in "ab"] == list(
        chain.links
    )


async def test_without_an_sdk_nothing_is_stored(tmp_path: Path) -> None:
    plugin = OtelInstrumentation(tracer_provider=trace.NoOpTracerProvider())
    seen: list[dict[str, Any]] = []

    async def handler(ctx: Context, params: dict[str, Any]) -> None:
        seen.append(dict(ctx.task.params))

    tm = Taskmill(sqlite_url(tmp_path), plugins=False)
    tm.add_plugin(plugin, name="otel")
    async with tm:
        tm.register("t", handler)
        task = await tm.enqueue("t", {"x": 1})
        assert task.params == {"x": 1}
        await tm.run_worker(until_idle=True, handle_signals=False)
        assert (await tm.wait(task.id, timeout=10)).status is TaskStatus.COMPLETED
    assert seen == [{"x": 1}]
    assert plugin.telemetry.pending() == 0 and plugin.telemetry.running() == 0


async def test_a_send_span_whose_enqueue_failed_is_ended_as_unconfirmed(
    tmp_path: Path, otel: Recorder
) -> None:
    otel.plugin = OtelInstrumentation(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider, max_pending=2
    )
    async with instrumented(sqlite_url(tmp_path), otel) as tm:
        for _ in range(3):
            with pytest.raises(InvalidParams):
                await tm.enqueue("t", {"bad": object()})
        assert otel.plugin.telemetry.pending() == 2
        await tm.enqueue("t")
    unconfirmed = [s for s in otel.spans("send t") if s.status.status_code is StatusCode.ERROR]
    assert len(unconfirmed) == 2
    assert all(attrs_of(s)["error.type"] == "taskmill.unconfirmed" for s in unconfirmed)


def test_the_entry_point_is_the_module_instance() -> None:
    tm = Taskmill("memory://")
    tm.load_plugins(enable=["otel"])
    info = tm.plugins.get("otel")
    assert info is not None and info.distribution == "taskmill-otel"
    assert set(info.hooks) == {
        "taskmill_task_headers",
        "taskmill_task_enqueued",
        "taskmill_task_started",
        "taskmill_handler_context",
        "taskmill_task_finished",
        "taskmill_task_detached",
    }
    assert isinstance(taskmill_otel.instrumentation, OtelInstrumentation)


def test_the_plugin_is_inactive_until_opentelemetry_is_set_up() -> None:
    """Installed without an SDK, the hooks do nothing (and import nothing); once the
    application installs a recording provider, the next check turns them on."""
    script = textwrap.dedent(
        """
        import sys
        import taskmill_otel
        from taskmill import TaskSpec

        plugin = taskmill_otel.OtelInstrumentation()
        spec = TaskSpec(task_type="t")
        assert plugin.taskmill_task_headers(spec, "id-1") is None
        assert plugin.taskmill_handler_context(None, None) is None
        assert "opentelemetry" not in sys.modules, "imported without being set up"

        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
        assert plugin.taskmill_task_headers(spec, "id-2") is None  # checked 5 s apart
        taskmill_otel.RECHECK_SECONDS = 0.0
        plugin._checked_at = -1e9
        headers = plugin.taskmill_task_headers(spec, "id-3")
        assert headers and "traceparent" in headers, headers
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


async def test_a_task_created_over_http_continues_the_callers_trace(
    tmp_path: Path, otel: Recorder
) -> None:
    """An app in another language sends its W3C ``traceparent`` with ``POST
    /v1/tasks`` (and ``:batch``): the task's ``send`` span continues that trace, and
    the worker's ``process`` span follows it."""
    import httpx
    from taskmill_http import create_app

    from tests.http_support import TOKENS, serve

    trace_id, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    traceparent = f"00-{trace_id}-{caller_span}-01"
    tm = instrumented(sqlite_url(tmp_path), otel)
    async with tm:

        async def job(ctx: Context, params: dict[str, Any]) -> None:
            return None

        tm.register("http.job", job, app_id="photos")
        async with serve(create_app(tm, TOKENS)) as base, httpx.AsyncClient(base_url=base) as http:
            auth = {"Authorization": "Bearer tok-photos", "traceparent": traceparent}
            one = await http.post("/v1/tasks", json={"task_type": "http.job"}, headers=auth)
            assert one.status_code == 201, one.text
            many = await http.post(
                "/v1/tasks:batch", json=[{"task_type": "http.job"}], headers=auth
            )
            assert many.status_code == 201, many.text
            plain = await http.post(
                "/v1/tasks",
                json={"task_type": "http.job"},
                headers={"Authorization": "Bearer tok-photos"},
            )
        ids = [one.json()["id"], many.json()[0]["id"], plain.json()["id"]]
        await tm.run_worker(until_idle=True, handle_signals=False)
        for task_id in ids:
            assert (await tm.wait(task_id, timeout=10)).status is TaskStatus.COMPLETED
    sends = {attrs_of(s)["messaging.message.id"]: s for s in otel.spans("send http.job")}
    for task_id in ids[:2]:
        send = sends[task_id]
        assert send.context is not None and send.parent is not None
        assert f"{send.context.trace_id:032x}" == trace_id
        assert f"{send.parent.span_id:016x}" == caller_span
    unrelated = sends[ids[2]]
    assert unrelated.context is not None and f"{unrelated.context.trace_id:032x}" != trace_id
    processes = otel.spans("process http.job")
    assert sum(f"{p.context.trace_id:032x}" == trace_id for p in processes if p.context) == 2
