"""A differential contract test: random workloads claimed by the backend under test and
by the in-memory reference store must come out the same.

Mixed into :class:`taskmill.testing.StorageContract`. The reference is reached through
the ``memory://`` entry point, like any backend.
"""

from __future__ import annotations

import random
from datetime import timedelta

from taskmill.discovery import storage_for_url
from taskmill.model import SuspensionScope
from taskmill.storage import ClaimRequest, HandlerKey, TaskStorage, utcnow
from taskmill.testing.helpers import finish, new_task


class ReferenceContract:
    """The backend claims exactly what the reference claims."""

    async def test_claims_match_the_reference_store(self, storage: TaskStorage) -> None:
        """Random queues and claim requests (handler caps including 0, app and host keys,
        priorities, tasks not yet due, suspensions): the order and the selection of
        every claim equal the in-memory reference's."""
        rng = random.Random(20240611)
        reference = storage_for_url("memory://")
        await reference.open()
        types = ["a", "b", "c"]
        apps: list[str | None] = [None, "x", "y"]
        for round_ in range(14):
            if round_ in (5, 9):
                scope = SuspensionScope(task_type=rng.choice(types), app_id=rng.choice(apps))
                for target in (reference, storage):
                    await target.suspend(scope)
            if round_ == 12:
                for target in (reference, storage):
                    for scope in await target.suspensions():
                        await target.resume(scope)
            specs = []
            for _ in range(rng.randint(0, 40)):
                run_at = None
                if rng.random() < 0.2:
                    run_at = utcnow() + timedelta(hours=1)
                elif rng.random() < 0.3:
                    run_at = utcnow() - timedelta(seconds=rng.randint(1, 100))
                specs.append(
                    new_task(
                        rng.choice(types),
                        {"r": round_},
                        app_id=rng.choice(apps),
                        priority=rng.choice([0, 100, 100, 1000, 5000]),
                        run_at=run_at,
                    )
                )
            for batch in (specs[: len(specs) // 2], specs[len(specs) // 2 :]):
                if batch:
                    await reference.enqueue(batch)
                    await storage.enqueue(batch)
            handlers: dict[HandlerKey, int | None] = {}
            for key in rng.sample([(a, t) for a in apps for t in types], rng.randint(1, 5)):
                handlers[key] = rng.choice([None, None, 0, 1, 2, 5])
            request = ClaimRequest(
                worker_id=f"w{round_}",
                handlers=handlers,
                limit=rng.randint(1, 25),
                lease_seconds=60,
                min_priority=rng.choice([None, None, 100, 1000]),
            )
            expected = [t.id for t in await reference.claim_batch(request)]
            got = await storage.claim_batch(request)
            assert [t.id for t in got] == expected, (round_, request)
            # Finish some, so that later rounds see a mix of statuses.
            if got:
                await storage.finish_batch([finish(t) for t in got[::2]])
                mine = [await reference.get(t.id) for t in got[::2]]
                await reference.finish_batch([finish(t) for t in mine if t is not None])
        await reference.close()
