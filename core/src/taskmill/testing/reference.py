"""Differential contract tests: random workloads run by the backend under test and by the
in-memory reference store must come out the same: the claims, and what ends settle.

The reference store runs the settlement engine (:mod:`taskmill.settlement`); a store with
a server-side fast path of its own (PostgreSQL's PL/pgSQL) is held to it here.

Mixed into :class:`taskmill.testing.StorageContract`. The reference is reached through
the ``memory://`` entry point, like any backend.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from taskmill.discovery import storage_for_url
from taskmill.model import CancelReason, SuspensionScope, Task
from taskmill.storage import ClaimRequest, FinishKind, HandlerKey, NewTask, TaskStorage, utcnow
from taskmill.testing.helpers import finish, new_task


async def _settled(store: TaskStorage, ids: list[str], start: str) -> dict[str, Any]:
    """What settlement decided of each task: its status, alias link, error, cancel
    reason and result, and the kinds of its events in order (read from cursor
    ``start``)."""
    kinds: dict[str, list[str]] = {}
    cursor = start
    while True:
        events, cursor = await store.read_events(cursor, limit=500)
        if not events:
            break
        for event in events:
            kinds.setdefault(event.task.id, []).append(f"{event.kind.value}:{event.status.value}")
    state: dict[str, Any] = {}
    for task_id in ids:
        task = await store.get(task_id)
        assert task is not None, task_id
        state[task_id] = (
            task.status.value,
            task.alias_of,
            task.error,
            None if task.cancel_reason is None else task.cancel_reason.value,
            task.result,
            kinds.get(task_id, []),
        )
    return state


def _graph_round(rng: random.Random, ids: list[str], round_: int) -> list[NewTask]:
    """New tasks that wait for stored ones (some whatever happens), share dedupe keys
    (aliases) and descend from earlier ones."""
    specs: list[NewTask] = []
    for n in range(rng.randint(3, 6)):
        known = ids
        after: tuple[str, ...] = ()
        if known and rng.random() < 0.6:
            after = tuple(rng.sample(known[-8:], k=min(len(known[-8:]), rng.randint(1, 2))))
        specs.append(
            new_task(
                "graph",
                {"round": round_, "n": n},
                max_retries=rng.choice([0, 0, 1]),
                dedupe_key=rng.choice([None, None, "k1", "k2"]),
                parent_id=rng.choice([None, None, *known[-4:]]),
                after=after,
                after_always=rng.random() < 0.3,
            )
        )
    return specs


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

    async def test_settlement_matches_the_reference_store(self, storage: TaskStorage) -> None:
        """Random dependency graphs with dedupe aliases and parent links, ended by
        completes, failures, retries and cancels (cascading or not, of pending and of
        running tasks): every task's status, alias link, error, cancel reason, result
        and event kinds equal the in-memory reference's, which runs the settlement
        engine (:mod:`taskmill.settlement`)."""
        rng = random.Random(20261204)
        reference = storage_for_url("memory://")
        await reference.open()
        stores = (reference, storage)
        starts = [(await store.read_events(None))[1] for store in stores]
        # First a fixed case: a waiting leader with an alias, and a task after the
        # alias; the leader's dependency fails, which ends all three.
        first = new_task("graph", max_retries=0)
        leader = new_task("graph", after=(first.id,), dedupe_key="fixed")
        ids = [first.id, leader.id]
        alias = new_task("graph", dedupe_key="fixed")
        after_alias = new_task("graph", after=(alias.id,))
        ids += [alias.id, after_alias.id]
        for store in stores:
            for one in (first, leader, alias, after_alias):
                await store.enqueue([one])
            (running,) = await store.claim_batch(
                ClaimRequest(
                    worker_id="w", handlers={(None, "graph"): None}, limit=1, lease_seconds=60
                )
            )
            assert running.id == first.id
            await store.finish_batch([finish(running, FinishKind.FAIL, error="boom")])
        for round_ in range(10):
            specs = _graph_round(rng, ids, round_)
            for store in stores:
                await store.enqueue(specs)
            ids += [t.id for t in specs]
            request = ClaimRequest(
                worker_id=f"w{round_}",
                handlers={(None, "graph"): None},
                limit=rng.randint(1, 4),
                lease_seconds=60,
            )
            claimed: list[list[Task]] = [await store.claim_batch(request) for store in stores]
            assert [t.id for t in claimed[1]] == [t.id for t in claimed[0]], (
                f"round {round_}: claimed {[t.id for t in claimed[1]]}, the reference "
                f"{[t.id for t in claimed[0]]} (the tasks settled differently before)"
            )
            kinds = [
                rng.choice([FinishKind.COMPLETE, FinishKind.FAIL, FinishKind.RETRY, None])
                for _ in claimed[0]
            ]
            if rng.random() < 0.5 and ids:
                # A cancel while some are running: running ones are logged and ended.
                # A stop request (SUSPENDED) instead makes their finishes requeue them.
                victim = rng.choice(ids)
                cascade = rng.random() < 0.5
                stop = rng.choice([CancelReason.USER, CancelReason.SUSPENDED])
                for store in stores:
                    await store.cancel(task_ids=[victim], reason=stop, cascade=cascade)
            for store, mine in zip(stores, claimed, strict=True):
                finishes = [
                    finish(t, kind, result={"id": t.id}, error=f"failed {t.id}")
                    for t, kind in zip(mine, kinds, strict=True)
                    if kind is not None
                ]
                await store.finish_batch(finishes)
            if round_ % 3 == 2:
                victims = rng.sample(ids, k=min(3, len(ids)))
                for store in stores:
                    await store.cancel(task_ids=victims, reason=CancelReason.PREEMPTED)
        expected, got = [
            await _settled(store, ids, start) for store, start in zip(stores, starts, strict=True)
        ]
        differ = {i: (expected[i], got[i]) for i in ids if expected[i] != got[i]}
        assert not differ, f"{len(differ)} of {len(ids)} tasks settled differently: {differ}"
        await reference.close()
