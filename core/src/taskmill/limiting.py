"""The limit engine: the sequence that applies global rate and concurrency limits inside
a claim, written once for every store.

:mod:`taskmill.limits` *decides* (which keys are locked and in what order, how a bucket
refills, how far the caps are cut, what a start spends). This module *sequences* those
decisions inside the one transaction of a claim, against a small per-store interface,
the :class:`BucketLedger`:

1. :func:`limit_claim` locks the buckets of the request's limited keys in
   :func:`~taskmill.limits.locked_keys` order (a store creates the missing ones where
   claims can race) and reads the store's clock, refills the rate-limited keys' tokens,
   counts the RUNNING tasks with a live lease of the concurrency-limited keys, and cuts
   the request's caps (:func:`~taskmill.limits.limited_caps`);
2. the store claims with the cut request (:attr:`Limited.request`), as usual;
3. :func:`spend_claimed` writes back the buckets the claimed tasks took tokens from.

A request without limits costs nothing: :func:`limit_claim` returns it as it is without
touching the ledger. The engine is asynchronous; a synchronous store (SQLite on its
database thread) runs it with :func:`taskmill.migrations.run_sync`, its ledger's methods
never suspending.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import attrs

from taskmill.limits import Bucket, limited_caps, locked_keys, refill, spend, taken_by_key
from taskmill.model import Task
from taskmill.storage import ClaimRequest, HandlerKey

__all__ = ["BucketLedger", "InProcessLedger", "Limited", "limit_claim", "spend_claimed"]


class BucketLedger(Protocol):
    """A store's side of the limits, inside the transaction of one claim.

    Every method reads or writes the store's current state in that transaction; none
    commits. The engine calls each at most once per claim, in this order:
    :meth:`lock_buckets`, :meth:`count_running`, and after the claim
    :meth:`save_buckets`.
    """

    async def lock_buckets(
        self, keys: Sequence[HandlerKey]
    ) -> tuple[Mapping[HandlerKey, Bucket], float]:
        """Lock the rate buckets of ``keys`` (stored under
        :func:`~taskmill.limits.scope_of`) in the order given, until the transaction
        ends, so that no other claim of these keys reads or writes them meanwhile; a
        store where claims can race creates the missing ones first (empty as of the
        epoch, which refills to full). Concurrency-only keys are locked too: that
        serializes the claims that count their RUNNING tasks.

        :returns: the stored buckets by key (a key left out is full) and the store's
            clock in seconds, which the tokens refill to and the buckets are saved at.
        """
        ...

    async def count_running(self, keys: Sequence[HandlerKey]) -> Mapping[HandlerKey, int]:
        """How many RUNNING tasks of each of ``keys`` (locked) hold a live lease at the
        store's time of this claim: ``(None, type)`` counts every app's tasks of the
        type, ``(app_id, type)`` that app's only. A task whose lease expired holds no
        slot, rescued or not."""
        ...

    async def save_buckets(self, tokens: Mapping[HandlerKey, float], now: float) -> None:
        """Write ``tokens`` into the (locked) buckets of their keys, as of ``now``."""
        ...


@attrs.frozen
class Limited:
    """A claim request cut by its limits, and what the claim must write back."""

    request: ClaimRequest
    """The request with each limited key's cap cut to what the limits allow now."""
    tokens: Mapping[HandlerKey, float]
    """The refilled tokens of the rate-limited keys locked, before this claim's starts."""
    now: float
    """The store's clock (seconds) that :meth:`BucketLedger.lock_buckets` read."""


async def limit_claim(ledger: BucketLedger, request: ClaimRequest) -> Limited:
    """Lock, read, refill, count and cut (steps 1 to 3 of :mod:`taskmill.limits`) for
    ``request``, inside the claim's transaction.

    :returns: the request to claim with, and the tokens :func:`spend_claimed` spends.
        Without limits: ``request`` itself, and the ledger is not called.
    """
    limits = request.limits
    if not limits:
        return Limited(request, {}, 0.0)
    keys = locked_keys(request.handlers, limits)
    tokens: dict[HandlerKey, float] = {}
    running: Mapping[HandlerKey, int] = {}
    now = 0.0
    if keys:
        buckets, now = await ledger.lock_buckets(keys)
        for key in keys:
            rate = limits[key].rate
            if rate is not None:
                tokens[key] = refill(buckets.get(key), rate, now)
        counted = [key for key in keys if limits[key].max_running is not None]
        if counted:
            running = await ledger.count_running(counted)
    caps = limited_caps(request.handlers, limits, tokens=tokens, running=running)
    return Limited(attrs.evolve(request, handlers=caps), tokens, now)


async def spend_claimed(
    ledger: BucketLedger, limited: Limited, claimed: Iterable[tuple[str | None, str]]
) -> None:
    """After the claim of ``limited.request``: write back, as of the lock's clock, the
    buckets that the ``claimed`` tasks (their ``(app_id, task_type)``) took tokens from,
    each by the starts of its key (:func:`~taskmill.limits.spend`). A bucket nothing was
    taken from is left as it was (refilling it would give the same tokens later)."""
    if not limited.tokens:
        return
    taken = taken_by_key(claimed, limited.request.handlers)
    spent = {key: spend(left, taken[key]) for key, left in limited.tokens.items() if taken.get(key)}
    if spent:
        await ledger.save_buckets(spent, limited.now)


class InProcessLedger:
    """:class:`BucketLedger` of a store whose state lives in this process's objects (the
    memory store): its buckets in ``buckets`` (written in place), its tasks by id in
    ``tasks`` and the ids of the RUNNING ones in ``running``, its clock ``now``
    (seconds). Its methods never suspend, so the claim that runs the engine over it
    stays one atomic step."""

    __slots__ = ("_buckets", "_now", "_running", "_tasks")

    def __init__(
        self,
        buckets: dict[HandlerKey, Bucket],
        tasks: Mapping[str, Task],
        running: Iterable[str],
        now: float,
    ) -> None:
        self._buckets = buckets
        self._tasks = tasks
        self._running = running
        self._now = now

    async def lock_buckets(
        self, keys: Sequence[HandlerKey]
    ) -> tuple[dict[HandlerKey, Bucket], float]:
        stored = self._buckets
        return {key: stored[key] for key in keys if key in stored}, self._now

    async def count_running(self, keys: Sequence[HandlerKey]) -> dict[HandlerKey, int]:
        running = dict.fromkeys(keys, 0)
        for task_id in self._running:
            task = self._tasks[task_id]
            lease = task.lease_expires_at
            if lease is not None and lease.timestamp() <= self._now:
                continue  # an expired lease holds no slot
            for key in {(task.app_id, task.task_type), (None, task.task_type)}:
                if key in running:
                    running[key] += 1
        return running

    async def save_buckets(self, tokens: Mapping[HandlerKey, float], now: float) -> None:
        self._buckets.update((key, Bucket(left, now)) for key, left in tokens.items())
