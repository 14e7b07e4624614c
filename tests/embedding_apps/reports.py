"""The task code every example host shares: one ``report`` handler.

``register(tm)`` is also what ``taskmill worker --import reports`` calls, so the same
handlers run embedded in a web app or in a worker process of their own.
"""

import asyncio
from typing import Any

from taskmill import Context, Taskmill


def register(tm: Taskmill) -> None:
    """Register the ``report`` handler on ``tm``."""

    @tm.handler("report", max_retries=3)
    async def build_report(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
        steps = int(params["steps"])
        for step in range(steps):
            await asyncio.sleep(float(params.get("step_seconds", 0.1)))  # the real work
            await ctx.progress(step + 1, steps)
        return {"steps": steps}
