"""The lifecycle kernel: every rule about how a task moves, written once, as data.

Backends do not re-derive these rules. The memory store interprets them
(:func:`plan`, :func:`settle_alias`); SQL stores generate their
``SET`` / ``CASE`` clauses from them once, when their statements are built (see
:mod:`taskmill.sql.lifecycle`), so the hot path pays nothing for the indirection.

The rules:

- **Finishes** (:data:`FINISHES`): what each :class:`~taskmill.storage.FinishKind` does
  to the stored task: its new status, whether the attempt is given back, which fields
  it writes, the event it emits and the outcome logged for the attempt.
- **The retry budget** (:func:`has_retry_budget`): a task may start ``max_retries + 1``
  attempts; the worker turns a RETRY without budget into a FAIL (:func:`attempt_kind`),
  and :func:`decide_retry` says how long a retry waits and what a give-up's error says.
- **The stop request** (:func:`finish_kind`): a RETRY or FAIL of a task asked to stop
  (SUSPENDED, SHUTDOWN) is a RELEASE; storage applies this against the stored row.
- **Rescue** (:data:`RESCUES`, :func:`rescue_case`): what an expired lease becomes.
- **Cancellation** (:data:`CANCELLATION`): a terminal ``cancel()`` of an active task.
- **Aliases** (:data:`ALIAS_FIELDS`, :func:`settles_aliases`): a dedupe leader that
  reaches a terminal status gives every alias still PENDING its status, result, error
  and cancel reason, and the event of that status.
- **Redrive** (:func:`check_redrive`, :func:`key_taken`): ``retry()`` takes a FAILED
  or CANCELLED leader back to PENDING, never an alias, never while another leader holds
  its dedupe key.
- **Dependencies** (:func:`dependency_blocks`, :func:`dependency_settles`,
  :data:`DEPENDENCY_CANCELLATION`): a task enqueued with ``after=`` counts its
  dependencies not yet ended and is claimed only at zero. Each dependency that ends
  resolves its edge once: COMPLETED (or any end, with ``after_policy="always"``) takes
  one off the count, and the last one RELEASES the task; any other end CANCELS a task
  still PENDING, with an error naming the dependency, which in turn settles its own
  dependents. A dependency's redrive never reopens a resolved edge.

:data:`FINISH_TABLE` enumerates finish kind by stop request by retry budget with the
transition each combination ends in; the shipped suite
(:class:`taskmill.testing.lifecycle.LifecycleContract`) walks every row on every backend.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeAlias

import attrs

from taskmill.errors import DuplicateTaskId, InvalidTaskSpec, InvalidTransition
from taskmill.model import (
    NO_PROGRESS,
    AttemptOutcome,
    CancelReason,
    EventKind,
    Task,
    TaskStatus,
    task_from_values,
)
from taskmill.serialization import loads
from taskmill.storage import Finish, FinishKind, NewTask

__all__ = [
    "ALIAS_FIELDS",
    "CANCELLATION",
    "DEFAULT_CANCEL_REASON",
    "DEPENDENCY_CANCELLATION",
    "DEPENDENCY_CANCEL_REASON",
    "FINISHES",
    "FINISH_TABLE",
    "REDRIVE_EVENT",
    "RELEASED_ON_STOP",
    "RESCUES",
    "RESCUE_ERROR",
    "TERMINAL_EVENTS",
    "ChildrenOf",
    "DependentOutcome",
    "FinishRow",
    "RescueCase",
    "RetryDecision",
    "RunAt",
    "Transition",
    "TransitionPlan",
    "Write",
    "attempt_kind",
    "cancel_error",
    "cancel_targets",
    "check_redrive",
    "decide_retry",
    "dependency_blocks",
    "dependency_error",
    "dependency_settles",
    "enqueued",
    "existing_task",
    "finish_kind",
    "finish_rounds",
    "has_retry_budget",
    "key_taken",
    "plan",
    "rescue_case",
    "settle_alias",
    "settles_aliases",
    "split_taken",
    "unknown_dependency",
]


class Write(enum.Enum):
    """What a transition does to one stored field."""

    KEEP = "keep"
    """Leave it as stored."""
    SET = "set"
    """Write the value the transition brings (the finish's, or the rescue's)."""
    CLEAR = "clear"
    """Write NULL."""


class RunAt(enum.Enum):
    """When a requeued task is due again."""

    KEEP = "keep"
    NOW = "now"
    LATER = "later"
    """Now plus the finish's ``retry_in`` (the backoff the worker chose)."""


@attrs.frozen
class Transition:
    """One way out of RUNNING: the new stored state, its event and the attempt's log.

    ``progress`` and ``finished_at`` follow from ``status``: a requeued task (PENDING)
    starts its next attempt with no progress, a terminal one keeps the attempt's last
    progress and gets ``finished_at`` = now. Every transition clears the lease
    (``worker_id``, ``lease_expires_at``) and sets ``updated_at`` = now.
    """

    status: TaskStatus
    event: EventKind
    gives_back_attempt: bool
    """True: ``attempts`` goes down by one (the attempt is not spent)."""
    run_at: RunAt
    result: Write
    error: Write
    cancel_reason: Write
    outcome: AttemptOutcome | None
    """The execution-log outcome; None: the one the worker reported."""

    @property
    def requeues(self) -> bool:
        """True when the task goes back to PENDING (its progress is reset)."""
        return self.status is TaskStatus.PENDING

    @property
    def terminal(self) -> bool:
        """True when the task ends: ``finished_at`` is set and its aliases settle."""
        return self.status.terminal


FINISHES: Final[Mapping[FinishKind, Transition]] = {
    FinishKind.COMPLETE: Transition(
        status=TaskStatus.COMPLETED,
        event=EventKind.COMPLETED,
        gives_back_attempt=False,
        run_at=RunAt.KEEP,
        result=Write.SET,
        error=Write.CLEAR,
        cancel_reason=Write.CLEAR,
        outcome=None,
    ),
    FinishKind.RETRY: Transition(
        status=TaskStatus.PENDING,
        event=EventKind.RETRYING,
        gives_back_attempt=False,
        run_at=RunAt.LATER,
        result=Write.KEEP,
        error=Write.SET,
        cancel_reason=Write.KEEP,
        outcome=None,
    ),
    FinishKind.FAIL: Transition(
        status=TaskStatus.FAILED,
        event=EventKind.FAILED,
        gives_back_attempt=False,
        run_at=RunAt.KEEP,
        result=Write.KEEP,
        error=Write.SET,
        cancel_reason=Write.KEEP,
        outcome=None,
    ),
    FinishKind.RELEASE: Transition(
        status=TaskStatus.PENDING,
        event=EventKind.REQUEUED,
        gives_back_attempt=True,
        run_at=RunAt.NOW,
        result=Write.KEEP,
        error=Write.KEEP,
        cancel_reason=Write.CLEAR,
        outcome=AttemptOutcome.INTERRUPTED,
    ),
    FinishKind.CANCEL: Transition(
        status=TaskStatus.CANCELLED,
        event=EventKind.CANCELLED,
        gives_back_attempt=False,
        run_at=RunAt.KEEP,
        result=Write.KEEP,
        error=Write.SET,
        cancel_reason=Write.SET,
        outcome=None,
    ),
}
"""What each finish kind does to a task whose lease still holds. A CANCEL without a
reason writes :data:`DEFAULT_CANCEL_REASON`."""

DEFAULT_CANCEL_REASON: Final = CancelReason.USER
"""The reason a CANCEL finish writes when the worker gave none."""

RELEASED_ON_STOP: Final = frozenset({FinishKind.RETRY, FinishKind.FAIL})
"""The finish kinds that become RELEASE when the task has a stop request."""


def has_retry_budget(attempts: int, max_retries: int) -> bool:
    """True when a task that has started ``attempts`` attempts may start another:
    never more than ``max_retries + 1`` in all."""
    return attempts < max_retries + 1


def attempt_kind(requested: FinishKind, *, attempts: int, max_retries: int) -> FinishKind:
    """The finish a worker reports for an attempt that asked for ``requested``: a
    RETRY without retry budget left is a FAIL (the dead letter)."""
    if requested is FinishKind.RETRY and not has_retry_budget(attempts, max_retries):
        return FinishKind.FAIL
    return requested


@attrs.frozen
class RetryDecision:
    """How an attempt that asked for another one ends (:func:`decide_retry`)."""

    kind: FinishKind
    """RETRY, or FAIL when the retry budget is spent."""
    error: str
    """The attempt's error; a give-up's ends in ``" (gave up after N attempts)"``."""
    retry_in: float
    """Seconds until the retry is due (0 for a give-up)."""


def decide_retry(
    error: str,
    *,
    attempts: int,
    max_retries: int,
    delay: float | None,
    backoff: Callable[[int], float],
) -> RetryDecision:
    """The end of attempt number ``attempts`` that asked for a retry (a handler's
    error or timeout, ``Retry``, a detached owner's report): while the task has retry
    budget (:func:`attempt_kind`), RETRY after ``delay`` seconds, or ``backoff(attempts)``
    when it named none; without, FAIL with ``error`` saying it gave up."""
    kind = attempt_kind(FinishKind.RETRY, attempts=attempts, max_retries=max_retries)
    if kind is FinishKind.FAIL:
        return RetryDecision(kind, f"{error} (gave up after {attempts} attempts)", 0.0)
    return RetryDecision(kind, error, backoff(attempts) if delay is None else delay)


def finish_kind(requested: FinishKind, *, stop_requested: bool) -> FinishKind:
    """The finish storage applies for ``requested`` on a task that does (or does not)
    carry a stop request: a RETRY or FAIL of a task asked to stop is a RELEASE (the
    attempt was interrupted, whatever error it turned that into)."""
    if stop_requested and requested in RELEASED_ON_STOP:
        return FinishKind.RELEASE
    return requested


_NO_RESULT: Final = (None, "null")  # most handlers return None: skip parsing it


def finish_values(finish: Finish, kind: FinishKind, now: datetime) -> dict[str, Any]:
    """What a finish applied as ``kind`` (:func:`finish_kind`'s) at ``now`` gives
    :meth:`TransitionPlan.apply` for a store that keeps snapshots: its error and cancel
    reason, its data and progress when it carries them, the result of a COMPLETE and the
    due time of a RETRY."""
    values: dict[str, Any] = {
        "error": finish.error,
        "cancel_reason": finish.cancel_reason or DEFAULT_CANCEL_REASON,
    }
    if finish.data is not None:
        values["data"] = finish.data
    if finish.progress is not None:
        values["progress"] = finish.progress
    if kind is FinishKind.COMPLETE:
        result_json = finish.result_json
        values["result"] = None if result_json in _NO_RESULT else loads(result_json)
    elif kind is FinishKind.RETRY:
        values["run_later"] = now + timedelta(seconds=finish.retry_in)
    return values


@attrs.frozen
class FinishRow:
    """One row of :data:`FINISH_TABLE`."""

    requested: FinishKind
    """What the handler's end asked for."""
    stop_requested: bool
    """Whether the stored task carries a non-terminal stop request."""
    budget_left: bool
    """Whether the attempt being finished leaves retry budget."""
    applied: FinishKind
    """What storage applies."""

    @property
    def transition(self) -> Transition:
        """What the applied finish does."""
        return FINISHES[self.applied]


def _finish_table() -> tuple[FinishRow, ...]:
    rows: list[FinishRow] = []
    for requested in FinishKind:
        for stop_requested in (False, True):
            for budget_left in (True, False):
                kind = attempt_kind(requested, attempts=1, max_retries=1 if budget_left else 0)
                applied = finish_kind(kind, stop_requested=stop_requested)
                rows.append(FinishRow(requested, stop_requested, budget_left, applied))
    return tuple(rows)


FINISH_TABLE: Final = _finish_table()
"""Finish kind by stop request by retry budget → the finish applied (and so its
:class:`Transition`), every combination."""


class RescueCase(enum.Enum):
    """What an expired lease's task becomes, by its stop request and retry budget."""

    CANCEL = "cancel"
    """A terminal cancel was requested: CANCELLED, with the requested reason."""
    RELEASE = "release"
    """A stop (suspension, shutdown) was requested: PENDING, the attempt given back."""
    RETRY = "retry"
    """No request, budget left: PENDING now, the attempt counted."""
    GIVE_UP = "give_up"
    """No request, no budget: FAILED."""


CANCELLATION: Final = Transition(
    status=TaskStatus.CANCELLED,
    event=EventKind.CANCELLED,
    gives_back_attempt=False,
    run_at=RunAt.KEEP,
    result=Write.KEEP,
    error=Write.KEEP,
    cancel_reason=Write.SET,
    outcome=AttemptOutcome.CANCELLED,
)
"""``cancel()`` with a terminal reason (USER, PREEMPTED) of an active task, PENDING or
RUNNING: CANCELLED at once with that reason. A RUNNING task's attempt is logged
CANCELLED with the error ``cancelled (<reason>)`` (:func:`cancel_error`); its worker
finds its lease gone."""


def cancel_error(reason: CancelReason) -> str:
    """The error logged for an attempt cancelled for ``reason``."""
    return f"cancelled ({reason.value})"


RESCUE_ERROR: Final = "lease expired"
"""The error a rescue writes (and logs for the LOST attempt)."""

_RESCUED_AS: Final[Mapping[RescueCase, Transition]] = {
    # A requested terminal cancel, honoured: the reason and error stay as requested.
    RescueCase.CANCEL: attrs.evolve(CANCELLATION, cancel_reason=Write.KEEP),
    RescueCase.RELEASE: FINISHES[FinishKind.RELEASE],
    # A retry due now, not after a backoff, and told apart from a handler's failure.
    RescueCase.RETRY: attrs.evolve(
        FINISHES[FinishKind.RETRY], event=EventKind.REQUEUED, run_at=RunAt.NOW
    ),
    RescueCase.GIVE_UP: FINISHES[FinishKind.FAIL],
}
RESCUES: Final[Mapping[RescueCase, Transition]] = {
    case: attrs.evolve(t, outcome=AttemptOutcome.LOST) for case, t in _RESCUED_AS.items()
}
"""What a rescue does in each case; ``Write.SET`` of the error writes
:data:`RESCUE_ERROR`."""


def rescue_case(cancel_reason: CancelReason | None, attempts: int, max_retries: int) -> RescueCase:
    """The rescue of a RUNNING task whose lease expired, from its stored stop request
    and retry budget."""
    if cancel_reason is not None:
        return RescueCase.CANCEL if cancel_reason.terminal else RescueCase.RELEASE
    if has_retry_budget(attempts, max_retries):
        return RescueCase.RETRY
    return RescueCase.GIVE_UP


TERMINAL_EVENTS: Final[Mapping[TaskStatus, EventKind]] = {
    TaskStatus.COMPLETED: EventKind.COMPLETED,
    TaskStatus.FAILED: EventKind.FAILED,
    TaskStatus.CANCELLED: EventKind.CANCELLED,
}
"""The event of a task (leader or alias) reaching each terminal status."""

ALIAS_FIELDS: Final = ("status", "result", "error", "cancel_reason")
"""What a settled alias copies from its terminal leader (it also gets ``finished_at``
and ``updated_at`` = now)."""


def settles_aliases(status: TaskStatus, dedupe_key: str | None, alias_of: str | None) -> bool:
    """True when a task in ``status`` settles its aliases: a dedupe leader (a key, not
    itself an alias) that is terminal. Only aliases still PENDING are settled."""
    return dedupe_key is not None and alias_of is None and status.terminal


def settle_alias(alias: Task, leader: Task, now: datetime) -> Task:
    """``alias`` settled by its terminal ``leader`` (see :data:`ALIAS_FIELDS`)."""
    copied: dict[str, Any] = {name: getattr(leader, name) for name in ALIAS_FIELDS}
    return alias.evolve(finished_at=now, updated_at=now, **copied)


@attrs.frozen
class TransitionPlan:
    """A transition digested once for stores that keep snapshots: :meth:`apply` does
    no enum tests and no lookups per task (see :func:`plan`)."""

    transition: Transition
    requeues: bool
    terminal: bool
    _constant: dict[str, Any]
    _set_result: bool
    _set_error: bool
    _set_reason: bool
    _run_at: RunAt
    _gives_back: bool

    def apply(
        self,
        task: Task,
        now: datetime,
        *,
        run_later: datetime | None = None,
        result: Any = None,
        error: str | None = None,
        cancel_reason: CancelReason | None = None,
        **changes: Any,
    ) -> Task:
        """``task`` after the transition at ``now``.

        The values are those a ``Write.SET`` field takes (``run_later`` for
        ``RunAt.LATER``); ``changes`` are written as well (the finish's data and
        progress, which a requeue then resets).
        """
        values = changes
        values.update(self._constant)
        if self._set_result:
            values["result"] = result
        if self._set_error:
            values["error"] = error
        if self._set_reason:
            values["cancel_reason"] = cancel_reason
        if self._run_at is not _KEEP_RUN_AT:
            values["run_at"] = now if self._run_at is _RUN_NOW else (run_later or now)
        if self.terminal:
            values["finished_at"] = now
        if self._gives_back:
            values["attempts"] = task.attempts - 1
        values["updated_at"] = now
        return task.evolve(**values)


_KEEP_RUN_AT: Final = RunAt.KEEP
_RUN_NOW: Final = RunAt.NOW


def plan(transition: Transition) -> TransitionPlan:
    """``transition`` digested for :meth:`TransitionPlan.apply`; build it once."""
    constant: dict[str, Any] = {
        "status": transition.status,
        "worker_id": None,
        "lease_expires_at": None,
    }
    for name, write in (
        ("result", transition.result),
        ("error", transition.error),
        ("cancel_reason", transition.cancel_reason),
    ):
        if write is Write.CLEAR:
            constant[name] = None
    if not transition.terminal:
        constant["progress"] = NO_PROGRESS  # the next attempt starts from nothing
    return TransitionPlan(
        transition=transition,
        requeues=transition.requeues,
        terminal=transition.terminal,
        constant=constant,
        set_result=transition.result is Write.SET,
        set_error=transition.error is Write.SET,
        set_reason=transition.cancel_reason is Write.SET,
        run_at=transition.run_at,
        gives_back=transition.gives_back_attempt,
    )


REDRIVE_EVENT: Final = EventKind.REQUEUED
"""The event of a redrive: back to PENDING with a fresh retry budget."""


def existing_task(new: NewTask, stored: Task) -> Task:
    """The one rule for an enqueue whose task id is already stored (or earlier in the
    same call): when ``stored`` has the same ``task_type``, ``app_id`` and ``params``,
    the enqueue of ``new`` is a no-op that returns ``stored`` unchanged (whatever its
    status; no event, no dedupe decision); otherwise it raises, and the whole call
    stores nothing.

    This is what makes deterministic ids (periodic fires) exactly-once across
    processes: the store, not the caller, decides which insert wins.

    :raises DuplicateTaskId: the id is taken by a different task.
    """
    if (
        stored.task_type != new.task_type
        or stored.app_id != new.app_id
        or stored.params != loads(new.params_json)
    ):
        raise DuplicateTaskId(
            f"task id {new.id!r} is already stored as a {stored.task_type!r} task"
            f" (app {stored.app_id!r}) with other params; give the new task its own"
            " id, or leave id unset to get a fresh one"
        )
    return stored


def split_taken(
    tasks: Sequence[NewTask], stored: Mapping[str, Task]
) -> tuple[list[NewTask], dict[str, Task]]:
    """Apply :func:`existing_task` to one enqueue, given the ``stored`` snapshots of
    those of its ids the store already holds (read in the enqueue's transaction).

    :returns: the tasks to insert (the first task of each id not stored, in order) and
        the snapshot to return for each stored id. A later task of the call with the
        same id as an inserted one gets that inserted task's snapshot.
    :raises DuplicateTaskId: an id is taken by a different task (stored or earlier in
        the call); nothing may be stored.
    """
    fresh: dict[str, NewTask] = {}
    known: dict[str, Task] = {}
    for new in tasks:
        found = stored.get(new.id)
        if found is not None:
            known[new.id] = existing_task(new, found)
            continue
        first = fresh.get(new.id)
        if first is None:
            fresh[new.id] = new
        elif (first.task_type, first.app_id) != (new.task_type, new.app_id) or (
            first.params_json != new.params_json
            and loads(first.params_json) != loads(new.params_json)
        ):
            raise DuplicateTaskId(
                f"task id {new.id!r} is given twice in one enqueue, for different tasks;"
                " give each task its own id, or leave id unset to get a fresh one"
            )
    return list(fresh.values()), known


def enqueued(new: NewTask, *, now: datetime, run_at: datetime, alias_of: str | None) -> Task:
    """The snapshot an enqueue stores for ``new`` at ``now``: PENDING, due at ``run_at``,
    no attempt yet, an alias of ``alias_of`` when a leader holds its dedupe key."""
    return _pending(new, loads(new.params_json), now, run_at, alias_of)


def enqueued_batch(
    news: Sequence[NewTask], *, now: datetime, alias_of: Mapping[str, str]
) -> list[Task]:
    """:func:`enqueued` for each of ``news``, all stored at ``now``: each due at its
    ``run_at`` (in UTC) or else ``now``, an alias of ``alias_of[id]`` where that is
    given. The params of the whole batch are parsed as one JSON document."""
    params = loads("[" + ",".join([new.params_json for new in news]) + "]")
    assert isinstance(params, list)
    return [
        _pending(
            new,
            one,
            now,
            now if new.run_at is None else new.run_at.astimezone(UTC),
            alias_of.get(new.id),
        )
        for new, one in zip(news, params, strict=True)
    ]


def _pending(
    new: NewTask, params: Any, now: datetime, run_at: datetime, alias_of: str | None
) -> Task:
    # Every field, positionally (the field order of Task); of the values unchecked so
    # far, only the two timestamps need a check.
    if now.tzinfo is None or run_at.tzinfo is None:
        raise ValueError(f"timestamps must be timezone-aware, got {now!r} and {run_at!r}")
    return task_from_values(
        new.id,
        new.task_type,
        TaskStatus.PENDING,
        now,
        run_at,
        now,
        new.app_id,
        params,
        {},
        int(new.priority),
        0,
        new.max_retries,
        None,
        None,
        NO_PROGRESS,
        new.dedupe_key,
        alias_of,
        new.parent_id,
        new.user_id,
        None,
        None,
        None,
        None,
        None,
    )


ChildrenOf: TypeAlias = Callable[[list[str]], Awaitable[Iterable[tuple[str, str]]]]
"""Every child of the given tasks, finished ones too, as (child id, parent id) pairs,
each parent's children in creation order."""


async def cancel_targets(selected: Iterable[str], children_of: ChildrenOf | None) -> list[str]:
    """The tasks a cancel applies to, in the order it applies to them: ``selected``
    (the ids named, then the active tasks its filter selects, in creation order), then,
    when it cascades (``children_of`` given), breadth first their descendants, each
    task's children in creation order.

    Finished children are walked through (their own children may be active), and the
    walk ends even on a ``parent_id`` cycle. A synchronous store passes a
    ``children_of`` that never suspends and runs this with
    :func:`taskmill.migrations.run_sync`.
    """
    order: dict[str, None] = dict.fromkeys(selected)
    if children_of is None:
        return list(order)
    level = list(order)
    while level:
        children: dict[str, list[str]] = {}
        for child, parent in await children_of(level):
            children.setdefault(parent, []).append(child)
        found: list[str] = []
        for parent in level:
            for child in children.get(parent, ()):
                if child not in order:
                    order[child] = None
                    found.append(child)
        level = found
    return list(order)


def check_redrive(task_id: str, status: TaskStatus, alias_of: str | None) -> None:
    """Refuse a redrive (``retry()``) of a task that is active, COMPLETED or an alias;
    the store then checks its dedupe key (:func:`key_taken`).

    :raises InvalidTransition: the lifecycle does not allow it.
    """
    if status is not TaskStatus.FAILED and status is not TaskStatus.CANCELLED:
        raise InvalidTransition(
            f"task {task_id} is {status.value}; only failed or cancelled tasks can be retried"
        )
    if alias_of is not None:
        raise InvalidTransition(f"task {task_id} is an alias of {alias_of}; retry the leader")


def key_taken(task_id: str, leader: str, dedupe_key: str | None) -> InvalidTransition:
    """The refusal of a redrive while ``leader`` is active for the task's dedupe key."""
    return InvalidTransition(
        f"task {task_id} cannot be retried: task {leader} is already active "
        f"for dedupe key {dedupe_key!r}"
    )


# -- dependencies (``after=``) -----------------------------------------------------------

DEPENDENCY_CANCEL_REASON: Final = CancelReason.PREEMPTED
"""The reason of a task cancelled because a dependency did not complete: the system, not
a user, made it obsolete (as a preemption does); the error names the dependency."""

DEPENDENCY_CANCELLATION: Final = Transition(
    status=TaskStatus.CANCELLED,
    event=EventKind.CANCELLED,
    gives_back_attempt=False,
    run_at=RunAt.KEEP,
    result=Write.KEEP,
    error=Write.SET,
    cancel_reason=Write.SET,
    outcome=None,
)
"""A waiting (PENDING, never claimed since it waits) task whose dependency ended FAILED
or CANCELLED under ``after_policy="completed"``: CANCELLED with
:data:`DEPENDENCY_CANCEL_REASON` and :func:`dependency_error`; no attempt is logged."""


class DependentOutcome(enum.Enum):
    """What one resolved dependency edge does to its dependent."""

    WAITS = "waits"
    """One fewer dependency to wait for; others are still unfinished."""
    RELEASED = "released"
    """That was the last one: the task is claimable (event RELEASED)."""
    CANCELLED = "cancelled"
    """The dependency did not complete: the task is cancelled (event CANCELLED)."""
    UNCHANGED = "unchanged"
    """The dependent is not PENDING (cancelled, or redriven and ended): only the count
    goes down, nothing else happens."""


def dependency_blocks(status: TaskStatus, always: bool) -> bool | None:
    """How a dependency in ``status`` counts for its dependent: None while it is active
    (wait for it), False when it ended in a way that lets the dependent run (COMPLETED,
    or any end with ``always``), True when it ended in a way that cancels it."""
    if status.active:
        return None
    return not always and status is not TaskStatus.COMPLETED


def dependency_error(dependency_id: str, status: TaskStatus) -> str:
    """The error of a task cancelled because ``dependency_id`` ended in ``status``."""
    return f"dependency {dependency_id} {status.value}; cancelled with it (after_policy)"


def dependency_settles(
    dependent_status: TaskStatus, waiting_after: int, *, blocks: bool
) -> DependentOutcome:
    """What an ending dependency does to a dependent in ``dependent_status`` that waits
    for ``waiting_after`` dependencies once this one is taken off (the count always goes
    down by one: it is the number of edges not yet resolved)."""
    if dependent_status is not TaskStatus.PENDING:
        return DependentOutcome.UNCHANGED
    if blocks:
        return DependentOutcome.CANCELLED
    return DependentOutcome.RELEASED if waiting_after == 0 else DependentOutcome.WAITS


def unknown_dependency(dependency: str, app_id: str | None, other: str | None) -> InvalidTaskSpec:
    """The refusal of a dependency that is not stored (``other`` None) or belongs to app
    ``other``, not to the dependent's ``app_id``: an app cannot see another's tasks."""
    if other is None:
        return InvalidTaskSpec(
            f"after= names task {dependency}, which does not exist; "
            "a task can only depend on tasks already stored"
        )
    return InvalidTaskSpec(
        f"after= names task {dependency} of app {other!r}, not of {app_id!r}; "
        "a task can only depend on tasks of its own app"
    )


def check_dependencies(tasks: Iterable[NewTask], app_of: Mapping[str, str | None]) -> None:
    """Refuse, before anything is written, a dependency of ``tasks`` that is not stored
    or is another app's task; ``app_of`` holds the app id of each stored dependency.

    :raises InvalidTaskSpec: :func:`unknown_dependency`'s.
    """
    for new in tasks:
        for dependency in new.after:
            if dependency not in app_of:
                raise unknown_dependency(dependency, new.app_id, None)
            if app_of[dependency] != new.app_id:
                raise unknown_dependency(dependency, new.app_id, app_of[dependency])


def finish_rounds(finishes: Sequence[Finish]) -> list[list[int]]:
    """The positions of ``finishes`` in rounds of distinct task ids, in call order: a
    task named twice in one ``finish_batch`` call has its second finish in the next
    round, so that it finds its lease gone, as if the finishes ran one after another.
    A store that writes a round with one statement gets sequential semantics."""
    rounds: list[list[int]] = []
    seen: dict[str, int] = {}
    for index, finish in enumerate(finishes):
        n = seen.get(finish.lease.task_id, 0)
        seen[finish.lease.task_id] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(index)
    return rounds
