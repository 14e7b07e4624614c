"""``FinishWriter``: writes a worker's finished attempts to the store in batches.

Group commit: whatever finished while the previous write was in flight goes in the next
one, at most :data:`MAX_FINISH_BATCH` outcomes a write. A batch that fails goes back to
the front of the buffer and is retried with backoff. Until its outcome is written a task
is still held (RUNNING in the store, its lease renewed), so it counts against the
worker's ``concurrency``: a slow store slows claiming down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator

from taskmill.attempt_hooks import AttemptHooks
from taskmill.errors import log_retried_failure
from taskmill.model import Task
from taskmill.storage import Finish, Lease, TaskStorage

log = logging.getLogger("taskmill.worker")

MAX_FINISH_BATCH = 500
"""The most outcomes one write carries; a backlog is written in several."""
SLOW_WRITE_SECONDS = 2.0
"""A write of outcomes that takes this long is logged: the store is slowing the worker."""


class FinishWriter:
    """The buffer of one worker's unwritten outcomes and the duty that writes them.

    Each outcome waits with the claimed snapshot only, so the execution behind it
    (context, future, lease) is freed as soon as its handler returns. ``wake`` is
    called when a write frees slots; ``stopping`` says whether the worker is stopping
    (a stop does not wait for ``finish_window``).
    """

    def __init__(
        self,
        *,
        storage: TaskStorage,
        plugins: AttemptHooks,
        concurrency: int,
        prefetch: int,
        finish_window: float,
        wake: Callable[[], None],
        stopping: Callable[[], bool],
    ) -> None:
        self._storage = storage
        self._plugins = plugins
        self._concurrency = concurrency
        self._prefetch = prefetch
        self._finish_window = finish_window
        self._wake = wake
        self._stopping = stopping
        self.pending: list[tuple[Finish, Task | None]] = []
        """Outcomes waiting for the next write, each with its claimed task (None:
        nothing ran, so no plugin hears of it)."""
        self.in_flight: list[tuple[Finish, Task | None]] = []
        """The batch being written now."""
        self.written = 0
        """Outcomes written (whichever writer's state the store kept)."""
        self.deadline: float | None = None
        """``time.monotonic()`` after which a failed write is given up (at shutdown),
        not retried; None: retried until it succeeds."""
        self._flushing = False
        self._ready: asyncio.Event | None = None
        self._flushed: asyncio.Event | None = None
        self._slow_store_since: float | None = None

    def prepare(self) -> None:
        """Make the events of a new run, on the loop that runs it."""
        self._ready = asyncio.Event()
        self._flushed = asyncio.Event()
        self._flushed.set()

    @property
    def held(self) -> int:
        """Outcomes not yet written: buffered or being written."""
        return len(self.pending) + len(self.in_flight)

    def leases(self) -> Iterator[Lease]:
        """The leases of every outcome not yet written (renewed like running tasks)."""
        for finish, _ in self.pending:
            yield finish.lease
        for finish, _ in self.in_flight:
            yield finish.lease

    def queue(self, finish: Finish, claimed: Task | None) -> None:
        """Buffer an outcome for the next write."""
        self.pending.append((finish, claimed))
        if self._flushed is not None:
            self._flushed.clear()
        if self._ready is not None:
            self._ready.set()

    async def run(self) -> None:
        """The flush duty: write whatever is buffered, after ``finish_window`` seconds
        to gather more; forever (cancel it to stop)."""
        assert self._ready is not None
        while True:
            await self._ready.wait()
            if self._finish_window and not self._stopping():
                # Gather more outcomes into this write. A stop does not wait for it:
                # its flush writes directly while this loop sleeps.
                await asyncio.sleep(self._finish_window)
            self._ready.clear()
            await self._flush_pending()

    async def flush_all(self) -> None:
        """Write every queued outcome (waiting for an in-flight write too)."""
        assert self._flushed is not None
        if self.pending and not self._flushing:
            await self._flush_pending()
        while self.pending or self._flushing:
            if self._ready is not None:
                self._ready.set()
            await self._flushed.wait()
            if self.pending and not self._flushing:
                await self._flush_pending()

    async def _flush_pending(self) -> None:
        assert self._flushed is not None
        delay = 0.05
        while self.pending:
            batch = self.pending[:MAX_FINISH_BATCH]
            del self.pending[:MAX_FINISH_BATCH]
            self.in_flight = batch
            self._flushing = True
            began = time.monotonic()
            finishes = [f for f, _ in batch]
            # The snapshots are for the plugins observing finishes; without any, a
            # store need not build them.
            results: list[Task | None] | None = None
            try:
                if self._plugins.observes_finishes:
                    results = await self._storage.finish_batch(finishes)
                    applied = [stored is not None for stored in results]
                else:
                    applied = await self._storage.finish_batch_applied(finishes)
            except Exception:
                self.in_flight = []
                self._flushing = False
                if self.deadline is not None and time.monotonic() > self.deadline:
                    log.exception(
                        "giving up on writing %d outcomes at shutdown; their tasks stay "
                        "RUNNING until their leases expire, then run again",
                        len(batch),
                    )
                    break
                log_retried_failure(
                    log, "writing %d outcomes failed; retrying in %.2f s", len(batch), delay
                )
                self.pending[:0] = batch
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)
                continue
            self.in_flight = []
            self._note_write_time(time.monotonic() - began, len(batch))
            self.written += len(batch)
            for index, ((finish, claimed), written) in enumerate(zip(batch, applied, strict=True)):
                if not written:
                    log.info(
                        "task %s: lease lost before its outcome was written; the "
                        "store kept the other writer's state",
                        finish.lease.task_id,
                    )
                if results is None:
                    continue
                try:
                    await self._notify_finished(finish, results[index], claimed)
                except Exception:
                    log.exception(
                        "after-finish notification for task %s failed", finish.lease.task_id
                    )
            # Only now: a shutdown waiting for the flush also waits for the
            # notifications, so that no plugin hears of a worker stop before its tasks.
            self._flushing = False
            if self._prefetch:
                # The written batch freed its slots: with a local queue, claim into them
                # now, while the next batch is written, not after the whole backlog (a
                # backlog of several writes only builds up with a local queue, and its
                # claims wait for a quarter of the capacity, so they stay large).
                # Without one, the claim waits for the backlog: claiming each freed slot
                # at once made more, smaller claims, which CPU-bound sync handlers paid
                # for in GIL hand-overs (docs/benchmarks.md, "Issue 15: flow between
                # claims and finishes").
                self._wake()
        self._flushed.set()
        self._wake()

    async def _notify_finished(
        self, finish: Finish, stored: Task | None, claimed: Task | None
    ) -> None:
        """The lifecycle hooks of one written outcome (``stored`` None: the lease was
        lost, and the attempt ended the way the other writer ended it)."""
        plugins = self._plugins
        # No claimed task: nothing ran (the handler vanished before the task started).
        if claimed is None or not plugins.observes_finishes:
            return
        if stored is None:
            current = await self._storage.get(finish.lease.task_id)
            await plugins.attempt_taken(claimed, current, finish.started_at, finish.finished_at)
        else:
            await plugins.attempt_finished(finish, stored)

    def _note_write_time(self, seconds: float, count: int) -> None:
        """Say so in the log when the store is slow to take outcomes (claims wait)."""
        now = time.monotonic()
        if seconds >= SLOW_WRITE_SECONDS:
            if self._slow_store_since is None:
                self._slow_store_since = now - seconds
                log.warning(
                    "the store took %.1f s to write %d outcomes; claiming waits for the "
                    "writes (%d of %d slots hold unwritten outcomes)",
                    seconds,
                    count,
                    len(self.pending) + count,
                    self._concurrency,
                )
        elif self._slow_store_since is not None and not self.pending:
            log.warning(
                "the store caught up after %.1f s; claiming at full speed again",
                now - self._slow_store_since,
            )
            self._slow_store_since = None
