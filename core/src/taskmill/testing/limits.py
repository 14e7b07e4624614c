"""Contract: global rate limits and global concurrency limits, applied inside the claim
(see :mod:`taskmill.limits`).

Every test drives ``claim_batch`` with :attr:`ClaimRequest.limits`; the ones racing two
store objects need ``shared_between_processes``.
"""

from __future__ import annotations

import asyncio
import time

import attrs

from taskmill.limits import TypeLimit, parse_rate
from taskmill.model import TaskFilter, TaskStatus
from taskmill.storage import ClaimRequest, HandlerKey, TaskStorage
from taskmill.testing.capabilities import requires
from taskmill.testing.fixtures import StorageFactory
from taskmill.testing.helpers import claim, finish, new_task, wait_until

__all__ = ["LimitContract"]

_JOB: HandlerKey = (None, "job")


def limited(
    request: ClaimRequest,
    key: HandlerKey = _JOB,
    *,
    rate: str | None = None,
    max_running: int | None = None,
) -> ClaimRequest:
    """``request`` with a global limit on ``key`` added."""
    limit = TypeLimit(rate=None if rate is None else parse_rate(rate), max_running=max_running)
    return attrs.evolve(request, limits={**request.limits, key: limit})


class LimitContract:
    """Rate buckets and global RUNNING caps hold inside one claim, on the store's state."""

    @requires("global_limits")
    async def test_rate_limit_allows_one_burst_then_nothing(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task() for _ in range(8)])
        first = await storage.claim_batch(limited(claim(limit=10), rate="5/min"))
        assert len(first) == 5
        # 5/min refills one token every 12 s: the next claim finds none.
        assert await storage.claim_batch(limited(claim(limit=10), rate="5/min")) == []
        # Without the limit, the rest is claimable: nothing was held back for good.
        rest = await storage.claim_batch(claim(limit=10))
        assert len(rest) == 3

    @requires("global_limits")
    async def test_rate_bucket_refills_at_the_rate(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task() for _ in range(200)])
        request = limited(claim(limit=200), rate="20/s")
        started = time.monotonic()
        taken = len(await storage.claim_batch(request))
        assert taken == 20
        while time.monotonic() - started < 1.0:
            taken += len(await storage.claim_batch(request))
            await asyncio.sleep(0.01)
        elapsed = time.monotonic() - started
        # One burst of 20, then 20 per second: never more than burst + rate * elapsed
        # (+1 for a token completed at the edge), and the refill did happen.
        assert 25 <= taken <= 20 + 20 * elapsed + 1

    @requires("global_limits")
    async def test_limited_type_does_not_starve_others_in_the_claim(
        self, storage: TaskStorage
    ) -> None:
        await storage.enqueue([new_task("job", priority=9) for _ in range(5)])
        await storage.enqueue([new_task("other") for _ in range(3)])
        got = await storage.claim_batch(limited(claim("job", "other", limit=10), rate="2/h"))
        assert sorted(t.task_type for t in got) == ["job", "job", "other", "other", "other"]

    @requires("global_limits")
    async def test_claim_order_holds_within_the_limit(self, storage: TaskStorage) -> None:
        low = await storage.enqueue([new_task(priority=1) for _ in range(2)])
        high = await storage.enqueue([new_task(priority=7) for _ in range(2)])
        got = await storage.claim_batch(limited(claim(limit=10), rate="3/h"))
        assert [t.id for t in got] == [high[0].id, high[1].id, low[0].id]

    @requires("global_limits")
    async def test_global_concurrency_caps_running_tasks(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task() for _ in range(5)])
        first = await storage.claim_batch(limited(claim(limit=10), max_running=2))
        assert len(first) == 2
        again = limited(claim(worker="w2", limit=10), max_running=2)
        assert await storage.claim_batch(again) == []
        await storage.finish_batch([finish(first[0])])
        (next_one,) = await storage.claim_batch(again)
        assert next_one.status is TaskStatus.RUNNING

    @requires("global_limits")
    async def test_expired_lease_frees_a_global_slot(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task() for _ in range(2)])
        (held,) = await storage.claim_batch(limited(claim(lease=0.2), max_running=1))
        request = limited(claim(worker="w2"), max_running=1)
        assert await storage.claim_batch(request) == []
        # No rescue ran: the expired lease alone frees the slot.
        (freed,) = await wait_until(lambda: storage.claim_batch(request))
        assert freed.id != held.id

    @requires("global_limits")
    async def test_app_scoped_limit_covers_only_that_app(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task(app_id="a") for _ in range(3)])
        await storage.enqueue([new_task(app_id="b") for _ in range(3)])
        request = claim(("a", "job"), "job", limit=10)
        got = await storage.claim_batch(limited(request, ("a", "job"), max_running=1))
        assert sorted(t.app_id or "" for t in got) == ["a", "b", "b", "b"]

    @requires("global_limits")
    async def test_host_key_limit_covers_every_app_of_the_type(self, storage: TaskStorage) -> None:
        await storage.enqueue([new_task(app_id="a"), new_task(app_id="b"), new_task()])
        (one,) = await storage.claim_batch(limited(claim(limit=10), max_running=1))
        assert await storage.claim_batch(limited(claim(limit=10), max_running=2)) != []
        assert await storage.claim_batch(limited(claim(limit=10), max_running=2)) == []
        assert one.status is TaskStatus.RUNNING

    @requires("global_limits")
    @requires("shared_between_processes")
    async def test_rate_bucket_is_shared_between_stores(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        other = await storage_factory()
        await storage.enqueue([new_task() for _ in range(10)])
        a = await storage.claim_batch(limited(claim(limit=3), rate="5/h"))
        b = await other.claim_batch(limited(claim(worker="w2", limit=10), rate="5/h"))
        assert (len(a), len(b)) == (3, 2)

    @requires("global_limits")
    @requires("shared_between_processes")
    async def test_global_concurrency_holds_across_racing_stores(
        self, storage: TaskStorage, storage_factory: StorageFactory
    ) -> None:
        stores = [storage, await storage_factory(), await storage_factory()]
        await storage.enqueue([new_task() for _ in range(30)])

        async def grab(store: TaskStorage, n: int) -> int:
            request = limited(claim(worker=f"w{n}", limit=2), max_running=3)
            got = 0
            for _ in range(5):
                got += len(await store.claim_batch(request))
            return got

        taken = await asyncio.gather(*(grab(s, n) for n, s in enumerate(stores)))
        assert sum(taken) == 3
        assert len(await storage.query(TaskFilter(statuses=(TaskStatus.RUNNING,)))) == 3
