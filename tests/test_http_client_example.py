"""The Python client's documented example (docs/service.md, "Python client") run as it
is written, against the real service on PostgreSQL with a worker: it sees the task's
first event (``enqueued``), because it subscribes before it enqueues (issue 28 item 6).

The example is read from the document, so a change that goes back to subscribing after
``enqueue`` fails here: on a fresh service a stream opened after the enqueue starts
after the task's first event.
"""

from __future__ import annotations

import asyncio
import re
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from taskmill import Taskmill
from taskmill.context import Context
from taskmill_http import Client, create_app

from tests.http_support import TOKENS, serve

pytestmark = pytest.mark.timeout(60)

DOC = Path(__file__).parents[1] / "docs" / "service.md"


def documented_example() -> str:
    """The Python block of the document's "Python client" section."""
    section = DOC.read_text().split("\n## Python client\n", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, "docs/service.md has no Python example under 'Python client'"
    return found.group(1)


async def run_example(code: str, base_url: str, token: str) -> list[str]:
    """Run ``code`` (top-level ``await`` and all) against ``base_url``; what it printed."""
    code = code.replace("http://127.0.0.1:8080", base_url).replace("s3cret-photos", token)
    printed: list[str] = []
    scope: dict[str, Any] = {
        "print": lambda *args: printed.append(" ".join(str(a) for a in args)),
    }
    exec(f"async def example():\n{textwrap.indent(code, '    ')}", scope)
    async with asyncio.timeout(30):
        await scope["example"]()
    return printed


@pytest.fixture
async def service_on_postgres(postgres_url: str) -> AsyncIterator[str]:
    """The service on PostgreSQL, with a worker serving photos' ``resize``."""
    async with Taskmill(postgres_url, plugins=False) as tm:

        @tm.handler("resize", app_id="photos")
        async def resize(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
            ctx.progress(1, 2, "halfway")
            return {"resized": params["path"]}

        worker = tm.worker(
            concurrency=2, reserved_high_priority_slots=0, handle_signals=False, poll_interval=0.05
        )
        running = asyncio.create_task(worker.run())
        try:
            async with serve(create_app(tm, TOKENS, dashboard=False)) as base:
                yield base
        finally:
            await worker.stop(grace=0)
            await running


async def test_the_documented_example_sees_the_tasks_first_event_on_postgresql(
    service_on_postgres: str,
):
    code = documented_example()
    assert "client.subscribe()" in code and code.index("subscribe") < code.index("enqueue")
    printed = await run_example(code, service_on_postgres, "tok-photos")
    kinds = [line.split()[0] for line in printed]
    assert kinds[0] == "enqueued", printed
    assert kinds[-1] == "completed", printed
    assert "started" in kinds, printed


async def test_subscribe_is_open_when_its_block_starts(service_on_postgres: str):
    async with Client(service_on_postgres, "tok-photos") as client:
        for _ in range(3):  # each a fresh stream, each from the moment it opened
            async with client.subscribe() as events:
                task = await client.enqueue("resize", {"path": "b.png"})
                async with asyncio.timeout(10):
                    first = await anext(events)
                    while first.task.id != task.id:  # the earlier tasks' later events
                        first = await anext(events)
                assert first.kind.value == "enqueued"
