"""The route table: every endpoint once, from which both the Starlette routes and the
OpenAPI document are built (so the document cannot drift from what is served)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs
from starlette.requests import Request
from starlette.responses import Response

if TYPE_CHECKING:
    from taskmill_http.service import Call


@attrs.frozen
class Param:
    """A query or path parameter, as OpenAPI describes it."""

    name: str
    schema: dict[str, Any]
    description: str
    where: str = "query"
    repeated: bool = False


Handler = Callable[["Call"], Awaitable[Any]]
RawHandler = Callable[["Call"], Awaitable[Response]]


@attrs.frozen
class Endpoint:
    """One operation of the service."""

    method: str
    path: str
    """The path as OpenAPI writes it: ``/v1/tasks/{task_id}``."""
    handler: Handler | RawHandler
    summary: str
    returns: Any = None
    """The type of the response body (for the document); None: no JSON body."""
    status: int = 200
    body: Any = None
    """The type of the request body; None: none."""
    body_required: bool = True
    params: tuple[Param, ...] = ()
    admin_only: bool = False
    errors: tuple[int, ...] = ()
    """Statuses beyond 401/413/422/503, which every authenticated endpoint may answer."""
    raw: bool = False
    """The handler builds its own response (the event stream)."""
    media_type: str = "application/json"
    public: bool = False
    """No token needed (the OpenAPI document)."""
    description: str = ""

    @property
    def operation_id(self) -> str:
        name = getattr(self.handler, "__name__", "op").lstrip("_")
        return name


def path_params(request: Request) -> dict[str, str]:
    """The path parameters Starlette matched."""
    return dict(request.path_params)
