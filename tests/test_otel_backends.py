"""taskmill-otel's trace crosses the enqueue on every backend: the trace context is
stored with the task (params key ``taskmill.headers``), so a worker of another
``Taskmill`` (another process, in the last test) continues the trace of the request
that enqueued it, and the tasks its handler enqueues continue it too."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from taskmill import Context, Task, Taskmill, TaskStatus, headers_of

from tests.cli_support import SCRIPT, cli_env, stored, wait_until
from tests.test_otel import Recorder, attrs_of

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def otel() -> Iterator[Recorder]:
    recorder = Recorder()
    yield recorder
    recorder.shutdown()


def hex_ids(span: Any) -> tuple[str, str]:
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


@pytest.mark.parametrize("backend_url", ["sqlite", "postgres", "mysql", "mongo"], indirect=True)
async def test_the_trace_crosses_the_enqueue(backend_url: str, otel: Recorder) -> None:
    """The web process enqueues inside its request's span; a worker of another
    ``Taskmill`` (with its own plugin instance) reads the task from the store."""

    async def parent(ctx: Context, params: dict[str, Any]) -> str:
        child = await ctx.spawn("child", {"from": params["n"]})
        return child.id

    async def child(ctx: Context, params: dict[str, Any]) -> int:
        return int(params["from"]) + 1

    web = Taskmill(backend_url, plugins=False)
    web.add_plugin(otel.plugin, name="otel")
    worker_side = Recorder()
    workers = Taskmill(backend_url, plugins=False)
    workers.add_plugin(worker_side.plugin, name="otel")
    try:
        async with web, workers:
            workers.register("parent", parent)
            workers.register("child", child)
            with otel.tracer.start_as_current_span("POST /orders") as request:
                task = await web.enqueue("parent", {"n": 1})
            stored = await workers.get(task.id)
            assert stored is not None and "traceparent" in headers_of(stored)
            await workers.run_worker(until_idle=True, handle_signals=False)
            done = await web.wait(task.id, timeout=30)
            assert done.status is TaskStatus.COMPLETED
            kid = await web.wait(str(done.result), timeout=30)
            assert kid.status is TaskStatus.COMPLETED and kid.result == 2
            assert "traceparent" in headers_of(kid)
        trace_id = request.get_span_context().trace_id
        send = otel.span("send parent")
        assert send.context is not None and send.context.trace_id == trace_id
        process = worker_side.span("process parent")
        assert process.context is not None and process.context.trace_id == trace_id
        assert process.parent is not None and process.parent.span_id == send.context.span_id
        assert process.parent.is_remote
        child_send = worker_side.span("send child")
        assert child_send.parent is not None
        assert child_send.parent.span_id == process.context.span_id
        child_process = worker_side.span("process child")
        assert child_process.context is not None and child_process.context.trace_id == trace_id
        assert child_send.context is not None and child_process.parent is not None
        assert child_process.parent.span_id == child_send.context.span_id
        assert attrs_of(child_process)["taskmill.parent_id"] == task.id
    finally:
        worker_side.shutdown()


APP = '''
"""A handler module for `taskmill worker --import otel_app`: the OpenTelemetry SDK,
configured as an application would (global provider), writing its spans to a file."""
import json
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class FileExporter(SpanExporter):
    def export(self, spans):
        with open(os.environ["OTEL_APP_SPANS"], "a") as out:
            for span in spans:
                parent = span.parent
                out.write(json.dumps({
                    "name": span.name,
                    "kind": span.kind.name,
                    "trace_id": f"{span.context.trace_id:032x}",
                    "span_id": f"{span.context.span_id:016x}",
                    "parent": None if parent is None else f"{parent.span_id:016x}",
                    "pid": os.getpid(),
                }) + "\\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
trace.set_tracer_provider(provider)


def register(tm):
    @tm.handler("otel.parent")
    async def parent(ctx, params):
        return (await ctx.spawn("otel.child", {})).id

    @tm.handler("otel.child")
    def child(ctx, params):
        return os.getpid()
'''


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def spans_named(path: Path, *names: str) -> list[dict[str, Any]] | None:
    """The spans written to ``path``, once every one of ``names`` is among them."""
    spans = read_spans(path)
    return spans if set(names) <= {s["name"] for s in spans} else None


@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_the_trace_crosses_into_a_worker_process(
    store: str, tmp_path: Path, otel: Recorder, request: pytest.FixtureRequest
) -> None:
    """`taskmill worker` in a process of its own loads the plugin from its entry point
    (on the global providers its handler module set up) and continues the trace."""
    if store == "sqlite":
        url = f"sqlite:///{tmp_path / 'tasks.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url"))
    (tmp_path / "otel_app.py").write_text(APP)
    spans_file = tmp_path / "spans.jsonl"
    stored(url, lambda tm: tm.progress_summary())  # create the store first
    proc = subprocess.Popen(
        [str(SCRIPT), "--url", url, "worker", "--import", "otel_app"],
        cwd=tmp_path,
        env=cli_env(tmp_path, TASKMILL_ENABLE_PLUGINS="otel", OTEL_APP_SPANS=str(spans_file)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    async def enqueue_and_wait() -> tuple[Any, Task, Task]:
        web = Taskmill(url, plugins=False)
        web.add_plugin(otel.plugin, name="otel")
        async with web:
            with otel.tracer.start_as_current_span("POST /orders") as request_span:
                task = await web.enqueue("otel.parent")
            done = await web.wait(task.id, timeout=60)
            kid = await web.wait(str(done.result), timeout=60) if done.result else done
            return request_span, done, kid

    names = ("process otel.parent", "send otel.child", "process otel.child")
    try:
        request_span, done, kid = asyncio.run(enqueue_and_wait())
        assert done.status is TaskStatus.COMPLETED, done.error
        assert kid.status is TaskStatus.COMPLETED and kid.result == proc.pid
        wait_until(lambda: spans_named(spans_file, *names) is not None, "the worker's spans")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
    assert proc.returncode == 0, err
    spans = spans_named(spans_file, *names)
    assert spans is not None
    by_name = {s["name"]: s for s in spans}
    trace_id, _ = hex_ids(request_span)
    _, send_id = hex_ids(otel.span("send otel.parent"))
    parent_process = by_name["process otel.parent"]
    assert parent_process["pid"] == proc.pid and parent_process["kind"] == "CONSUMER"
    assert parent_process["trace_id"] == trace_id
    assert parent_process["parent"] == send_id
    assert by_name["send otel.child"]["parent"] == parent_process["span_id"]
    assert by_name["process otel.child"]["trace_id"] == trace_id
    assert by_name["process otel.child"]["parent"] == by_name["send otel.child"]["span_id"]
