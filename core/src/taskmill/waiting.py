"""Waiting primitives that never swallow a cancellation.

On Python 3.11, ``asyncio.wait_for`` can swallow a cancellation that arrives just as the
awaited thing completes (fixed in 3.12): a loop around it then never ends, and whoever
cancelled it waits forever. Every timed wait in taskmill goes through these instead.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Awaitable, Collection
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger("taskmill.worker")


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass (None: no limit).

    :returns: whether the event is set. A cancellation of the caller always propagates.
    """
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True


async def within(awaitable: Awaitable[T], timeout: float | None) -> T:
    """Await ``awaitable`` for at most ``timeout`` seconds.

    :raises TimeoutError: it did not finish in time (it is cancelled).
    """
    async with asyncio.timeout(timeout):
        return await awaitable


async def cancel_and_wait(
    tasks: Collection[asyncio.Task[object]], *, patience: float = 2.0
) -> None:
    """Cancel ``tasks`` and wait for them to end, for at most about ``patience`` seconds.

    A task that ignores its cancellation (a bug, or a library that swallows it) is
    cancelled again every 100 ms, and given up on once ``patience`` runs out: its stack is
    logged and the caller goes on, so a stuck task can never hold a shutdown.
    """
    pending = {task for task in tasks if not task.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    while pending:
        for task in pending:
            task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            for task in pending:
                stack = io.StringIO()
                task.print_stack(file=stack)
                log.error(
                    "task %s did not end when cancelled; leaving it behind:\n%s",
                    task.get_name(),
                    stack.getvalue(),
                )
            return
        _, pending = await asyncio.wait(pending, timeout=min(0.1, remaining))
    # Retrieve the outcomes so that none is reported as "never retrieved".
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()
