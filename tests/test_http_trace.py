"""An HTTP handler's request carries the task's W3C trace context, so that a receiver's
tracing (a Node app's, say) continues the trace: the context stored with the task when
nothing in the worker traces, and the attempt's ``process`` span when taskmill-otel
records one. Real HTTP receivers on loopback, on SQLite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from taskmill import Taskmill, TaskStatus
from taskmill_http import HttpHandler

from tests.receiver_fixtures import Receiver
from tests.test_otel import Recorder, instrumented

pytestmark = pytest.mark.timeout(60)
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def run_one(tm: Taskmill, task_type: str = "job", **enqueue: Any) -> str:
    task = await tm.enqueue(task_type, **enqueue)
    await tm.run_worker(until_idle=True, handle_signals=False, poll_interval=0.05)
    done = await tm.get(task.id)
    assert done is not None and done.status is TaskStatus.COMPLETED, done
    return task.id


async def test_the_stored_trace_context_reaches_the_receiver(
    tmp_path: Path, receiver: Receiver
) -> None:
    async with Taskmill(f"sqlite:///{tmp_path / 'tasks.db'}", plugins=False) as tm:
        tm.register("job", HttpHandler(f"{receiver.base}/run"))
        headers = {"traceparent": TRACE, "tracestate": "vendor=1", "x-other": "kept"}
        await run_one(tm, headers=headers)
        await run_one(tm)  # none stored: none sent
        # The handler's own header wins the name.
        own = HttpHandler(f"{receiver.base}/run", headers={"TraceParent": "mine"})
        tm.register("own", own)
        await run_one(tm, "own", headers={"traceparent": TRACE})
    assert [r["trace"] for r in receiver.requests] == [
        {"traceparent": TRACE, "tracestate": "vendor=1"},
        {},
        {"traceparent": "mine"},
    ]


async def test_with_taskmill_otel_the_receiver_is_a_child_of_the_process_span(
    tmp_path: Path, receiver: Receiver
) -> None:
    otel = Recorder()
    try:
        async with instrumented(f"sqlite:///{tmp_path / 'tasks.db'}", otel) as tm:
            tm.register("job", HttpHandler(f"{receiver.base}/run"))
            await run_one(tm, headers={"traceparent": TRACE})
        process = otel.span("process job")
    finally:
        otel.shutdown()
    context = process.get_span_context()
    assert context is not None
    (sent,) = receiver.requests
    _, trace_id, parent_id, _ = sent["trace"]["traceparent"].split("-")
    assert trace_id == f"{context.trace_id:032x}" == TRACE.split("-")[1]
    assert parent_id == f"{context.span_id:016x}"


async def test_a_stored_value_that_is_no_header_is_left_out_and_the_task_still_runs(
    tmp_path: Path, receiver: Receiver
) -> None:
    async with Taskmill(f"sqlite:///{tmp_path / 'tasks.db'}", plugins=False) as tm:
        tm.register("job", HttpHandler(f"{receiver.base}/run"))
        task_id = await run_one(
            tm, headers={"traceparent": TRACE, "tracestate": "a\r\nX-Injected: 1", "baggage": "é€"}
        )
        stored = await tm.get(task_id)
    assert [r["trace"] for r in receiver.requests] == [{"traceparent": TRACE}]
    assert stored is not None and stored.status is TaskStatus.COMPLETED
    # What was stored is kept as it was given.
    assert stored.params["taskmill.headers"]["tracestate"] == "a\r\nX-Injected: 1"
