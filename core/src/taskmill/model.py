"""The task model: frozen snapshots of stored state, and the values that describe it.

A :class:`Task` is a snapshot; state changes happen in storage and callers get a fresh
snapshot back. Serialization lives in :mod:`taskmill.serialization`, at the edges.
"""

from __future__ import annotations

import enum
import operator
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, TypeAlias, TypeVar

import attrs

from taskmill import filters
from taskmill.errors import InvalidTaskSpec
from taskmill.validation import check_key

_Slotted = TypeVar("_Slotted")

JSON: TypeAlias = Any
"""A JSON value: dict, list, str, int, float, bool or None."""


class Priority(enum.IntEnum):
    """Named priority levels; any int is a valid priority and higher runs first."""

    BACKGROUND = 0
    NORMAL = 100
    USER_ACTION = 1000
    URGENT = 5000


class TaskStatus(enum.Enum):
    """Where a task is in its lifecycle: PENDING → RUNNING → a terminal status."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """True for COMPLETED, FAILED and CANCELLED: nothing more will happen."""
        return self in _TERMINAL

    @property
    def active(self) -> bool:
        """True for PENDING and RUNNING."""
        return not self.terminal


_TERMINAL = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})
TERMINAL_STATUSES: frozenset[TaskStatus] = _TERMINAL
ACTIVE_STATUSES: frozenset[TaskStatus] = frozenset({TaskStatus.PENDING, TaskStatus.RUNNING})


class CancelReason(enum.Enum):
    """Why a task was interrupted.

    USER and PREEMPTED end the task (CANCELLED); SUSPENDED and SHUTDOWN put it back to
    PENDING without spending an attempt.
    """

    USER = "user"
    PREEMPTED = "preempted"
    SUSPENDED = "suspended"
    SHUTDOWN = "shutdown"

    @property
    def terminal(self) -> bool:
        """True when a task interrupted for this reason ends as CANCELLED."""
        return self in (CancelReason.USER, CancelReason.PREEMPTED)


class AttemptOutcome(enum.Enum):
    """How one attempt ended, as recorded in the execution log."""

    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    LOST = "lost"
    """The worker's lease expired (it crashed or hung) and the task was rescued."""
    INTERRUPTED = "interrupted"
    """Shutdown or suspension put the task back without spending an attempt."""


def _utc(instance: Any, attribute: attrs.Attribute[Any], value: datetime | None) -> None:
    if value is not None and value.tzinfo is None:
        raise ValueError(f"{attribute.name} must be a timezone-aware datetime, got {value!r}")


def _optional_float(value: float | None) -> float | None:
    return None if value is None else float(value)


@attrs.frozen
class Progress:
    """How far a running task has come: ``done`` of ``total`` units, and a message."""

    done: float = attrs.field(default=0.0, converter=float)
    total: float | None = attrs.field(default=None, converter=_optional_float)
    message: str | None = None

    @property
    def pct(self) -> float | None:
        """Percentage done (0-100), or None when the total is unknown."""
        if not self.total:
            return None
        return max(0.0, min(100.0, 100.0 * self.done / self.total))


NO_PROGRESS = Progress()


@attrs.frozen
class Task:
    """A snapshot of one stored task. Fields follow SPEC section 3."""

    id: str
    task_type: str
    status: TaskStatus
    created_at: datetime = attrs.field(validator=_utc)
    run_at: datetime = attrs.field(validator=_utc)
    updated_at: datetime = attrs.field(validator=_utc)
    app_id: str | None = None
    params: dict[str, JSON] = attrs.field(factory=dict)
    data: dict[str, JSON] = attrs.field(factory=dict)
    priority: int = Priority.NORMAL
    attempts: int = 0
    max_retries: int = 3
    result: JSON = None
    error: str | None = None
    progress: Progress = NO_PROGRESS
    dedupe_key: str | None = None
    alias_of: str | None = None
    parent_id: str | None = None
    user_id: str | None = None
    cancel_reason: CancelReason | None = None
    started_at: datetime | None = attrs.field(default=None, validator=_utc)
    finished_at: datetime | None = attrs.field(default=None, validator=_utc)
    worker_id: str | None = None
    lease_expires_at: datetime | None = attrs.field(default=None, validator=_utc)

    def evolve(self, **changes: Any) -> Task:
        """A copy of this snapshot with ``changes`` applied (for stores building the
        next snapshot; faster than ``attrs.evolve``: only the changed timestamps are
        checked, the others were when this snapshot was built).

        :raises TypeError: a name is not a field of ``Task``.
        :raises ValueError: a changed timestamp is naive.
        """
        values = list(_task_values(self))
        for name, value in changes.items():
            try:
                values[_TASK_INDEX[name]] = value
            except KeyError:
                raise TypeError(f"Task has no field {name!r}") from None
            if value is not None and name in _TIMESTAMPS and value.tzinfo is None:
                raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")
        return task_from_values(*values)

    @property
    def is_alias(self) -> bool:
        """True when this task is an alias of a dedupe leader and never runs itself."""
        return self.alias_of is not None


_TASK_FIELDS = tuple(a.name for a in attrs.fields(Task))
_TASK_INDEX = {name: i for i, name in enumerate(_TASK_FIELDS)}
_task_values = operator.attrgetter(*_TASK_FIELDS)
_TIMESTAMPS = frozenset(a.name for a in attrs.fields(Task) if a.validator is not None)
"""The fields ``Task`` checks when it is built (timezone-aware datetimes or None)."""


def slot_builder(cls: type[_Slotted], *, keywords: bool = False) -> Callable[..., _Slotted]:
    """``cls(...)`` for an attrs class with slots, as one straight-line function that
    stores each field through its slot's descriptor, as attrs generates ``__init__``,
    without the validators and the per-field attribute lookup of ``object.__setattr__``
    (a third to a half less time).

    Without ``keywords``: every field, positionally in the field order of ``cls``, as
    given (no converter runs), for values already checked. With ``keywords``: the
    parameters, defaults and converters of ``cls``'s ``__init__``, converters called in
    field order, a converter skipped only where its field keeps a default the converter
    returns unchanged; ``cls``'s converters must be functions of the value alone and it
    may have no validator and no factory default.
    """
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    parameters: list[str] = []
    body: list[str] = []
    for field in attrs.fields(cls):  # type: ignore[arg-type]
        name = field.name
        namespace[f"_set_{name}"] = cls.__dict__[name].__set__
        value = name
        parameters.append(name)
        if keywords:
            if isinstance(field.default, attrs.Factory) or field.validator is not None:  # type: ignore[arg-type]
                raise TypeError(f"{cls.__name__}.{name}: needs the attrs __init__")
            if field.default is not attrs.NOTHING:
                namespace[f"_default_{name}"] = field.default
                parameters[-1] = f"{name}=_default_{name}"
            convert: Any = field.converter
            if convert is not None:
                namespace[f"_convert_{name}"] = convert
                value = f"_convert_{name}({name})"
                if field.default is not attrs.NOTHING and convert(field.default) is field.default:
                    value = f"{name} if {name} is _default_{name} else {value}"
        body.append(f"    _set_{name}(obj, {value})\n")
    head = f"def build({', '.join(parameters)}):\n    obj = _new(_cls)\n"
    source = f"{head}{''.join(body)}    return obj\n"
    exec(source, namespace)
    build: Callable[..., _Slotted] = namespace["build"]
    return build


task_from_values: Final[Callable[..., Task]] = slot_builder(Task)
"""``Task(*values)`` for values already checked: every field, positionally in the
field order of ``Task``, timestamps timezone-aware. For stores building snapshots from
their rows or from another snapshot; it checks nothing."""


@attrs.frozen
class Attempt:
    """One row of a task's execution log."""

    task_id: str
    number: int
    worker_id: str
    started_at: datetime = attrs.field(validator=_utc)
    finished_at: datetime = attrs.field(validator=_utc)
    outcome: AttemptOutcome
    error: str | None = None

    @property
    def elapsed_ms(self) -> float:
        """Wall time of the attempt in milliseconds."""
        return (self.finished_at - self.started_at).total_seconds() * 1000.0


def attempt_runs(attempts: Sequence[Attempt]) -> list[int]:
    """The run (1, 2, ...) each attempt of one task's log belongs to, oldest first.

    A manual retry (``tm.retry``, ``taskmill retry``, the dashboard's Retry) gives the
    task a fresh attempt budget, so its attempt numbers start again at 1; the log keeps
    the earlier run's attempts. A new run starts where the number goes down, or repeats
    after an attempt that spent it (every outcome but INTERRUPTED, which gives the task
    back without spending its attempt, so the next one has the same number)."""
    runs: list[int] = []
    run = 1
    previous: Attempt | None = None
    for attempt in attempts:
        if previous is not None and (
            attempt.number < previous.number
            or (
                attempt.number == previous.number
                and previous.outcome is not AttemptOutcome.INTERRUPTED
            )
        ):
            run += 1
        runs.append(run)
        previous = attempt
    return runs


def _tuple_or_none(value: Any) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | TaskStatus):
        return (value,)
    return tuple(value)


def _statuses(value: Any) -> tuple[TaskStatus, ...] | None:
    items = _tuple_or_none(value)
    if items is None:
        return None
    try:
        return tuple(TaskStatus(s) for s in items)
    except ValueError:
        choices = ", ".join(s.value for s in TaskStatus)
        raise InvalidTaskSpec(
            f"statuses takes TaskStatus values ({choices}), not {list(items)!r}",
            field="statuses",
        ) from None


def _storable_text(instance: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    # A filter value no store can hold (NUL, a lone surrogate) is refused, the same on
    # every backend, rather than sent to a driver that would fail on it.
    if value is not None:
        check_key(attribute.name, value, sys.maxsize)


def _storable_texts(
    instance: Any, attribute: attrs.Attribute[Any], value: tuple[str, ...] | None
) -> None:
    for one in value or ():
        check_key(attribute.name, one, sys.maxsize)


@attrs.frozen
class TaskFilter:
    """Which tasks an operation applies to; every field set narrows the selection."""

    app_id: str | None = attrs.field(default=None, validator=_storable_text)
    task_types: tuple[str, ...] | None = attrs.field(
        default=None, converter=_tuple_or_none, validator=_storable_texts
    )
    statuses: tuple[TaskStatus, ...] | None = attrs.field(default=None, converter=_statuses)
    parent_id: str | None = attrs.field(default=None, validator=_storable_text)
    user_id: str | None = attrs.field(default=None, validator=_storable_text)
    dedupe_key: str | None = attrs.field(default=None, validator=_storable_text)
    created_after: datetime | None = attrs.field(default=None, validator=_utc)
    created_before: datetime | None = attrs.field(default=None, validator=_utc)
    text: str | None = attrs.field(default=None, validator=_storable_text)
    """Tasks whose id or dedupe key contains this text (case-sensitive), for search
    boxes; an empty text selects every task."""

    def matches(self, task: Task) -> bool:
        """True when ``task`` is selected by this filter (the reference semantics,
        :func:`taskmill.filters.matches`)."""
        return filters.matches(self, task)


HEADERS_MAX: Final = 16
"""The most headers one task carries (``TaskSpec.headers``)."""
HEADER_NAME_MAX: Final = 128
HEADER_VALUE_MAX: Final = 8192


def _headers(value: Any) -> dict[str, str] | None:
    """``TaskSpec.headers`` checked: a mapping of at most :data:`HEADERS_MAX` text names
    (up to :data:`HEADER_NAME_MAX` characters) to text values (up to
    :data:`HEADER_VALUE_MAX`), nothing a store cannot keep."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidTaskSpec(
            f"headers is a mapping of text to text, not {type(value).__name__}", field="headers"
        )
    if len(value) > HEADERS_MAX:
        raise InvalidTaskSpec(
            f"a task carries at most {HEADERS_MAX} headers, not {len(value)}", field="headers"
        )
    for name, text in value.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise InvalidTaskSpec(
                f"header {name!r}: names and values are text, not {type(text).__name__}",
                field="headers",
            )
        check_key("headers", name, HEADER_NAME_MAX, empty=False)
        check_key("headers", text, HEADER_VALUE_MAX)
    return dict(value) or None


def _task_ids(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ValueError(f"after= takes a list of task ids, not the string {value!r}")
    return tuple(value)


@attrs.frozen
class TaskSpec:
    """Everything ``Taskmill.enqueue`` takes, as a value; the unit of ``enqueue_many``."""

    task_type: str
    params: dict[str, JSON] | None = None
    app_id: str | None = None
    priority: int = Priority.NORMAL
    dedupe_key: str | None = None
    run_at: datetime | None = None
    """Checked with every other value when the task is built (taskmill.validation)."""
    delay: timedelta | float | None = None
    parent_id: str | None = None
    max_retries: int | None = None
    user_id: str | None = None
    after: tuple[str, ...] = attrs.field(default=(), converter=_task_ids)
    """Ids of stored tasks this one waits for (docs/dependencies.md): it is claimed only
    once every one of them has COMPLETED."""
    after_policy: str = "completed"
    """``"completed"``: a dependency that ends FAILED or CANCELLED cancels this task;
    ``"always"``: it runs once every dependency has ended, however it ended."""
    headers: dict[str, str] | None = attrs.field(default=None, converter=_headers)
    """Transport headers the task is created under (say, the W3C ``traceparent`` of the
    request that enqueues it): stored with the task under the reserved params key
    ``taskmill.headers``, with what the plugins' ``taskmill_task_headers`` give (theirs
    win a name), and read back with :func:`taskmill.headers_of`. The HTTP service sets
    ``traceparent``, ``tracestate`` and ``baggage`` from the request's own headers."""

    @classmethod
    def from_value(cls, value: TaskSpec | Mapping[str, Any]) -> TaskSpec:
        """Accept a ``TaskSpec`` or a dict of ``enqueue``'s keyword arguments."""
        if isinstance(value, TaskSpec):
            return value
        plain = type(value) is dict  # the common case; a Mapping's ABC check costs more
        if not plain and not isinstance(value, Mapping):
            raise InvalidTaskSpec(
                f"a task spec is a TaskSpec or a dict, not {type(value).__name__}"
            )
        if not _SPEC_FIELDS.issuperset(value):
            unknown = value.keys() - _SPEC_FIELDS
            raise InvalidTaskSpec(f"unknown task spec field(s): {', '.join(sorted(unknown))}")
        if "task_type" not in value:
            raise InvalidTaskSpec("a task spec needs a 'task_type'")
        try:
            if plain and cls is TaskSpec:
                return _spec_from_fields(**value)
            return cls(**value)
        except InvalidTaskSpec:
            raise  # it names its field
        except (TypeError, ValueError) as exc:
            raise InvalidTaskSpec(f"invalid task spec: {exc}") from None


_SPEC_FIELDS: frozenset[str] = frozenset(attrs.fields_dict(TaskSpec))


_spec_from_fields: Final[Callable[..., TaskSpec]] = slot_builder(TaskSpec, keywords=True)
"""``TaskSpec(**fields)``, faster; for :meth:`TaskSpec.from_value`, which has checked
that ``fields`` is a dict of known field names that includes ``task_type``."""


@attrs.frozen
class ProgressSummary:
    """Counts of tasks by status for a selection; ``pct`` is the share that finished."""

    total: int = 0
    pending: int = 0
    running: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    waiting: int = 0
    """Of the PENDING tasks, those still waiting for a dependency (``after=``)."""

    @classmethod
    def from_counts(
        cls, counts: Mapping[TaskStatus, int] | Mapping[str, int], *, waiting: int = 0
    ) -> ProgressSummary:
        """The summary of tasks counted by status (or by status value, as stored); a
        status that is absent counts 0. ``waiting`` is how many PENDING ones wait for a
        dependency."""
        by = {getattr(k, "value", k): n for k, n in counts.items()}
        pending, running = by.get("pending", 0), by.get("running", 0)
        completed, failed, cancelled = (
            by.get("completed", 0),
            by.get("failed", 0),
            by.get("cancelled", 0),
        )
        return cls(
            total=pending + running + completed + failed + cancelled,
            pending=pending,
            running=running,
            completed=completed,
            failed=failed,
            cancelled=cancelled,
            waiting=int(waiting),
        )

    @property
    def finished(self) -> int:
        """Tasks in a terminal status."""
        return self.completed + self.failed + self.cancelled

    @property
    def pct(self) -> float:
        """Percentage of the selection that is terminal (100 for an empty selection)."""
        return 100.0 if self.total == 0 else 100.0 * self.finished / self.total


@attrs.frozen
class SuspensionScope:
    """What a suspension covers: every task (both None), one task type, one app, or one
    task type of one app."""

    task_type: str | None = None
    app_id: str | None = None

    def covers(self, app_id: str | None, task_type: str) -> bool:
        """True when tasks of ``(app_id, task_type)`` fall under this suspension."""
        return (self.task_type is None or task_type == self.task_type) and (
            self.app_id is None or app_id == self.app_id
        )


class EventKind(enum.Enum):
    """What happened to a task."""

    ENQUEUED = "enqueued"
    STARTED = "started"
    PROGRESS = "progress"
    RETRYING = "retrying"
    """An attempt failed and the task waits for its next one."""
    REQUEUED = "requeued"
    """Back to PENDING without spending an attempt (shutdown, suspension) or rescued."""
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CANCEL_REQUESTED = "cancel_requested"
    """A running task was asked to stop (suspension); its worker will requeue it."""
    RELEASED = "released"
    """A task waiting for dependencies (``after=``) became claimable: the last of them
    ended (COMPLETED, or any way with ``after_policy="always"``)."""


@attrs.frozen
class TaskEvent:
    """One change to one task, as delivered by ``Taskmill.events``.

    ``task`` is the task's snapshot when the event is read, which may already reflect
    later changes; ``status`` is the status the change produced.
    """

    kind: EventKind
    task: Task
    status: TaskStatus
    at: datetime = attrs.field(validator=_utc)
    cursor: str
    """Position in the store's event log: an opaque token that compares with ``<`` in
    commit order against the other tokens of the same store (see
    :meth:`taskmill.storage.TaskStorage.read_events`); pass it to
    ``tm.events(since=...)`` to resume after this event."""
