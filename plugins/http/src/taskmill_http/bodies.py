"""The service's request and response bodies: attrs classes, (un)structured by cattrs.

One model system: request bodies are attrs classes structured by :data:`converter`
(strict: a string is not an int, unknown fields are refused), responses are taskmill's
own models through :func:`taskmill.serialization.to_dict`, and the OpenAPI schemas of
both are derived from the same classes by :func:`json_schema`.
"""

from __future__ import annotations

import enum
import types
import typing
from datetime import datetime
from typing import Any, Literal, Union

import attrs
import cattrs
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
    "structure",
]


class BodyError(ValueError):
    """A request body does not have the shape its endpoint takes (the message says
    where and why)."""


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


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    base = make_converter()  # taskmill's own datetime rules: ISO-8601, tz-aware, UTC
    conv.register_structure_hook(datetime, base.get_structure_hook(datetime))
    conv.register_unstructure_hook(datetime, base.get_unstructure_hook(datetime))
    for kind in (str, int, float, bool):
        conv.register_structure_hook(kind, _strict(kind))
    return conv


converter = _make_converter()
"""Structures request bodies: strict scalar types, no unknown fields, tz-aware
datetimes."""

T = typing.TypeVar("T")


def structure(value: Any, cls: type[T]) -> T:
    """``value`` (parsed JSON) as a ``cls``.

    :raises BodyError: it does not fit; the message lists every problem with its path.
    """
    try:
        return converter.structure(value, cls)
    except Exception as exc:
        if isinstance(exc, cattrs.BaseValidationError):
            problems = cattrs.transform_error(exc, path="body")
        else:
            problems = [f"{exc} @ body"]
        raise BodyError("; ".join(problems)) from None


# -- request bodies -----------------------------------------------------------------


@attrs.frozen
class TaskSpecBody:
    """One task to create: ``enqueue``'s arguments (SPEC section 3 names).

    ``app_id`` is taken from the caller's token; only an admin token may name one.
    ``delay`` is in seconds; ``run_at`` an ISO-8601 datetime with its UTC offset.
    """

    task_type: str
    params: dict[str, Any] | None = None
    app_id: str | None = None
    priority: int = Priority.NORMAL.value
    dedupe_key: str | None = None
    run_at: datetime | None = None
    delay: float | None = None
    parent_id: str | None = None
    max_retries: int | None = None
    user_id: str | None = None


@attrs.frozen
class CancelBody:
    """How to cancel one task."""

    reason: CancelReason = CancelReason.USER
    cascade: bool = True


@attrs.frozen
class FilterBody:
    """Which tasks ``POST /v1/tasks:cancel`` cancels: every field set narrows the
    selection (only active tasks are ever cancelled)."""

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


@attrs.frozen
class CleanupBody:
    """Delete terminal tasks that finished more than ``older_than_seconds`` ago."""

    older_than_seconds: float
    include_failed: bool = False


@attrs.frozen
class PreemptBody:
    """Cancel the active tasks of ``task_type`` (with ``dedupe_key``: only those) as
    PREEMPTED."""

    task_type: str
    dedupe_key: str | None = None
    app_id: str | None = None


@attrs.frozen
class SuspendBody:
    """A suspension scope: every task type when ``task_type`` is null."""

    task_type: str | None = None
    app_id: str | None = None


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
    timeout: float | None = None
    max_retries: int | None = None
    concurrency: int | None = None
    app_id: str | None = None


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
    """What went wrong: a stable ``code`` and a message for people."""

    code: str
    message: str


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
                properties[field.name] = json_schema(hints[field.name], components, closed=closed)
                if field.default is attrs.NOTHING or not closed:
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
