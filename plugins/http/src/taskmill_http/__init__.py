"""taskmill-http: the task operations over HTTP for other processes.

- :func:`create_app` builds the ASGI app (Starlette) of the service for an open
  ``Taskmill`` and its tokens; ``taskmill serve`` runs it with uvicorn.
- :class:`Client` calls the service with the methods of ``tm.for_app(...)``.

See docs/service.md.
"""

from taskmill_http.client import Client
from taskmill_http.errors import (
    LeaseLost,
    PermissionDenied,
    ServiceError,
    TaskCancelled,
    Unauthorized,
)
from taskmill_http.handler import HttpHandler
from taskmill_http.service import Limits, Service, create_app
from taskmill_http.stored import StoredHandlers, stored_handlers
from taskmill_http.tokens import ADMIN, TOKENS_ENV, Caller, Tokens

__all__ = [
    "ADMIN",
    "TOKENS_ENV",
    "Caller",
    "Client",
    "HttpHandler",
    "LeaseLost",
    "Limits",
    "PermissionDenied",
    "Service",
    "ServiceError",
    "StoredHandlers",
    "TaskCancelled",
    "Tokens",
    "Unauthorized",
    "create_app",
    "stored_handlers",
]
