"""taskmill-http: the task operations over HTTP for other processes.

- :func:`create_app` builds the ASGI app (Starlette) of the service for an open
  ``Taskmill`` and its tokens; ``taskmill serve`` runs it with uvicorn.
- :class:`Client` calls the service with the methods of ``tm.for_app(...)``.

See docs/service.md.
"""

from typing import TYPE_CHECKING, Any

from taskmill_http.allowlist import HandlerHosts, HostNotAllowed
from taskmill_http.errors import (
    LeaseLost,
    PermissionDenied,
    ServiceError,
    TaskCancelled,
    Unauthorized,
)
from taskmill_http.stored import StoredHandlers, stored_handlers
from taskmill_http.tokens import ADMIN, TOKENS_ENV, Caller, Tokens

if TYPE_CHECKING:
    from taskmill_http.client import Client
    from taskmill_http.events_client import Subscription
    from taskmill_http.handler import HttpHandler
    from taskmill_http.service import Limits, Service, create_app

# Loaded on first use: the client and handler bring httpx, the service Starlette and
# the dashboard, and a worker process (which loads this plugin) needs none of them.
_LAZY = {
    "Client": "taskmill_http.client",
    "Subscription": "taskmill_http.events_client",
    "HttpHandler": "taskmill_http.handler",
    "Limits": "taskmill_http.service",
    "Service": "taskmill_http.service",
    "create_app": "taskmill_http.service",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'taskmill_http' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ADMIN",
    "TOKENS_ENV",
    "Caller",
    "Client",
    "HandlerHosts",
    "HostNotAllowed",
    "HttpHandler",
    "LeaseLost",
    "Limits",
    "PermissionDenied",
    "Service",
    "ServiceError",
    "StoredHandlers",
    "Subscription",
    "TaskCancelled",
    "Tokens",
    "Unauthorized",
    "create_app",
    "stored_handlers",
]
