"""The service's request and response bodies: attrs classes, (un)structured by cattrs.

One model system: request bodies are attrs classes structured by :data:`converter`
(strict: a string is not an int nor a list, a float is not an int, unknown fields are
refused), responses are taskmill's own models through
:func:`taskmill.serialization.to_dict`, and the OpenAPI schemas of both are derived from
the same classes by :func:`json_schema`.

The values themselves are checked by the core (:mod:`taskmill.validation`), which
refuses each with the field it names; a body field's ``metadata`` states those limits
in the schema (:func:`limits`), taken from the core's constants, so that the document
and the refusals cannot disagree. A value only the service looks at (a handler's URL, a
lease token, an external job's progress) is checked by the service against the very
keywords its schema states (:func:`checked`), when the body is structured.
"""

from __future__ import annotations

import enum
import re
import types
import typing
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar, Literal, Union

import attrs
import cattrs
from cattrs.cols import list_structure_factory
from cattrs.errors import AttributeValidationNote, ForbiddenExtraKeysError
from cattrs.v import format_exception
from taskmill.model import (
    Attempt,
    CancelReason,
    EventKind,
    Priority,
    Progress,
    SuspensionScope,
    Task,
    TaskEvent,
    TaskStatus,
)
from taskmill.serialization import make_converter
from taskmill.validation import (
    APP_ID_MAX,
    DEDUPE_KEY_MAX,
    DELAY_MAX,
    MAX_RETRIES_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    PROGRESS_MESSAGE_MAX,
    RUN_AT_MAX,
    RUN_AT_MIN,
    TASK_ID_MAX,
    TASK_TYPE_MAX,
    TIMEOUT_MAX,
    USER_ID_MAX,
    WORKER_ID_MAX,
)
from taskmill.workers import WorkerHandler

__all__ = [
    "BodyError",
    "CancelBody",
    "ChildSpecBody",
    "CleanupBody",
    "FilterBody",
    "PreemptBody",
    "SuspendBody",
    "TaskSpecBody",
    "checked",
    "converter",
    "json_schema",
    "key_limits",
    "limits",
    "structure",
]


class BodyError(ValueError):
    """A request body does not have the shape its endpoint takes (the message says
    where and why; ``field`` names the first body field at fault)."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def _strict(kind: type) -> Any:
    def structure(value: Any, _: type) -> Any:
        # bool is an int to Python, not to a JSON client.
        if isinstance(value, bool) and kind is not bool:
            raise TypeError(f"expected {kind.__name__}, got a boolean")
        if kind is float and isinstance(value, int):
            return float(value)
        if not isinstance(value, kind):
            raise TypeError(f"expected {_JSON_NAMES[kind]}, got {type(value).__name__}")
        return value

    return structure


_JSON_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


def _is_list(tp: Any) -> bool:
    return typing.get_origin(tp) is list


def _strict_list(tp: Any, conv: cattrs.Converter) -> Any:
    items = list_structure_factory(tp, conv)

    def structure(value: Any, _: type) -> Any:
        # cattrs would take any iterable: a string as its characters, an object as its keys.
        if not isinstance(value, list):
            raise TypeError(f"expected an array, got {type(value).__name__}")
        return items(value, tp)

    return structure


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    base = make_converter()  # taskmill's own datetime rules: ISO-8601, tz-aware, UTC
    conv.register_structure_hook(datetime, base.get_structure_hook(datetime))
    conv.register_unstructure_hook(datetime, base.get_unstructure_hook(datetime))
    for kind in (str, int, float, bool):
        conv.register_structure_hook(kind, _strict(kind))
    conv.register_structure_hook_factory(_is_list, _strict_list)
    return conv


converter = _make_converter()
"""Structures request bodies: strict scalar types, arrays only from arrays, no unknown
fields, tz-aware datetimes."""

T = typing.TypeVar("T")


def structure(value: Any, cls: type[T]) -> T:
    """``value`` (parsed JSON) as a ``cls``.

    :raises BodyError: it does not fit; the message lists every problem with its path,
        ``field`` names the first field at fault.
    """
    try:
        structured = converter.structure(value, cls)
    except Exception as exc:
        if isinstance(exc, cattrs.BaseValidationError):
            problems = cattrs.transform_error(exc, path="body", format_exception=_problem)
        else:
            problems = [f"{exc} @ body"]
        raise BodyError("; ".join(problems), field=_field_at_fault(exc)) from None
    _check_fields(structured)
    return structured


def _problem(exc: BaseException, tp: type | None) -> str:
    # The strict hooks' and taskmill's datetime rule's own words ("expected an integer,
    # got float", "datetime without a timezone") say more than cattrs' generic ones.
    if isinstance(exc, TypeError | ValueError) and exc.args:
        return str(exc)
    return format_exception(exc, tp)


def _field_at_fault(exc: BaseException) -> str | None:
    """The top-level field a structuring error is about (an unknown one included)."""
    if isinstance(exc, ForbiddenExtraKeysError):
        return min(exc.extra_fields, default=None)
    for inner in getattr(exc, "exceptions", ()):
        for note in getattr(inner, "__notes__", ()):
            if isinstance(note, AttributeValidationNote):
                return note.name
        if isinstance(inner, ForbiddenExtraKeysError):
            return min(inner.extra_fields, default=None)
    return None


# -- the limits a body field states --------------------------------------------------

SCHEMA = "taskmill_http.schema"
"""The ``metadata`` key of an attrs field whose JSON Schema adds keywords to its type's."""
CHECKED = "taskmill_http.checked"
"""The ``metadata`` key of an attrs field whose schema keywords the service enforces."""
OMITTED_WHEN_NONE = "taskmill_http.omitted_when_none"
"""The ``metadata`` key of a response field left out when it is None (not required)."""
REPLACED = "taskmill_http.replaced"
"""The ``metadata`` key of a field whose schema is given whole (not derived from its
type): see :class:`ChildSpecBody`."""


def limits(**keywords: Any) -> dict[str, Any]:
    """``metadata`` for an attrs field: JSON Schema keywords (``maxLength``,
    ``minimum``, ``format``, ``description``...) added to the schema of its type (to the
    non-null branch of an optional one). Give the core's figures
    (:mod:`taskmill.validation`): the schema states what the core refuses, never a
    limit of its own."""
    return {SCHEMA: keywords}


def checked(meaning: str | None = None, /, **keywords: Any) -> dict[str, Any]:
    """``metadata`` for an attrs field the service itself checks (the core never sees
    its value): the JSON Schema keywords ``minLength``, ``maxLength``, ``pattern``,
    ``minimum``, ``maximum``, ``exclusiveMinimum`` and ``exclusiveMaximum`` are stated in
    the schema and enforced on the structured body, a value outside them refused with
    422 ``invalid_body`` naming the field (``meaning``: what a ``pattern`` admits, in
    words, for the message). A ``pattern`` is written unanchored: it must match the
    whole value, and the schema states it anchored."""
    stated = dict(keywords)
    if "pattern" in stated:
        stated["pattern"] = anchored(stated["pattern"])
    return {SCHEMA: stated, CHECKED: (keywords, meaning)}


def anchored(pattern: str) -> str:
    """``pattern`` as a JSON Schema ``pattern`` that matches whole values (a JSON Schema
    pattern matches anywhere; Python checks the unanchored one with ``fullmatch``)."""
    return f"^(?:{pattern})$"


NO_NUL = "[^\\x00]*"
"""The text a key admits: no NUL (JSON carries no lone surrogate past
:func:`taskmill_http.requests.read_json`)."""


def key_limits(max_length: int | None, *, non_empty: bool = False) -> dict[str, Any]:
    """:func:`limits` of a key the core checks: no NUL, at most ``max_length``
    characters (None: any number), and with ``non_empty`` at least one."""
    found: dict[str, Any] = {"pattern": anchored(NO_NUL)}
    if max_length is not None:
        found["maxLength"] = max_length
    if non_empty:
        found["minLength"] = 1
    return limits(**found)


def _too_small(value: Any, keyword: str, bound: Any) -> bool:
    return bool(
        (keyword == "minimum" and value < bound)
        or (keyword == "exclusiveMinimum" and value <= bound)
        or (keyword == "maximum" and value > bound)
        or (keyword == "exclusiveMaximum" and value >= bound)
    )


_BOUND_WORDS = {
    "minimum": "at least",
    "exclusiveMinimum": "more than",
    "maximum": "at most",
    "exclusiveMaximum": "less than",
}


def check_value(name: str, value: Any, keywords: dict[str, Any], meaning: str | None) -> None:
    """:raises BodyError: ``value`` (of field ``name``) is outside ``keywords``."""
    if isinstance(value, str):
        low, high = keywords.get("minLength", 0), keywords.get("maxLength")
        if len(value) < low or (high is not None and len(value) > high):
            size = f"{low} to {high}" if high is not None else f"at least {low}"
            raise BodyError(f"{name} must be {size} characters, got {len(value)}", field=name)
        pattern = keywords.get("pattern")
        if pattern is not None and _compiled(pattern).fullmatch(value) is None:
            what = meaning or f"text matching {anchored(pattern)}"
            raise BodyError(f"{name} must be {what}, got {value[:200]!r}", field=name)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        for keyword, bound in keywords.items():
            if keyword in _BOUND_WORDS and _too_small(value, keyword, bound):
                raise BodyError(
                    f"{name} must be {_BOUND_WORDS[keyword]} {bound:g}, got {value!r}",
                    field=name,
                )


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    found = _PATTERNS.get(pattern)
    if found is None:
        found = _PATTERNS[pattern] = re.compile(pattern)
    return found


def _check_fields(value: Any) -> None:
    """Enforce the :func:`checked` keywords of ``value``'s fields (of the attrs bodies
    inside it too, and of every item of a list)."""
    if isinstance(value, list):
        for item in value:
            _check_fields(item)
        return
    if not attrs.has(type(value)):
        return
    for field in attrs.fields(type(value)):
        found = getattr(value, field.name)
        if found is None:
            continue
        if CHECKED in field.metadata:
            keywords, meaning = field.metadata[CHECKED]
            check_value(field.name, found, keywords, meaning)
        _check_fields(found)


HANDLER_CONCURRENCY_MAX = 1_000_000
"""The most attempts of one stored handler running at once on a worker (the service's
own bound: the core sets none for a handler registered in code)."""
SECONDS_MAX = 100 * 365 * 86400.0
"""The longest retention age, retry delay or estimate (100 years) a request may name."""
NUMBER_MAX = 1e15
"""The largest magnitude of a progress count (``done``, ``total``) the service keeps:
finite, exact in every store and in JavaScript to the unit."""
URL_MAX = 2000
"""The longest handler URL."""
IDENTIFIER_MAX = 200
"""The longest other name (an app event's kind, an external job's id, an event
position)."""

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_IPV6 = "|".join(
    (
        rf"(?:{_H16}:){{7}}{_H16}",
        rf"(?:{_H16}:){{1,7}}:",
        rf"(?:{_H16}:){{1,6}}:{_H16}",
        *(rf"(?:{_H16}:){{1,{n}}}(?::{_H16}){{1,{7 - n}}}" for n in range(5, 0, -1)),
        rf":(?:(?::{_H16}){{1,7}}|:)",
    )
)
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_LAST_LABEL = r"[A-Za-z_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_PORT = r"(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
HANDLER_URL = (
    rf"https?://(?:(?:{_LABEL}\.)*{_LAST_LABEL}|{_IPV4}|\[(?:{_IPV6})\])"
    rf"(?::{_PORT})?(?:[/?#][!-~]*)?"
)
"""What a handler URL may be: ``http://`` or ``https://`` (lower case), a host (an
ASCII name whose last label starts with a letter, an IPv4 address, or an IPv6 address
in brackets), an optional port, and a path, query and fragment of printable ASCII. No
user info, no spaces: a URL every HTTP client reads the same way, so the host the
allow-list checks is the host a worker connects to."""
LEASE = rf"[0-9]{{1,9}}:[^\x00]{{1,{WORKER_ID_MAX}}}"
"""A lease token: the attempt number, ``:``, the worker's id
(:func:`taskmill_http.handler.lease_token`)."""

_TASK_TYPE = key_limits(TASK_TYPE_MAX, non_empty=True)
_APP_ID = key_limits(APP_ID_MAX)
_PRIORITY = limits(format="int32", minimum=PRIORITY_MIN, maximum=PRIORITY_MAX)
_MAX_RETRIES = limits(minimum=0, maximum=MAX_RETRIES_MAX)
_COUNT = {"minimum": -NUMBER_MAX, "maximum": NUMBER_MAX}
_TOTAL = {"exclusiveMinimum": 0, "maximum": NUMBER_MAX}
_SECONDS = {"minimum": 0, "maximum": SECONDS_MAX}
_RUN_AT_YEARS = r"(?:19[7-9][0-9]|[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-.*"
"""The years of a ``run_at`` (1970 to 9998: the exact bounds are the description's)."""


# -- request bodies -----------------------------------------------------------------


@attrs.frozen
class TaskSpecBody:
    """One task to create: ``enqueue``'s arguments (SPEC section 3 names).

    ``app_id`` is taken from the caller's token; only an admin token may name one.
    ``delay`` is in seconds; ``run_at`` an ISO-8601 datetime with its UTC offset; give
    one of them, not both. An integer is written without a fraction (``2``, not
    ``2.0``).
    """

    task_type: str = attrs.field(metadata=_TASK_TYPE)
    params: dict[str, Any] | None = None
    app_id: str | None = attrs.field(default=None, metadata=_APP_ID)
    priority: int = attrs.field(default=Priority.NORMAL.value, metadata=_PRIORITY)
    dedupe_key: str | None = attrs.field(default=None, metadata=key_limits(DEDUPE_KEY_MAX))
    run_at: datetime | None = attrs.field(
        default=None,
        metadata=limits(
            pattern=anchored(_RUN_AT_YEARS),
            description=f"from {RUN_AT_MIN.isoformat()} to before {RUN_AT_MAX.isoformat()},"
            " with a UTC offset; a past one is due at once",
        ),
    )
    delay: float | None = attrs.field(
        default=None,
        metadata=limits(minimum=0, maximum=DELAY_MAX, description="seconds from now"),
    )
    parent_id: str | None = attrs.field(default=None, metadata=key_limits(TASK_ID_MAX))
    max_retries: int | None = attrs.field(default=None, metadata=_MAX_RETRIES)
    user_id: str | None = attrs.field(default=None, metadata=key_limits(USER_ID_MAX))

    json_schema_extra: ClassVar[Callable[[], dict[str, Any]]] = staticmethod(
        lambda: {
            # The core refuses both at once ("give run_at or delay, not both").
            "not": {
                "required": ["run_at", "delay"],
                "properties": {"run_at": {"type": "string"}, "delay": {"type": "number"}},
            }
        }
    )


@attrs.frozen
class ChildSpecBody(TaskSpecBody):
    """One child to create under the path's task: a task spec whose ``parent_id`` is
    the path's (leave it out; naming the path's task again is taken too, naming
    another task is refused)."""

    parent_id: str | None = attrs.field(
        default=None,
        metadata={REPLACED: {"type": "null", "description": "the path's task: leave it out"}},
    )


@attrs.frozen
class CancelBody:
    """How to cancel one task."""

    reason: CancelReason = CancelReason.USER
    cascade: bool = True


_FILTER_KEY = key_limits(None)


@attrs.frozen
class FilterBody:
    """Which tasks ``POST /v1/tasks:cancel`` cancels: every field set narrows the
    selection (only active tasks are ever cancelled). A body selecting nothing is
    refused: ``{"all": true}`` (and no other selecting field) cancels every active task
    of the caller's app (of every app, for an admin token)."""

    all: bool = False
    app_id: str | None = attrs.field(default=None, metadata=_FILTER_KEY)
    task_types: list[str] | None = attrs.field(
        default=None, metadata={SCHEMA: {"items": {"type": "string", **_FILTER_KEY[SCHEMA]}}}
    )
    statuses: list[TaskStatus] | None = None
    parent_id: str | None = attrs.field(default=None, metadata=_FILTER_KEY)
    user_id: str | None = attrs.field(default=None, metadata=_FILTER_KEY)
    dedupe_key: str | None = attrs.field(default=None, metadata=_FILTER_KEY)
    created_after: datetime | None = None
    created_before: datetime | None = None
    reason: CancelReason = CancelReason.USER
    cascade: bool = True

    NOT_SELECTING: ClassVar[frozenset[str]] = frozenset({"all", "reason", "cascade"})

    @classmethod
    def selecting(cls) -> list[str]:
        """The fields that select tasks (all but ``all``, ``reason`` and ``cascade``)."""
        return [f.name for f in attrs.fields(cls) if f.name not in cls.NOT_SELECTING]

    def selects_something(self) -> bool:
        """Whether a field other than ``all``, ``reason`` and ``cascade`` is set."""
        return any(getattr(self, name) is not None for name in self.selecting())

    json_schema_extra: ClassVar[Callable[[], dict[str, Any]]] = staticmethod(
        lambda: {
            # Exactly one of: {"all": true} with no selecting field, or a selecting field.
            "anyOf": [
                {
                    "required": ["all"],
                    "properties": {
                        "all": {"const": True},
                        **{name: {"type": "null"} for name in FilterBody.selecting()},
                    },
                },
                {
                    "properties": {"all": {"const": False}},
                    "anyOf": [
                        {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                        for name in FilterBody.selecting()
                    ],
                },
            ]
        }
    )


@attrs.frozen
class CleanupBody:
    """Delete terminal tasks that finished more than ``older_than_seconds`` ago."""

    older_than_seconds: float = attrs.field(metadata=checked(**_SECONDS))
    include_failed: bool = False


@attrs.frozen
class PreemptBody:
    """Cancel the active tasks of ``task_type`` (with ``dedupe_key``: only those) as
    PREEMPTED."""

    task_type: str = attrs.field(metadata=_TASK_TYPE)
    dedupe_key: str | None = attrs.field(default=None, metadata=_FILTER_KEY)
    app_id: str | None = attrs.field(default=None, metadata=_APP_ID)


@attrs.frozen
class SuspendBody:
    """A suspension scope: every task type when ``task_type`` is null."""

    task_type: str | None = attrs.field(default=None, metadata=_TASK_TYPE)
    app_id: str | None = attrs.field(default=None, metadata=_APP_ID)


@attrs.frozen
class AppEventBody:
    """An app entity change to publish on the event stream (``app_entity``): what
    changed (``kind``), where (``scope``) and anything else (``payload``). Only an
    admin token may name the ``app_id`` whose subscribers see it."""

    kind: str = attrs.field(
        metadata=checked("text without NUL", minLength=1, maxLength=IDENTIFIER_MAX, pattern=NO_NUL)
    )
    scope: str | None = None
    payload: Any = None
    app_id: str | None = attrs.field(default=None, metadata=_APP_ID)


@attrs.frozen
class HandlerBody:
    """A handler registered in the store: tasks of the path's type (of the token's app)
    are POSTed to ``url`` by every worker. The options are ``Taskmill.handler``'s (an
    integer written without a fraction). Only an admin token may name an ``app_id``
    (null: the host's handler)."""

    url: str = attrs.field(
        metadata=checked(
            "an http:// or https:// URL with a plain host (a name, an IPv4 address or"
            " an [IPv6] address), no user info and no spaces",
            maxLength=URL_MAX,
            pattern=HANDLER_URL,
            description="where workers POST the tasks; its host must be on the"
            " service's handler_hosts allow-list (default: loopback only), else the"
            " registration is refused with 422 handler_host_not_allowed",
        )
    )
    timeout: float | None = attrs.field(
        default=None, metadata=limits(exclusiveMinimum=0, maximum=TIMEOUT_MAX)
    )
    max_retries: int | None = attrs.field(default=None, metadata=_MAX_RETRIES)
    concurrency: int | None = attrs.field(
        default=None, metadata=checked(minimum=1, maximum=HANDLER_CONCURRENCY_MAX)
    )
    app_id: str | None = attrs.field(default=None, metadata=_APP_ID)


@attrs.frozen
class ProgressReport:
    """A detached owner's progress report (it also renews the lease): ``done`` of
    ``total`` with a message, and ``data`` merged into the task's data."""

    lease: str = attrs.field(metadata=checked("the lease token the task was sent", pattern=LEASE))
    done: float | None = attrs.field(default=None, metadata=checked(**_COUNT))
    total: float | None = attrs.field(default=None, metadata=checked(**_TOTAL))
    message: str | None = attrs.field(
        default=None,
        metadata=checked("text without NUL", maxLength=PROGRESS_MESSAGE_MAX, pattern=NO_NUL),
    )
    data: dict[str, Any] | None = None


@attrs.frozen
class StatusReport:
    """A detached owner's end of the attempt: ``completed`` (with ``result``),
    ``failed`` (dead letter, with ``error``), ``retry`` (another attempt after
    ``retry_in`` seconds or the backoff) or ``cancelled``."""

    lease: str = attrs.field(metadata=checked("the lease token the task was sent", pattern=LEASE))
    status: Literal["completed", "failed", "retry", "cancelled"]
    result: Any = None
    error: str | None = None
    retry_in: float | None = attrs.field(default=None, metadata=checked(**_SECONDS))


# -- responses that are not taskmill models -------------------------------------------


@attrs.frozen
class TaskPage:
    """One page of ``GET /v1/tasks``; pass ``next_cursor`` as ``cursor`` for the next."""

    tasks: list[Task]
    next_cursor: str | None


@attrs.frozen
class Count:
    """How many tasks an operation changed."""

    count: int


@attrs.frozen
class CancelledCount:
    """How many tasks changed (cascaded children and aliases included)."""

    cancelled: int


@attrs.frozen
class DeletedCount:
    """How many tasks were deleted."""

    deleted: int


@attrs.frozen
class SuspendResult:
    """How many running tasks were asked to stop."""

    interrupted: int


@attrs.frozen
class ResumeResult:
    """Whether the suspension existed."""

    resumed: bool


@attrs.frozen
class Summary:
    """Counts by status of the selected tasks; ``pct`` is the share finished."""

    total: int
    pending: int
    running: int
    completed: int
    failed: int
    cancelled: int
    pct: float


@attrs.frozen
class Deleted:
    """Whether something was deleted."""

    deleted: bool


@attrs.frozen
class Published:
    """Where an in-memory event went in the stream (its SSE ``id``)."""

    position: str


@attrs.frozen
class WorkerInfo:
    """A worker registered in the store, as ``taskmill workers --json`` shows it; for an
    app token, only its app's and the host's handlers, and its app's running tasks."""

    id: str
    alive: bool
    """Its last heartbeat is younger than its lease (a dead one is listed until pruned)."""
    host: str
    pid: int
    version: str
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_seconds: float
    lease_seconds: float
    concurrency: int
    """Its slots (shared by every app it serves)."""
    busy: int
    """Slots running a task now."""
    queued: int
    """Tasks claimed into its local queue, not started."""
    processed: int
    handlers: list[WorkerHandler]
    running: list[str]
    """The ids of the running tasks the token may see (at most 20)."""
    running_not_shown: int
    """Running tasks not listed (beyond 20; for an app token, its own app's only)."""


@attrs.frozen
class WorkerList:
    """``GET /v1/workers``: the workers the token may see, live ones first."""

    registry: bool
    """The store keeps a worker registry (false: ``workers`` is empty, they still run)."""
    workers: list[WorkerInfo]


@attrs.frozen
class ErrorDetail:
    """What went wrong: a stable ``code``, a message for people and, when one value
    was refused, the ``field`` that holds it (docs/semantics.md, "Limits")."""

    code: str
    message: str
    field: str | None = attrs.field(default=None, metadata={OMITTED_WHEN_NONE: True})


@attrs.frozen
class ErrorBody:
    """Every error the service answers."""

    error: ErrorDetail


# -- JSON Schema of these classes ---------------------------------------------------------

RESPONSE_MODELS: tuple[type, ...] = (
    Task,
    Progress,
    Attempt,
    TaskEvent,
    SuspensionScope,
    TaskPage,
    Count,
    CancelledCount,
    DeletedCount,
    SuspendResult,
    ResumeResult,
    Summary,
    Published,
    Deleted,
    ErrorDetail,
    ErrorBody,
)
_ENUMS = (TaskStatus, CancelReason, EventKind)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_schema(tp: Any, components: dict[str, Any], *, closed: bool = False) -> dict[str, Any]:
    """The JSON Schema (OpenAPI 3.1) of type ``tp``; attrs classes and enums are added
    to ``components`` and referenced.

    :param closed: attrs classes refuse unknown properties (request bodies).
    """
    if tp is Any:
        return {}
    if tp is type(None):
        return {"type": "null"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if tp is datetime:
        return {"type": "string", "format": "date-time"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        name = tp.__name__
        if name not in components:
            components[name] = {"type": "string", "enum": [m.value for m in tp]}
        return _ref(name)
    if isinstance(tp, type) and attrs.has(tp):
        name = tp.__name__
        if name not in components:
            components[name] = {}  # placeholder: recursion-safe
            hints = typing.get_type_hints(tp)
            properties: dict[str, Any] = {}
            required: list[str] = []
            for field in attrs.fields(tp):
                if not field.init:
                    continue
                if REPLACED in field.metadata:
                    properties[field.name] = dict(field.metadata[REPLACED])
                else:
                    of_type = json_schema(hints[field.name], components, closed=closed)
                    properties[field.name] = _stating(of_type, field.metadata.get(SCHEMA))
                if field.default is attrs.NOTHING or not (
                    closed or field.metadata.get(OMITTED_WHEN_NONE)
                ):
                    required.append(field.name)
            schema: dict[str, Any] = {"type": "object", "properties": properties}
            if required:
                schema["required"] = required
            if closed:
                schema["additionalProperties"] = False
            extra = getattr(tp, "json_schema_extra", None)
            if extra is not None:
                schema.update(extra())
            if tp.__doc__:
                schema["description"] = " ".join(tp.__doc__.split())
            components[name] = schema
        return _ref(name)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return {"anyOf": [json_schema(a, components, closed=closed) for a in args]}
    if origin is Literal:
        return {"enum": list(args)}
    if origin is list or origin is tuple:
        return {"type": "array", "items": json_schema(args[0], components, closed=closed)}
    if origin is dict:
        return {"type": "object", "additionalProperties": json_schema(args[1], components)}
    raise TypeError(f"no JSON schema for {tp!r}")


def _stating(schema: dict[str, Any], keywords: dict[str, Any] | None) -> dict[str, Any]:
    """``schema`` with ``keywords`` added (to its non-null branches when it is a union;
    a description to the whole)."""
    if not keywords:
        return schema
    keywords = dict(keywords)
    described = {"description": keywords.pop("description")} if "description" in keywords else {}
    if "anyOf" in schema and keywords:
        branches = [b if b == {"type": "null"} else {**b, **keywords} for b in schema["anyOf"]]
        return {**schema, "anyOf": branches, **described}
    return {**schema, **keywords, **described}
