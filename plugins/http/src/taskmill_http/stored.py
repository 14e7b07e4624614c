"""Handlers registered in the store (``PUT /v1/handlers/{task_type}``), served by every
worker that has taskmill-http installed.

:class:`StoredHandlers` keeps one ``Taskmill``'s handler registry in step with the
store's :class:`~taskmill.storage.HandlerRegistration` records: an
:class:`~taskmill_http.HttpHandler` for each, re-read every ``interval`` seconds (so a
registration made through any service replica reaches every worker within it), and
whenever the service changes one in this process. A registration whose key already has
a handler registered in code is skipped, with a warning: code wins.

Each handler checks the handler-host allow-list (:attr:`StoredHandlers.hosts`) at
every request: the list of this process (``$TASKMILL_HANDLER_HOSTS``, else loopback
only; ``create_app`` gives the service's), whatever list the registering service had.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from typing import Any

from taskmill.app import Taskmill
from taskmill.errors import HandlerConflict
from taskmill.storage import HandlerKey, HandlerRegistration

from taskmill_http.allowlist import HandlerHosts

log = logging.getLogger("taskmill.http.handlers")

SOURCE = "taskmill-http stored handler"
"""How the registry names who registered a stored handler (``taskmill plugins``,
conflict messages)."""
DEFAULT_INTERVAL = 1.0


def _source(key: HandlerKey) -> str:
    app_id, task_type = key
    return f"{SOURCE} {app_id or '(host)'}/{task_type}"


def _options(r: HandlerRegistration) -> tuple[object, ...]:
    return (r.url, r.timeout, r.max_retries, r.concurrency)


class StoredHandlers:
    """The stored registrations of one ``Taskmill``, kept registered in its registry."""

    def __init__(
        self,
        tm: Taskmill,
        *,
        interval: float = DEFAULT_INTERVAL,
        hosts: HandlerHosts | None = None,
    ) -> None:
        self.tm = tm
        self.interval = interval
        self._hosts = hosts
        self._served: dict[HandlerKey, HandlerRegistration] = {}
        self._skipped: set[HandlerKey] = set()
        self._users = 0
        self._loop: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def hosts(self) -> HandlerHosts:
        """The allow-list the handlers check at every request (default: this process's
        ``$TASKMILL_HANDLER_HOSTS``, else loopback only, read when first needed)."""
        if self._hosts is None:
            from taskmill_http.settings import ServiceSettings

            self._hosts = ServiceSettings.from_environment().handler_host_list()
        return self._hosts

    @hosts.setter
    def hosts(self, hosts: HandlerHosts) -> None:
        if hosts == self._hosts:
            return
        self._hosts = hosts
        # Registered again with the new list at the next refresh.
        for key in list(self._served):
            self.tm.registry.unregister_source(_source(key))
            del self._served[key]

    @property
    def served(self) -> list[HandlerRegistration]:
        """The registrations registered in the registry now."""
        return list(self._served.values())

    async def refresh(self) -> None:
        """Read the registrations and (un)register their handlers to match."""
        if not self.tm.storage.capabilities.handler_registrations:
            return
        async with self._lock:
            wanted = {r.key: r for r in await self.tm.storage.handler_registrations()}
            registry = self.tm.registry
            for key, old in list(self._served.items()):
                new = wanted.get(key)
                if new is None or _options(new) != _options(old):
                    registry.unregister_source(_source(key))
                    del self._served[key]
            for key, registration in wanted.items():
                if key in self._served:
                    continue
                try:
                    registry.register(
                        registration.task_type,
                        _http_handler(registration.url, self.hosts),
                        app_id=registration.app_id,
                        max_retries=registration.max_retries,
                        timeout=registration.timeout,
                        concurrency=registration.concurrency,
                        source=_source(key),
                    )
                except (HandlerConflict, ValueError) as exc:
                    if key not in self._skipped:
                        log.warning("stored handler %s/%s skipped: %s", key[0], key[1], exc)
                        self._skipped.add(key)
                    continue
                self._skipped.discard(key)
                self._served[key] = registration

    async def start(self) -> None:
        """Register the stored handlers now, then keep them in step (counted: each
        :meth:`start` needs a :meth:`stop`)."""
        self._users += 1
        try:
            await self.refresh()
        except Exception:
            log.exception("reading the stored handler registrations failed; retrying")
        if self._loop is None:
            self._loop = asyncio.create_task(self._refresh_loop(), name="taskmill-http-handlers")

    async def stop(self) -> None:
        """Undo one :meth:`start`; the last one stops refreshing."""
        self._users = max(0, self._users - 1)
        if self._users == 0 and self._loop is not None:
            loop, self._loop = self._loop, None
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.refresh()
            except Exception:
                log.exception("reading the stored handler registrations failed")


_BY_TASKMILL: weakref.WeakKeyDictionary[Taskmill, StoredHandlers] = weakref.WeakKeyDictionary()


def stored_handlers(
    tm: Taskmill, *, interval: float | None = None, hosts: HandlerHosts | None = None
) -> StoredHandlers:
    """The one :class:`StoredHandlers` of ``tm`` (made on first use); ``interval`` and
    ``hosts``, when given, replace its own."""
    found = _BY_TASKMILL.get(tm)
    if found is None:
        found = _BY_TASKMILL[tm] = StoredHandlers(
            tm, interval=interval or DEFAULT_INTERVAL, hosts=hosts
        )
        return found
    if interval is not None:
        found.interval = interval
    if hosts is not None:
        found.hosts = hosts
    return found


def _http_handler(url: str, hosts: HandlerHosts) -> Any:
    """An :class:`~taskmill_http.HttpHandler` for ``url`` that POSTs only where
    ``hosts`` allows; its HTTP client (httpx) is imported with the first stored
    registration, not with every worker's start."""
    from taskmill_http.handler import HttpHandler

    return HttpHandler(url, hosts=hosts)
