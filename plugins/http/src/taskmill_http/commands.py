"""``taskmill serve``: the service on uvicorn (added through ``taskmill_register_commands``).

``taskmill serve [--url URL] [--host 127.0.0.1] [--port 8080] [--tokens FILE]
[--worker] [--handler-hosts HOSTS]``. The tokens file comes from ``--tokens``, else
``$TASKMILL_TOKENS_FILE``; there is no default, so a service never starts open to
anyone. The service's own settings (:mod:`taskmill_http.settings`: the handler-host
allow-list) come from their flags, their variables and the tokens file's ``[service]``
table. SIGINT/SIGTERM stop it (uvicorn finishes the requests in flight).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from taskmill.app import Taskmill
from taskmill.errors import ConfigurationError
from taskmill.plugins import CommandRegistrar

from taskmill_http.settings import ServiceSettings, add_flags
from taskmill_http.tokens import SESSION_SECRET_ENV, TOKENS_ENV, Tokens

log = logging.getLogger("taskmill.http")


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (taskmill-http depends on it outside
    Windows): it writes responses and reads requests at a fraction of asyncio's cost,
    which is most of the service's time once creates are coalesced. Imported when
    ``serve`` runs, not when the command line is built for another command."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def add_serve(commands: CommandRegistrar) -> None:
    """Add ``serve`` to the command line."""
    cmd = commands.add(
        "serve",
        serve,
        "Serve the task operations over HTTP for other processes (taskmill-http).",
        f"Requests authenticate with Authorization: Bearer TOKEN; --tokens (or "
        f"${TOKENS_ENV}) names the TOML file mapping each token to an app id, or to "
        '"*" for an admin. The dashboard is at /ui (sign in with a token; '
        f"${SESSION_SECRET_ENV} signs its session cookies). See docs/service.md and "
        "docs/dashboard.md.",
        loop_factory=_new_loop,
    )
    cmd.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    cmd.add_argument(
        "--port", type=int, default=8080, metavar="N", help="port to listen on (default 8080)"
    )
    cmd.add_argument(
        "--tokens", default=None, metavar="FILE", help=f"the tokens file (default: ${TOKENS_ENV})"
    )
    cmd.add_argument(
        "--worker",
        action="store_true",
        help="also run a worker in this process (the handlers registered in the store and "
        "those of the installed plugins), with the worker settings",
    )
    add_flags(cmd)


async def serve(args: argparse.Namespace, settings: Any) -> int:
    """Run the service until SIGINT/SIGTERM; exit status 0."""
    path = args.tokens or os.environ.get(TOKENS_ENV)
    if not path:
        raise ConfigurationError(
            f"taskmill serve needs a tokens file: --tokens FILE or ${TOKENS_ENV} (TOML with "
            '[tokens] "token" = "app_id", or "*" for an admin)'
        )
    tokens = Tokens.from_file(path)
    own = ServiceSettings.load(args=args, tokens_file=path)
    handler_hosts = own.handler_host_list()
    # The server's modules load here, not with the command line: every other command
    # (a worker's start, say) would pay for them.
    import uvicorn

    from taskmill_http.service import create_app

    class _Server(uvicorn.Server):
        """uvicorn's server, except that a SIGINT/SIGTERM that stopped it gracefully is
        not raised again afterwards: ``taskmill serve`` then exits 0, like ``taskmill
        worker``."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()

    tm = Taskmill(settings.url, **settings.taskmill_options())
    tm.load_plugins(enable=settings.enable_plugins, disable=settings.disable_plugins)
    worker_options = settings.worker_options()
    async with tm:
        app = create_app(
            tm,
            tokens,
            session_secret=os.environ.get(SESSION_SECRET_ENV) or None,
            # A detached owner's retry waits the backoff the workers use: the same settings.
            retry_policy=worker_options.get("retry_policy"),
            handler_hosts=handler_hosts,
        )
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=5,
        )
        server = _Server(config)
        worker = None
        running: asyncio.Task[None] | None = None
        if args.worker:
            options = {**worker_options, "handle_signals": False}
            worker = tm.worker(**options)
            running = asyncio.create_task(worker.run())
        print(
            f"taskmill serve: http://{args.host}:{args.port} ({len(tokens)} tokens"
            f"{', with a worker' if worker else ''}, on {_loop_name()}; handler hosts:"
            f" {', '.join(handler_hosts.entries) or 'none'})",
            file=sys.stderr,
            flush=True,
        )
        # What startup built (modules, the app, the store's statements) lives as long
        # as the process: frozen, the collector's full passes no longer walk it, which
        # under load was 5 % of the service's CPU (docs/benchmarks.md, "The HTTP service").
        gc.collect()
        gc.freeze()
        try:
            await server.serve()
        finally:
            if worker is not None and running is not None:
                await worker.stop()
                await running
    return 0


def _loop_name() -> str:
    """``uvloop`` or ``asyncio``: the event loop serving, as the startup line says."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
