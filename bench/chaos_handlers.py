"""The handlers of the chaos run (bench/chaos.py), loaded by ``taskmill worker --import
chaos_handlers``.

Each run appends one line to ``$TASKMILL_CHAOS_LOG`` (``O_APPEND`` writes of a short line
are atomic, even from several processes): ``start``, then ``done`` just before the
handler returns, or ``fail``. The chaos run checks the store against these lines.
"""

from __future__ import annotations

import asyncio
import os

from taskmill import Context, Retry, Taskmill

TIMEOUT_SECONDS = 0.5
"""The handler timeout of ``chaos/timeout``, whose first attempt sleeps past it."""


def record(kind: str, ctx: Context) -> None:
    """Append ``kind task_id attempt pid`` to the side-channel log."""
    line = f"{kind} {ctx.task.id} {ctx.task.attempts} {os.getpid()}\n"
    fd = os.open(os.environ["TASKMILL_CHAOS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def register(tm: Taskmill) -> None:
    """Register ``chaos/work`` and ``chaos/timeout`` on ``tm``."""

    @tm.handler("chaos/work")
    async def work(ctx: Context, params: dict[str, int]) -> int:
        record("start", ctx)
        await asyncio.sleep(params["ms"] / 1000)
        if ctx.task.attempts <= params["fail_attempts"]:
            record("fail", ctx)
            raise Retry(delay=0.05, message=f"injected failure of attempt {ctx.task.attempts}")
        record("done", ctx)
        return ctx.task.attempts

    @tm.handler("chaos/timeout", timeout=TIMEOUT_SECONDS)
    async def timeout(ctx: Context, params: dict[str, int]) -> int:
        record("start", ctx)
        if ctx.task.attempts == 1:
            await asyncio.sleep(TIMEOUT_SECONDS * 4)  # timed out by the worker
        record("done", ctx)
        return ctx.task.attempts
