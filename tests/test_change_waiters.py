"""ChangeWaiters, the waiting side that notification listeners build on."""

from __future__ import annotations

import asyncio

import pytest
from taskmill.storage import ChangeWaiters, StoreChange
from taskmill.testing import wait_until

WORK = frozenset({StoreChange.WORK})


async def test_a_wake_during_prepare_is_not_lost():
    waiters = ChangeWaiters()

    async def prepare() -> None:
        waiters.wake(WORK)  # a change heard while subscribing

    assert await waiters.wait(WORK, 5, prepare) is True
    assert waiters.waiting(StoreChange.WORK) == 0


async def test_only_the_kinds_waited_for_wake_and_a_timeout_is_false():
    waiters = ChangeWaiters()
    waiting = asyncio.create_task(waiters.wait(WORK, 5))

    async def registered() -> bool:
        return waiters.waiting(StoreChange.WORK) == 1

    await wait_until(registered, timeout=5)
    waiters.wake({StoreChange.EVENTS})
    await asyncio.sleep(0.01)
    assert not waiting.done()
    waiters.wake(WORK)
    assert await waiting is True
    assert await waiters.wait(WORK, 0.01) is False


async def test_close_releases_every_waiter_and_later_waits_return_at_once():
    waiters = ChangeWaiters()
    waiting = [asyncio.create_task(waiters.wait(frozenset({kind}), 30)) for kind in StoreChange]

    async def registered() -> bool:
        return all(waiters.waiting(kind) == 1 for kind in StoreChange)

    await wait_until(registered, timeout=5)
    waiters.close()
    assert await asyncio.gather(*waiting) == [False] * len(waiting)
    assert await waiters.wait(WORK, 30) is False


async def test_a_wait_whose_prepare_fails_because_of_the_close_is_false():
    waiters = ChangeWaiters()

    async def prepare() -> None:
        waiters.close()
        raise ConnectionError("the listener's connection closed under the subscription")

    assert await waiters.wait(WORK, 5, prepare) is False

    other = ChangeWaiters()

    async def fails() -> None:
        raise ConnectionError("not closed: the error is the caller's")

    with pytest.raises(ConnectionError):
        await other.wait(WORK, 5, fails)
    assert other.waiting(StoreChange.WORK) == 0
