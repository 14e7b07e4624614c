"""ASGI entry point: Django serves HTTP, and the ASGI lifespan runs the taskmill worker.

Django's own ASGI handler does not take part in the lifespan protocol, so this module
answers the lifespan events and hands every other connection to Django. Run it with
``uvicorn django_site.asgi:application``. uvicorn owns SIGINT and SIGTERM: on either it
ends the lifespan, and the lifespan stops the worker.
"""

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_site.settings")
django_application = get_asgi_application()  # sets Django up: import the project after

from django.conf import settings  # noqa: E402

from django_site.tasks import tm  # noqa: E402

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]


@contextlib.asynccontextmanager
async def run_worker() -> AsyncIterator[None]:
    async with tm:
        worker = tm.worker(concurrency=4)
        running = asyncio.create_task(worker.run())  # leaves SIGINT/SIGTERM to the server
        try:
            yield
        finally:
            await worker.stop(grace=settings.TASKMILL_SHUTDOWN_GRACE)
            await running
    print("shutdown complete", flush=True)  # the rest of your shutdown code


async def lifespan(receive: Receive, send: Send) -> None:
    """Enter ``run_worker()`` at the server's startup and leave it at its shutdown."""
    async with contextlib.AsyncExitStack() as stack:
        await receive()  # {"type": "lifespan.startup"}
        try:
            await stack.enter_async_context(run_worker())
        except Exception as exc:
            await send({"type": "lifespan.startup.failed", "message": repr(exc)})
            return
        await send({"type": "lifespan.startup.complete"})
        await receive()  # {"type": "lifespan.shutdown"}
        try:
            await stack.aclose()
        except Exception as exc:
            await send({"type": "lifespan.shutdown.failed", "message": repr(exc)})
            return
    await send({"type": "lifespan.shutdown.complete"})


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
    else:
        await django_application(scope, receive, send)
