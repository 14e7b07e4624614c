"""Reading requests safely: bounded bodies, strict JSON, validated query parameters.

Everything here raises :class:`~taskmill_http.errors.ServiceError` with the status the
mistake deserves (400, 413, 422) and the ``field`` at fault, so that no input reaches
the core in a shape it would not refuse cleanly. The values themselves (lengths, ranges,
NUL) are the core's to refuse (:mod:`taskmill.validation`); the service answers those
refusals as 422 with the same ``field``.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

from starlette.requests import Request
from taskmill.model import TaskStatus
from taskmill.validation import (
    APP_ID_MAX,
    DEDUPE_KEY_MAX,
    TASK_ID_MAX,
    TASK_TYPE_MAX,
    USER_ID_MAX,
)

from taskmill_http.bodies import IDENTIFIER_MAX, NO_NUL, SECONDS_MAX, BodyError, structure
from taskmill_http.errors import ServiceError

T = TypeVar("T")

MAX_IDENTIFIER = IDENTIFIER_MAX
"""The longest other name in a path or query parameter (an event position, an external
job's id)."""
CURSOR_MAX = -(-(1 + 4 * TASK_ID_MAX) * 4 // 3)
"""The longest listing cursor: the unpadded base64 of ``k`` and a task id of
``TASK_ID_MAX`` characters of 4 UTF-8 bytes each."""
_B64 = "[A-Za-z0-9_-]"
CURSOR = f"a[w-z0-9_-](?:(?:{_B64}{{4}})*{_B64}{{1,2}}|(?:{_B64}{{4}})+)"
"""What a listing cursor looks like (:func:`encode_cursor`): unpadded URL-safe base64
(never of a length that leaves 6 bits over) of ``k`` and a task id, so it starts with
``a`` and one of ``w-z0-9_-``. Any text of this shape decodes to a task id."""
INTEGER = "[0-9]+"
"""An integer query parameter: ASCII digits, nothing else (no sign, no spaces)."""
KEY_MAX: dict[str, int] = {
    "task_type": TASK_TYPE_MAX,
    "task_types": TASK_TYPE_MAX,
    "app_id": APP_ID_MAX,
    "user_id": USER_ID_MAX,
    "dedupe_key": DEDUPE_KEY_MAX,
    "parent_id": TASK_ID_MAX,
    "task_id": TASK_ID_MAX,
    "cursor": CURSOR_MAX,
}
"""The longest value of each key a path or query parameter names: the core's limits
(a longer one names nothing any store holds)."""
MAX_SECONDS = SECONDS_MAX
"""The longest retention age or retry delay (100 years) a request may name."""


def max_length(name: str) -> int:
    """The longest value the path or query parameter ``name`` takes."""
    return KEY_MAX.get(name, MAX_IDENTIFIER)


def text_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of the path or query parameter ``name``: a string of at most
    :func:`max_length` characters without NUL, as :func:`query_one`,
    :func:`query_values` and :func:`check_identifier` take it."""
    return {"type": "string", "maxLength": max_length(name), "pattern": f"^{NO_NUL}$"}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def read_json(request: Request, max_bytes: int, *, required: bool = True) -> Any:
    """The request body as parsed JSON (None for an empty optional body).

    :raises ServiceError: 413 past ``max_bytes``, 400 when it is not JSON (NaN and
        Infinity included) or holds a lone surrogate, 422 when a required body is
        empty, or an optional one is ``null`` (leave the body out instead).
    """
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise ServiceError(413, "body_too_large", f"the body is over {max_bytes} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise ServiceError(413, "body_too_large", f"the body is over {max_bytes} bytes")
    if not body.strip():
        if required:
            raise ServiceError(422, "invalid_body", "this endpoint needs a JSON body")
        return None
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise ServiceError(400, "invalid_json", f"the body is not JSON: {exc}") from None
    if b"\\u" in body or b"\\U" in body:
        # A lone surrogate parses, but no store can keep it (it is not UTF-8).
        try:
            json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise ServiceError(
                400, "invalid_json", "the body holds a lone surrogate (\\ud800-\\udfff)"
            ) from None
    if value is None:
        # Not "no body": an optional body is left out, or is what its schema says.
        hint = "send" if required else "leave the body out, or send"
        raise ServiceError(
            422, "invalid_body", f"the body is null; {hint} the JSON this endpoint takes"
        )
    return value


def body_as(value: Any, cls: type[T]) -> T:
    """A parsed JSON body as the attrs class ``cls``, each field of its JSON type (its
    values are for the core to check).

    :raises ServiceError: 422 ``invalid_body`` naming every problem, with the first
        field at fault.
    """
    if not isinstance(value, dict):
        raise ServiceError(422, "invalid_body", "the body must be a JSON object")
    try:
        return structure(value, cls)
    except BodyError as exc:
        raise ServiceError(422, "invalid_body", str(exc), field=exc.field) from None


def list_body(value: Any, cls: type[T], max_items: int) -> list[T]:
    """A parsed JSON body that must be a list of ``cls`` objects, at most ``max_items``.

    :raises ServiceError: 422 when it is not a list or an item does not fit, 413
        ``too_many_items`` past ``max_items``.
    """
    if not isinstance(value, list):
        raise ServiceError(422, "invalid_body", "the body must be a JSON array")
    if len(value) > max_items:
        raise ServiceError(
            413, "too_many_items", f"{len(value)} items; at most {max_items} per request"
        )
    items = []
    for i, item in enumerate(value):
        try:
            items.append(body_as(item, cls))
        except ServiceError as exc:
            raise ServiceError(exc.status, exc.code, f"item {i}: {exc}", field=exc.field) from None
    return items


def check_identifier(name: str, value: str | None) -> None:
    """:raises ServiceError: 422 when ``value`` (a path parameter, or another name the
    core does not check) is empty, longer than :func:`max_length` or holds a NUL."""
    if value is None:
        return
    longest = max_length(name)
    if not value or len(value) > longest or "\x00" in value:
        raise ServiceError(
            422,
            "invalid_body",
            f"{name} must be 1 to {longest} characters without NUL",
            field=name,
        )


# -- query parameters -------------------------------------------------------------------


def query_values(request: Request, name: str) -> list[str]:
    """Every value of a repeatable parameter (``?status=a&status=b`` or ``a,b``; empty
    ones skipped). Each value as sent (commas and all) is checked as
    :func:`text_schema` states: at most :func:`max_length` characters, no NUL."""
    values: list[str] = []
    for raw in request.query_params.getlist(name):
        if "\x00" in raw or len(raw) > max_length(name):
            raise ServiceError(
                422,
                "invalid_query",
                f"{name}: a value is over {max_length(name)} characters or has a NUL",
                field=name,
            )
        values.extend(v for v in raw.split(",") if v)
    return values


STATUSES = "|".join(s.value for s in TaskStatus)
STATUS_LIST = f"(?:{STATUSES})(?:,(?:{STATUSES}))*"
"""A value of the ``status`` parameter: one status, or several separated by commas."""


def query_one(request: Request, name: str) -> str | None:
    """A single-valued parameter (the last one given), or None."""
    values = request.query_params.getlist(name)
    if not values:
        return None
    value = values[-1]
    if not value or "\x00" in value or len(value) > max_length(name):
        raise ServiceError(
            422,
            "invalid_query",
            f"{name} must be 1 to {max_length(name)} characters without NUL",
            field=name,
        )
    return value


def query_statuses(request: Request) -> tuple[TaskStatus, ...] | None:
    """The ``status`` parameter's statuses (None without one); each value sent is
    :data:`STATUS_LIST`."""
    raw = request.query_params.getlist("status")
    if not raw:
        return None
    if not all(re.fullmatch(STATUS_LIST, value) for value in raw):
        choices = ", ".join(s.value for s in TaskStatus)
        raise ServiceError(
            422,
            "invalid_query",
            f"status must be one of {choices} (several: repeat it, or separate with commas)",
            field="status",
        )
    return tuple(TaskStatus(v) for value in raw for v in value.split(","))


def query_datetime(request: Request, name: str) -> datetime | None:
    value = query_one(request, name)
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        moment = None
    if moment is None or moment.utcoffset() is None:
        raise ServiceError(
            422,
            "invalid_query",
            f"{name} must be an ISO-8601 datetime with a UTC offset",
            field=name,
        )
    return moment


def query_int(request: Request, name: str, default: int, low: int, cap: int) -> int:
    """An integer parameter of at least ``low``; a value above ``cap`` is taken as
    ``cap`` (a page larger than the service serves is a page of its largest size)."""
    value = query_one(request, name)
    if value is None:
        return default
    number = int(value) if re.fullmatch(INTEGER, value) else low - 1
    if number < low:
        raise ServiceError(
            422, "invalid_query", f"{name} must be an integer of at least {low}", field=name
        )
    return min(number, cap)


def encode_cursor(last_task_id: str) -> str:
    """The opaque ``cursor`` of the page that follows the task ``last_task_id``.

    A keyset position: the next page starts right after that task in the store's
    insertion order (:meth:`taskmill.TaskStorage.query` with ``after``), so it costs no
    scan of the earlier rows and does not shift when tasks are added or cleaned up.
    """
    return base64.urlsafe_b64encode(f"k{last_task_id}".encode()).decode().rstrip("=")


def decode_cursor(request: Request) -> str | None:
    """The task id the ``cursor`` parameter stands for (None without one).

    Every text of the cursor's shape (:data:`CURSOR`) stands for some task id (bytes
    that are not UTF-8 decode with U+FFFD): one this service did not hand out names no
    stored task, and the listing answers it as it answers a cursor whose task is gone.

    :raises ServiceError: 422 for a text that is not of the cursor's shape.
    """
    value = query_one(request, "cursor")
    if value is None:
        return None
    if re.fullmatch(CURSOR, value) is None:
        raise ServiceError(
            422, "invalid_query", "cursor is not one this service handed out", field="cursor"
        )
    raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    return raw[1:].decode("utf-8", "replace")  # raw[0] is b"k": the shape says so


def ensure_own_app(caller_app: str | None, named: str | None) -> None:
    """:raises ServiceError: 403 when an app token names another app in a filter."""
    if caller_app is not None and named is not None and named != caller_app:
        raise ServiceError(
            403,
            "other_app",
            f"this token acts for app {caller_app!r}, not {named!r}",
            field="app_id",
        )


def refuse_app_id(caller_app: str | None, named: Sequence[str | None]) -> None:
    """:raises ServiceError: 422 when an app token's body names an ``app_id``: the app
    comes from the token alone."""
    if caller_app is not None and any(a is not None for a in named):
        raise ServiceError(
            422,
            "app_id_not_allowed",
            "the app comes from the token; remove app_id from the body",
            field="app_id",
        )
