"""``LeaseKeeper``: keeps one worker's leases in step with the store, and rescues others'.

Three duties: renewing every lease the worker holds (running, prefetched, and outcomes
not yet written) every ``lease_seconds / 3``; watching the running tasks' leases for a
cancel or suspension request within ``cancel_check_interval``; and rescuing the expired
leases of other workers, after renewing its own (after a stall longer than a lease the
worker's own have expired too, and it must not rescue a task whose outcome it is still
writing). A lease the store no longer knows is lost: its handler is interrupted and its
outcome never written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from taskmill.attempt_hooks import AttemptHooks
from taskmill.errors import log_retried_failure
from taskmill.execution import Execution
from taskmill.finish_writer import FinishWriter
from taskmill.model import CancelReason, TaskStatus
from taskmill.slots import Slots
from taskmill.storage import Lease, TaskStorage, utcnow
from taskmill.waiting import wait_event

log = logging.getLogger("taskmill.worker")


class LeaseKeeper:
    """Renews, watches and rescues leases for one worker. ``wake`` is called when a
    rescue put tasks back to claim."""

    def __init__(
        self,
        *,
        lease_seconds: float,
        cancel_check_interval: float,
        storage: TaskStorage,
        plugins: AttemptHooks,
        slots: Slots,
        writer: FinishWriter,
        wake: Callable[[], None],
    ) -> None:
        self._lease_seconds = lease_seconds
        self._cancel_check_interval = cancel_check_interval
        self._storage = storage
        self._plugins = plugins
        self._slots = slots
        self._writer = writer
        self._wake = wake
        self._check_now = asyncio.Event()
        self.last_rescue = 0.0
        """``time.monotonic()`` of the last rescue."""

    def held_leases(self) -> list[Lease]:
        """Every lease the worker holds: running (not abandoned), prefetched, and of
        outcomes not yet written."""
        leases = list(self._slots.leases())
        leases.extend(self._writer.leases())
        return leases

    def check_soon(self) -> None:
        """Check the running tasks' leases now (a control change was notified)."""
        self._check_now.set()

    async def renew(self) -> None:
        """The renewal duty, every ``lease_seconds / 3``; forever."""
        interval = self._lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            leases = self.held_leases()
            if not leases:
                continue
            try:
                held = await self._storage.renew_leases(leases, self._lease_seconds)
            except Exception:
                log_retried_failure(log, "renewing %d leases failed", len(leases))
                continue
            await self._apply_lease_state(leases, held)

    async def watch(self) -> None:
        """Learn of cancellations and suspensions of running tasks within
        ``cancel_check_interval``, whichever process asked for them; forever."""
        while True:
            await wait_event(self._check_now, self._cancel_check_interval)
            self._check_now.clear()
            leases = [e.lease for e in self._slots.running.values() if not e.abandoned]
            if not leases:
                continue
            try:
                held = await self._storage.watch_leases(leases)
            except Exception:
                log_retried_failure(log, "checking %d leases failed", len(leases))
                continue
            await self._apply_lease_state(leases, held)

    async def rescue_once(self) -> int:
        """Renew this worker's leases, then rescue expired ones; returns how many tasks
        were rescued."""
        self.last_rescue = time.monotonic()
        # Renew first: after a stall longer than a lease, this worker's own leases have
        # expired too, and it must not rescue a task whose outcome it is still writing.
        leases = self.held_leases()
        if leases:
            held = await self._storage.renew_leases(leases, self._lease_seconds)
            await self._apply_lease_state(leases, held)
        rescued = await self._storage.rescue_expired()
        if rescued:
            log.warning(
                "rescued %d tasks whose worker lost its lease: %s",
                len(rescued),
                ", ".join(t.id for t in rescued[:10]),
            )
            self._wake()
            if self._plugins.observes_finishes:
                await self._plugins.tasks_rescued(rescued)
        return len(rescued)

    async def _apply_lease_state(
        self, asked: list[Lease], held: dict[str, CancelReason | None]
    ) -> None:
        slots = self._slots
        # Only the leases asked about: tasks claimed meanwhile are not in ``held``.
        if slots.queued:
            lost = {lease.task_id for lease in asked if lease.task_id not in held}
            for task, _ in slots.drop_queued(lost):
                log.warning("task %s: lease lost while prefetched; dropping it", task.id)
        for lease in asked:
            execution = slots.running.get(lease.task_id)
            if execution is None or execution.lease != lease or execution.abandoned:
                continue
            if lease.task_id not in held:
                await self._lease_lost(execution)
            else:
                reason = held[lease.task_id]
                if reason is not None:
                    execution.control.interrupt(reason)

    async def _lease_lost(self, execution: Execution) -> None:
        """Another writer owns the task now (it was cancelled, or rescued after this
        worker stalled): stop the handler and never write its outcome."""
        execution.abandoned = True
        current = await self._storage.get(execution.task.id)
        reason = (current.cancel_reason if current is not None else None) or (CancelReason.USER)
        if current is not None and current.status is TaskStatus.CANCELLED:
            log.info(
                "task %s was cancelled (%s); stopping its handler", execution.task.id, reason.value
            )
        else:
            log.warning(
                "task %s: lease lost (%s); stopping its handler",
                execution.task.id,
                current.status.value if current else "deleted",
            )
        execution.control.interrupt(reason)
        if self._plugins.observes_finishes:
            await self._plugins.attempt_taken(
                execution.task, current, execution.started_at, utcnow()
            )
