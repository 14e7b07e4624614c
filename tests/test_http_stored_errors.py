"""What docs/dashboard.md says a task's error holds is what the service hands out (issue
28 item 6: the document said a stored error has no traceback): the exception's
``Type: message`` and the traceback of the handler's own code, bounded by the figures
the document names, which are the code's."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from taskmill import Taskmill
from taskmill.context import Context
from taskmill.tracebacks import EXCERPT_FRAMES, EXCERPT_LIMIT
from taskmill.validation import ERROR_MAX
from taskmill_http import create_app

from tests.http_support import TOKENS, serve

pytestmark = pytest.mark.timeout(60)

DOC = Path(__file__).parents[1] / "docs" / "dashboard.md"


def test_the_document_names_the_codes_bounds():
    text = " ".join(DOC.read_text().split())
    assert "no traceback" not in text.replace("carry no traceback", "")
    assert f"the innermost {EXCERPT_FRAMES} of them" in text
    assert f"at most {EXCERPT_LIMIT:,} characters" in text
    assert f"at most {ERROR_MAX:,} characters" in text


def _inner(depth: int) -> None:
    if depth == 0:
        raise ValueError("the thumbnail is corrupt")
    _inner(depth - 1)


async def test_a_failed_tasks_error_holds_the_handlers_traceback(tmp_path: Path):
    async with Taskmill(f"sqlite:///{tmp_path / 'tasks.db'}", plugins=False) as tm:

        @tm.handler("thumb", app_id="photos", max_retries=0)
        async def thumb(ctx: Context, params: dict[str, Any]) -> None:
            _inner(params["depth"])

        worker = tm.worker(handle_signals=False, poll_interval=0.05)
        running = asyncio.create_task(worker.run())
        try:
            async with serve(create_app(tm, TOKENS, dashboard=False)) as base:
                headers = {"Authorization": "Bearer tok-photos"}
                async with httpx.AsyncClient(base_url=base, headers=headers) as http:
                    errors = []
                    for depth in (1, 20):
                        made = await http.post(
                            "/v1/tasks", json={"task_type": "thumb", "params": {"depth": depth}}
                        )
                        await tm.wait(made.json()["id"], timeout=20)
                        task = (await http.get(f"/v1/tasks/{made.json()['id']}")).json()
                        errors.append(task["error"])
        finally:
            await worker.stop(grace=0)
            await running
    shallow, deep = errors
    first, *rest = shallow.splitlines()
    assert first.startswith("ValueError: the thumbnail is corrupt (gave up after 1 attempts)")
    assert rest[0] == "Traceback (most recent call last):"
    frames = re.findall(r'^  File ".*", line \d+, in (\w+)$', shallow, re.MULTILINE)
    assert frames == ["thumb", "_inner", "_inner"]  # the whole traceback of its own code
    deep_frames = re.findall(r'^  File ".*", line \d+, in (\w+)$', deep, re.MULTILINE)
    repeated = sum(int(n) for n in re.findall(r"\[Previous line repeated (\d+) more", deep))
    assert set(deep_frames) == {"_inner"}  # the innermost ones: the handler's frame is cut
    assert len(deep_frames) + repeated == EXCERPT_FRAMES
    assert len(deep) <= ERROR_MAX
