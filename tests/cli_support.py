"""What the tests of the ``taskmill`` command share: the installed console script, run
in a subprocess in a test's own directory, and ways to read the store it wrote."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from taskmill import Task, Taskmill

SCRIPT = Path(sys.executable).with_name("taskmill")

HANDLERS = '''
"""Handlers the CLI tests load with `taskmill worker --import cli_handlers`."""
import taskmill


def register(tm: taskmill.Taskmill) -> None:
    @tm.handler("test.add")
    async def add(ctx, params):
        ctx.check_cancelled()
        await ctx.progress(1, 1, "added")
        return {"sum": params["a"] + params["b"]}

    @tm.handler("test.reject", max_retries=0)
    def reject(ctx, params):
        raise taskmill.Fail(f"rejected: {params.get('why', 'no reason')}")

    @tm.handler("test.wait_for_file")
    async def wait_for_file(ctx, params):
        import asyncio, pathlib
        path = pathlib.Path(params["path"])
        while not path.exists():
            await asyncio.sleep(0.02)
        return {"seen": str(path)}

    @tm.handler("test.add", app_id="photos")
    async def add_photos(ctx, params):
        return {"app": "photos"}
'''

CLI = Callable[..., subprocess.CompletedProcess[str]]


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a command under test: this one without taskmill's settings
    (so that the machine's own cannot leak in), ``tmp_path`` on ``PYTHONPATH``, and
    ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("TASKMILL_") and k != "TASKMILL_TEST_POSTGRES_URL")
        and k not in ("COLUMNS", "LINES", "PGPASSWORD", "PGPASSFILE")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    env["PYTHONIOENCODING"] = "utf-8"
    env.update(extra)
    return env


def ok(process: subprocess.CompletedProcess[str]) -> str:
    """The stdout of a command that must have exited 0."""
    assert process.returncode == 0, (
        f"exit {process.returncode}\nstdout:\n{process.stdout}\nstderr:\n{process.stderr}"
    )
    return process.stdout


def stored(url: str, action: Callable[[Taskmill], Any]) -> Any:
    """Run ``action`` on the store at ``url`` (no plugins) and return its result."""

    async def go() -> Any:
        async with Taskmill(url, plugins=False) as tm:
            return await action(tm)

    return asyncio.run(go())


def task_of(url: str, task_id: str) -> Task:
    task = stored(url, lambda tm: tm.get(task_id))
    assert task is not None
    return task


def enqueue(cli: CLI, url: str, *args: str) -> str:
    """Enqueue through the command and return the printed task id."""
    task_id = ok(cli("--url", url, "enqueue", *args)).strip()
    uuid.UUID(task_id)
    return task_id


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
