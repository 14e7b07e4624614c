"""A Starlette app, served by uvicorn, that runs a taskmill worker in its lifespan.

Run it with ``uvicorn starlette_app:app``. uvicorn owns SIGINT and SIGTERM: on either it
ends the lifespan, and the lifespan stops the worker.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from taskmill import Taskmill

import reports

tm = Taskmill()  # $TASKMILL_URL, else sqlite:///taskmill.db
reports.register(tm)


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    async with tm:
        worker = tm.worker(concurrency=4)
        running = asyncio.create_task(worker.run())  # leaves SIGINT/SIGTERM to uvicorn
        try:
            yield
        finally:
            # Running tasks get 5 s to finish; the rest go back to PENDING.
            await worker.stop(grace=5)
            await running
    print("shutdown complete", flush=True)  # the rest of your shutdown code


async def enqueue_report(request: Request) -> JSONResponse:
    task = await tm.enqueue("report", await request.json())
    return JSONResponse({"id": task.id}, status_code=201)


app = Starlette(routes=[Route("/reports", enqueue_report, methods=["POST"])], lifespan=lifespan)
