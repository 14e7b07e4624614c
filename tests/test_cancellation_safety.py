"""No loop of taskmill can swallow its own cancellation, so a worker always stops.

On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that arrives in the same
loop iteration as the awaited thing completes: a ``while True`` around it then never
ends, and a shutdown that cancels and awaits it hangs forever. That is how a worker on
PostgreSQL hung at stop: its own release NOTIFY set the event the lease-watch loop waited
on at the moment the shutdown cancelled it.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from taskmill.waiting import cancel_and_wait, wait_event

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [
    p
    for pattern in ("core/src/**/*.py", "backends/*/src/**/*.py", "plugins/*/src/**/*.py")
    for p in ROOT.glob(pattern)
]


async def _wait_for_event(event: asyncio.Event, timeout: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        return False
    return True


async def _loop_until_cancelled(
    wait: Callable[[asyncio.Event, float], Awaitable[bool]],
) -> bool:
    """Whether a loop around ``wait`` ends when it is cancelled just as its event is
    set (the race of the shutdown hang)."""
    event = asyncio.Event()

    async def watch() -> None:
        while True:
            await wait(event, 10.0)
            event.clear()

    task = asyncio.create_task(watch())
    await asyncio.sleep(0.01)  # the loop now waits on the event
    event.set()  # wakes the wait (the worker's own NOTIFY) ...
    task.cancel()  # ... in the same iteration as the shutdown's cancel
    done, _ = await asyncio.wait([task], timeout=1.0)
    if not done:
        task.cancel()  # the swallowed cancel: end the test's own task
        await asyncio.wait([task], timeout=1.0)
    return bool(done)


async def test_a_loop_around_wait_event_ends_when_cancelled_as_its_event_is_set() -> None:
    for _ in range(20):
        assert await _loop_until_cancelled(wait_event)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for was fixed in 3.12")
async def test_the_race_is_real_on_this_python_asyncio_wait_for_swallows_the_cancel() -> None:
    # The hazard the rule below guards against, shown on this interpreter.
    assert not await _loop_until_cancelled(_wait_for_event)


def test_no_taskmill_code_uses_asyncio_wait_for() -> None:
    uses = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in SOURCES
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bwait_for\(", line) and not line.lstrip().startswith("#")
    ]
    assert SOURCES and uses == [], "use asyncio.timeout or taskmill.waiting instead: " + str(uses)


async def test_cancel_and_wait_gives_up_on_a_task_that_ignores_its_cancellation() -> None:
    stubborn_ran = asyncio.Event()
    ignoring = True

    async def stubborn() -> None:
        while True:
            try:
                stubborn_ran.set()
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if not ignoring:
                    raise
                # A bug elsewhere: this task ignores its cancellation.

    async def polite() -> None:
        await asyncio.sleep(10)

    tasks = [asyncio.create_task(stubborn()), asyncio.create_task(polite())]
    await stubborn_ran.wait()
    async with asyncio.timeout(5):
        await cancel_and_wait(tasks, patience=0.3)
    assert tasks[1].cancelled()
    assert not tasks[0].done()  # left behind (its stack logged); the caller went on
    ignoring = False
    tasks[0].cancel()
    await asyncio.wait([tasks[0]], timeout=5)
    assert tasks[0].cancelled()
