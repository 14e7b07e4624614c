"""The service's conventions as the client writes and reads them, shared by
:class:`~taskmill_http.Client`'s requests and its event stream
(:mod:`taskmill_http.events_client`): a ``TaskFilter`` as the query parameters of a
listing, and an error response as the taskmill exception it stands for.
"""

from __future__ import annotations

from datetime import datetime

import httpx
from taskmill.errors import InvalidInput, TaskmillError
from taskmill.model import TaskFilter

from taskmill_http.errors import CODE_EXCEPTIONS


def raise_for_error(response: httpx.Response) -> None:
    """Raise the taskmill exception an error response stands for (nothing for a
    success); a refusal's ``field`` is the ``field`` of the ``InvalidInput`` raised."""
    if response.status_code < 400:
        return
    field = None
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
        if isinstance(error.get("field"), str):
            field = error["field"]
    except (ValueError, KeyError, TypeError, AttributeError):
        code, message = "http", f"HTTP {response.status_code}: {response.text[:200]}"
    kind = CODE_EXCEPTIONS.get(code, TaskmillError)
    if field is not None and issubclass(kind, InvalidInput):
        raise kind(message, field=field)
    raise kind(message)


def filter_params(filter: TaskFilter | None) -> list[tuple[str, str | int | float | bool | None]]:
    """``filter`` as the query parameters of the listing endpoints."""
    if filter is None:
        return []
    params: list[tuple[str, str | int | float | bool | None]] = []
    for name in ("app_id", "parent_id", "user_id", "dedupe_key"):
        value = getattr(filter, name)
        if value is not None:
            params.append((name, value))
    params.extend(("task_type", t) for t in filter.task_types or ())
    params.extend(("status", s.value) for s in filter.statuses or ())
    for name in ("created_after", "created_before"):
        moment: datetime | None = getattr(filter, name)
        if moment is not None:
            params.append((name, moment.isoformat()))
    return params
