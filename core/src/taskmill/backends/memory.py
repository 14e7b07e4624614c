"""``memory://`` — an in-process store for tests and embedding.

Every operation runs synchronously on the event loop between two awaits, which makes it
atomic without locks. Nothing survives the process, and each ``memory://`` storage is
its own store (two ``Taskmill("memory://")`` objects do not share tasks).

Claims are served from one heap per ``(app_id, task_type)`` ordered by (priority DESC,
creation ASC) plus one heap of tasks not yet due, so a claim costs O(batch · log n)
however many tasks are queued.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, Self

import attrs

from taskmill.cursors import position_token, token_position
from taskmill.errors import InvalidURL, StorageUnavailable, TaskNotFound
from taskmill.lifecycle import (
    CANCELLATION,
    DEPENDENCY_CANCEL_REASON,
    DEPENDENCY_CANCELLATION,
    FINISHES,
    REDRIVE_EVENT,
    RESCUE_ERROR,
    RESCUES,
    TransitionPlan,
    cancel_targets,
    check_dependencies,
    check_redrive,
    dependency_blocks,
    dependency_error,
    enqueued,
    finish_kind,
    finish_values,
    key_taken,
    plan,
    rescue_case,
    settle_alias,
    settles_aliases,
    split_taken,
)
from taskmill.limiting import InProcessLedger, limit_claim, spend_claimed
from taskmill.limits import Bucket
from taskmill.model import (
    NO_PROGRESS,
    Attempt,
    AttemptOutcome,
    CancelReason,
    EventKind,
    ProgressSummary,
    SuspensionScope,
    Task,
    TaskEvent,
    TaskFilter,
    TaskStatus,
)
from taskmill.settlement import Active, Edge, Settlement
from taskmill.settlement import cancel as settlement_cancel
from taskmill.storage import (
    LEASED_STATUS,
    ClaimRequest,
    Finish,
    HandlerKey,
    HandlerRegistration,
    Lease,
    NewTask,
    ProgressUpdate,
    StorageCapabilities,
    StoredWorker,
    TaskStorage,
    from_timestamp,
    wall_clock,
)

_PENDING = TaskStatus.PENDING
_RELEASED = EventKind.RELEASED
_RUNNING = TaskStatus.RUNNING
assert CANCELLATION.outcome is not None
CANCELLED_OUTCOME = CANCELLATION.outcome
_FINISH_PLANS = {kind: plan(t) for kind, t in FINISHES.items()}
_RESCUE_PLANS = {case: plan(t) for case, t in RESCUES.items()}
_CANCEL_PLAN = plan(CANCELLATION)
_DEPENDENCY_CANCEL_PLAN = plan(DEPENDENCY_CANCELLATION)
QueueKey = tuple[str | None, str]
_ReadyEntry = tuple[int, int, str]  # (-priority, seq, task id)
_LogRow = tuple[int, str, datetime, datetime, str, str | None]
"""An execution-log row: an ``Attempt`` without its task id, its outcome by value."""


class MemoryStorage(TaskStorage):
    """In-process storage. See the module docstring for its guarantees and limits."""

    capabilities = StorageCapabilities(
        durable=False,
        shared_between_processes=False,
        notifications=False,
        transactions_across_records=True,
        commit_ordered_cursors=True,
        handler_registrations=True,
        worker_registry=True,
    )

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._open = False
        self._tasks: dict[str, Task] = {}
        self._seq: dict[str, int] = {}
        self._next_seq = 0
        self._ready: dict[QueueKey, list[_ReadyEntry]] = {}
        self._delayed: list[tuple[float, int, str]] = []
        self._running: set[str] = set()
        self._leaders: dict[tuple[str | None, str, str], str] = {}
        self._aliases: dict[str, list[str]] = {}
        self._log: dict[str, tuple[_LogRow, ...]] = {}
        self._children: dict[str, list[str]] = {}
        self._suspended: set[SuspensionScope] = set()
        # (cursor, kind, task id, status, POSIX time), enums by value: tuples of plain
        # values only, which the garbage collector stops tracking (see _log_attempt).
        self._events: list[tuple[int, str, str, str, float]] = []
        self._event_seq = 0
        self._registrations: dict[HandlerKey, HandlerRegistration] = {}
        # Dependencies: per task, how many of its dependencies have not ended (absent:
        # none), and per dependency its unresolved edges (dependent id, after_always).
        self._waiting: dict[str, int] = {}
        self._dependents: dict[str, list[tuple[str, bool]]] = {}
        self._buckets: dict[HandlerKey, Bucket] = {}
        # Tasks deleted by their finish (Finish.delete): the last snapshot and the POSIX
        # time, kept while the event log keeps events of that age.
        self._tombstones: dict[str, tuple[Task, float]] = {}
        self._workers: dict[str, tuple[str, float]] = {}
        """Worker registrations: record text and heartbeat (POSIX time), by id."""

    def _emit(self, kind: EventKind, task: Task, at: float) -> None:
        self._event_seq += 1
        self._events.append((self._event_seq, kind.value, task.id, task.status.value, at))

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        if options:
            raise InvalidURL(f"memory:// takes no options, got: {', '.join(sorted(options))}")
        return cls(url)

    async def open(self, *, auto_migrate: bool = False) -> None:
        self._open = True

    async def close(self) -> None:
        # The tasks stay in this object: reopening it finds them again.
        self._open = False

    def _check_open(self) -> None:
        if not self._open:
            raise StorageUnavailable("this memory:// store is not open; call open() first")

    async def migrate(self) -> int:
        return 1

    # -- queue bookkeeping ---------------------------------------------------------

    def _queue(self, task: Task, now: float) -> None:
        """Put a PENDING leader where claims will find it."""
        seq = self._seq[task.id]
        due = task.run_at.timestamp()
        if due > now:
            heapq.heappush(self._delayed, (due, seq, task.id))
        else:
            heap = self._ready.setdefault((task.app_id, task.task_type), [])
            heapq.heappush(heap, (-task.priority, seq, task.id))

    def _promote_due(self, now: float) -> None:
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            _, seq, task_id = heapq.heappop(delayed)
            task = self._tasks.get(task_id)
            if task is not None and task.status is _PENDING and task.run_at.timestamp() <= now:
                heap = self._ready.setdefault((task.app_id, task.task_type), [])
                heapq.heappush(heap, (-task.priority, seq, task.id))

    def _claimable(self, entry: _ReadyEntry) -> Task | None:
        task = self._tasks.get(entry[2])
        if task is None or task.status is not _PENDING or task.alias_of is not None:
            return None
        return task

    # -- writing -------------------------------------------------------------------

    async def enqueue(self, tasks: Sequence[NewTask]) -> list[Task]:
        self._check_open()
        now_ts = wall_clock()
        now = from_timestamp(now_ts)
        fresh, known = split_taken(
            tasks, {t.id: self._tasks[t.id] for t in tasks if t.id in self._tasks}
        )
        wanted = {d for new in fresh for d in new.after}
        check_dependencies(fresh, {d: t.app_id for d in wanted if (t := self._tasks.get(d))})
        ledger = _MemoryLedger(self, now_ts)
        settlement = Settlement(ledger)
        blocked: list[tuple[str, Task]] = []  # (task, the dependency that cancels it)
        for new in fresh:
            alias_of = None
            if new.dedupe_key is not None:
                scope = (new.app_id, new.task_type, new.dedupe_key)
                alias_of = self._leaders.get(scope)
                if alias_of is None:
                    self._leaders[scope] = new.id
            task = enqueued(new, now=now, run_at=new.run_at or now, alias_of=alias_of)
            self._tasks[task.id] = task
            self._seq[task.id] = self._next_seq
            self._next_seq += 1
            blocker = self._wait_for(new) if new.after else None
            if alias_of is None:
                if blocker is None and not self._waiting.get(task.id):
                    self._queue(task, now_ts)
            else:
                self._aliases.setdefault(alias_of, []).append(task.id)
            if task.parent_id is not None:
                self._children.setdefault(task.parent_id, []).append(task.id)
            self._emit(EventKind.ENQUEUED, task, now_ts)
            if blocker is not None:
                blocked.append((task.id, blocker))
        # The batch is stored; then what a dependency blocks is cancelled, in order (a
        # blocked leader settles its aliases of the batch, which are then skipped).
        for task_id, blocker in blocked:
            task = self._tasks[task_id]
            if task.status is _PENDING:
                error = dependency_error(blocker.id, blocker.status)
                task = await ledger.cancel_dependent(task, error)
                await settlement.transitioned(task, DEPENDENCY_CANCELLATION.event)
        await settlement.dependents()
        return [known.get(new.id) or self._tasks[new.id] for new in tasks]

    def _wait_for(self, new: NewTask) -> Task | None:
        """Record the edges of ``new`` to its unfinished dependencies; the first one
        already ended in a way that cancels ``new`` (None when none did)."""
        blocker: Task | None = None
        for dependency in new.after:
            found = self._tasks[dependency]
            blocks = dependency_blocks(found.status, new.after_always)
            if blocks is None:
                self._dependents.setdefault(dependency, []).append((new.id, new.after_always))
                self._waiting[new.id] = self._waiting.get(new.id, 0) + 1
            elif blocks and blocker is None:
                blocker = found
        return blocker

    async def claim_batch(self, request: ClaimRequest) -> list[Task]:
        self._check_open()
        now_ts = wall_clock()
        self._promote_due(now_ts)
        now = from_timestamp(now_ts)
        lease_until = from_timestamp(now_ts + request.lease_seconds)
        handlers = request.handlers
        if request.limits:
            ledger = InProcessLedger(self._buckets, self._tasks, self._running, now_ts)
            limited = await limit_claim(ledger, request)
            handlers = limited.request.handlers
        # Which heaps each handler key draws from.
        sources: dict[QueueKey, HandlerKey] = {}
        for queue_key in self._ready:
            app_id, task_type = queue_key
            if (app_id, task_type) in handlers:
                sources[queue_key] = (app_id, task_type)
            elif (None, task_type) in handlers:
                sources[queue_key] = (None, task_type)
        if self._suspended:
            for queue_key in list(sources):
                if any(scope.covers(*queue_key) for scope in self._suspended):
                    del sources[queue_key]
        counts: dict[HandlerKey, int] = {}
        claimed: list[Task] = []
        min_priority = request.min_priority
        while len(claimed) < request.limit and sources:
            best: QueueKey | None = None
            best_entry: _ReadyEntry | None = None
            for queue_key in list(sources):
                heap = self._ready[queue_key]
                while heap and self._claimable(heap[0]) is None:
                    heapq.heappop(heap)
                if not heap:
                    del sources[queue_key]
                    continue
                if best_entry is None or heap[0] < best_entry:
                    best, best_entry = queue_key, heap[0]
            if best is None or best_entry is None:
                break
            if min_priority is not None and -best_entry[0] < min_priority:
                break
            key = sources[best]
            cap = handlers[key]
            if cap is not None and counts.get(key, 0) >= cap:
                for queue_key in [q for q, k in sources.items() if k == key]:
                    del sources[queue_key]
                continue
            heapq.heappop(self._ready[best])
            task = self._tasks[best_entry[2]]
            task = task.evolve(
                status=_RUNNING,
                attempts=task.attempts + 1,
                worker_id=request.worker_id,
                started_at=now,
                updated_at=now,
                lease_expires_at=lease_until,
            )
            self._tasks[task.id] = task
            self._running.add(task.id)
            counts[key] = counts.get(key, 0) + 1
            self._emit(EventKind.STARTED, task, now_ts)
            claimed.append(task)
        if request.limits:
            await spend_claimed(ledger, limited, ((t.app_id, t.task_type) for t in claimed))
        return claimed

    def _held(self, lease: Lease) -> Task | None:
        task = self._tasks.get(lease.task_id)
        if (
            task is None
            or task.status is not _RUNNING
            or not lease.holds(task.id, LEASED_STATUS, task.worker_id, task.attempts)
        ):
            return None
        return task

    def _log_attempt(self, attempt: Attempt) -> None:
        # Rows of plain values only, so that the garbage collector stops tracking them:
        # an Attempt object (and a list) kept per task would make every full collection
        # slower as finished tasks pile up.
        row = (
            attempt.number,
            attempt.worker_id,
            attempt.started_at,
            attempt.finished_at,
            attempt.outcome.value,
            attempt.error,
        )
        self._log[attempt.task_id] = (*self._log.get(attempt.task_id, ()), row)

    def _write(self, task: Task) -> Task:
        """Store ``task``'s new state: out of the running set once it is no longer
        RUNNING, its dedupe key free once it ended."""
        self._tasks[task.id] = task
        if task.status is not _RUNNING:
            self._running.discard(task.id)
        if task.dedupe_key is not None and task.status.terminal:
            scope = (task.app_id, task.task_type, task.dedupe_key)
            if self._leaders.get(scope) == task.id:
                del self._leaders[scope]
        return task

    def _transition(
        self, task: Task, plan: TransitionPlan, now_ts: float, now: datetime, values: dict[str, Any]
    ) -> Task:
        """Write a transition out of RUNNING (or PENDING) at ``now_ts`` (``now``);
        requeue it when it does."""
        task = self._write(plan.apply(task, now, **values))
        if plan.requeues:
            self._queue(task, now_ts)
        return task

    async def finish_batch(self, finishes: Sequence[Finish]) -> list[Task | None]:
        self._check_open()
        now_ts = wall_clock()
        now = from_timestamp(now_ts)
        settlement = Settlement(_MemoryLedger(self, now_ts))
        results: list[Task | None] = []
        for finish in finishes:
            task = self._held(finish.lease)
            if task is None:
                results.append(None)
                continue
            kind = finish.kind
            if task.cancel_reason is not None:
                kind = finish_kind(kind, stop_requested=True)
            chosen = _FINISH_PLANS[kind]
            values = finish_values(finish, kind, now)
            task = self._transition(task, chosen, now_ts, now, values)
            await settlement.transitioned(task, chosen.transition.event, delete=finish.delete)
            outcome = chosen.transition.outcome or finish.outcome
            self._log_attempt(
                Attempt(
                    task_id=task.id,
                    number=finish.lease.attempt,
                    worker_id=finish.lease.worker_id,
                    started_at=finish.started_at,
                    finished_at=finish.finished_at,
                    outcome=outcome,
                    error=finish.error if outcome is not AttemptOutcome.COMPLETED else None,
                )
            )
            results.append(task)
        await settlement.dependents()
        return results

    async def renew_leases(
        self, leases: Sequence[Lease], lease_seconds: float
    ) -> dict[str, CancelReason | None]:
        self._check_open()
        now_ts = wall_clock()
        until = from_timestamp(now_ts + lease_seconds)
        held: dict[str, CancelReason | None] = {}
        for lease in leases:
            task = self._held(lease)
            if task is None:
                continue
            self._tasks[task.id] = task.evolve(lease_expires_at=until)
            held[task.id] = task.cancel_reason
        return held

    async def save_progress(self, updates: Sequence[ProgressUpdate]) -> set[str]:
        self._check_open()
        now_ts = wall_clock()
        now = from_timestamp(now_ts)
        written: set[str] = set()
        for update in updates:
            task = self._held(update.lease)
            if task is None:
                continue
            changes: dict[str, Any] = {"updated_at": now}
            if update.progress is not None:
                changes["progress"] = update.progress
            if update.data is not None:
                changes["data"] = update.data
            task = self._tasks[task.id] = task.evolve(**changes)
            self._emit(EventKind.PROGRESS, task, now_ts)
            written.add(task.id)
        return written

    async def rescue_expired(self, *, limit: int = 1000) -> list[Task]:
        self._check_open()
        now_ts = wall_clock()
        now = from_timestamp(now_ts)
        settlement = Settlement(_MemoryLedger(self, now_ts))
        rescued: list[Task] = []
        for task_id in list(self._running):
            if len(rescued) >= limit:
                break
            task = self._tasks[task_id]
            if task.lease_expires_at is None or task.lease_expires_at > now:
                continue
            worker_id, number, started = task.worker_id, task.attempts, task.started_at
            chosen = _RESCUE_PLANS[rescue_case(task.cancel_reason, task.attempts, task.max_retries)]
            transition = chosen.transition
            task = self._transition(task, chosen, now_ts, now, {"error": RESCUE_ERROR})
            await settlement.transitioned(task, transition.event)
            assert transition.outcome is not None  # a rescue logs its own outcome
            self._log_attempt(
                Attempt(
                    task_id=task_id,
                    number=number,
                    worker_id=worker_id or "",
                    started_at=started or now,
                    finished_at=now,
                    outcome=transition.outcome,
                    error=RESCUE_ERROR,
                )
            )
            rescued.append(task)
        await settlement.dependents()
        return rescued

    async def retry(self, task_id: str) -> Task:
        self._check_open()
        task = self._tasks.get(task_id)
        if task is None:
            raise TaskNotFound(f"no task {task_id}")
        check_redrive(task_id, task.status, task.alias_of)
        now_ts = wall_clock()
        now = from_timestamp(now_ts)
        if task.dedupe_key is not None:
            scope = (task.app_id, task.task_type, task.dedupe_key)
            if scope in self._leaders:
                raise key_taken(task_id, self._leaders[scope], task.dedupe_key)
            self._leaders[scope] = task.id
        task = task.evolve(
            status=_PENDING,
            attempts=0,
            result=None,
            error=None,
            cancel_reason=None,
            progress=NO_PROGRESS,
            run_at=now,
            updated_at=now,
            started_at=None,
            finished_at=None,
        )
        self._tasks[task_id] = task
        if not self._waiting.get(task_id):
            self._queue(task, now_ts)
        self._emit(REDRIVE_EVENT, task, now_ts)
        return task

    # -- reading -------------------------------------------------------------------

    async def deleted_task(self, task_id: str) -> Task | None:
        self._check_open()
        gone = self._tombstones.get(task_id)
        return None if gone is None else gone[0]

    async def get(self, task_id: str) -> Task | None:
        self._check_open()
        return self._tasks.get(task_id)

    def _select(self, filter: TaskFilter) -> Iterator[Task]:
        return (t for t in self._tasks.values() if filter.matches(t))

    async def query(
        self,
        filter: TaskFilter,
        *,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        after: str | None = None,
    ) -> list[Task]:
        self._check_open()
        selected: Iterable[Task] = self._select(filter)
        if after is not None:
            place = self._seq.get(after)
            if place is None:
                return []
            if newest_first:
                selected = [t for t in selected if self._seq[t.id] < place]
            else:
                selected = [t for t in selected if self._seq[t.id] > place]
        ordered = sorted(selected, key=lambda t: self._seq[t.id], reverse=newest_first)
        return ordered[offset : offset + limit]

    async def summary(self, filter: TaskFilter) -> ProgressSummary:
        self._check_open()
        counts = dict.fromkeys(TaskStatus, 0)
        waiting = 0
        for task in self._select(filter):
            counts[task.status] += 1
            if task.status is _PENDING and task.id in self._waiting:
                waiting += 1
        return ProgressSummary.from_counts(counts, waiting=waiting)

    async def attempts(self, task_id: str) -> list[Attempt]:
        self._check_open()
        return [
            Attempt(task_id, number, worker_id, started, finished, AttemptOutcome(outcome), error)
            for number, worker_id, started, finished, outcome, error in self._log.get(task_id, ())
        ]

    async def next_run_at(self, handlers: Sequence[HandlerKey]) -> datetime | None:
        self._check_open()
        keys = set(handlers)
        best: datetime | None = None
        for task in self._tasks.values():
            if task.status is not _PENDING or task.alias_of is not None:
                continue
            if task.id in self._waiting:
                continue
            if any(scope.covers(task.app_id, task.task_type) for scope in self._suspended):
                continue
            if (task.app_id, task.task_type) in keys or (None, task.task_type) in keys:
                best = task.run_at if best is None else min(best, task.run_at)
        return best

    async def cleanup(
        self,
        older_than: timedelta,
        *,
        statuses: frozenset[TaskStatus] = frozenset({TaskStatus.COMPLETED, TaskStatus.CANCELLED}),
    ) -> int:
        self._check_open()
        if any(s.active for s in statuses):
            raise ValueError("cleanup deletes terminal tasks only")
        cutoff = from_timestamp(wall_clock()) - older_than
        doomed = [
            t.id
            for t in self._tasks.values()
            if t.status in statuses and t.finished_at is not None and t.finished_at < cutoff
        ]
        for task_id in doomed:
            del self._tasks[task_id]
            del self._seq[task_id]
            self._log.pop(task_id, None)
            self._children.pop(task_id, None)
            self._waiting.pop(task_id, None)
        return len(doomed)

    # -- control ---------------------------------------------------------------------

    async def cancel(
        self,
        *,
        task_ids: Sequence[str] | None = None,
        filter: TaskFilter | None = None,
        reason: CancelReason = CancelReason.USER,
        cascade: bool = True,
    ) -> list[Task]:
        self._check_open()
        if task_ids is None and filter is None:
            raise ValueError("cancel needs task_ids or a filter")
        now_ts = wall_clock()
        now = from_timestamp(now_ts)
        selected = list(task_ids or ())
        if filter is not None:
            selected.extend(t.id for t in self._select(filter) if t.status.active)

        async def children_of(level: list[str]) -> list[tuple[str, str]]:
            return [(c, p) for p in level for c in self._children.get(p, ())]

        targets = await cancel_targets(selected, children_of if cascade else None)
        return await settlement_cancel(_MemoryLedger(self, now_ts), targets, reason, now)

    async def watch_leases(self, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
        self._check_open()
        held: dict[str, CancelReason | None] = {}
        for lease in leases:
            task = self._held(lease)
            if task is not None:
                held[task.id] = task.cancel_reason
        return held

    async def suspend(self, scope: SuspensionScope) -> int:
        self._check_open()
        self._suspended.add(scope)
        running = [
            self._tasks[task_id]
            for task_id in self._running
            if scope.covers(self._tasks[task_id].app_id, self._tasks[task_id].task_type)
        ]
        changed = await self.cancel(
            task_ids=[t.id for t in running], reason=CancelReason.SUSPENDED, cascade=False
        )
        return len(changed)

    async def resume(self, scope: SuspensionScope) -> bool:
        self._check_open()
        if scope not in self._suspended:
            return False
        self._suspended.discard(scope)
        return True

    async def suspensions(self) -> list[SuspensionScope]:
        self._check_open()
        return sorted(self._suspended, key=lambda s: (s.task_type or "", s.app_id or ""))

    async def read_events(
        self, after: str | None, *, limit: int = 1000
    ) -> tuple[list[TaskEvent], str]:
        self._check_open()
        if after is None:
            return [], position_token(self._event_seq)
        position = token_position(after)
        rows = self._events
        start = bisect.bisect_right(rows, position, key=lambda row: row[0])
        events: list[TaskEvent] = []
        cursor = after
        tombstones = self._tombstones
        for seq, kind, task_id, status, at in rows[start : start + max(limit, 0)]:
            cursor = position_token(seq)
            task = self._tasks.get(task_id)
            if task is None and tombstones:
                gone = tombstones.get(task_id)
                task = None if gone is None else gone[0]
            if task is not None:
                events.append(
                    TaskEvent(
                        kind=EventKind(kind),
                        task=task,
                        status=TaskStatus(status),
                        at=from_timestamp(at),
                        cursor=cursor,
                    )
                )
        return events, cursor

    async def prune_events(self, older_than: timedelta) -> int:
        self._check_open()
        cutoff = wall_clock() - older_than.total_seconds()
        keep = 0
        while keep < len(self._events) and self._events[keep][4] < cutoff:
            keep += 1
        del self._events[:keep]
        if self._tombstones:
            self._tombstones = {i: g for i, g in self._tombstones.items() if g[1] >= cutoff}
        return keep

    # -- worker registry -------------------------------------------------------------

    async def put_worker(self, worker_id: str, record: str) -> None:
        self._check_open()
        self._workers[worker_id] = (record, wall_clock())

    async def workers(self) -> list[StoredWorker]:
        self._check_open()
        return [
            StoredWorker(id=i, heartbeat_at=from_timestamp(at), record=record)
            for i, (record, at) in sorted(self._workers.items())
        ]

    async def remove_worker(self, worker_id: str) -> bool:
        self._check_open()
        return self._workers.pop(worker_id, None) is not None

    async def prune_workers(self, older_than: timedelta) -> int:
        self._check_open()
        cutoff = wall_clock() - older_than.total_seconds()
        old = [i for i, (_, at) in self._workers.items() if at < cutoff]
        for worker_id in old:
            del self._workers[worker_id]
        return len(old)

    # -- handler registrations -----------------------------------------------------

    async def put_handler_registration(
        self, registration: HandlerRegistration
    ) -> HandlerRegistration:
        self._check_open()
        stored = attrs.evolve(registration, updated_at=from_timestamp(wall_clock()))
        self._registrations[stored.key] = stored
        return stored

    async def delete_handler_registration(self, app_id: str | None, task_type: str) -> bool:
        self._check_open()
        return self._registrations.pop((app_id, task_type), None) is not None

    async def handler_registrations(self) -> list[HandlerRegistration]:
        self._check_open()
        return sorted(
            self._registrations.values(),
            key=lambda r: (r.app_id is not None, r.app_id or "", r.task_type),
        )


class _MemoryLedger:
    """:class:`taskmill.settlement.CancelLedger` over a :class:`MemoryStorage`'s
    dictionaries at ``now_ts`` (its methods never suspend: the operation stays atomic)."""

    __slots__ = ("_at", "_now", "_store")

    def __init__(self, store: MemoryStorage, now_ts: float) -> None:
        self._store = store
        self._now = now_ts
        self._at = from_timestamp(now_ts)

    def identify(self, row: Task) -> tuple[str, TaskStatus]:
        return row.id, row.status

    def leads_aliases(self, row: Task) -> bool:
        return row.dedupe_key is not None and settles_aliases(
            row.status, row.dedupe_key, row.alias_of
        )

    def emit(self, kind: EventKind, row: Task) -> None:
        self._store._emit(kind, row, self._now)
        if kind is _RELEASED:
            self._store._queue(row, self._now)  # its last dependency ended: claimable

    async def forget(self, rows: Sequence[Task]) -> None:
        store = self._store
        for task in rows:
            del store._tasks[task.id]
            del store._seq[task.id]
            store._log.pop(task.id, None)
            store._children.pop(task.id, None)
            store._tombstones[task.id] = (task, self._now)

    async def settle_aliases(self, leader: Task) -> list[Task]:
        store = self._store
        settled: list[Task] = []
        for alias_id in store._aliases.pop(leader.id, ()):
            alias = store._tasks.get(alias_id)
            if alias is not None and alias.status is _PENDING:
                settled.append(store._write(settle_alias(alias, leader, self._at)))
        return settled

    async def resolve_edges(self, ended: Sequence[str]) -> list[Edge]:
        dependents = self._store._dependents
        return [
            Edge(dependency, dependent, always)
            for dependency in ended
            for dependent, always in dependents.pop(dependency, ())
        ]

    async def count_down(self, dependent: str) -> tuple[Task, int] | None:
        store = self._store
        left = store._waiting.get(dependent, 1) - 1
        if left:
            store._waiting[dependent] = left
        else:
            store._waiting.pop(dependent, None)
        task = store._tasks.get(dependent)
        return None if task is None else (task, left)

    async def cancel_dependent(self, dependent: Task, error: str) -> Task:
        return self._store._write(
            _DEPENDENCY_CANCEL_PLAN.apply(
                dependent, self._at, error=error, cancel_reason=DEPENDENCY_CANCEL_REASON
            )
        )

    async def request_stop(self, ids: Sequence[str], reason: CancelReason) -> dict[str, Task]:
        store = self._store
        asked: dict[str, Task] = {}
        for task_id in ids:
            task = store._tasks.get(task_id)
            if task is not None and task.status is _RUNNING and task.cancel_reason is None:
                asked[task_id] = store._write(
                    task.evolve(cancel_reason=reason, updated_at=self._at)
                )
        return asked

    async def lock_active(self, ids: Sequence[str]) -> list[Active]:
        store = self._store
        found = [t for i in dict.fromkeys(ids) if (t := store._tasks.get(i)) and t.status.active]
        found.sort(key=lambda t: store._seq[t.id])
        return [
            Active(t.id, t.status, t.alias_of, t.worker_id, t.attempts, t.started_at) for t in found
        ]

    async def cancel_rows(self, ids: Sequence[str], reason: CancelReason) -> dict[str, Task]:
        store = self._store
        return {
            task_id: store._transition(
                store._tasks[task_id], _CANCEL_PLAN, self._now, self._at, {"cancel_reason": reason}
            )
            for task_id in ids
        }

    async def log_attempts(self, attempts: Sequence[Attempt]) -> None:
        for attempt in attempts:
            self._store._log_attempt(attempt)
