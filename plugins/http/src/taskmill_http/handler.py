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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx
from taskmill.context import Context
from taskmill.errors import Detached, Fail, ProxyError
from taskmill.model import JSON, Task
from taskmill.proxy import ProxyHandler
from taskmill.serialization import dumps
from taskmill.storage import Lease

_ERROR_EXCERPT = 500


def lease_token(lease: Lease) -> str:
    """The token a receiver passes back to report on the attempt of ``lease``: a
    fencing token (which attempt, which worker), not a credential; the bearer token
    says who may report."""
    return f"{lease.attempt}:{lease.worker_id}"


def parse_lease(task_id: str, token: str) -> Lease | None:
    """The lease ``token`` stands for on ``task_id``; None when it is malformed."""
    attempt, _, worker_id = token.partition(":")
    if not attempt.isdigit() or len(attempt) > 9 or not worker_id:
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


class HttpHandler(ProxyHandler["asyncio.Task[httpx.Response]"]):
    """Runs each task by ``POST url`` (see the module docstring for the protocol).

    Register it like any handler, in code or through a plugin::

        tm.register("thumbnail", HttpHandler("http://127.0.0.1:9000/run"), timeout=60)

    or, stored so that every worker serves it, with ``PUT /v1/handlers/{task_type}``.

    :param headers: extra request headers (an ``Authorization`` for the receiver, say).
    :param connect_timeout: seconds to connect; a receiver that cannot be reached is a
        retried failure. Waiting for the answer is bounded by the handler's
        ``timeout`` only.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"an HttpHandler URL is http:// or https://, got {url!r}")
        self.url = url
        self.headers = dict(headers or {})
        self.connect_timeout = connect_timeout
        self.cancel_grace = 0.0
        self._client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"HttpHandler({self.url!r})"

    def _http(self) -> httpx.AsyncClient:
        # One connection pool per handler and event loop.
        client = self._client
        if client is None or client.is_closed:
            timeout = httpx.Timeout(None, connect=self.connect_timeout)
            client = self._client = httpx.AsyncClient(timeout=timeout, trust_env=False)
        return client

    async def aclose(self) -> None:
        """Close the connections (a new request opens them again)."""
        if self._client is not None:
            await self._client.aclose()

    async def send(self, ctx: Context, params: dict[str, Any]) -> asyncio.Task[httpx.Response]:
        """Start the request; the attempt's outcome is its answer."""
        body = dumps(request_body(ctx.task))
        headers = {**self.headers, "Content-Type": "application/json"}
        return asyncio.create_task(self._http().post(self.url, content=body, headers=headers))

    async def receive(self, ctx: Context, handle: asyncio.Task[httpx.Response]) -> JSON:
        """Wait for the answer and map it to the attempt's outcome."""
        try:
            response = await handle
        except httpx.TimeoutException as exc:
            raise ProxyError(f"{self.url} did not answer: {type(exc).__name__}") from None
        except httpx.TransportError as exc:
            raise ProxyError(f"cannot reach {self.url}: {type(exc).__name__}: {exc}") from None
        status = response.status_code
        if status == 202:
            raise Detached(f"{self.url} took the attempt over (202 Accepted)")
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

    async def cancel(self, handle: asyncio.Task[httpx.Response], grace: float) -> None:
        """Abort the request: the receiver sees its connection closed."""
        handle.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await handle
