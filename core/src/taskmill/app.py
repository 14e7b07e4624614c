"""``Taskmill``: the application's entry point — handlers, task operations, workers."""

from __future__ import annotations

import logging
import time
import uuid
import weakref
from collections.abc import Callable, Collection, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

import attrs

from taskmill.backoff import RetryPolicy
from taskmill.canvas import serve_builtins
from taskmill.discovery import resolve_url, storage_for_url
from taskmill.errors import InvalidInput, InvalidTaskSpec, TaskmillError, UnknownTaskType
from taskmill.hosts import AttachedWorker
from taskmill.lifecycle import cancel_error, decide_retry
from taskmill.model import (
    JSON,
    AttemptOutcome,
    CancelReason,
    Priority,
    Task,
    TaskSpec,
    TaskStatus,
)
from taskmill.operations import (
    AppTasks,
    TaskOperations,
    new_task_from_values,
    unserved_type_message,
)
from taskmill.periodic import (
    DEFAULT_CATCH_UP,
    DEFAULT_CATCH_UP_WINDOW,
    CatchUp,
    Schedule,
    Schedules,
)
from taskmill.plugins import DISABLE_ENV, ENABLE_ENV, PluginInfo, Plugins
from taskmill.registry import (
    BatchHandlerFunc,
    BatchOptions,
    Handler,
    HandlerFunc,
    HandlerRegistry,
    Retention,
)
from taskmill.serialization import dumps, encode_params
from taskmill.storage import Finish, FinishKind, HandlerKey, Lease, NewTask, TaskStorage, utcnow
from taskmill.validation import (
    APP_ID_MAX,
    DEDUPE_KEY_MAX,
    MAX_RETRIES_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    TASK_ID_MAX,
    TASK_TYPE_MAX,
    USER_ID_MAX,
    check_delay,
    check_int,
    check_key,
    check_older_than,
    check_retry_delay,
    check_run_at,
)
from taskmill.worker import Worker
from taskmill.worker_options import WorkerArgs, WorkerOptions
from taskmill.workers import WorkerHandler, WorkerStatus, statuses

F = TypeVar("F", bound=HandlerFunc | BatchHandlerFunc)

DEFAULT_MAX_RETRIES = 3
DEFAULT_MAX_PARAMS_BYTES = 1024 * 1024


def _result_json(result: JSON) -> str:
    try:
        return dumps(result)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"result is not a JSON value: {exc}", field="result") from None


def _stop_reason(kind: FinishKind, reason: CancelReason | None) -> CancelReason:
    """The reason of a reported CANCEL (terminal, USER unless given) or RELEASE (a stop)."""
    cancel = kind is FinishKind.CANCEL
    if cancel and reason is None:
        return CancelReason.USER
    if reason is None or reason.terminal is not cancel:
        takes = "USER or PREEMPTED" if cancel else "SUSPENDED or SHUTDOWN"
        raise InvalidInput(
            f"a reported {kind.name} takes the reason {takes}, got {reason!r}", field="reason"
        )
    return reason


log = logging.getLogger("taskmill")

PUBLISHED_TTL = 5.0
"""Seconds a process keeps the handler options the live workers publish
(:meth:`Taskmill.with_published_options`) before reading them again."""

_KEEP = Retention()
"""No worker's defaults: a detached report follows its handler's own options only."""
_DETACHED_OUTCOMES = {
    FinishKind.COMPLETE: AttemptOutcome.COMPLETED,
    FinishKind.RETRY: AttemptOutcome.FAILED,
    FinishKind.FAIL: AttemptOutcome.FAILED,
    FinishKind.CANCEL: AttemptOutcome.CANCELLED,
    FinishKind.RELEASE: AttemptOutcome.INTERRUPTED,
}


class Taskmill(TaskOperations):
    """Durable background tasks on the storage ``url`` names.

    ``url`` None means ``$TASKMILL_URL``, else ``sqlite:///taskmill.db``. Use it as
    ``async with Taskmill(...) as tm:`` or call :meth:`open` / :meth:`close`.

    :param plugins: True (the default) loads the plugins installed in the
        ``taskmill.plugins`` entry-point group at :meth:`open`, except those
        ``$TASKMILL_DISABLE_PLUGINS`` names; False loads none. A sequence of plugin
        objects (modules or instances with ``@taskmill.hookimpl`` functions) loads the
        installed plugins and registers those objects too; see also :meth:`add_plugin`.
        A plugin that cannot be loaded makes :meth:`open` raise
        :class:`~taskmill.PluginError` (see docs/plugins.md).
    :param max_params_bytes: largest accepted params, as JSON (default 1 MiB).
    :param default_max_retries: retries for tasks whose handler and enqueue call do not
        say (default 3).
    :param auto_migrate: migrate an older schema on open instead of refusing.
    :param strict_types: enqueueing (``enqueue``, ``enqueue_many``, ``batch_children``,
        ``ctx.spawn``) a task type that no handler registered here serves raises
        :class:`~taskmill.UnknownTaskType`, naming close matches. Off by default: another
        process may serve the type, and such a task simply waits, PENDING, for it.
    :param storage: a store object to use instead of the one ``url`` names (for a
        backend not installed as an entry point, or a test); :meth:`open` opens it and
        :meth:`close` closes it. ``url`` then defaults to the store's own.
    :param storage_options: passed to the backend (see docs/backends.md).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        plugins: bool | Sequence[object] = True,
        max_params_bytes: int = DEFAULT_MAX_PARAMS_BYTES,
        default_max_retries: int = DEFAULT_MAX_RETRIES,
        auto_migrate: bool = False,
        strict_types: bool = False,
        storage: TaskStorage | None = None,
        **storage_options: Any,
    ) -> None:
        super().__init__(self, None)
        if storage is not None:
            if storage_options:
                raise TypeError("give storage options to the store object, not with storage=")
            self.url = url if url is not None else storage.url
            self.storage: TaskStorage = storage
        else:
            self.url = resolve_url(url)
            self.storage = storage_for_url(self.url, **storage_options)
        self.registry = HandlerRegistry()
        self._published: tuple[float, dict[HandlerKey, WorkerHandler]] | None = None
        """The live workers' handler options, with when they were read (monotonic)."""
        self.max_params_bytes = check_int("max_params_bytes", max_params_bytes, 2, 2**40)
        self.default_max_retries = check_int(
            "default_max_retries", default_max_retries, 0, MAX_RETRIES_MAX
        )
        self.auto_migrate = auto_migrate
        self.strict_types = strict_types
        self.schedules = Schedules()
        """The periodic tasks the workers of this ``Taskmill`` enqueue (see
        :meth:`periodic` and docs/scheduling.md)."""
        self.plugins = Plugins()
        """The loaded plugins (iterate for :class:`~taskmill.plugins.PluginInfo`)."""
        if isinstance(plugins, bool):
            self._discover_plugins = plugins
        elif isinstance(plugins, str | bytes) or not isinstance(plugins, Sequence):
            raise TypeError(
                f"plugins must be a bool or a sequence of plugin objects, not {plugins!r}"
            )
        else:
            self._discover_plugins = True
            for plugin in plugins:
                self.plugins.add(plugin)
        self._plugins_loaded = False
        self._opened = False
        self._workers: weakref.WeakSet[AttachedWorker] = weakref.WeakSet()

    # -- lifecycle ---------------------------------------------------------------------

    async def open(self) -> Taskmill:
        """Connect to the storage (creating the schema of an empty database).

        :raises SchemaVersionError: the database needs ``taskmill migrate``.
        :raises StorageUnavailable: the database cannot be reached.
        """
        if not self._opened:
            self.load_plugins()
            await self.storage.open(auto_migrate=self.auto_migrate)
            self._opened = True
        return self

    def load_plugins(
        self,
        *,
        strict: bool = True,
        enable: Collection[str] | None = None,
        disable: Collection[str] | None = None,
        enable_from: str = ENABLE_ENV,
        disable_from: str = DISABLE_ENV,
    ) -> None:
        """Load the installed plugins (unless ``plugins=False``) and register every
        plugin's handlers. :meth:`open` does it with the defaults; call it yourself
        first to choose otherwise, or to see the plugins (``tm.plugins``) without
        opening the storage. Does nothing the second time.

        :param strict: False leaves out a plugin that cannot be loaded, with a warning,
            and lists it in ``tm.plugins.broken``, instead of raising (for tools that
            only read: a worker must not run without a plugin's handlers).
        :param enable: load only these installed plugins (default:
            ``$TASKMILL_ENABLE_PLUGINS``, else all).
        :param disable: skip these (default: ``$TASKMILL_DISABLE_PLUGINS``).
        :param enable_from: how warnings name where ``enable`` came from.
        :param disable_from: how warnings name where ``disable`` came from.
        :raises PluginError: (``strict`` only) a plugin failed to import, implements an
            unknown hook, or its ``taskmill_register_handlers`` failed. Nothing stays
            loaded then, so a later call starts afresh.
        :raises HandlerConflict: (``strict`` only) a plugin registered a handler whose
            ``(app_id, task_type)`` already has one; the message names both registrants.
        """
        if self._plugins_loaded:
            return
        try:
            if self._discover_plugins:
                self.plugins.load_entry_points(
                    enable=enable,
                    disable=disable,
                    strict=strict,
                    enable_from=enable_from,
                    disable_from=disable_from,
                )
            self.plugins.register_handlers(self.registry, strict=strict)
            for schedule in self.plugins.schedules():
                self.schedules.add(schedule)
        except BaseException:
            self.plugins.unload(self.registry)
            raise
        self._plugins_loaded = True

    def add_plugin(self, plugin: object, *, name: str | None = None) -> PluginInfo:
        """Register a plugin object (a module or an instance with
        ``@taskmill.hookimpl`` functions) in code, whatever ``plugins`` said.

        Its handlers are registered with the other plugins' at :meth:`open`, or at once
        when the plugins are already loaded.

        :param name: how ``taskmill plugins`` and messages name it (default: its
            ``__name__``, else its class name).
        :raises PluginError: the name is taken, or the object is not a valid plugin.
        :raises HandlerConflict: see :meth:`load_plugins`. The plugin is not added then.
        """
        info = self.plugins.add(plugin, name)
        if self._plugins_loaded:
            try:
                self.plugins.register_handlers(self.registry)
                for schedule in self.plugins.schedules():
                    self.schedules.add(schedule)
            except BaseException:
                self.plugins.remove(info.name, self.registry)
                raise
            info = self.plugins.get(info.name) or info
        return info

    async def close(self) -> None:
        """Stop this object's running workers and release the storage."""
        for worker in list(self._workers):
            await worker.stop()
        if self._opened:
            self._opened = False
            await self.storage.close()

    async def __aenter__(self) -> Taskmill:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def check_open(self) -> None:
        """Refuse to work before :meth:`open` (or after :meth:`close`): every operation
        on tasks calls it first.

        :raises TaskmillError: this object is not open; the message says how to open it.
        """
        if not self._opened:
            raise TaskmillError(
                "this Taskmill is not open; use `async with Taskmill(...) as tm:` or "
                "`await tm.open()` first"
            )

    # -- handlers ----------------------------------------------------------------------

    def handler(
        self,
        task_type: str,
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
    ) -> Callable[[F], F]:
        """Decorator: register the function as the handler of ``task_type``.

        The handler is ``async def`` or plain ``def`` (run in a worker thread), takes
        ``(ctx, params)`` and returns a JSON value or None.

        ``concurrency`` caps the tasks of this handler running at once in one worker;
        ``global_concurrency`` caps them across every worker sharing the store, and
        ``rate_limit`` (``"100/s"``, ``"30/min"``, ``"5/h"``) caps how many start per
        period across every worker. Both global limits are applied inside the store's
        claim; see docs/rate-limits.md. With ``app_id`` they cover that app's tasks only.

        ``delete_completed`` deletes each task when it completes, with its attempt log,
        in the finish's transaction (``delete_failed`` the same when it fails for good);
        None follows the worker's option of the same name. See docs/retention.md.

        ``batch`` (:class:`~taskmill.registry.BatchOptions`) makes it a batch handler:
        it takes one argument, the list of the contexts of up to ``max_size`` tasks,
        and returns one outcome per task; see docs/batches.md.
        """

        def decorate(func: F) -> F:
            self.register(
                task_type,
                func,
                app_id=app_id,
                max_retries=max_retries,
                timeout=timeout,
                concurrency=concurrency,
                rate_limit=rate_limit,
                global_concurrency=global_concurrency,
                delete_completed=delete_completed,
                delete_failed=delete_failed,
                batch=batch,
            )
            return func

        return decorate

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
        """Register ``handler`` for ``(app_id, task_type)``; see :meth:`handler`.

        :raises HandlerConflict: the key already has a handler.
        :raises InvalidLimit: ``rate_limit`` or ``global_concurrency`` is not valid.
        """
        return self.registry.register(
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
        )

    # -- periodic tasks ------------------------------------------------------------------

    def periodic(
        self,
        cron: str | None = None,
        *,
        every: timedelta | None = None,
        task_type: str | None = None,
        name: str | None = None,
        params: dict[str, Any] | None = None,
        app_id: str | None = None,
        timezone: str = "UTC",
        catch_up: CatchUp = DEFAULT_CATCH_UP,
        catch_up_window: timedelta = DEFAULT_CATCH_UP_WINDOW,
        priority: int = Priority.NORMAL,
        max_retries: int | None = None,
        timeout: float | None = None,
        concurrency: int | None = None,
    ) -> Callable[[F], F]:
        """Decorator: register the function as the handler of ``task_type`` (default:
        the function's name) and enqueue it with ``params`` at every fire time of
        ``cron`` (in ``timezone``) or of ``every``.

        Every worker of this ``Taskmill`` runs the schedule; the store's duplicate-id
        rule makes each fire time one task however many workers run (see
        docs/scheduling.md). ``name`` (default: the task type) identifies the schedule;
        ``catch_up`` says what a starting worker does with fires missed while none ran.

        :raises ConfigurationError: a bad expression, time zone or policy, or another
            schedule with this name.
        """

        def decorate(func: F) -> F:
            kind = task_type or func.__name__
            self.register(
                kind,
                func,
                app_id=app_id,
                max_retries=max_retries,
                timeout=timeout,
                concurrency=concurrency,
            )
            self.add_schedule(
                Schedule(
                    name=name or kind,
                    task_type=kind,
                    cron=cron,
                    every=every,
                    params=dict(params or {}),
                    app_id=app_id,
                    timezone=timezone,
                    catch_up=catch_up,
                    catch_up_window=catch_up_window,
                    priority=priority,
                    max_retries=max_retries,
                )
            )
            return func

        return decorate

    def add_schedule(self, schedule: Schedule) -> Schedule:
        """Add a periodic task whose handler is registered elsewhere (or served by
        another process); see :meth:`periodic`.

        :raises ConfigurationError: another schedule has its name (and app).
        """
        return self.schedules.add(schedule)

    async def cleanup(self, older_than: timedelta, *, include_failed: bool = False) -> int:
        """Delete COMPLETED and CANCELLED tasks (and FAILED ones with
        ``include_failed``) that finished more than ``older_than`` ago, with their
        execution logs. Returns how many were deleted.

        :raises InvalidTaskSpec: ``older_than`` is not a timedelta or is negative.
        """
        self.check_open()
        older_than = check_older_than(older_than, utcnow())
        statuses = {TaskStatus.COMPLETED, TaskStatus.CANCELLED}
        if include_failed:
            statuses.add(TaskStatus.FAILED)
        return await self.storage.cleanup(older_than, statuses=frozenset(statuses))

    def new_task(self, spec: TaskSpec, task_id: str | None = None) -> NewTask:
        """The task :meth:`enqueue` would store for ``spec``, checked against this
        object's limits (``max_params_bytes``, the store's own) and handlers (the
        handler's ``max_retries``, else ``default_max_retries``; ``strict_types``), with
        the id ``task_id`` or else a fresh one. Nothing is stored: for a caller that
        stores tasks itself, as the scheduler does with ``storage.enqueue``.

        :raises InvalidParams: the params are not a JSON object or are too large.
        :raises InvalidTaskSpec: a field is out of range or the fields disagree (see
            :meth:`enqueue`).
        :raises UnknownTaskType: ``strict_types`` is set and no handler registered here
            serves the task type.
        """
        task_type, app_id = spec.task_type, spec.app_id
        dedupe_key, parent_id, user_id = spec.dedupe_key, spec.parent_id, spec.user_id
        check_key("task_type", task_type, TASK_TYPE_MAX, empty=False)
        if app_id is not None:
            check_key("app_id", app_id, APP_ID_MAX)
        if dedupe_key is not None:
            check_key("dedupe_key", dedupe_key, DEDUPE_KEY_MAX)
        if user_id is not None:
            check_key("user_id", user_id, USER_ID_MAX)
        if parent_id is not None:
            check_key("parent_id", parent_id, TASK_ID_MAX)
        if task_id is not None:
            check_key("id", task_id, TASK_ID_MAX, empty=False)
        for one in spec.after:
            check_key("after", one, TASK_ID_MAX)
        priority = check_int("priority", spec.priority, PRIORITY_MIN, PRIORITY_MAX)
        params = {} if spec.params is None else spec.params
        storage = self.storage
        max_bytes, limit_of = self.max_params_bytes, "max_params_bytes"
        ceiling = storage.capabilities.max_value_bytes
        if ceiling is not None and ceiling < max_bytes:
            max_bytes = ceiling
            limit_of = f"the most {type(storage).__name__} keeps in one value"
        params_json = encode_params(params, max_bytes=max_bytes, limit_of=limit_of)
        run_at, delay = spec.run_at, spec.delay
        if run_at is not None and delay is not None:
            raise InvalidTaskSpec("give run_at or delay, not both", field="delay")
        if run_at is not None:
            run_at = check_run_at(run_at)
        elif delay is not None:
            run_at = check_delay(delay, utcnow())
        max_retries = spec.max_retries
        handler = self.registry.lookup(app_id, task_type)
        if handler is None and self.strict_types:
            raise UnknownTaskType(unserved_type_message(self.registry, app_id, task_type))
        if max_retries is None:
            max_retries = handler.max_retries if handler is not None else None
        if max_retries is None:
            max_retries = self.default_max_retries
        max_retries = check_int("max_retries", max_retries, 0, MAX_RETRIES_MAX)
        after = _dependencies(spec)
        if after and not storage.capabilities.dependencies:
            raise InvalidTaskSpec(
                f"after= needs a store that keeps task dependencies, and"
                f" {type(storage).__name__} does not (docs/backends.md lists each"
                " backend's gaps); chain the tasks from the handler instead"
            )
        # NewTask(id=..., task_type=..., ...) without the attrs __init__: the same object.
        return new_task_from_values(
            str(uuid.uuid4()) if task_id is None else task_id,
            task_type,
            params,
            params_json,
            app_id,
            priority,
            max_retries,
            run_at,
            dedupe_key,
            parent_id,
            user_id,
            after,
            spec.after_policy == "always",
        )

    def for_app(self, app_id: str) -> AppTasks:
        """The same task operations bound to one app: they stamp ``app_id`` on what
        they create, filter by it, and treat another app's task ids as unknown."""
        return AppTasks(self, app_id)

    # -- detached attempts ---------------------------------------------------------------

    async def report_detached(
        self,
        lease: Lease,
        kind: FinishKind,
        *,
        result: JSON = None,
        error: str | None = None,
        retry_in: float | None = None,
        reason: CancelReason | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> Task | None:
        """Store the end of a detached attempt (:class:`~taskmill.Detached`) that its new
        owner reports, fenced by ``lease``: the finish a worker writes for a handler that
        ends the same way, then the ``taskmill_task_finished`` hooks of this process.
        Returns the task as stored, or None when ``lease`` no longer holds (the task was
        cancelled, rescued, re-claimed or deleted); nothing is written then.

        - ``COMPLETE``: COMPLETED with ``result``, a JSON value.
        - ``RETRY``, as a handler's error or ``Retry(retry_in)``: PENDING, due in
          ``retry_in`` seconds or else the backoff of ``retry_policy``, while the task has
          retry budget; without, FAILED, the error ending in ``(gave up after N
          attempts)`` (:func:`taskmill.lifecycle.decide_retry`).
        - ``FAIL``, as ``Fail``: FAILED at once (dead letter).
        - ``CANCEL``: CANCELLED for ``reason`` (USER unless given).
        - ``RELEASE``: the owner was told to stop (``reason`` SUSPENDED or SHUTDOWN): back
          to PENDING without spending the attempt.

        A stored stop request turns a RETRY or FAIL into a RELEASE, as for any worker.
        A COMPLETE (FAIL) deletes the task when its handler in this process says
        ``delete_completed=True`` (``delete_failed=True``); a worker's defaults do not
        apply here (docs/retention.md).

        The retry policy is a worker's option and is not stored with the task, so the
        caller says which applies: pass the ``retry_policy`` of the workers that serve
        the task (``taskmill serve`` passes the one its ``retry_*`` settings make).
        None is ``RetryPolicy()``, the policy of a worker built without one.

        :raises InvalidInput: ``result`` is not a JSON value, ``retry_in`` is not a
            number of seconds from 0 to 100 years, or ``reason`` does not fit ``kind``
            (a RELEASE needs a stop, SUSPENDED or SHUTDOWN; a CANCEL takes USER or
            PREEMPTED).
        """
        self.check_open()
        try:
            check_retry_delay(retry_in, name="retry_in")
        except ValueError as exc:
            raise InvalidInput(str(exc), field="retry_in") from None
        result_json = _result_json(result) if kind is FinishKind.COMPLETE else None
        if kind is FinishKind.CANCEL or kind is FinishKind.RELEASE:
            reason = _stop_reason(kind, reason)
            error = error or cancel_error(reason)
        elif kind is FinishKind.FAIL:
            error = error or "the owner failed the task"
        task = await self.storage.get(lease.task_id)
        if task is None:
            return None
        if kind is FinishKind.RETRY:
            decided = decide_retry(
                error or "the owner asked for a retry",
                attempts=lease.attempt,
                max_retries=task.max_retries,
                delay=retry_in,
                backoff=(retry_policy or RetryPolicy()).delay,
            )
            kind, error, retry_in = decided.kind, decided.error, decided.retry_in
        now = utcnow()
        finish = Finish(
            lease=lease,
            kind=kind,
            outcome=_DETACHED_OUTCOMES[kind],
            started_at=task.started_at or now,
            finished_at=now,
            result_json=result_json,
            error=error,
            retry_in=retry_in or 0.0,
            cancel_reason=reason if kind is FinishKind.CANCEL else None,
            delete=self._deletes(task, kind),
        )
        (stored,) = await self.storage.finish_batch([finish])
        if stored is not None and self.plugins.observes_finishes:
            await self.plugins.attempt_finished(finish, stored)  # a failing hook is logged
        return stored

    def _deletes(self, task: Task, kind: FinishKind) -> bool:
        """Whether a detached report of ``kind`` deletes ``task``: its handler's own
        ``delete_completed`` / ``delete_failed`` here (no worker's default applies), on
        a store that can."""
        handler = self.registry.lookup(task.app_id, task.task_type)
        return (
            handler is not None
            and self.storage.capabilities.delete_on_finish
            and handler.deletes(kind, _KEEP)
        )

    # -- workers -----------------------------------------------------------------------

    async def with_published_options(self, specs: list[TaskSpec]) -> list[TaskSpec]:
        """``specs``, each without ``max_retries`` and without a handler in this
        process given the ``max_retries`` of the handler the live workers publish for
        its type (docs/workers.md, "Handler options across processes"): the HTTP service
        and any process that enqueues tasks it does not run give them the retry budget
        of the handler that will run them. Where live workers disagree, the most
        recently started one's wins (the newest code). Read from the store at most
        every :data:`PUBLISHED_TTL` seconds; nothing is read when every spec has its
        ``max_retries`` or a handler here."""
        registry = self.registry
        wanted = [
            i
            for i, s in enumerate(specs)
            if s.max_retries is None and registry.lookup(s.app_id, s.task_type) is None
        ]
        if not wanted or not self.storage.capabilities.worker_registry:
            return specs
        published = await self._published_handlers()
        if not published:
            return specs
        out = list(specs)
        for i in wanted:
            spec = specs[i]
            found = published.get((spec.app_id, spec.task_type)) or published.get(
                (None, spec.task_type)
            )
            if found is not None and found.max_retries is not None:
                out[i] = attrs.evolve(spec, max_retries=found.max_retries)
        return out

    async def _published_handlers(self) -> dict[HandlerKey, WorkerHandler]:
        now = time.monotonic()
        cached = self._published
        if cached is not None and now - cached[0] < PUBLISHED_TTL:
            return cached[1]
        found: dict[HandlerKey, WorkerHandler] = {}
        try:
            listed = await self.workers()
        except TaskmillError:
            log.warning("reading the worker registry failed; enqueuing with the defaults")
            return {}
        for status in sorted((w for w in listed if w.alive), key=lambda w: w.record.started_at):
            for handler in status.record.handlers:
                found[handler.key] = handler  # the newest worker's, last, wins
        self._published = (now, found)
        return found

    async def workers(self) -> list[WorkerStatus]:
        """The workers registered in the store, from every process sharing it: live
        ones first (their last heartbeat younger than their lease), then the dead ones
        whose records are not pruned yet (docs/workers.md). Every app's workers: on
        the host ``Taskmill`` only.

        :raises TaskmillError: the store keeps no worker registry
            (``capabilities.worker_registry``).
        """
        self.check_open()
        return statuses(await self.storage.workers())

    def worker(
        self, options: WorkerOptions | None = None, /, **overrides: Unpack[WorkerArgs]
    ) -> Worker[Self]:
        """A :class:`~taskmill.worker.Worker` for this object's handlers and storage,
        and for the roots of groups (``taskmill.group``, registered here the first time:
        see docs/canvas.md).

        Takes the fields of :class:`~taskmill.WorkerOptions` as keyword arguments
        (``concurrency`` 10, ``reserved_high_priority_slots`` 1, ``worker_id``,
        ``lease_seconds`` 30, ``poll_interval`` 1.0, ``shutdown_grace`` 30,
        ``retry_policy``, ``handle_signals`` True, ...), on top of ``options`` when
        given, else of the defaults.

        :raises ValueError: the options are inconsistent (see ``WorkerOptions``).
        """
        chosen = options or WorkerOptions()
        if overrides:
            chosen = attrs.evolve(chosen, **overrides)
        serve_builtins(self.registry)  # every worker serves group roots (docs/canvas.md)
        return Worker(self, chosen)

    async def run_worker(
        self,
        options: WorkerOptions | None = None,
        /,
        *,
        until_idle: bool = False,
        **overrides: Unpack[WorkerArgs],
    ) -> Worker[Self]:
        """Build a worker (as :meth:`worker` does) and run it, until idle or until
        stopped; returns it."""
        self.check_open()
        worker = self.worker(options, **overrides)
        if until_idle:
            await worker.run_until_idle()
        else:
            await worker.run()
        return worker

    # -- what the task operations and workers use (taskmill.hosts) ---------------------

    def notify_workers(self) -> None:
        """Wake this object's running workers in this process: work may be due now
        (called after an enqueue, a retry or a resume; workers in other processes
        learn of it from the store)."""
        for worker in self._workers:
            worker.notify()

    def attach_worker(self, worker: AttachedWorker) -> None:
        """``worker`` starts serving this object: in-process enqueues wake it, and
        :meth:`close` stops it. Called by the worker itself.

        :raises TaskmillError: this object is not open.
        """
        self.check_open()
        self._workers.add(worker)

    def detach_worker(self, worker: AttachedWorker) -> None:
        """``worker`` stopped serving (undoes :meth:`attach_worker`; idempotent)."""
        self._workers.discard(worker)

    async def spawn_child(
        self,
        parent: Task,
        task_type: str,
        params: dict[str, JSON] | None,
        options: dict[str, Any],
    ) -> Task:
        """Enqueue a child of the running task ``parent``, as ``ctx.spawn`` does:
        ``options`` are :meth:`enqueue`'s; ``parent_id`` is ``parent``'s and ``app_id``
        defaults to its.

        :raises InvalidTaskSpec: ``options`` names another parent.
        """
        options.setdefault("app_id", parent.app_id)
        if options.get("parent_id", parent.id) != parent.id:
            raise InvalidTaskSpec("ctx.spawn creates children of the running task only")
        options["parent_id"] = parent.id
        return await self.enqueue(task_type, params, **options)


_AFTER_POLICIES = ("completed", "always")


def _dependencies(spec: TaskSpec) -> tuple[str, ...]:
    """``spec.after`` checked and without repeats (in the order given)."""
    if spec.after_policy not in _AFTER_POLICIES:
        raise InvalidTaskSpec(
            f"after_policy must be 'completed' or 'always', got {spec.after_policy!r}"
        )
    if not spec.after:
        return ()
    for dependency in spec.after:
        if not isinstance(dependency, str) or not dependency:
            raise InvalidTaskSpec(f"after= takes task ids (strings), got {dependency!r}")
    if spec.dedupe_key is not None:
        raise InvalidTaskSpec(
            "a task with after= cannot have a dedupe_key: an alias takes its leader's "
            "outcome and never waits for dependencies of its own; enqueue it without one"
        )
    return tuple(dict.fromkeys(spec.after))
