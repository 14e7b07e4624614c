"""What an endpoint is and what its handler is given: the :class:`Endpoint` the route
table lists (its :class:`Param` s), and the :class:`Call`, one authenticated request,
over the :class:`Service`, the state behind one app (bounded by its :class:`Limits`).

The endpoints (:mod:`taskmill_http.endpoints`, :mod:`taskmill_http.reports`), the route
table, the OpenAPI document and the dashboard build on this module;
:mod:`taskmill_http.service` turns each endpoint into a route of the app.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from starlette.requests import Request
from starlette.responses import Response
from taskmill.app import Taskmill
from taskmill.backoff import RetryPolicy
from taskmill.model import TaskFilter
from taskmill.operations import TaskOperations

from taskmill_http import requests as rq
from taskmill_http.allowlist import HandlerHosts
from taskmill_http.coalescing import CreateCoalescer
from taskmill_http.errors import ServiceError
from taskmill_http.events import EventHub
from taskmill_http.jobs import ExternalJobs
from taskmill_http.metrics import MetricsCollector
from taskmill_http.stored import stored_handlers
from taskmill_http.tokens import Caller, Tokens


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
    depth_sample_seconds: float = 10.0
    """How often the metrics collector samples the queue depth (the store's summary
    counts: one for the whole store, one per sampled app; docs/service.md, "Metrics")."""


class Service:
    """The state behind one app: the ``Taskmill``, the tokens, the limits and the
    handler-host allow-list."""

    def __init__(
        self,
        tm: Taskmill,
        tokens: Tokens,
        limits: Limits,
        *,
        retry_policy: RetryPolicy | None = None,
        handler_hosts: HandlerHosts | None = None,
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
        self.metrics = MetricsCollector(
            tm, self.hub, tokens, depth_sample_seconds=limits.depth_sample_seconds
        )
        """Counts the last hour per minute and app from the hub's events, and samples the
        queue depth (``GET /v1/metrics/timeline``, the dashboard's charts)."""
        self.jobs = ExternalJobs(ttl=limits.external_job_ttl, max_jobs=limits.max_external_jobs)
        """The external jobs reported to this process."""
        self.handlers = stored_handlers(tm, hosts=handler_hosts)
        """The handlers registered in the store, kept registered in ``tm``'s registry
        (so that enqueueing applies their options, and a worker of ``tm`` serves them)."""
        self.creates = CreateCoalescer(max_batch=limits.max_items)
        """Stores the single-task creates that arrive together with one call
        (``POST /v1/tasks``: see :mod:`taskmill_http.coalescing`)."""
        self.endpoints: tuple[Endpoint, ...] = ()
        """What the app serves (its route table; the OpenAPI document describes it)."""

    @property
    def handler_hosts(self) -> HandlerHosts:
        """Where a handler registered through this service may POST: checked when it is
        registered, and at every request by a worker of ``tm``, with this same list."""
        return self.handlers.hosts

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
        """Start keeping the stored handlers registered, and the metrics collector (the
        app's startup does it)."""
        if self.tm.storage.capabilities.handler_registrations:
            await self.handlers.start()
            self._handlers_started = True
        await self.metrics.start()

    async def close(self) -> None:
        """Stop what the service runs in the background and end the event streams."""
        await self.creates.close()
        await self.metrics.close()
        await self.hub.close()
        if self._handlers_started:
            self._handlers_started = False
            await self.handlers.stop()


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
