"""The ASGI app: SPEC section 10's task operations over HTTP, scoped by bearer token.

Every request is authenticated first (401 without a known token), then runs the same
operation as ``tm.for_app(app_id)`` for an app token, or as ``tm`` itself for an admin
token: a task of another app is 404, a filter naming another app is 403, an ``app_id``
in an app token's body is 422. Errors are ``{"error": {"code", "message"}}``, with the
refused ``field`` when there is one; bad input is never a 500. The values of a body are
the core's to check (:mod:`taskmill.validation`): its refusals are answered as 422.

The route table is :mod:`taskmill_http.routes`, what each endpoint does
:mod:`taskmill_http.endpoints` and :mod:`taskmill_http.reports`, the state behind the
app and the request an endpoint sees :mod:`taskmill_http.calls`; this module turns each
endpoint into a route and builds the app.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import Receive, Scope, Send
from taskmill.app import Taskmill
from taskmill.backoff import RetryPolicy
from taskmill.errors import TaskmillError
from taskmill.serialization import converter as model_converter
from taskmill.serialization import dumps

from taskmill_http import requests as rq
from taskmill_http.allowlist import HandlerHosts
from taskmill_http.calls import Call as Call  # re-exported: their old home
from taskmill_http.calls import Endpoint
from taskmill_http.calls import Limits as Limits
from taskmill_http.calls import Service as Service
from taskmill_http.dashboard import create_dashboard
from taskmill_http.errors import ServiceError, error_body, field_of, status_of
from taskmill_http.openapi import openapi_endpoint
from taskmill_http.routes import ENDPOINTS
from taskmill_http.routes import TASK_ENDPOINTS as TASK_ENDPOINTS  # its old home
from taskmill_http.tokens import Caller, Tokens

log = logging.getLogger("taskmill.http")


def json_response(value: Any, status: int = 200) -> Response:
    """``value`` (taskmill models, attrs bodies, plain JSON) as a JSON response."""
    return Response(
        dumps(model_converter.unstructure(value)), status, media_type="application/json"
    )


def error_response(status: int, code: str, message: str, field: str | None = None) -> Response:
    """The one error shape: ``{"error": {"code", "message"}}``, with ``"field"`` in
    ``error`` when one value was refused."""
    body = error_body(code, message, field)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return Response(dumps(body), status, media_type="application/json", headers=headers)


# -- the app ---------------------------------------------------------------------------


def _refuse_unknown_query(endpoint: Endpoint, request: Request) -> None:
    """:raises ServiceError: 422 ``invalid_query`` naming a query parameter the
    endpoint does not take (strict, as bodies are: a misspelt filter must not widen a
    listing to everything)."""
    known = {p.name for p in endpoint.params if p.where == "query"}
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        takes = ", ".join(sorted(known)) or "none"
        raise ServiceError(
            422,
            "invalid_query",
            f"unknown query parameter {unknown[0]!r} (this endpoint takes: {takes})",
            field=unknown[0],
        )


def _route(service: Service, endpoints: Sequence[Endpoint]) -> Route:
    """One route for every endpoint of a path (so that a 405 lists all its methods)."""
    by_method = {e.method: e for e in endpoints}
    if "GET" in by_method:
        by_method.setdefault("HEAD", by_method["GET"])

    async def serve(request: Request) -> Response:
        # Starlette answers other methods 405 with Allow (see _http_error).
        endpoint = by_method[request.method]
        try:
            caller = Caller(None) if endpoint.public else service.authenticate(request)
            _refuse_unknown_query(endpoint, request)
            if endpoint.admin_only and not caller.is_admin:
                raise ServiceError(403, "admin_only", "this endpoint needs an admin token")
            call = Call(service, caller, request, endpoint)
            if endpoint.body is not None:
                call.body = await rq.read_json(
                    request, service.limits.max_body_bytes, required=endpoint.body_required
                )
            result = await endpoint.handler(call)
        except TaskmillError as exc:
            status, code = status_of(exc)
            if status >= 500:
                log.warning("%s %s: %s", request.method, request.url.path, exc)
            return error_response(status, code, str(exc), field_of(exc))
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(500, "internal", "the service failed; see its log")
        if endpoint.raw:
            assert isinstance(result, Response)
            return result
        return json_response(result, endpoint.status)

    return Route(endpoints[0].path, serve, methods=list(by_method), name=endpoints[0].operation_id)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
    message = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
    response = error_response(exc.status_code, code, message)
    if exc.headers and "Allow" in exc.headers:
        response.headers["Allow"] = exc.headers["Allow"]
    return response


def create_app(
    tm: Taskmill,
    tokens: Tokens | Mapping[str, str],
    *,
    limits: Limits | None = None,
    dashboard: bool = True,
    session_secret: str | None = None,
    retry_policy: RetryPolicy | None = None,
    handler_hosts: HandlerHosts | Iterable[str] | None = None,
) -> Starlette:
    """The ASGI app of the service, for ``tm`` (an open ``Taskmill``, whose lifecycle
    stays the caller's) and ``tokens`` (a :class:`~taskmill_http.Tokens`, or a dict of
    token to app id or ``"*"``).

    Mount it in your own Starlette or FastAPI app, or serve it with uvicorn
    (``taskmill serve`` does). ``app.state.service`` is the :class:`Service` behind it.

    With ``dashboard`` (the default) the dashboard is served at ``/ui`` (see
    docs/dashboard.md); ``session_secret`` signs its session cookies (without one, a
    random key: sessions last as long as the process).

    ``retry_policy`` is the backoff a detached owner's ``retry`` report waits when it
    names no ``retry_in``: give the one of the workers that serve the tasks (``taskmill
    serve`` gives the one its ``retry_*`` settings make); None is ``RetryPolicy()``, the
    default of a worker (see :meth:`taskmill.Taskmill.report_detached`).

    ``handler_hosts`` is the allow-list of the hosts a handler registered with ``PUT
    /v1/handlers/{task_type}`` may POST to (a :class:`~taskmill_http.HandlerHosts`, or
    its entries: host names, ``*.suffix`` wildcards, IP addresses, CIDR networks, ``*``);
    None: ``$TASKMILL_HANDLER_HOSTS``, else loopback only. A registration outside it is
    refused (422 ``handler_host_not_allowed``), and a worker of ``tm`` checks every
    request against it (docs/service.md, "Handler hosts").
    """
    if not isinstance(tokens, Tokens):
        tokens = Tokens(tokens)
    if handler_hosts is not None and not isinstance(handler_hosts, HandlerHosts):
        handler_hosts = HandlerHosts(handler_hosts, source="create_app(handler_hosts=...)")
    service = Service(
        tm, tokens, limits or Limits(), retry_policy=retry_policy, handler_hosts=handler_hosts
    )
    endpoints = (*ENDPOINTS, openapi_endpoint(ENDPOINTS))
    service.endpoints = endpoints

    by_path: dict[str, list[Endpoint]] = {}
    for endpoint in endpoints:
        by_path.setdefault(endpoint.path, []).append(endpoint)
    api = [_route(service, group) for group in by_path.values()]
    routes: list[BaseRoute] = list(api)
    ui = create_dashboard(service, session_secret=session_secret) if dashboard else None
    if ui is not None:
        routes.append(Route("/ui", lambda request: RedirectResponse("ui/", 308)))
        routes.append(Mount("/ui", ui))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await service.start()
        if ui is not None:
            await ui.state.dashboard.start()
        try:
            yield
        finally:
            if ui is not None:
                await ui.state.dashboard.close()
            await service.close()

    app = ServiceApp(
        direct=api,
        routes=routes,
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.service = service
    return app


class ServiceApp(Starlette):
    """The service's Starlette app. A request for a path without parameters (``POST
    /v1/tasks``, ``GET /v1/tasks``...) with one of its methods goes straight to its
    endpoint, as Starlette's router would send it, without the layers around the router
    (its error middleware, its exception middleware and the route search): about 30 µs
    of the service's CPU per request, 8 % of a create whose task a worker in the same
    process runs. Everything else, and every request once middleware is added to the app
    or when it is mounted under a prefix (``root_path``), takes Starlette's own path.

    An endpoint answers every error itself (:func:`_route`), so the layers skipped had
    nothing to do for these requests; an exception while the answer is sent reaches the
    server, which answers 500 when nothing was sent yet, as those layers did.
    """

    def __init__(self, *, direct: Sequence[Route], **options: Any) -> None:
        """``direct``: the routes of :func:`_route` (their endpoints are ``serve``);
        ``options`` are Starlette's."""
        super().__init__(**options)
        self._direct: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {}
        for route in direct:
            if "{" not in route.path:
                for method in route.methods or ():
                    self._direct[(method, route.path)] = route.endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path") and not self.user_middleware:
            endpoint = self._direct.get((scope["method"], scope["path"]))
            if endpoint is not None:
                scope["app"] = self
                response = await endpoint(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)
