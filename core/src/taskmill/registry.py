"""The handler registry: which callable runs a task, keyed by ``(app_id, task_type)``."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import attrs

from taskmill.errors import HandlerConflict, InvalidHandler
from taskmill.limits import Rate, TypeLimit, check_max_running, parse_rate
from taskmill.model import JSON
from taskmill.storage import FinishKind, HandlerKey
from taskmill.validation import (
    APP_ID_MAX,
    MAX_RETRIES_MAX,
    TASK_TYPE_MAX,
    check_int,
    check_key,
    check_timeout,
)

if TYPE_CHECKING:
    from taskmill.context import Context

AsyncHandlerFunc: TypeAlias = Callable[["Context", dict[str, Any]], Awaitable[JSON]]
SyncHandlerFunc: TypeAlias = Callable[["Context", dict[str, Any]], JSON]
HandlerFunc: TypeAlias = AsyncHandlerFunc | SyncHandlerFunc
BatchHandlerFunc: TypeAlias = Callable[[list["Context"]], Awaitable[Sequence[Any]] | Sequence[Any]]
"""A batch handler: takes the contexts of a batch of tasks, returns one outcome per
task in the same order (a JSON value, or an exception for that task alone)."""

BATCH_MAX_SIZE: Final = 10_000
"""The largest ``BatchOptions.max_size``."""


def _batch_size(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= BATCH_MAX_SIZE:
        raise ValueError(
            f"max_size must be a whole number from 1 to {BATCH_MAX_SIZE}, got {value!r}"
        )


def _batch_wait(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 3600:
        raise ValueError(f"max_wait must be seconds from 0 to 3600, got {value!r}")


@attrs.frozen
class BatchOptions:
    """How a batch handler's tasks are gathered (docs/batches.md): a batch is called
    once ``max_size`` of its tasks wait in one worker, or ``max_wait`` seconds after the
    first of them started waiting, whichever comes first.

    :raises ValueError: ``max_size`` is not 1 to 10,000, or ``max_wait`` not 0 to 3,600
        seconds.
    """

    max_size: int = attrs.field(default=100, validator=_batch_size)
    """The most tasks in one call (also bounded by the worker's slots: a waiting task
    holds one)."""
    max_wait: float = attrs.field(default=0.05, validator=_batch_wait)
    """Seconds the first task of a batch waits for others to join it."""


@attrs.frozen
class Retention:
    """A worker's defaults for what its finishes delete (docs/retention.md): its
    ``delete_completed`` and ``delete_failed`` options."""

    delete_completed: bool = False
    delete_failed: bool = False


@attrs.frozen
class Handler:
    """A registered handler and its options."""

    task_type: str
    func: HandlerFunc | BatchHandlerFunc
    app_id: str | None = None
    max_retries: int | None = None
    """Retries after the first attempt for tasks enqueued while this is registered."""
    timeout: float | None = None
    """Seconds an attempt may run before it is stopped and counted as timed out."""
    concurrency: int | None = None
    """At most this many tasks of this handler run at once in one worker."""
    rate_limit: Rate | None = None
    """At most this many starts per period across every worker of the store."""
    global_concurrency: int | None = None
    """At most this many RUNNING tasks of this key across every worker of the store."""
    delete_completed: bool | None = None
    """Delete its tasks when they complete (None: the worker's ``delete_completed``)."""
    delete_failed: bool | None = None
    """Delete its tasks when they fail for good (None: the worker's ``delete_failed``)."""
    batch: BatchOptions | None = None
    """A batch handler: ``func`` takes a list of contexts (docs/batches.md)."""
    source: str = "application"
    """Who registered it (the application, or a plugin's name): named in conflicts."""
    is_async: bool = attrs.field(init=False)

    @is_async.default
    def _is_async(self) -> bool:
        func: Any = self.func
        return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
            getattr(func, "__call__", None)  # noqa: B004 - async callable objects
        )

    @property
    def key(self) -> HandlerKey:
        """``(app_id, task_type)``."""
        return (self.app_id, self.task_type)

    def deletes(self, kind: FinishKind, worker: Retention) -> bool:
        """Whether a finish of ``kind`` deletes its task: this handler's
        ``delete_completed`` / ``delete_failed``, else the ``worker``'s."""
        if kind is FinishKind.COMPLETE:
            own = self.delete_completed
            return worker.delete_completed if own is None else own
        if kind is FinishKind.FAIL:
            own = self.delete_failed
            return worker.delete_failed if own is None else own
        return False

    @property
    def limit(self) -> TypeLimit | None:
        """The global limits a claim carries for this handler, or None."""
        if self.rate_limit is None and self.global_concurrency is None:
            return None
        return TypeLimit(rate=self.rate_limit, max_running=self.global_concurrency)


def _check_options(
    task_type: str,
    max_retries: int | None,
    timeout: float | None,
    concurrency: int | None,
) -> None:
    # The same limits as every task spec (docs/semantics.md, "Limits"): a handler a task
    # could never be created for is refused at registration.
    check_key("task_type", task_type, TASK_TYPE_MAX, empty=False)
    if max_retries is not None:
        check_int("max_retries", max_retries, 0, MAX_RETRIES_MAX)
    check_timeout(timeout)
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")


def _check_switch(name: str, value: bool | None) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be True, False or None (the worker's), got {value!r}")
    return value


def _check_signature(task_type: str, handler: object, *, batch: bool = False) -> None:
    """Refuse a handler that cannot be called as ``handler(ctx, params)`` (a batch
    handler: ``handler(batch)``): found at registration, not as a TypeError in every
    attempt."""
    takes = "(batch), a list of contexts" if batch else "(ctx, params)"
    if not callable(handler):
        raise InvalidHandler(
            f"the handler for {task_type!r} must be a function taking {takes}, "
            f"got {type(handler).__name__} {handler!r}"
        )
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return
    try:
        if batch:
            signature.bind([])
        else:
            signature.bind(None, {})
    except TypeError:
        name = getattr(handler, "__name__", None) or type(handler).__name__
        declare = (
            f"`async def {name}(batch: list[Context]) -> list[Any]`"
            if batch
            else f"`async def {name}(ctx: Context, params: dict)` (or a plain def)"
        )
        count = "one argument" if batch else "two arguments"
        raise InvalidHandler(
            f"the handler for {task_type!r} must take {count}, {takes}, "
            f"but {name} is declared as {name}{_plain(signature)}; declare it as {declare}"
        ) from None


def _plain(signature: inspect.Signature) -> str:
    """A signature as written in source (postponed annotations are strings)."""
    return str(signature).replace("'", "")


class HandlerRegistry:
    """Handlers by ``(app_id, task_type)``; lookups fall back to the host's handler.

    Registering a second handler for the same key is a :class:`HandlerConflict` that
    names both registrants.
    """

    def __init__(self) -> None:
        self._handlers: dict[HandlerKey, Handler] = {}

    def register(
        self,
        task_type: str,
        handler: HandlerFunc | BatchHandlerFunc,
        *,
        app_id: str | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        concurrency: int | None = None,
        rate_limit: str | None = None,
        global_concurrency: int | None = None,
        delete_completed: bool | None = None,
        delete_failed: bool | None = None,
        batch: BatchOptions | None = None,
        source: str = "application",
    ) -> Handler:
        """Register ``handler`` for ``(app_id, task_type)`` and return its record.

        :raises HandlerConflict: that key already has a handler.
        :raises InvalidHandler: ``handler`` cannot be called as ``handler(ctx, params)``.
        :raises ValueError: an option is out of range.
        :raises InvalidLimit: ``rate_limit`` or ``global_concurrency`` is not valid.
        """
        _check_options(task_type, max_retries, timeout, concurrency)
        if app_id is not None:
            check_key("app_id", app_id, APP_ID_MAX)
        rate = None if rate_limit is None else parse_rate(rate_limit)
        max_running = check_max_running(global_concurrency)
        if batch is not None and not isinstance(batch, BatchOptions):
            raise ValueError(f"batch must be a BatchOptions or None, got {batch!r}")
        _check_signature(task_type, handler, batch=batch is not None)
        record = Handler(
            task_type=task_type,
            func=handler,
            app_id=app_id,
            max_retries=max_retries,
            timeout=timeout,
            concurrency=concurrency,
            rate_limit=rate,
            global_concurrency=max_running,
            delete_completed=_check_switch("delete_completed", delete_completed),
            delete_failed=_check_switch("delete_failed", delete_failed),
            batch=batch,
            source=source,
        )
        existing = self._handlers.get(record.key)
        if existing is not None:
            scope = f"app {app_id!r}" if app_id is not None else "the host"
            raise HandlerConflict(
                f"task type {task_type!r} of {scope} is registered twice: by "
                f"{existing.source} and by {source}; remove one of them or give one an "
                "app_id of its own"
            )
        self._handlers[record.key] = record
        return record

    def unregister_source(self, source: str) -> None:
        """Remove every handler that ``source`` registered."""
        for key in [k for k, h in self._handlers.items() if h.source == source]:
            del self._handlers[key]

    def lookup(self, app_id: str | None, task_type: str) -> Handler | None:
        """The handler for a task: its app's own, else the host's, else None."""
        handler = self._handlers.get((app_id, task_type))
        if handler is None and app_id is not None:
            handler = self._handlers.get((None, task_type))
        return handler

    def __iter__(self) -> Iterator[Handler]:
        return iter(list(self._handlers.values()))

    def __len__(self) -> int:
        return len(self._handlers)

    def __contains__(self, key: object) -> bool:
        return key in self._handlers


class HandlerRegistrar:
    """What a plugin's ``taskmill_register_handlers`` hook receives as ``registry``.

    It registers into the application's :class:`HandlerRegistry` on the plugin's behalf,
    so that a conflict names the plugin, and remembers what the plugin registered (for
    ``taskmill plugins``).
    """

    def __init__(self, registry: HandlerRegistry, source: str) -> None:
        self._registry = registry
        self.source = source
        """Who registers through this object, as conflicts name it."""
        self.handlers: list[Handler] = []
        """The handlers registered through this object, in order."""

    def register(
        self,
        task_type: str,
        handler: HandlerFunc | BatchHandlerFunc,
        *,
        app_id: str | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        concurrency: int | None = None,
        rate_limit: str | None = None,
        global_concurrency: int | None = None,
        delete_completed: bool | None = None,
        delete_failed: bool | None = None,
        batch: BatchOptions | None = None,
    ) -> Handler:
        """Register ``handler`` for ``(app_id, task_type)``, with the options of
        ``Taskmill.handler``.

        :raises HandlerConflict: that key already has a handler (the message names both
            registrants).
        :raises ValueError: an option is out of range.
        """
        record = self._registry.register(
            task_type,
            handler,
            app_id=app_id,
            max_retries=max_retries,
            timeout=timeout,
            concurrency=concurrency,
            rate_limit=rate_limit,
            global_concurrency=global_concurrency,
            delete_completed=delete_completed,
            delete_failed=delete_failed,
            batch=batch,
            source=self.source,
        )
        self.handlers.append(record)
        return record
