"""The service's request and response bodies: attrs classes, (un)structured by cattrs.

One model system: request bodies are attrs classes structured by :data:`converter`
(strict: a string is not an int nor a list, a float is not an int, unknown fields are
refused), responses are taskmill's own models through
:func:`taskmill.serialization.to_dict`, and the OpenAPI schemas of both are derived from
the same classes by :func:`json_schema`.

The values themselves are checked by the core (:mod:`taskmill.validation`), which
refuses each with the field it names; a body field's ``metadata`` states those limits
in the schema (:func:`limits`), taken from the core's constants, so that the document
and the refusals cannot disagree.
"""

from __future__ import annotations

import enum
import types
import typing
from datetime import datetime
from typing import Any, Literal, Union

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
    RUN_AT_MAX,
    RUN_AT_MIN,
    TASK_ID_MAX,
    TASK_TYPE_MAX,
    TIMEOUT_MAX,
    USER_ID_MAX,
)

__all__ = [
    "BodyError",
    "CancelBody",
    "CleanupBody",
    "FilterBody",
    "PreemptBody",
    "SuspendBody",
    "TaskSpecBody",
    "converter",
    "json_schema",
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
        return converter.structure(value, cls)
    except Exception as exc:
        if isinstance(exc, cattrs.BaseValidationError):
            problems = cattrs.transform_error(exc, path="body", format_exception=_problem)
        else:
            problems = [f"{exc} @ body"]
        raise BodyError("; ".join(problems), field=_field_at_fault(exc)) from None


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
OMITTED_WHEN_NONE = "taskmill_http.omitted_when_none"
"""The ``metadata`` key of a response field left out when it is None (not required)."""


def limits(**keywords: Any) -> dict[str, Any]:
    """``metadata`` for an attrs field: JSON Schema keywords (``maxLength``,
    ``minimum``, ``format``, ``description``...) added to the schema of its type (to the
    non-null branch of an optional one). Give the core's figures
    (:mod:`taskmill.validation`): the schema states what the core refuses, never a
    limit of its own."""
    return {SCHEMA: keywords}


def _key(max_length: int, *, non_empty: bool = False) -> dict[str, Any]:
    return limits(maxLength=max_length, **({"minLength": 1} if non_empty else {}))


HANDLER_CONCURRENCY_MAX = 1_000_000
"""The most attempts of one stored handler running at once on a worker (the service's
own bound: the core sets none for a handler registered in code)."""

_TASK_TYPE = _key(TASK_TYPE_MAX, non_empty=True)
_APP_ID = _key(APP_ID_MAX)
_PRIORITY = limits(format="int32", minimum=PRIORITY_MIN, maximum=PRIORITY_MAX)
_MAX_RETRIES = limits(minimum=0, maximum=MAX_RETRIES_MAX)


# -- request bodies -----------------------------------------------------------------


@attrs.frozen
class TaskSpecBody:
    """One task to create: ``enqueue``'s arguments (SPEC section 3 names).

    ``app_id`` is taken from the caller's token; only an admin token may name one.
    ``delay`` is in seconds; ``run_at`` an ISO-8601 datetime with its UTC offset.
    """

    task_type: str = attrs.field(metadata=_TASK_TYPE)
    params: dict[str, Any] | None = None
    app_id: str | None = attrs.field(default=None, metadata=_APP_ID)
    priority: int = attrs.field(default=Priority.NORMAL.value, metadata=_PRIORITY)
    dedupe_key: str | None = attrs.field(default=None, metadata=_key(DEDUPE_KEY_MAX))
    run_at: datetime | None = attrs.field(
        default=None,
        metadata=limits(
            description=f"from {RUN_AT_MIN.isoformat()} to before {RUN_AT_MAX.isoformat()},"
            " with a UTC offset; a past one is due at once"
        ),
    )
    delay: float | None = attrs.field(
        default=None,
        metadata=limits(minimum=0, maximum=DELAY_MAX, description="seconds from now"),
    )
    parent_id: str | None = attrs.field(default=None, metadata=_key(TASK_ID_MAX))
    max_retries: int | None = attrs.field(default=None, metadata=_MAX_RETRIES)
    user_id: str | None = attrs.field(default=None, metadata=_key(USER_ID_MAX))


@attrs.frozen
class CancelBody:
    """How to cancel one task."""

    reason: CancelReason = CancelReason.USER
    cascade: bool = True


@attrs.frozen
class FilterBody:
    """Which tasks ``POST /v1/tasks:cancel`` cancels: every field set narrows the
    selection (only active tasks are ever cancelled). A body selecting nothing is
    refused: ``{"all": true}`` (and no other selecting field) cancels every active task
    of the caller's app (of every app, for an admin token)."""

    all: bool = False
    app_id: str | None = None
    task_types: list[str] | None = None
    statuses: list[TaskStatus] | None = None
    parent_id: str | None = None
    user_id: str | None = None
    dedupe_key: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    reason: CancelReason = CancelReason.USER
    cascade: bool = True

    def selects_something(self) -> bool:
        """Whether a field other than ``all``, ``reason`` and ``cascade`` is set."""
        skipped = {"all", "reason", "cascade"}
        return any(
            getattr(self, f.name) is not None
            for f in attrs.fields(FilterBody)
            if f.name not in skipped
        )


@attrs.frozen
class CleanupBody:
    """Delete terminal tasks that finished more than ``older_than_seconds`` ago."""

    older_than_seconds: float
    include_failed: bool = False


@attrs.frozen
class PreemptBody:
    """Cancel the active tasks of ``task_type`` (with ``dedupe_key``: only those) as
    PREEMPTED."""

    task_type: str = attrs.field(metadata=_TASK_TYPE)
    dedupe_key: str | None = None
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

    kind: str
    scope: str | None = None
    payload: Any = None
    app_id: str | None = None


@attrs.frozen
class HandlerBody:
    """A handler registered in the store: tasks of the path's type (of the token's app)
    are POSTed to ``url`` by every worker. The options are ``Taskmill.handler``'s. Only
    an admin token may name an ``app_id`` (null: the host's handler)."""

    url: str
    timeout: float | None = attrs.field(
        default=None, metadata=limits(exclusiveMinimum=0, maximum=TIMEOUT_MAX)
    )
    max_retries: int | None = attrs.field(default=None, metadata=_MAX_RETRIES)
    concurrency: int | None = attrs.field(
        default=None, metadata=limits(minimum=1, maximum=HANDLER_CONCURRENCY_MAX)
    )
    app_id: str | None = attrs.field(default=None, metadata=_APP_ID)


@attrs.frozen
class ProgressReport:
    """A detached owner's progress report (it also renews the lease): ``done`` of
    ``total`` with a message, and ``data`` merged into the task's data."""

    lease: str
    done: float | None = None
    total: float | None = None
    message: str | None = None
    data: dict[str, Any] | None = None


@attrs.frozen
class StatusReport:
    """A detached owner's end of the attempt: ``completed`` (with ``result``),
    ``failed`` (dead letter, with ``error``), ``retry`` (another attempt after
    ``retry_in`` seconds or the backoff) or ``cancelled``."""

    lease: str
    status: Literal["completed", "failed", "retry", "cancelled"]
    result: Any = None
    error: str | None = None
    retry_in: float | None = None


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
