"""``Claimer``: how much a worker claims, for which handlers, and where the tasks go.

A claim asks the store for at most the free capacity: ``concurrency`` (plus ``prefetch``)
less what the worker holds, counting outcomes not yet written. The general slots are
claimed for first, then the slots reserved for high priority. Each handler key is named
with the room left under its ``concurrency`` cap, and each global limit travels with
the claim, so the store enforces both in the same statement.

``prefetch=None`` (the default) sizes the local queue from the worker's own pace: about
:data:`AUTO_QUEUE_SECONDS` of work at the rate it started tasks over the last
:data:`RATE_WINDOW`, never more than :data:`AUTO_PREFETCH_MAX` tasks, and none while
that is less than one task per slot (slow handlers: nothing is held unstarted).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from taskmill.finish_writer import FinishWriter
from taskmill.limits import TypeLimit
from taskmill.model import Task
from taskmill.registry import Handler, HandlerRegistry
from taskmill.slots import HIGH_PRIORITY, Slots
from taskmill.storage import ClaimRequest, HandlerKey, TaskStorage, utcnow

AUTO_PREFETCH_MAX = 1000
"""The most tasks a worker with the default (``prefetch`` auto) holds but has not
started: the fairness bound between workers."""
AUTO_QUEUE_SECONDS = 0.1
"""With ``prefetch`` auto, the local queue holds about this many seconds of work at the
worker's measured rate of starting tasks."""
RATE_WINDOW = 0.1
"""Seconds over which that rate is measured (``prefetch`` auto)."""


def auto_prefetch(rate: float, concurrency: int) -> int:
    """The local queue's size for a worker starting ``rate`` tasks a second: about
    :data:`AUTO_QUEUE_SECONDS` of work, at most :data:`AUTO_PREFETCH_MAX`; 0 while that
    is less than one task per slot."""
    size = int(rate * AUTO_QUEUE_SECONDS)
    return 0 if size < concurrency else min(size, AUTO_PREFETCH_MAX)


class Claimer:
    """Claims tasks into one worker's slots (and its local queue, with ``prefetch``)."""

    def __init__(
        self,
        *,
        worker_id: str,
        concurrency: int,
        reserved_high_priority_slots: int,
        prefetch: int | None,
        lease_seconds: float,
        task_types: frozenset[str] | None,
        app_ids: frozenset[str | None] | None,
        storage: TaskStorage,
        registry: HandlerRegistry,
        slots: Slots,
        writer: FinishWriter,
        stopping: Callable[[], bool],
    ) -> None:
        self._worker_id = worker_id
        self._concurrency = concurrency
        self._general = concurrency - reserved_high_priority_slots
        self._auto = prefetch is None
        self._prefetch = 0 if prefetch is None else prefetch
        """The local queue's size now (with ``prefetch`` auto, it follows the rate)."""
        self._window_start = time.monotonic()
        self._window_started = 0
        self._lease_seconds = lease_seconds
        self._task_types = task_types
        self._app_ids = app_ids
        self._storage = storage
        self._registry = registry
        self._slots = slots
        self._writer = writer
        self._stopping = stopping

    @property
    def held(self) -> int:
        """Tasks the worker holds in the store: running, prefetched, and finished but
        not yet written."""
        slots = self._slots
        return len(slots.running) + len(slots.queued) + self._writer.held

    @property
    def prefetch(self) -> int:
        """The local queue's size now: ``prefetch``, or with auto the size the rate of
        starting tasks calls for (at most :data:`AUTO_PREFETCH_MAX`)."""
        return self._prefetch

    def _measure(self) -> None:
        """With ``prefetch`` auto: resize the queue every :data:`RATE_WINDOW` from the
        tasks started meanwhile (started, not claimed: claims from a full queue are
        rarer than a window)."""
        now = time.monotonic()
        elapsed = now - self._window_start
        if elapsed >= RATE_WINDOW:
            started = self._slots.started
            rate = (started - self._window_started) / elapsed
            self._prefetch = auto_prefetch(rate, self._concurrency)
            self._window_start = now
            self._window_started = started

    def served_handlers(self) -> list[Handler]:
        """The handlers this worker claims for: the registry's, narrowed by
        ``task_types`` and ``app_ids``."""
        return [
            h
            for h in self._registry
            if (self._task_types is None or h.task_type in self._task_types)
            and (self._app_ids is None or h.app_id in self._app_ids)
        ]

    async def seconds_until_due(self) -> float | None:
        """Seconds until a task this worker serves is due (0: now), or None: none is
        pending."""
        keys = [h.key for h in self.served_handlers()]
        if not keys:
            return None
        due = await self._storage.next_run_at(keys)
        if due is None:
            return None
        return max(0.0, (due - utcnow()).total_seconds())

    async def fill_slots(
        self, *, prefetch: bool = True, coalesce: bool = False
    ) -> tuple[int, bool]:
        """Claim into free slots (and the local queue, with ``prefetch``); returns
        (claimed, drained) where drained means nothing more is claimable into the free
        slots right now. ``prefetch=False`` claims one batch into free slots only.

        ``coalesce`` (the claim loop): while outcomes are being written, a claim for
        fewer than half the general slots waits for that write, whose end wakes the
        claim loop, and then claims for every slot it freed as well. Claiming each freed
        slot at once splits a busy worker's tasks into trains that never merge again
        (at concurrency 10: claims and writes of 1 and 8 tasks, alternating), each
        paying a claim and a write of its own (docs/benchmarks.md, "Claims that wait
        for the write in flight")."""
        if self._stopping():
            return 0, False
        if self._auto:
            self._measure()
        return await self._fill(prefetch=prefetch, coalesce=coalesce)

    async def _fill(self, *, prefetch: bool, coalesce: bool) -> tuple[int, bool]:
        if self._prefetch and prefetch:
            return await self._fill_queue()
        general = self._general
        slots = self._slots
        claimed = 0
        for min_priority in (None, HIGH_PRIORITY):
            # A slot is free once its outcome is written, not when its handler returns:
            # a slow store then slows claiming down instead of piling up RUNNING tasks.
            free = self._concurrency - self.held
            if min_priority is None:
                free = min(free, general - slots.running_normal)
                if coalesce and 0 < free < general // 2 and self._writer.held:
                    return claimed, False  # not drained: the write's end wakes the loop
            if free <= 0:
                continue
            handlers = self._claim_handlers()
            if not any(room is None or room > 0 for room in handlers.values()):
                return claimed, True
            batch = await self._claim(free, min_priority, handlers)
            for task in batch:
                slots.start(task)
            claimed += len(batch)
            if len(batch) < free:
                return claimed, True
            if min_priority is None and batch[-1].priority < HIGH_PRIORITY:
                # A claim takes the highest priorities first, so nothing the reserved
                # slots may take was left behind: claiming for them would find nothing.
                return claimed, True
        return claimed, False

    async def _fill_queue(self) -> tuple[int, bool]:
        """With ``prefetch``: claim up to ``concurrency + prefetch`` held tasks into the
        local queue, then start what the free slots take.

        Claims are adaptive: while the queue still feeds every slot, the worker waits
        until a quarter of its capacity is free, so claims come in batches instead of
        one row per finished task; with the queue empty it claims whatever is free.
        """
        slots = self._slots
        capacity = self._concurrency + self._prefetch
        free = capacity - self.held
        starving = len(slots.queued) < self._concurrency - len(slots.running)
        if free <= 0 or (not starving and free < max(1, capacity // 4)):
            slots.start_queued()
            return 0, False
        handlers = self._claim_handlers()
        if not any(room is None or room > 0 for room in handlers.values()):
            slots.start_queued()
            return 0, True
        batch = await self._claim(free, None, handlers)
        for task in batch:
            slots.enqueue_local(task)
        slots.start_queued()
        return len(batch), len(batch) < free

    async def _claim(
        self, limit: int, min_priority: int | None, handlers: dict[HandlerKey, int | None]
    ) -> list[Task]:
        return await self._storage.claim_batch(
            ClaimRequest(
                worker_id=self._worker_id,
                handlers=handlers,
                limit=limit,
                lease_seconds=self._lease_seconds,
                min_priority=min_priority,
                limits=self._claim_limits(handlers),
            )
        )

    def _claim_handlers(self) -> dict[HandlerKey, int | None]:
        handlers: dict[HandlerKey, int | None] = {}
        served = {h.key for h in self.served_handlers()}
        per_key = self._slots.per_key
        for handler in self._registry:
            if handler.key not in served:
                # Filtered out, but kept in the request with room 0, like a full handler:
                # left out, its app's tasks would be claimed through the host's key.
                handlers[handler.key] = 0
            elif handler.concurrency is None:
                handlers[handler.key] = None
            else:
                # A full handler stays in the request with room 0: left out, its app's
                # tasks would be claimed through the host handler's key instead.
                room = handler.concurrency - per_key.get(handler.key, 0)
                handlers[handler.key] = max(0, room)
        return handlers

    def _claim_limits(self, handlers: dict[HandlerKey, int | None]) -> dict[HandlerKey, TypeLimit]:
        """The global limits of the handlers this claim may take for."""
        limits: dict[HandlerKey, TypeLimit] = {}
        for handler in self._registry:
            limit = handler.limit
            if limit is not None and handlers.get(handler.key, 0) != 0:
                limits[handler.key] = limit
        return limits
