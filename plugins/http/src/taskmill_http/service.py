"""The ASGI app: SPEC section 10's task operations over HTTP, scoped by bearer token.

Every request is authenticated first (401 without a known token), then runs the same
operation as ``tm.for_app(app_id)`` for an app token, or as ``tm`` itself for an admin
token: a task of another app is 404, a filter naming another app is 403, an ``app_id``
in an app token's body is 422. Errors are ``{"error": {"code", "message"}}``, with the
refused ``field`` when there is one; bad input is never a 500. The values of a body are
the core's to check (:mod:`taskmill.validation`): its refusals are answered as 422.

The route table is :mod:`taskmill_http.routes`, what each endpoint does
:mod:`taskmill_http.endpoints` and :mod:`taskmill_http.reports`; this module holds the
state behind the app and turns each endpoint into a route.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from taskmill.app import Taskmill
from taskmill.backoff import RetryPolicy
from taskmill.errors import TaskmillError
from taskmill.model import TaskFilter
from taskmill.operations import TaskOperations
from taskmill.serialization import converter as model_converter
from taskmill.serialization import dumps

from taskmill_http import requests as rq
from taskmill_http.coalescing import CreateCoalescer
from taskmill_http.errors import ServiceError, error_body, field_of, status_of
from taskmill_http.events import EventHub
from taskmill_http.jobs import ExternalJobs
from taskmill_http.routes import ENDPOINTS, Endpoint
from taskmill_http.routes import TASK_ENDPOINTS as TASK_ENDPOINTS  # its old home
from taskmill_http.stored import stored_handlers
from taskmill_http.tokens import Caller, Tokens

log = logging.getLogger("taskmill.http")


@attrs.frozen
class Limits:
    """What one request may ask of the service."""

    max_body_bytes: int = 8 * 1024 * 1024
    """The largest request body (413 past it)."""
    max_items: int = 1000
    """The most tasks one batch or children request creates, and the largest page of a
    listing (413 ``too_many_items`` past it)."""
    subscriber_queue: int = 1000
    """Events waiting for one event-stream subscriber; past it the subscriber is told
    to resume from its position and the stream ends."""
    heartbeat_seconds: float = 15.0
    """A comment line goes to an idle event stream this often, so that proxies keep it."""
    external_job_ttl: float = 3600.0
    """Seconds an external job is kept after its last update."""
    max_external_jobs: int = 10_000
    """External jobs one service process holds at most."""
    detached_lease_seconds: float = 30.0
    """Each report of a detached owner extends its lease to now + this."""


class Service:
    """The state behind one app: the ``Taskmill``, the tokens and the limits."""

    def __init__(
        self,
        tm: Taskmill,
        tokens: Tokens,
        limits: Limits,
        *,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        self.tm = tm
        self.tokens = tokens
        self.limits = limits
        self.retry_policy = retry_policy
        """The backoff of a detached owner's ``retry`` without ``retry_in``: that of the
        workers serving its tasks (None: ``RetryPolicy()``, a worker's default)."""
        self._handlers_started = False
        self.hub = EventHub(tm, queue_size=limits.subscriber_queue)
        """Fans the store's events (and in-memory ones) out to the event streams."""
        self.jobs = ExternalJobs(ttl=limits.external_job_ttl, max_jobs=limits.max_external_jobs)
        """The external jobs reported to this process."""
        self.handlers = stored_handlers(tm)
        """The handlers registered in the store, kept registered in ``tm``'s registry
        (so that enqueueing applies their options, and a worker of ``tm`` serves them)."""
        self.creates = CreateCoalescer(max_batch=limits.max_items)
        """Stores the single-task creates that arrive together with one call
        (``POST /v1/tasks``: see :mod:`taskmill_http.coalescing`)."""
        self.endpoints: tuple[Endpoint, ...] = ()
        """What the app serves (its route table; the OpenAPI document describes it)."""

    def authenticate(self, request: Request) -> Caller:
        """The caller the ``Authorization: Bearer`` header identifies.

        :raises ServiceError: 401 without a header, or with an unknown token.
        """
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ServiceError(401, "unauthorized", "send Authorization: Bearer <token>")
        caller = self.tokens.caller(token.strip())
        if caller is None:
            raise ServiceError(401, "unauthorized", "unknown token")
        return caller

    def operations(self, caller: Caller) -> TaskOperations:
        """The task operations of ``caller``: ``tm.for_app(app)``, or ``tm`` (admin)."""
        if caller.app_id is None:
            return self.tm
        return self.tm.for_app(caller.app_id)

    async def start(self) -> None:
        """Start keeping the stored handlers registered (the app's startup does it)."""
        if self.tm.storage.capabilities.handler_registrations:
            await self.handlers.start()
            self._handlers_started = True

    async def close(self) -> None:
        """Stop what the service runs in the background and end the event streams."""
        await self.creates.close()
        await self.hub.close()
        if self._handlers_started:
            self._handlers_started = False
            await self.handlers.stop()


@attrs.define
class Call:
    """One authenticated request, as an endpoint's handler sees it."""

    service: Service
    caller: Caller
    request: Request
    endpoint: Endpoint
    body: Any = None

    @property
    def ops(self) -> TaskOperations:
        return self.service.operations(self.caller)

    @property
    def limits(self) -> Limits:
        return self.service.limits

    def path(self, name: str) -> str:
        value = str(self.request.path_params[name])
        rq.check_identifier(name, value)
        return value

    def filter_from_query(self) -> TaskFilter:
        """The task filter of the query string, app-checked (403 for another app)."""
        request = self.request
        app_id = rq.query_one(request, "app_id")
        rq.ensure_own_app(self.caller.app_id, app_id)
        task_types = rq.query_values(request, "task_type")
        return TaskFilter(
            app_id=app_id,
            task_types=tuple(task_types) or None,
            statuses=rq.query_statuses(request),
            parent_id=rq.query_one(request, "parent_id"),
            user_id=rq.query_one(request, "user_id"),
            dedupe_key=rq.query_one(request, "dedupe_key"),
            created_after=rq.query_datetime(request, "created_after"),
            created_before=rq.query_datetime(request, "created_before"),
        )


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


def _route(service: Service, endpoint: Endpoint) -> Route:
    async def serve(request: Request) -> Response:
        try:
            caller = Caller(None) if endpoint.public else service.authenticate(request)
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

    return Route(endpoint.path, serve, methods=[endpoint.method], name=endpoint.operation_id)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
    message = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
    return error_response(exc.status_code, code, message)


def create_app(
    tm: Taskmill,
    tokens: Tokens | Mapping[str, str],
    *,
    limits: Limits | None = None,
    dashboard: bool = True,
    session_secret: str | None = None,
    retry_policy: RetryPolicy | None = None,
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
    """
    from taskmill_http.dashboard import create_dashboard
    from taskmill_http.openapi import openapi_endpoint

    if not isinstance(tokens, Tokens):
        tokens = Tokens(tokens)
    service = Service(tm, tokens, limits or Limits(), retry_policy=retry_policy)
    endpoints = (*ENDPOINTS, openapi_endpoint(ENDPOINTS))
    service.endpoints = endpoints

    routes: list[BaseRoute] = [_route(service, e) for e in endpoints]
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

    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.service = service
    return app
