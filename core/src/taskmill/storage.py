"""The storage contract: the domain operations every backend implements.

:class:`TaskStorage` is not a SQL executor. Each method is one domain operation, atomic
on its own, and every state change is a conditional write: a transition applies only if
the task is still in the state (status, lease owner, attempt number) the caller saw.
That is what makes the same semantics hold on an in-process dict, on SQLite with several
worker processes, and on a database shared by many machines.

The executable definition of these guarantees is :mod:`taskmill.testing`; a backend
proves itself by subclassing its contract suite.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Self, TypeAlias

import attrs

from taskmill.errors import TaskmillError
from taskmill.limits import TypeLimit
from taskmill.model import (
    JSON,
    Attempt,
    AttemptOutcome,
    CancelReason,
    Progress,
    ProgressSummary,
    SuspensionScope,
    Task,
    TaskEvent,
    TaskFilter,
    TaskStatus,
)
from taskmill.validation import storable_error

HandlerKey: TypeAlias = tuple[str | None, str]
"""``(app_id, task_type)`` of a registered handler; ``app_id`` None serves every app that
has no handler of its own for that task type (SPEC 5.13)."""


def _tz_aware(instance: Any, attribute: attrs.Attribute[Any], value: datetime | None) -> None:
    if value is not None and value.tzinfo is None:
        raise ValueError(f"{attribute.name} must be a timezone-aware datetime, got {value!r}")


def utcnow() -> datetime:
    """The current time as a tz-aware UTC datetime."""
    return datetime.now(UTC)


def from_timestamp(seconds: float) -> datetime:
    """A tz-aware UTC datetime from POSIX seconds."""
    return datetime.fromtimestamp(seconds, UTC)


def wall_clock() -> float:
    """POSIX seconds; the clock the embedded backends use."""
    return time.time()


@attrs.frozen
class StorageCapabilities:
    """What a backend can do beyond the contract's core.

    The contract suite reads these: a test that needs a capability is marked with
    :func:`taskmill.testing.requires` and is skipped, naming the capability, on a backend
    that declares it lacks it; every other test runs everywhere. A backend declares what
    it lacks by setting a flag to False, and docs/backends.md lists each backend's gaps.
    """

    durable: bool = True
    """Tasks survive the process that wrote them: a store opened again on the same URL
    after :meth:`TaskStorage.close` holds everything that was committed."""
    shared_between_processes: bool = True
    """Several processes (and machines, for server databases) can use one store: two
    store objects built from the same URL are two views of the same tasks, and every
    guarantee (one claimant per task, one dedupe leader, stop requests, the event log)
    holds across them."""
    notifications: bool = False
    """The backend pushes 'new work' to idle workers instead of relying on polling:
    :meth:`TaskStorage.change_listener` returns a listener that a commit made through
    any store object wakes."""
    transactions_across_records: bool = True
    """An operation that writes several records (a batch enqueue, a leader's finish
    with the settlement of its aliases, a cascading cancel) commits them together: a
    reader through another store object sees all of them or none."""
    commit_ordered_cursors: bool = True
    """Event cursors (opaque tokens, ordered by ``<``) follow commit order across every
    store object: a reader polling :meth:`TaskStorage.read_events` while others write
    sees each event exactly once, never passing an event that commits later."""
    dependencies: bool = True
    """The store keeps task dependencies (:attr:`NewTask.after`, docs/dependencies.md):
    a dependent is claimed only once its dependencies completed, and is settled in the
    transaction that ends each of them. A store without it refuses ``after`` at enqueue
    (:class:`~taskmill.errors.InvalidTaskSpec`, nothing stored)."""
    global_limits: bool = True
    """Claims honour :attr:`ClaimRequest.limits` (global rate and concurrency limits,
    docs/rate-limits.md). A worker refuses to start with limited handlers on a store
    without it (:class:`~taskmill.errors.ConfigurationError`)."""
    handler_registrations: bool = False
    """The backend keeps :class:`HandlerRegistration` records (the ``*_handler_
    registration`` methods work)."""
    worker_registry: bool = False
    """The backend keeps the workers' registrations (:meth:`TaskStorage.put_worker`):
    every worker registers itself and heartbeats, so that ``tm.workers()``, ``taskmill
    workers`` and the dashboard list the live ones from any process."""
    delete_on_finish: bool = True
    """The store honours :attr:`Finish.delete` (docs/retention.md, "Delete on
    complete"): a task that a finish ends COMPLETED or FAILED is deleted in the same
    transaction with its settled aliases and execution logs, its last snapshot kept as a
    tombstone for as long as the event log keeps its events
    (:meth:`TaskStorage.deleted_task`). A worker refuses ``delete_completed`` and
    ``delete_failed`` on a store without it (:class:`~taskmill.errors.ConfigurationError`)."""
    max_value_bytes: int | None = None
    """The largest JSON value (a task's params or result, as UTF-8 JSON text) the store
    keeps in one task, when the store has a ceiling below what memory allows (MongoDB's
    document size, MySQL's ``max_allowed_packet``); a store may set it when it opens,
    from what its server reports. The core refuses larger params
    (:class:`~taskmill.errors.InvalidParams`) and fails a task whose result is larger,
    before the store sees them. None: no ceiling."""

    def lacking(self) -> tuple[str, ...]:
        """The names of the capabilities this backend declares it lacks, in field order."""
        return tuple(
            field.name for field in attrs.fields(type(self)) if getattr(self, field.name) is False
        )


class StoreChange(enum.Enum):
    """What a change notification is about (see :meth:`TaskStorage.change_listener`)."""

    WORK = "work"
    """Tasks became claimable: enqueued, retried, requeued, resumed."""
    CONTROL = "control"
    """A running task was cancelled or asked to stop (cancel, suspension)."""
    EVENTS = "events"
    """New entries in the event log."""


class ChangeListener(abc.ABC):
    """Push notifications of changes committed by any process sharing the store.

    Backends with a notification channel (PostgreSQL LISTEN/NOTIFY, MongoDB change
    streams) provide one; workers and ``tm.events`` then wake at once instead of waiting
    for their next poll. Notifications are hints: a listener may coalesce or (after a
    reconnect) miss some, so callers keep polling as a fallback at a slower pace.
    """

    @abc.abstractmethod
    async def wait(self, kinds: frozenset[StoreChange], timeout: float) -> bool:
        """Wait until a change of one of ``kinds`` is notified after this call began, or
        ``timeout`` seconds pass.

        :returns: True when notified, False on timeout.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop listening (idempotent)."""


class ChangeWaiters:
    """The waiting side of a :class:`ChangeListener`, for backends to build on: who
    waits for which kinds, and waking them. The listener calls :meth:`wake` for each
    change it hears (and for every kind after it may have missed some), and
    :meth:`close` when it closes.

    A waiter is registered before anything the wait needs is set up (``prepare``, such
    as subscribing to a channel), so a change reported while that runs is not lost.
    """

    def __init__(self) -> None:
        self._waiters: dict[StoreChange, set[asyncio.Future[None]]] = {
            kind: set() for kind in StoreChange
        }
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    async def wait(
        self,
        kinds: frozenset[StoreChange],
        timeout: float,
        prepare: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """Wait until :meth:`wake` names one of ``kinds`` after this call began, or
        ``timeout`` seconds pass; ``prepare`` runs first, once the waiter is registered.

        :returns: True when woken, False on timeout or once closed.
        """
        if self.closed:
            return False
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for kind in kinds:
            self._waiters[kind].add(woken)
        try:
            if prepare is not None:
                try:
                    await prepare()
                except Exception:
                    if self._closed_meanwhile():  # its connection went away with it
                        return False
                    raise
            await asyncio.wait([woken], timeout=max(0.0, timeout))
        finally:
            for kind in kinds:
                self._waiters[kind].discard(woken)
        return woken.done() and not woken.cancelled() and not self.closed

    def _closed_meanwhile(self) -> bool:
        # A call, so that the type checker does not carry the check made at the start
        # of wait() across its awaits.
        return self._closed

    def waiting(self, kind: StoreChange) -> int:
        """How many waits for ``kind`` are registered now."""
        return len(self._waiters[kind])

    def wake(self, kinds: Iterable[StoreChange]) -> None:
        """Wake every waiter for one of ``kinds``."""
        for kind in kinds:
            for woken in self._waiters[kind]:
                if not woken.done():
                    woken.set_result(None)

    def close(self) -> None:
        """Wake every waiter; from now on :meth:`wait` returns False at once."""
        self._closed = True
        self.wake(StoreChange)


@attrs.frozen
class NewTask:
    """A fully resolved task to insert; built by the core from a ``TaskSpec``."""

    id: str
    task_type: str
    params: dict[str, JSON]
    params_json: str
    """``params`` already serialized (and size-checked) by the core."""
    app_id: str | None
    priority: int
    max_retries: int
    run_at: datetime | None = None
    """When the task becomes due; None means now (the store's clock)."""
    dedupe_key: str | None = None
    parent_id: str | None = None
    user_id: str | None = None
    after: tuple[str, ...] = ()
    """Ids of stored tasks of the same app this one depends on (distinct; never with a
    ``dedupe_key``): see :meth:`TaskStorage.enqueue` and :mod:`taskmill.lifecycle`."""
    after_always: bool = False
    """Run once every dependency has ended, however it ended (``after_policy="always"``);
    False: a dependency that ends FAILED or CANCELLED cancels this task."""


@attrs.frozen
class ClaimRequest:
    """What a worker asks for in one claim."""

    worker_id: str
    handlers: Mapping[HandlerKey, int | None]
    """The handlers the worker has, each with the most tasks of its kind this claim may
    take (None: no cap beyond ``limit``). A task is matched to its app's own handler key
    if that is present, else to the host key ``(None, task_type)``."""
    limit: int
    lease_seconds: float
    min_priority: int | None = None
    """Only claim tasks at or above this priority (reserved high-priority slots)."""
    limits: Mapping[HandlerKey, TypeLimit] = attrs.field(factory=dict)
    """Global limits by handler key (rate and RUNNING count across every worker), which
    the store applies inside this claim; see :mod:`taskmill.limits`."""


@attrs.frozen
class Lease:
    """A worker's hold on a running task: the fencing token for every write it makes.

    ``attempt`` is the task's attempt count at claim time. A write fenced by a lease
    applies only while the task is RUNNING under the same worker id and attempt, so a
    worker that lost its lease can never overwrite what the next owner does.
    """

    task_id: str
    worker_id: str
    attempt: int

    def fence_args(self) -> tuple[str, str, int]:
        """This lease's values of the :data:`LEASE_FENCE` fields that come from it (all
        but the status), in that order: the parameters of a rendered fence."""
        return (self.task_id, self.worker_id, self.attempt)

    def holds(self, task_id: str, status: str, worker_id: str | None, attempts: int) -> bool:
        """Whether a task whose :data:`LEASE_FENCE` fields (status by stored value) hold
        these values is still held by this lease."""
        return (
            attempts == self.attempt
            and worker_id == self.worker_id
            and task_id == self.task_id
            and status == LEASED_STATUS
        )


LEASED_STATUS = TaskStatus.RUNNING.value
"""The status (by stored value) a task holds while a lease can hold it."""

LEASE_FENCE: tuple[tuple[str, str | None], ...] = (
    ("id", "task_id"),
    ("status", None),
    ("worker_id", "worker_id"),
    ("attempts", "attempt"),
)
"""The lease fence as data: the task fields a write under a :class:`Lease` is fenced by,
in order, each with the lease attribute it must equal (None: the status, which must be
:data:`LEASED_STATUS`). Every store fences with it: SQL stores render it with
:func:`taskmill.sql.rows.fence_clause` and bind :meth:`Lease.fence_args`, the others
compare with :meth:`Lease.holds`."""


class FinishKind(enum.Enum):
    """The transition a worker asks for when an attempt ends."""

    COMPLETE = "complete"
    """→ COMPLETED with ``result``; aliases take the same status and result."""
    RETRY = "retry"
    """→ PENDING, due ``retry_in`` seconds from now; the attempt stays counted."""
    FAIL = "fail"
    """→ FAILED (dead letter); aliases take the same status and error."""
    RELEASE = "release"
    """→ PENDING without spending the attempt (shutdown, suspension)."""
    CANCEL = "cancel"
    """→ CANCELLED with ``cancel_reason``."""


@attrs.frozen
class Finish:
    """The end of one attempt, as the worker reports it."""

    lease: Lease
    kind: FinishKind
    outcome: AttemptOutcome
    started_at: datetime
    finished_at: datetime
    result_json: str | None = None
    error: str | None = attrs.field(default=None, converter=storable_error)
    """Kept as every store can hold it (:func:`taskmill.validation.storable_error`)."""
    retry_in: float = 0.0
    cancel_reason: CancelReason | None = None
    data: dict[str, JSON] | None = None
    """The handler's runtime data, when it changed (None: leave as stored)."""
    progress: Progress | None = None
    """The last progress, when it changed (None: leave as stored)."""
    delete: bool = False
    """Delete the task if this finish ends it (COMPLETED or FAILED as applied, not a
    retry, a release or a cancel): the handler's ``delete_completed`` /
    ``delete_failed`` (docs/retention.md). Its aliases, settled by it, go with it; see
    :meth:`TaskStorage.finish_batch`."""


@attrs.frozen
class ProgressUpdate:
    """A coalesced progress/data write for a running task, fenced by its lease."""

    lease: Lease
    progress: Progress | None = None
    data: dict[str, JSON] | None = None


@attrs.frozen
class StoredWorker:
    """A worker's registration as a store keeps it (:meth:`TaskStorage.put_worker`)."""

    id: str
    heartbeat_at: datetime = attrs.field(validator=_tz_aware)
    """The store's clock at the last ``put_worker``."""
    record: str
    """The core's JSON text (:class:`taskmill.workers.WorkerRecord`)."""


@attrs.frozen
class HandlerRegistration:
    """A handler registered in the store instead of in code: a delegate at ``url`` runs
    the tasks of ``(app_id, task_type)``.

    Kept by the store so that every process sharing it, after any restart, serves the
    same registrations: the plugin that understands the URL (taskmill-http for
    ``http(s)://``) registers a proxy handler for each in its workers. The options are
    those of ``Taskmill.handler``.
    """

    task_type: str
    url: str
    app_id: str | None = None
    timeout: float | None = None
    max_retries: int | None = None
    concurrency: int | None = None
    updated_at: datetime | None = attrs.field(default=None, validator=_tz_aware)
    """When the store last wrote it (set by the store; ignored on the way in)."""

    @property
    def key(self) -> HandlerKey:
        """``(app_id, task_type)``."""
        return (self.app_id, self.task_type)


class TaskStorage(abc.ABC):
    """Abstract, domain-level task storage.

    Guarantees every implementation gives (and :mod:`taskmill.testing` checks):

    - Each method is atomic: it applies completely or not at all.
    - State changes are compare-and-set on (status, worker id, attempt): two writers
      racing for one transition cannot both win.
    - No task is ever held by two workers; a claim returns each task to one caller.
    - Methods raise :class:`~taskmill.errors.StorageUnavailable` when the store cannot
      be reached; nothing already stored is lost or half-written when they do.

    Implementations are found by URL scheme through the ``taskmill.backends`` entry-point
    group; the entry point names the class, and :meth:`from_url` builds it.
    """

    capabilities: ClassVar[StorageCapabilities] = StorageCapabilities()

    url: str

    async def change_listener(self) -> ChangeListener | None:
        """A listener for changes committed by any process, or None when the backend
        has no notification channel (``capabilities.notifications`` False) and callers
        must poll. Each call returns a new listener; the caller closes it.

        :raises StorageUnavailable: the notification channel cannot be opened.
        """
        return None

    # -- lifecycle ---------------------------------------------------------------

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Build a storage for ``url`` without connecting.

        :raises InvalidURL: the URL is malformed for this backend (the message shows the
            expected form) or an option is unknown.
        """

    @abc.abstractmethod
    async def open(self, *, auto_migrate: bool = False) -> None:
        """Connect and check the schema.

        An empty database gets the current schema. A database at an older schema
        version is migrated only when ``auto_migrate`` is true.

        :raises SchemaVersionError: the stored schema is older (and ``auto_migrate`` is
            false) or newer than this code; the message names the command to run.
        :raises StorageUnavailable: the database cannot be reached or opened.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections. Safe to call twice."""

    async def exists(self) -> bool:
        """Whether the store has been created (a database file, a schema with
        taskmill's tables), checked on a closed storage without creating or changing
        anything. Commands that only read use it to say there is no store there
        instead of creating an empty one.

        The default answers True (a backend that cannot tell lets :meth:`open` create
        the store); backends whose :meth:`open` creates something override it.

        :raises StorageUnavailable: the database cannot be reached to tell.
        """
        return True

    @abc.abstractmethod
    async def migrate(self) -> int:
        """Apply pending schema migrations; return the schema version now in place.

        Idempotent, and safe when several processes run it at once.

        :raises SchemaVersionError: the stored schema is newer than this code.
        """

    # -- writing tasks -----------------------------------------------------------

    @abc.abstractmethod
    async def enqueue(self, tasks: Sequence[NewTask]) -> list[Task]:
        """Insert tasks atomically (all or none), in one round trip where possible.

        Dedupe (SPEC 5.7): a task with a ``dedupe_key`` whose ``(app_id, task_type,
        dedupe_key)`` has an active (PENDING or RUNNING) leader is stored as an alias
        of that leader (``alias_of`` set, status PENDING, never claimed). This is
        decided by the store atomically, so concurrent enqueues from many processes
        yield exactly one leader. Within one call, the first task with a key leads.

        Duplicate ids (one rule on every backend,
        :func:`taskmill.lifecycle.split_taken`): a task whose ``id`` is already stored
        with the same ``task_type``, ``app_id`` and ``params`` is not inserted again;
        its slot in the result is the stored snapshot, unchanged, whatever its status,
        with no event and no dedupe decision. The same holds for a repeated id within
        one call (the first one is inserted). An id stored (or given earlier in the
        call) for a different type, app or params raises
        :class:`~taskmill.errors.DuplicateTaskId` and the call stores nothing. The store
        decides this atomically: concurrent enqueues of one id from many processes
        insert it once and all return that task. (A task removed by :meth:`cleanup`
        is no longer stored, so its id can be inserted again.)

        Dependencies (``after``, docs/dependencies.md): each id must name a task already
        stored, of the same ``app_id``. The store keeps one edge per dependency and, on
        the task, the number of dependencies not yet ended; a task with a non-zero
        number is never claimed (nor counted by :meth:`next_run_at`). A dependency that
        has already ended is resolved at once (:func:`taskmill.lifecycle.
        dependency_blocks`): COMPLETED, or any end with ``after_always``, counts as
        done; otherwise the task is stored CANCELLED (reason PREEMPTED, an error naming
        the dependency). Reading a dependency's status and writing the edge happen under
        a lock that the dependency's own finish takes, so no release is lost to a
        dependency that ends while its dependent is being enqueued. Every later end of
        a dependency (finish, rescue, cancel, alias settlement) settles its dependents
        in the same transaction (:func:`taskmill.lifecycle.dependency_settles`).

        :raises InvalidTaskSpec: a dependency does not exist or belongs to another app
            (the message names it); nothing is stored.
        :returns: the stored snapshots, in the order given.
        :raises DuplicateTaskId: an id is taken by a different task.
        """

    @abc.abstractmethod
    async def claim_batch(self, request: ClaimRequest) -> list[Task]:
        """Atomically move up to ``request.limit`` due PENDING tasks to RUNNING.

        Only leaders (never aliases) of types in ``request.handlers`` whose ``run_at``
        has come, at or above ``min_priority``, ordered by priority DESC then creation
        ASC, honouring each handler's cap. Each claimed task gets ``attempts + 1``,
        ``worker_id``, ``started_at`` = now and ``lease_expires_at`` = now +
        ``lease_seconds``. A task is returned to exactly one caller, however many store
        objects and processes claim at once.

        A claim that races a suspension (it read the suspensions before another process
        committed one that covers a task it then claimed) may still return that task:
        the task is then reported SUSPENDED by the next :meth:`watch_leases` or
        :meth:`renew_leases` of its worker, exactly as if it had been running when the
        suspension was stored, so its worker releases it.

        :returns: the claimed snapshots in claim order.
        """

    @abc.abstractmethod
    async def finish_batch(self, finishes: Sequence[Finish]) -> list[Task | None]:
        """Apply the end of many attempts in one call, each fenced by its lease.

        For each finish whose lease still holds, the task moves as its ``kind`` says,
        the lease is cleared, ``data``/``progress`` are saved when given, and one row is
        appended to the execution log. A non-terminal interruption requested while
        the handler ran (SUSPENDED, SHUTDOWN) turns a RETRY or FAIL into a RELEASE. A
        terminal cancel (USER, PREEMPTED) already made the task CANCELLED when it was
        requested, so the lease no longer holds and the finish changes nothing: a task
        cancelled while its handler was finishing stays CANCELLED. When a leader
        reaches a terminal status, its aliases take that status, result and error in
        the same transaction.

        A finish with ``delete`` that ends its task (COMPLETED or FAILED) then, in the
        same transaction and after the task's aliases and dependents are settled,
        deletes the task, the aliases it settled, and their execution logs (the attempt
        being finished is not logged). Their events are appended as for any finish;
        each deleted task's last snapshot is kept as a tombstone for
        :meth:`read_events` and :meth:`deleted_task` until :meth:`prune_events`
        removes events of its age. :meth:`get`, :meth:`query`, :meth:`summary` and
        :meth:`attempts` no longer see it. (Capability ``delete_on_finish``.)

        :returns: per finish, in order, the new snapshot, or None when the lease was
            lost (the task was rescued or re-claimed); such finishes change nothing.
        """

    async def finish_batch_applied(self, finishes: Sequence[Finish]) -> list[bool]:
        """:meth:`finish_batch` for a caller that needs no snapshots (a worker that no
        plugin observes): the same changes, and per finish, in order, whether it was
        applied (its lease held). A store may make this cheaper by not building the
        snapshots; by default it calls :meth:`finish_batch`."""
        return [stored is not None for stored in await self.finish_batch(finishes)]

    @abc.abstractmethod
    async def renew_leases(
        self, leases: Sequence[Lease], lease_seconds: float
    ) -> dict[str, CancelReason | None]:
        """Extend the leases that still hold to now + ``lease_seconds``.

        :returns: for each task whose lease still holds, the cancel reason requested for
            it while it runs (None when none): the worker interrupts those. A task
            running in a suspended scope is reported SUSPENDED even when no stop request
            was recorded for it (its claim raced the suspension). A task missing from
            the result is no longer this worker's: it must stop writing.
        """

    @abc.abstractmethod
    async def save_progress(self, updates: Sequence[ProgressUpdate]) -> set[str]:
        """Store progress and runtime data of running tasks, each fenced by its lease.

        :returns: the ids whose lease still held (and were written).
        """

    @abc.abstractmethod
    async def rescue_expired(self, *, limit: int = 1000) -> list[Task]:
        """Take back RUNNING tasks whose lease has expired (their worker died or hung).

        Each goes back to PENDING due now with the attempt counted and error "lease
        expired", or to FAILED when it has no retries left; a pending cancel request is
        honoured instead (terminal → CANCELLED, else PENDING without spending the
        attempt). One LOST row is appended to its execution log. Safe to run from every
        worker at once: each expired task is rescued once.

        :returns: the rescued snapshots.
        """

    @abc.abstractmethod
    async def retry(self, task_id: str) -> Task:
        """Redrive a FAILED or CANCELLED task: back to PENDING, due now, with a fresh
        attempt budget (``attempts`` = 0); result, error and cancel reason are cleared.
        The execution log is kept. A redriven task with a ``dedupe_key`` leads its key
        again: later enqueues with that key become its aliases.

        Two redrives are refused, because they would break dedupe (SPEC 5.7):

        - an alias: it only ever takes its leader's outcome; retry the leader, or enqueue
          anew;
        - a task whose ``(app_id, task_type, dedupe_key)`` has another active (PENDING or
          RUNNING) leader by now: two leaders would hold one key.

        :raises TaskNotFound: no such task.
        :raises InvalidTransition: the task is not FAILED or CANCELLED (the message names
            its status), is an alias (the message says "alias" and names the leader), or
            its dedupe key is held by another active leader (the message says "already
            active" and names it). Nothing is changed.
        """

    # -- reading -----------------------------------------------------------------

    @abc.abstractmethod
    async def get(self, task_id: str) -> Task | None:
        """The current snapshot of one task, or None."""

    async def deleted_task(self, task_id: str) -> Task | None:
        """The last snapshot of a task that a finish with :attr:`Finish.delete`
        deleted (its tombstone), while the event log keeps events of its age; None for
        any other id (capability ``delete_on_finish``; a store without it: always
        None)."""
        return None

    @abc.abstractmethod
    async def query(
        self,
        filter: TaskFilter,
        *,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        after: str | None = None,
    ) -> list[Task]:
        """Tasks selected by ``filter``, ordered by creation (oldest first unless
        ``newest_first``), at most ``limit`` of them after skipping ``offset``.

        The order is the store's insertion order, which is total: two tasks created at
        the same instant still have a fixed place. ``after`` (a task id) starts the list
        right after that task's place in this order, whatever the filter: keyset pages
        (pass the last id of a page) that cost no scan of the rows before them and do
        not shift while tasks are added. A task that does not exist (any more) selects
        nothing."""

    @abc.abstractmethod
    async def summary(self, filter: TaskFilter) -> ProgressSummary:
        """Counts by status of the tasks selected by ``filter``, computed by the store
        without loading tasks into Python."""

    @abc.abstractmethod
    async def attempts(self, task_id: str) -> list[Attempt]:
        """The execution log of one task, oldest first (empty for an unknown id)."""

    @abc.abstractmethod
    async def next_run_at(self, handlers: Sequence[HandlerKey]) -> datetime | None:
        """The earliest ``run_at`` of a claimable PENDING task for ``handlers`` (due or
        not), or None when there is none. Workers use it to sleep until work is due."""

    # -- retention ---------------------------------------------------------------

    @abc.abstractmethod
    async def cleanup(
        self,
        older_than: timedelta,
        *,
        statuses: frozenset[TaskStatus] = frozenset({TaskStatus.COMPLETED, TaskStatus.CANCELLED}),
    ) -> int:
        """Delete tasks in ``statuses`` (terminal ones only) that finished more than
        ``older_than`` ago, with their execution logs.

        :raises ValueError: ``statuses`` includes an active status.
        :returns: how many tasks were deleted.
        """

    # -- control (SPEC 5.6, 5.10, 5.11) ------------------------------------------

    @abc.abstractmethod
    async def cancel(
        self,
        *,
        task_ids: Sequence[str] | None = None,
        filter: TaskFilter | None = None,
        reason: CancelReason = CancelReason.USER,
        cascade: bool = True,
    ) -> list[Task]:
        """Interrupt the active tasks selected by ``task_ids`` and/or ``filter``.

        A terminal ``reason`` (USER, PREEMPTED) makes each selected PENDING or RUNNING
        task CANCELLED at once, with ``cancel_reason`` and ``finished_at`` set and the
        lease cleared; a running task's attempt is logged as CANCELLED, and its worker
        learns of it through :meth:`watch_leases`/:meth:`renew_leases` (the task is no
        longer held) and cannot overwrite it. A non-terminal reason (SUSPENDED,
        SHUTDOWN) leaves PENDING tasks alone and records the request on RUNNING ones,
        whose worker then releases them without spending the attempt.

        When a leader is cancelled its aliases are cancelled with it (they always take
        their leader's terminal status); cancelling an alias touches only the alias.
        ``cascade`` extends the selection to the active descendants (``parent_id``) of
        every selected task. Terminal tasks are never changed. Dedupe keys of cancelled
        leaders are free again at once.

        :raises ValueError: neither ``task_ids`` nor ``filter`` was given.
        :returns: every task whose state changed (including cascaded ones and aliases).
        """

    @abc.abstractmethod
    async def watch_leases(self, leases: Sequence[Lease]) -> dict[str, CancelReason | None]:
        """Like :meth:`renew_leases` without extending anything: a cheap read a worker
        makes often to learn of cancellations and suspensions of its running tasks.

        :returns: for each lease that still holds, the stop request recorded for the
            task (None when none), SUSPENDED for a task in a suspended scope whose claim
            raced the suspension (as :meth:`renew_leases`). A task missing from the
            result is no longer held.
        """

    @abc.abstractmethod
    async def suspend(self, scope: SuspensionScope) -> int:
        """Store a suspension (idempotent). From then on no task in ``scope`` is
        claimed, by any worker; running tasks in scope get a SUSPENDED stop request.

        :returns: how many running tasks were asked to stop.
        """

    @abc.abstractmethod
    async def resume(self, scope: SuspensionScope) -> bool:
        """Remove exactly this suspension (not narrower or wider ones).

        :returns: whether it existed.
        """

    @abc.abstractmethod
    async def suspensions(self) -> list[SuspensionScope]:
        """The stored suspensions."""

    @abc.abstractmethod
    async def read_events(
        self, after: str | None, *, limit: int = 1000
    ) -> tuple[list[TaskEvent], str]:
        """Events recorded after cursor ``after``, oldest first, at most ``limit``.

        Every state change (enqueue, claim, progress, each finish kind, rescue, cancel,
        stop request, redrive) appends an event in the same transaction as the change,
        so a reader never sees a change without its event. ``after`` None reads nothing
        and returns the current cursor: the point a new subscriber starts from. Events
        of a task deleted by its finish (:attr:`Finish.delete`) carry its tombstone,
        the last snapshot, as ``event.task``; events of tasks deleted otherwise
        (:meth:`cleanup`) are skipped.

        A cursor is an opaque token the store writes, a store can use what it has:

        - it is a non-empty ``str`` without ``"."`` (taskmill-http joins it with its
          own sequence into an SSE id ``T.L``);
        - tokens of one store compare with ``<`` in commit order: an event's
          ``TaskEvent.cursor`` is greater than the cursor of every event committed
          before it, and the returned cursor is never less than ``after``. Callers
          compare tokens only that way, never as numbers;
        - a store whose positions are integers writes them with
          :func:`taskmill.cursors.position_token` (fixed width, so string order is
          numeric order) instead of an encoding of its own.

        :returns: the events and the cursor to pass next time.
        :raises InvalidCursor: ``after`` is not a token this store wrote (checked
            whatever ``limit`` is, so ``limit=0`` validates a token).
        """

    @abc.abstractmethod
    async def prune_events(self, older_than: timedelta) -> int:
        """Delete events recorded more than ``older_than`` ago, and the tombstones of
        tasks deleted that long ago (:attr:`Finish.delete`); returns how many events."""

    # -- worker registry (capability ``worker_registry``) ----------------------------

    async def put_worker(self, worker_id: str, record: str) -> None:
        """Store (or replace) the registration of worker ``worker_id``: ``record`` is
        the core's JSON text of it (opaque to the store, at most 64 KiB), and its
        heartbeat is the store's clock now.

        :raises TaskmillError: the backend keeps no worker registry
            (``capabilities.worker_registry`` is False).
        """
        raise self._no_worker_registry()

    async def workers(self) -> list[StoredWorker]:
        """Every stored worker registration, by worker id.

        :raises TaskmillError: the backend keeps no worker registry.
        """
        raise self._no_worker_registry()

    async def remove_worker(self, worker_id: str) -> bool:
        """Delete the registration of ``worker_id``; whether there was one.

        :raises TaskmillError: the backend keeps no worker registry.
        """
        raise self._no_worker_registry()

    async def prune_workers(self, older_than: timedelta) -> int:
        """Delete the registrations whose last heartbeat is more than ``older_than``
        ago (by the store's clock); how many.

        :raises TaskmillError: the backend keeps no worker registry.
        """
        raise self._no_worker_registry()

    def _no_worker_registry(self) -> TaskmillError:
        return TaskmillError(
            f"{type(self).__name__} keeps no worker registry (capabilities.worker_registry"
            " is False): workers run, but no process can list them"
        )

    # -- handler registrations (capability ``handler_registrations``) -----------------

    async def put_handler_registration(
        self, registration: HandlerRegistration
    ) -> HandlerRegistration:
        """Store ``registration``, replacing the one of the same ``(app_id,
        task_type)``; atomic, so concurrent writers leave exactly one of theirs.

        :returns: the stored record, ``updated_at`` set to the store's clock.
        :raises TaskmillError: the backend does not keep registrations
            (``capabilities.handler_registrations`` is False).
        """
        raise self._no_registrations()

    async def delete_handler_registration(self, app_id: str | None, task_type: str) -> bool:
        """Delete the registration of ``(app_id, task_type)``; whether there was one.

        :raises TaskmillError: the backend does not keep registrations.
        """
        raise self._no_registrations()

    async def handler_registrations(self) -> list[HandlerRegistration]:
        """Every stored registration, sorted by (app id, host's first; task type).

        :raises TaskmillError: the backend does not keep registrations.
        """
        raise self._no_registrations()

    def _no_registrations(self) -> TaskmillError:
        return TaskmillError(
            f"the {type(self).__name__} backend does not keep handler registrations; "
            "register handlers in code, or use a backend that keeps them"
        )
