"""The limit engine (:mod:`taskmill.limiting`): what it asks of a store's ledger, in
which order, and what it writes back; the semantics on every store are the shipped
contract suite's (:mod:`taskmill.testing.limits`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

import attrs
import pytest
from taskmill.limiting import InProcessLedger, Limited, limit_claim, spend_claimed
from taskmill.limits import Bucket, TypeLimit, parse_rate
from taskmill.migrations import run_sync
from taskmill.model import Task, TaskStatus
from taskmill.storage import ClaimRequest, HandlerKey, from_timestamp
from taskmill.testing.helpers import claim

NOW = 1_000.0


@attrs.define
class RecordingLedger:
    """A ledger over given buckets and counts that records every call (and never
    suspends, like SQLite's)."""

    buckets: dict[HandlerKey, Bucket] = attrs.field(factory=dict)
    running: dict[HandlerKey, int] = attrs.field(factory=dict)
    calls: list[tuple[str, object]] = attrs.field(factory=list)

    async def lock_buckets(
        self, keys: Sequence[HandlerKey]
    ) -> tuple[dict[HandlerKey, Bucket], float]:
        self.calls.append(("lock", list(keys)))
        return {k: self.buckets[k] for k in keys if k in self.buckets}, NOW

    async def count_running(self, keys: Sequence[HandlerKey]) -> dict[HandlerKey, int]:
        self.calls.append(("count", list(keys)))
        return {k: self.running.get(k, 0) for k in keys}

    async def save_buckets(self, tokens: Mapping[HandlerKey, float], now: float) -> None:
        self.calls.append(("save", (dict(tokens), now)))


def limited(request: ClaimRequest, **limits: TypeLimit) -> ClaimRequest:
    """``request`` with ``limits`` by task type of the host's keys."""
    return attrs.evolve(request, limits={(None, t): limit for t, limit in limits.items()})


def rate(text: str) -> TypeLimit:
    return TypeLimit(rate=parse_rate(text))


async def test_a_request_without_limits_comes_back_as_is_without_the_ledger() -> None:
    ledger = RecordingLedger()
    request = claim("a", "b")
    result = await limit_claim(ledger, request)
    assert result.request is request
    await spend_claimed(ledger, result, [(None, "a")])
    assert ledger.calls == []


async def test_limited_keys_are_locked_in_scope_order_and_concurrency_keys_counted() -> None:
    ledger = RecordingLedger()
    request = claim("b", "a", ("app", "a"), "c", caps={(None, "c"): 0})
    request = attrs.evolve(
        request,
        limits={
            (None, "b"): TypeLimit(max_running=3),
            ("app", "a"): rate("5/s"),
            (None, "a"): TypeLimit(rate=parse_rate("5/s"), max_running=2),
            (None, "c"): TypeLimit(max_running=1),  # cap 0: may take nothing, not locked
        },
    )
    await limit_claim(ledger, request)
    assert ledger.calls == [
        ("lock", [(None, "a"), (None, "b"), ("app", "a")]),  # '*' before '=app'
        ("count", [(None, "a"), (None, "b")]),
    ]


async def test_caps_are_cut_to_refilled_whole_tokens_and_free_slots() -> None:
    ledger = RecordingLedger(
        buckets={(None, "a"): Bucket(tokens=1.5, updated_at=NOW - 0.25)},  # 4/s: +1 token
        running={(None, "b"): 2},
    )
    request = limited(
        claim("a", "b", "fresh"),
        a=rate("4/s"),
        b=TypeLimit(max_running=3),
        fresh=rate("7/min"),  # no bucket yet: full
    )
    result = await limit_claim(ledger, request)
    assert result.request.handlers == {(None, "a"): 2, (None, "b"): 1, (None, "fresh"): 7}
    assert result.tokens == {(None, "a"): pytest.approx(2.5), (None, "fresh"): 7.0}
    assert result.now == NOW
    assert result.request.limits == request.limits


async def test_only_the_buckets_a_claim_took_from_are_saved_at_the_lock_clock() -> None:
    ledger = RecordingLedger()
    request = attrs.evolve(
        claim("a", "b", ("app", "a")),
        limits={(None, "a"): rate("5/s"), (None, "b"): rate("5/s"), ("app", "a"): rate("5/s")},
    )
    result = await limit_claim(ledger, request)
    ledger.calls.clear()
    # An app without a key of its own is served, and spends, by the host's key.
    await spend_claimed(ledger, result, [(None, "a"), ("other", "a"), ("app", "a")])
    assert ledger.calls == [("save", ({(None, "a"): 3.0, ("app", "a"): 4.0}, NOW))]


async def test_a_claim_that_took_nothing_saves_nothing() -> None:
    ledger = RecordingLedger()
    result = await limit_claim(ledger, limited(claim("a"), a=rate("5/s")))
    ledger.calls.clear()
    await spend_claimed(ledger, result, [])
    assert ledger.calls == []


def test_a_synchronous_store_runs_the_engine_in_one_step() -> None:
    ledger = RecordingLedger(buckets={(None, "a"): Bucket(0.0, NOW)})
    result = run_sync(limit_claim(ledger, limited(claim("a"), a=rate("5/h"))))
    assert isinstance(result, Limited)
    assert result.request.handlers == {(None, "a"): 0}


def running_task(app_id: str | None, task_type: str, lease_left: float) -> Task:
    now = from_timestamp(NOW)
    return Task(
        id=f"{app_id}-{task_type}-{lease_left}",
        task_type=task_type,
        app_id=app_id,
        status=TaskStatus.RUNNING,
        created_at=now,
        updated_at=now,
        run_at=now,
        lease_expires_at=now + timedelta(seconds=lease_left),
    )


async def test_in_process_ledger_counts_live_leases_by_scope_and_saves_in_place() -> None:
    buckets: dict[HandlerKey, Bucket] = {}
    tasks = [
        running_task(None, "a", 10),
        running_task("app", "a", 10),
        running_task("app", "a", 0),  # expired: holds no slot
        running_task("other", "a", 10),
    ]
    ledger = InProcessLedger(buckets, {t.id: t for t in tasks}, [t.id for t in tasks], NOW)
    assert await ledger.count_running([(None, "a"), ("app", "a")]) == {
        (None, "a"): 3,
        ("app", "a"): 1,
    }
    assert await ledger.lock_buckets([(None, "a")]) == ({}, NOW)
    await ledger.save_buckets({(None, "a"): 2.0}, NOW)
    assert buckets == {(None, "a"): Bucket(2.0, NOW)}
