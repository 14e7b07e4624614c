"""The settlement engine: the procedures that carry out a transition's consequences,
written once for every store.

:mod:`taskmill.lifecycle` *decides* (which status, which event, whether a dependent is
released or cancelled, which tasks a cancel selects). This module *sequences* those
decisions inside the one transaction of a storage operation, against a small per-store
interface, the :class:`Ledger`:

- **a task ends** (:meth:`Settlement.transitioned`): its event; when it is a dedupe
  leader, its PENDING aliases take its status, result, error and cancel reason (the
  leader's terminal event each);
- **then its dependents** (:meth:`Settlement.dependents`), breadth first: every edge
  from a task that ended is resolved once; a dependent whose last dependency ended is
  released, one that a dependency blocks is cancelled (and settles *its* aliases and
  dependents in turn);
- **a cancel** (:func:`cancel`): a non-terminal reason (a suspension, a shutdown) asks
  the RUNNING tasks without a request yet to stop; a terminal one ends every selected
  active task CANCELLED, as if one by one in the selection's order (an alias whose
  leader comes before it is settled *by* that leader), logs the attempts of the RUNNING
  ones, then settles the dependents.

The engine is asynchronous; a synchronous store (SQLite on its database thread) runs it
with :func:`taskmill.migrations.run_sync`, its ledger's methods never suspending.

A store may keep a server-side fast path (PostgreSQL's PL/pgSQL ``settle_aliases`` and
``settle_dependents``): the shipped differential test
(:class:`taskmill.testing.reference.ReferenceContract`) runs the same scenarios
through the in-memory store, which uses this engine, and through the store under test,
and compares the two stores' states.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final, Generic, Protocol, TypeVar, cast

import attrs

from taskmill.lifecycle import (
    CANCELLATION,
    DEPENDENCY_CANCELLATION,
    TERMINAL_EVENTS,
    DependentOutcome,
    cancel_error,
    dependency_blocks,
    dependency_error,
    dependency_settles,
)
from taskmill.model import Attempt, CancelReason, EventKind, TaskStatus

__all__ = [
    "Active",
    "CancelLedger",
    "Edge",
    "Forgets",
    "Ledger",
    "ServerSideCancelLedger",
    "ServerSideLedger",
    "Settlement",
    "cancel",
]

R = TypeVar("R")
"""A store's row: whatever its ledger reads and writes (a tuple, a document, a Task)."""

assert CANCELLATION.outcome is not None
_CANCELLED_OUTCOME: Final = CANCELLATION.outcome
_TERMINAL: Final = frozenset(status for status in TaskStatus if status.terminal)
_DELETABLE: Final = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED})
"""What a finish with ``delete`` deletes: the ends a handler's attempt writes."""


@attrs.frozen
class Edge:
    """An unresolved dependency: ``dependent`` waits for ``dependency`` to end."""

    dependency: str
    dependent: str
    always: bool
    """``after_always``: the dependent runs however the dependency ends."""


@attrs.frozen
class Active:
    """What a terminal cancel needs to know of a selected task that is still active."""

    id: str
    status: TaskStatus
    alias_of: str | None
    worker_id: str | None
    attempts: int
    started_at: datetime | None


class _Settles(Protocol[R]):
    """What every store's side of the settlement provides."""

    def identify(self, row: R) -> tuple[str, TaskStatus]:
        """The task id and status of ``row``."""
        ...

    def leads_aliases(self, row: R) -> bool:
        """Whether ``row``'s task, which just changed, settles aliases now
        (:func:`taskmill.lifecycle.settles_aliases`)."""
        ...

    def emit(self, kind: EventKind, row: R) -> None:
        """Append the event ``kind`` of ``row``'s task in its current status (written
        with the operation's other events, in the order emitted)."""
        ...

    async def settle_aliases(self, leader: R) -> list[R]:
        """Give the PENDING aliases of the terminal ``leader`` its
        :data:`~taskmill.lifecycle.ALIAS_FIELDS`; their new rows in creation order."""
        ...


class Ledger(_Settles[R], Protocol[R]):
    """A store's side of the settlement, inside the transaction of one operation.

    Every method reads or writes the store's current state in that transaction; none
    commits. The engine calls them in the order the lifecycle's rules need.
    """

    async def resolve_edges(self, ended: Sequence[str]) -> list[Edge]:
        """Delete and return the unresolved edges from the tasks ``ended``."""
        ...

    async def count_down(self, dependent: str) -> tuple[R, int] | None:
        """One dependency of ``dependent`` ended: decrease its count of unresolved
        dependencies; its row and the count left, or None when it no longer exists."""
        ...

    async def cancel_dependent(self, dependent: R, error: str) -> R:
        """End ``dependent`` as :data:`~taskmill.lifecycle.DEPENDENCY_CANCELLATION`
        says, with ``error``; its new row."""
        ...


R_in = TypeVar("R_in", contravariant=True)


class Forgets(Protocol[R_in]):
    """The ledger of a store with the ``delete_on_finish`` capability."""

    async def forget(self, rows: Sequence[R_in]) -> None:
        """Delete the ended tasks ``rows`` (a finish with
        :attr:`~taskmill.storage.Finish.delete`, and the aliases it settled; their
        events already emitted) with their execution logs, keeping each row as the
        task's tombstone (:meth:`taskmill.storage.TaskStorage.deleted_task`)."""
        ...


class ServerSideLedger(_Settles[R], Protocol[R]):
    """A :class:`Ledger` whose store settles dependents in the database server, in one
    call (PostgreSQL's PL/pgSQL ``settle_dependents``), with the same outcome as
    :meth:`Settlement.dependents`: the shipped differential test holds it to that."""

    async def settle_dependents(self, ended: Sequence[R]) -> list[R]:
        """Settle the dependents of the tasks ``ended`` breadth first, as
        :meth:`Settlement.dependents` does (events included); the rows it cancelled,
        each followed by its aliases."""
        ...


class _Cancels(Protocol[R]):
    """What a store writes for a cancel."""

    async def request_stop(self, ids: Sequence[str], reason: CancelReason) -> dict[str, R]:
        """Set ``reason`` on the RUNNING tasks among ``ids`` that have no cancel reason
        yet; their new rows by id."""
        ...

    async def lock_active(self, ids: Sequence[str]) -> list[Active]:
        """The active tasks among ``ids``, locked against other writers until the
        transaction ends."""
        ...

    async def cancel_rows(self, ids: Sequence[str], reason: CancelReason) -> dict[str, R]:
        """End the tasks ``ids`` (all active, locked) as
        :data:`~taskmill.lifecycle.CANCELLATION` says with ``reason``; new rows by id."""
        ...

    async def log_attempts(self, attempts: Sequence[Attempt]) -> None:
        """Append ``attempts`` to the execution log."""
        ...


class CancelLedger(Ledger[R], _Cancels[R], Protocol[R]):
    """A :class:`Ledger` that also writes what a cancel changes."""


class ServerSideCancelLedger(ServerSideLedger[R], _Cancels[R], Protocol[R]):
    """A :class:`ServerSideLedger` that also writes what a cancel changes."""


class Settlement(Generic[R]):
    """The consequences of the transitions of one operation, in one transaction.

    The store writes a transition, then calls :meth:`transitioned`; after the last one it
    calls :meth:`dependents` once.
    """

    __slots__ = ("_doomed", "_ended", "_ended_rows", "_ledger")

    def __init__(self, ledger: Ledger[R] | ServerSideLedger[R]) -> None:
        self._ledger = ledger
        self._ended: list[tuple[str, TaskStatus]] = []
        self._ended_rows: list[R] = []
        self._doomed: list[R] = []

    async def transitioned(self, row: R, kind: EventKind, *, delete: bool = False) -> list[R]:
        """``row``'s task just made a transition whose event is ``kind``: append it and,
        when the task ended, settle its aliases. ``delete`` (a finish's
        :attr:`~taskmill.storage.Finish.delete`): when the task ended COMPLETED or
        FAILED, it and the aliases settled go once :meth:`dependents` has run.

        :returns: the aliases settled, in creation order.
        """
        ledger = self._ledger
        ledger.emit(kind, row)
        ended = ledger.identify(row)
        if ended[1] not in _TERMINAL:
            return []
        self._ended.append(ended)
        self._ended_rows.append(row)
        doomed = delete and ended[1] in _DELETABLE
        if doomed:
            self._doomed.append(row)
        if not ledger.leads_aliases(row):
            return []
        aliases = await self._aliases(row, ended[1])
        if doomed:
            self._doomed += aliases
        return aliases

    async def _aliases(self, leader: R, status: TaskStatus) -> list[R]:
        ledger = self._ledger
        if not ledger.leads_aliases(leader):
            return []
        aliases = await ledger.settle_aliases(leader)
        kind = TERMINAL_EVENTS[status]
        for alias in aliases:
            ledger.emit(kind, alias)
            self._ended.append(ledger.identify(alias))
            self._ended_rows.append(alias)
        return aliases

    @property
    def pending(self) -> bool:
        """Whether some task ended whose dependents are not settled yet."""
        return bool(self._ended)

    async def dependents(self) -> list[R]:
        """Settle the dependents of every task that ended so far, breadth first, as
        :func:`taskmill.lifecycle.dependency_settles` says: release those whose last
        dependency ended, cancel those a dependency blocks (with their aliases), and in
        turn settle the dependents of what that ends.

        :returns: the tasks this ended: each dependent cancelled, followed by its aliases.
        """
        ledger = self._ledger
        # Not isinstance(ledger, ServerSideLedger): a runtime protocol check costs
        # microseconds per finish batch, a measurable share of a worker's per-task cost.
        server_side = getattr(ledger, "settle_dependents", None)
        if server_side is not None:
            # Only cancels run a server-side ledger (PostgreSQL's finish is one statement
            # of its own, deletes included), and a cancel never deletes.
            assert not self._doomed, "a server-side ledger's store deletes in its own finish"
            ended, self._ended, self._ended_rows = self._ended_rows, [], []
            return await server_side(ended) if ended else []
        ledger = cast(Ledger[R], ledger)
        self._ended_rows = []
        changed: list[R] = []
        while self._ended:
            status_of = dict(self._ended)
            self._ended = []
            for edge in await ledger.resolve_edges(list(status_of)):
                found = await ledger.count_down(edge.dependent)
                if found is None:
                    continue  # removed by cleanup
                row, left = found
                ended_as = status_of[edge.dependency]
                blocks = bool(dependency_blocks(ended_as, edge.always))
                outcome = dependency_settles(ledger.identify(row)[1], left, blocks=blocks)
                if outcome is DependentOutcome.RELEASED:
                    ledger.emit(EventKind.RELEASED, row)
                elif outcome is DependentOutcome.CANCELLED:
                    error = dependency_error(edge.dependency, ended_as)
                    row = await ledger.cancel_dependent(row, error)
                    ledger.emit(DEPENDENCY_CANCELLATION.event, row)
                    self._ended.append(ledger.identify(row))
                    changed.append(row)
                    changed += await self._aliases(row, TaskStatus.CANCELLED)
        self._ended_rows = []
        if self._doomed:
            doomed, self._doomed = self._doomed, []
            # Only a store with ``delete_on_finish`` is given deleting finishes.
            await cast(Forgets[R], ledger).forget(doomed)
        return changed


async def cancel(
    ledger: CancelLedger[R] | ServerSideCancelLedger[R],
    targets: Sequence[str],
    reason: CancelReason,
    at: datetime,
) -> list[R]:
    """Cancel ``targets`` (in the order :func:`taskmill.lifecycle.cancel_targets` gave)
    with ``reason`` at ``at`` (see :meth:`taskmill.storage.TaskStorage.cancel`).

    :returns: every task changed: the targets in order, each cancelled leader followed
        by its aliases, then the dependents that cancelled (each followed by its aliases).
    """
    if not reason.terminal:
        # SUSPENDED, SHUTDOWN: only a running task without a request yet is asked to stop.
        asked = await ledger.request_stop(targets, reason)
        stopping = [asked[i] for i in targets if i in asked]
        for one in stopping:
            ledger.emit(EventKind.CANCEL_REQUESTED, one)
        return stopping
    active = await ledger.lock_active(targets)
    if not active:
        return []
    # An alias whose (active) leader comes before it is cancelled *by* that leader,
    # taking its result and error as aliases always do; otherwise it is cancelled alone.
    position = {task_id: n for n, task_id in enumerate(targets)}
    first = {a.id: position[a.id] for a in active}
    direct = [a.id for a in active if first.get(a.alias_of or "", len(targets)) > position[a.id]]
    rows = await ledger.cancel_rows(direct, reason)
    settlement = Settlement(ledger)
    changed: list[R] = []
    done: set[str] = set()
    for task_id in targets:
        row = rows.get(task_id)
        if row is None or task_id in done:
            continue
        done.add(task_id)
        changed.append(row)
        for alias in await settlement.transitioned(row, CANCELLATION.event):
            done.add(ledger.identify(alias)[0])
            changed.append(alias)
    error = cancel_error(reason)
    await ledger.log_attempts(
        [
            Attempt(
                task_id=a.id,
                number=a.attempts,
                worker_id=a.worker_id or "",
                started_at=a.started_at or at,
                finished_at=at,
                outcome=_CANCELLED_OUTCOME,
                error=error,
            )
            for a in active
            if a.status is TaskStatus.RUNNING
        ]
    )
    changed += await settlement.dependents()
    return changed
