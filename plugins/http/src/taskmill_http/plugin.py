"""The taskmill plugin of taskmill-http (entry point ``http`` in ``taskmill.plugins``).

- ``taskmill serve`` runs the service (see :mod:`taskmill_http.commands`).

- Every worker serves the handlers registered in the store (``PUT /v1/handlers``): they
  are registered as :class:`~taskmill_http.HttpHandler` when the worker starts and kept
  in step while it runs (see :mod:`taskmill_http.stored`), each POSTing only to the
  hosts of the worker's allow-list (``$TASKMILL_HANDLER_HOSTS``, else loopback only;
  :attr:`HttpPlugin.handler_hosts` in code). ``worker.tick()`` fires no
  worker hooks: a loop that only ticks calls
  ``await taskmill_http.stored_handlers(tm).refresh()`` itself.
"""

from __future__ import annotations

from taskmill import hookimpl
from taskmill.plugins import CommandRegistrar
from taskmill.worker import Worker

from taskmill_http.allowlist import HandlerHosts
from taskmill_http.commands import add_serve
from taskmill_http.stored import stored_handlers


class HttpPlugin:
    """The hooks taskmill-http implements."""

    refresh_interval: float | None = None
    """Seconds between reads of the stored registrations (None: the default, 1 s)."""
    handler_hosts: HandlerHosts | None = None
    """The allow-list of the stored handlers' requests (None: ``$TASKMILL_HANDLER_HOSTS``,
    else loopback only; a ``Taskmill`` whose service ``create_app`` made keeps the
    service's)."""

    @hookimpl
    def taskmill_register_commands(self, commands: CommandRegistrar) -> None:
        """``taskmill serve``."""
        add_serve(commands)

    @hookimpl
    async def taskmill_worker_started(self, worker: Worker) -> None:
        """Register the stored HTTP handlers before the worker's first claim."""
        handlers = stored_handlers(
            worker.taskmill, interval=self.refresh_interval, hosts=self.handler_hosts
        )
        await handlers.start()

    @hookimpl
    async def taskmill_worker_stopped(self, worker: Worker) -> None:
        """Stop keeping them in step once no worker of that ``Taskmill`` runs."""
        await stored_handlers(worker.taskmill).stop()


plugin = HttpPlugin()
"""The object the ``taskmill.plugins`` entry point names."""
