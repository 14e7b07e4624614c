"""Errors of the service: one JSON shape, one status per kind of mistake.

Every error answer is ``{"error": {"code": "...", "message": "...", "field": "..."}}``.
The ``code`` is stable (clients branch on it, :class:`~taskmill_http.Client` turns it
back into the taskmill exception the same call raises in process); the message is for
people; ``field``, present when one value was refused, names it (the
:attr:`taskmill.errors.InvalidInput.field` of the core's refusal, or the body field,
path or query parameter the service refused).
"""

from __future__ import annotations

from typing import Any

from taskmill.errors import (
    InvalidCursor,
    InvalidInput,
    InvalidParams,
    InvalidTaskSpec,
    InvalidTransition,
    StorageUnavailable,
    TaskmillError,
    TaskNotFound,
    UnknownTaskType,
)


class ServiceError(TaskmillError):
    """A request the service refuses, with its HTTP status, error code and, when one
    value is to blame, the ``field`` that holds it."""

    def __init__(self, status: int, code: str, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.field = field


class Unauthorized(TaskmillError):
    """The service refused the token (missing, or not in its tokens file): 401."""


class PermissionDenied(TaskmillError):
    """The token may not do this (an app token on an admin endpoint, or naming another
    app's tasks in a filter): 403."""


class LeaseLost(TaskmillError):
    """A detached owner reported on an attempt it no longer holds (the task was
    rescued, or another attempt started): 409 ``lease_lost``."""


class TaskCancelled(TaskmillError):
    """A detached owner reported on a task that was cancelled or asked to stop: 409
    ``cancelled``. Stop working on it."""


EXCEPTION_STATUS: tuple[tuple[type[TaskmillError], int, str], ...] = (
    (TaskNotFound, 404, "not_found"),
    (UnknownTaskType, 422, "unknown_task_type"),
    (InvalidParams, 422, "invalid_params"),
    (InvalidTaskSpec, 422, "invalid_task_spec"),
    (InvalidTransition, 409, "invalid_transition"),
    (InvalidCursor, 422, "invalid_cursor"),
    (StorageUnavailable, 503, "unavailable"),
    (LeaseLost, 409, "lease_lost"),
    (TaskCancelled, 409, "cancelled"),
)
"""How a taskmill exception raised by an operation is answered (first match wins)."""

CODE_EXCEPTIONS: dict[str, type[TaskmillError]] = {
    "not_found": TaskNotFound,
    "unknown_task_type": UnknownTaskType,
    "invalid_params": InvalidParams,
    "invalid_task_spec": InvalidTaskSpec,
    "invalid_body": InvalidTaskSpec,
    "invalid_query": InvalidTaskSpec,
    "app_id_not_allowed": InvalidTaskSpec,
    "other_app": InvalidTaskSpec,
    "too_many_items": InvalidTaskSpec,
    "body_too_large": InvalidParams,
    "invalid_transition": InvalidTransition,
    "invalid_cursor": InvalidCursor,
    "cursor_expired": InvalidCursor,
    "unavailable": StorageUnavailable,
    "unauthorized": Unauthorized,
    "admin_only": PermissionDenied,
    "lease_lost": LeaseLost,
    "cancelled": TaskCancelled,
}
"""The exception :class:`~taskmill_http.Client` raises for each error code: the one
``tm.for_app()`` raises for the same call (a filter naming another app is an
``InvalidTaskSpec`` there too)."""


def status_of(exc: TaskmillError) -> tuple[int, str]:
    """The HTTP status and error code that answer ``exc``."""
    if isinstance(exc, ServiceError):
        return exc.status, exc.code
    for kind, status, code in EXCEPTION_STATUS:
        if isinstance(exc, kind):
            return status, code
    return 422, "invalid_request"


def field_of(exc: TaskmillError) -> str | None:
    """The field a refusal names (None when it names none)."""
    if isinstance(exc, InvalidInput | ServiceError):
        return exc.field
    return None


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """The one error shape: ``{"error": {"code", "message"}}``, with ``field`` in
    ``error`` when the refusal names one."""
    detail: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        detail["field"] = field
    return {"error": detail}
