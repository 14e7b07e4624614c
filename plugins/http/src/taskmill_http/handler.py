"""``HttpHandler``: a proxy handler that runs each task by POSTing it to a URL.

The protocol, for receivers written in any language (also in docs/service.md):

- The worker sends ``POST url`` with ``{"task": {"id", "app_id", "task_type", "params",
  "attempt"}, "lease": "<token>", "lease_expires_at": "<ISO-8601>"}``.
- **200** with a JSON body (or an empty one): the task is COMPLETED with that result.
  A 200 whose body is not JSON fails the task (a broken receiver, not an unlucky one).
- **4xx**: the task FAILED, without a retry (dead letter); the body's start is the error.
- **5xx**, a refused or dropped connection: the attempt failed and is retried with
  backoff (while retries remain). A receiver slower than the handler's ``timeout``
  counts as a timed-out attempt, retried the same way.
- **202**: *detached*. The receiver owns the attempt from now on; the worker frees its
  slot. The receiver reports with ``POST /v1/tasks/{id}/progress`` (which also renews
  the lease) and ends it with ``POST /v1/tasks/{id}/status``, passing ``lease``; if it
  stops reporting, the lease expires and the task is rescued like any other. A cancel
  reaches it as ``409 cancelled`` on its next report.
- While attached, a cancel (or a suspension, a shutdown, the timeout) aborts the
  in-flight request: the receiver sees its connection closed.
- A redirect (3xx) is not followed: the task FAILED, naming where it pointed.
- The request carries the task's W3C trace context (``traceparent``, ``tracestate``,
  ``baggage``; :func:`trace_headers`), so a receiver's tracing continues the trace.

With an allow-list (``hosts``, :class:`~taskmill_http.allowlist.HandlerHosts`; every
handler registered over HTTP has the worker's), each request first checks the URL's
host: an address outside the list, or a name that resolves to one now, FAILS the
attempt without a request. A name off the list is resolved once per request and the
request goes to the addresses checked, not to what the name resolves to by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any, Final

import httpx
from taskmill.context import Context
from taskmill.errors import Detached, Fail, ProxyError
from taskmill.headers import HEADERS_KEY
from taskmill.model import JSON, Task
from taskmill.proxy import ProxyHandler
from taskmill.serialization import dumps
from taskmill.storage import Lease

from taskmill_http.allowlist import HandlerHosts, HostNotAllowed, Route
from taskmill_http.transport import (
    ConnectFailed,
    ConnectTimeout,
    HttpResponse,
    Origin,
    Transport,
    TransportFailed,
    check_header,
)

_ERROR_EXCERPT = 500
_DEFAULT_PORTS = {"http": 80, "https": 443}

TRACE_HEADERS: Final = ("traceparent", "tracestate", "baggage")
"""The W3C trace-context headers a request carries (:func:`trace_headers`)."""


def trace_headers(task: Task) -> dict[str, str]:
    """The trace context to send with ``task``'s request, as HTTP headers.

    When OpenTelemetry is loaded in this process and a span is current (with
    taskmill-otel, the attempt's ``process`` span), its context, through the
    configured propagator: the receiver's spans are children of the attempt. Otherwise
    the context stored with the task when it was enqueued (``enqueue(headers=...)``, the
    HTTP service's create, or taskmill-otel's ``send`` span): the receiver continues the
    producer's trace. Only ``traceparent``, ``tracestate`` and ``baggage`` are sent; a
    stored value that is not a valid header value is left out. Costs a dict lookup when
    OpenTelemetry is not loaded.
    """
    found: dict[str, str] = {}
    propagate = sys.modules.get("opentelemetry.propagate")
    if propagate is not None:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if "traceparent" in carrier:
            found = {name: carrier[name] for name in TRACE_HEADERS if name in carrier}
    if not found:
        stored = task.params.get(HEADERS_KEY)
        if not isinstance(stored, dict):
            return {}
        found = {
            name: value for name in TRACE_HEADERS if isinstance(value := stored.get(name), str)
        }
    for name, value in list(found.items()):
        try:
            check_header(name, value)
        except ValueError:
            del found[name]
    return found


async def url_route(hosts: HandlerHosts, url: str | httpx.URL) -> Route:
    """Where a request to ``url`` may go under ``hosts`` (the URL read as httpx reads
    it to connect: the host checked is the host connected to).

    :raises HostNotAllowed: the URL is not http(s), or ``hosts`` refuses its host.
    :raises OSError: its host is a name off the list that does not resolve now.
    """
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise HostNotAllowed(f"the handler URL {str(url)!r} is not a URL: {exc}") from None
    scheme = parsed.scheme
    if scheme not in _DEFAULT_PORTS or not parsed.raw_host:
        raise HostNotAllowed(f"the handler URL {str(url)!r} is not an http(s) URL with a host")
    host = parsed.raw_host.decode("ascii")
    return await hosts.route(host, parsed.port or _DEFAULT_PORTS[scheme])


def lease_token(lease: Lease) -> str:
    """The token a receiver passes back to report on the attempt of ``lease``: a
    fencing token (which attempt, which worker), not a credential; the bearer token
    says who may report."""
    return f"{lease.attempt}:{lease.worker_id}"


def parse_lease(task_id: str, token: str) -> Lease | None:
    """The lease ``token`` stands for on ``task_id``; None when it is malformed."""
    attempt, _, worker_id = token.partition(":")
    if not (attempt.isascii() and attempt.isdigit()) or len(attempt) > 9 or not worker_id:
        return None
    return Lease(task_id=task_id, worker_id=worker_id, attempt=int(attempt))


def lease_of(task: Task) -> Lease:
    """The lease of a claimed (RUNNING) snapshot."""
    assert task.worker_id is not None
    return Lease(task_id=task.id, worker_id=task.worker_id, attempt=task.attempts)


def request_body(task: Task) -> dict[str, Any]:
    """What the receiver gets for one attempt of ``task``."""
    expires = task.lease_expires_at
    return {
        "task": {
            "id": task.id,
            "app_id": task.app_id,
            "task_type": task.task_type,
            "params": task.params,
            "attempt": task.attempts,
        },
        "lease": lease_token(lease_of(task)),
        "lease_expires_at": None if expires is None else expires.isoformat(),
    }


_RESERVED_HEADERS: Final = frozenset({"host", "content-length", "transfer-encoding", "connection"})


class HttpHandler(ProxyHandler["asyncio.Task[HttpResponse]"]):
    """Runs each task by ``POST url`` (see the module docstring for the protocol).

    Register it like any handler, in code or through a plugin::

        tm.register("thumbnail", HttpHandler("http://127.0.0.1:9000/run"), timeout=60)

    or, stored so that every worker serves it, with ``PUT /v1/handlers/{task_type}``.

    :param headers: extra request headers (an ``Authorization`` for the receiver, say);
        not ``Host``, ``Content-Length``, ``Transfer-Encoding`` or ``Connection``, which
        the request sets itself.
    :param connect_timeout: seconds to connect; a receiver that cannot be reached is a
        retried failure. Waiting for the answer is bounded by the handler's
        ``timeout`` only.
    :param hosts: the hosts it may POST to, checked at every request (see the module
        docstring); None (the default for a handler registered in code): any.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        connect_timeout: float = 10.0,
        hosts: HandlerHosts | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"an HttpHandler URL is http:// or https://, got {url!r}")
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"the HttpHandler URL {url!r} is not a URL: {exc}") from None
        if not parsed.raw_host:
            raise ValueError(f"the HttpHandler URL {url!r} has no host")
        for name, value in (headers or {}).items():
            check_header(name, value)
            if name.lower() in _RESERVED_HEADERS:
                raise ValueError(f"an HttpHandler sets the {name} header itself")
        self.url = url
        self._parsed = parsed
        self._target = parsed.raw_path.decode("ascii")
        self._host_header = parsed.netloc.decode("ascii")
        self._origin: Origin = (
            parsed.scheme,
            parsed.raw_host.decode("ascii"),
            parsed.port or _DEFAULT_PORTS[parsed.scheme],
            None,
        )
        self.headers = dict(headers or {})
        self._request_headers = {**self.headers, "Content-Type": "application/json"}
        self._own_trace = {name.lower() for name in self.headers} & set(TRACE_HEADERS)
        self.connect_timeout = connect_timeout
        self.hosts = hosts
        self.cancel_grace = 0.0
        self._transport: Transport | None = None

    def __repr__(self) -> str:
        return f"HttpHandler({self.url!r})"

    def _http(self) -> Transport:
        # One set of kept-alive connections per handler (a worker runs one event loop).
        transport = self._transport
        if transport is None:
            transport = self._transport = Transport(connect_timeout=self.connect_timeout)
        return transport

    async def aclose(self) -> None:
        """Close the connections (a new request opens them again)."""
        if self._transport is not None:
            await self._transport.aclose()

    async def send(self, ctx: Context, params: dict[str, Any]) -> asyncio.Task[HttpResponse]:
        """Start the request; the attempt's outcome is its answer."""
        body = dumps(request_body(ctx.task)).encode()
        headers = self._request_headers
        trace = trace_headers(ctx.task)
        for name in self._own_trace:  # the handler's own headers win (set by hand)
            trace.pop(name, None)
        if trace:
            headers = {**trace, **headers}
        if self.hosts is None:
            return asyncio.create_task(
                self._http().post(self._origin, self._target, self._host_header, body, headers)
            )
        return asyncio.create_task(self._checked_post(self.hosts, body, headers))

    async def _checked_post(
        self, hosts: HandlerHosts, body: bytes, headers: dict[str, str]
    ) -> HttpResponse:
        """POST ``body`` where ``hosts`` lets the URL go: as it is (an address or a name
        on the list), else to each checked address of its name in turn (the ``Host``
        header and the TLS server name still the name's), never resolving it again."""
        route = await url_route(hosts, self._parsed)
        http = self._http()
        if not route.addresses:
            return await http.post(self._origin, self._target, self._host_header, body, headers)
        scheme, _, port, _ = self._origin
        server_name = route.host if scheme == "https" else None
        failure: ConnectFailed | None = None
        for address in route.addresses:
            try:
                return await http.post(
                    (scheme, address, port, server_name),
                    self._target,
                    self._host_header,
                    body,
                    headers,
                )
            except ConnectFailed as exc:
                failure = exc  # the next address, as a client tries a name's addresses
        assert failure is not None
        raise failure

    async def receive(self, ctx: Context, handle: asyncio.Task[HttpResponse]) -> JSON:
        """Wait for the answer and map it to the attempt's outcome."""
        try:
            response = await handle
        except HostNotAllowed as exc:
            raise Fail(f"not sent: {exc}") from None
        except OSError as exc:  # the name did not resolve: perhaps for a moment
            raise ProxyError(f"cannot resolve the host of {self.url}: {exc}") from None
        except ConnectTimeout as exc:
            raise ProxyError(f"{self.url} did not answer: ConnectTimeout: {exc}") from None
        except TransportFailed as exc:
            raise ProxyError(f"cannot reach {self.url}: {type(exc).__name__}: {exc}") from None
        status = response.status
        if status == 202:
            raise Detached(f"{self.url} took the attempt over (202 Accepted)")
        if 300 <= status < 400:
            where = response.headers.get("location", "nowhere")
            raise Fail(
                f"{self.url} answered {status}, a redirect to {where[:_ERROR_EXCERPT]!r},"
                " which is not followed: register the URL that answers"
            )
        if status == 200:
            if not response.content.strip():
                return None
            try:
                return json.loads(response.content)
            except ValueError:
                raise Fail(
                    f"{self.url} answered 200 with a body that is not JSON: "
                    f"{response.text[:_ERROR_EXCERPT]!r}"
                ) from None
        excerpt = response.text[:_ERROR_EXCERPT]
        if 400 <= status < 500:
            raise Fail(f"{self.url} refused the task ({status}): {excerpt}")
        raise ProxyError(f"{self.url} answered {status}: {excerpt}")

    async def cancel(self, handle: asyncio.Task[HttpResponse], grace: float) -> None:
        """Abort the request: the receiver sees its connection closed."""
        handle.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await handle
