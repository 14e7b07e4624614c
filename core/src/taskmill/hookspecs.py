"""Every hook a taskmill plugin can implement: the reference for plugin authors.

A plugin is a module or object whose functions are marked with
:data:`taskmill.hookimpl` and named after a hook below. Rules that hold for every hook:

- Only the arguments a hook implementation names are passed to it, so an
  implementation may take fewer arguments than its spec (never others).
- Every hook except :func:`taskmill_register_handlers` may be implemented as
  ``async def``: taskmill awaits whatever an implementation returns that is awaitable.
- Implementations run in pluggy's order: ``tryfirst=True`` ones first, then the most
  recently registered first, ``trylast=True`` ones last. pluggy's ``wrapper`` and
  ``hookwrapper`` implementations are not supported (use
  :func:`taskmill_handler_context` to wrap handlers).
- An exception raised by a notification hook (every hook but
  :func:`taskmill_register_handlers` and :func:`taskmill_register_commands`) is logged
  with the plugin's name and otherwise ignored: it never stops a worker, another
  plugin, or the write of a task's outcome.
- Notification hooks are awaited on the worker's (or the caller's) event loop, one after
  another: keep them quick, and hand slow work to a task of your own.

docs/plugins.md shows every hook with its exact signature; ``tests/test_plugin_docs.py``
fails when it and this module disagree. :class:`CommandRegistrar`, what
:func:`taskmill_register_commands` receives, is declared here with its hook (also
importable from :mod:`taskmill.plugins` and :mod:`taskmill.cli`).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Any

import pluggy

from taskmill.errors import PluginError
from taskmill.headers import HEADERS_KEY

if TYPE_CHECKING:
    from collections.abc import Iterable

    from taskmill.context import Context
    from taskmill.model import AttemptOutcome, CancelReason, Task, TaskSpec
    from taskmill.periodic import Schedule
    from taskmill.registry import HandlerRegistrar
    from taskmill.worker import Worker

PROJECT = "taskmill"

hookspec = pluggy.HookspecMarker(PROJECT)
"""Marks a function in this module as a hook specification."""

hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marks a plugin's function as the implementation of the hook it is named after
(re-exported as ``taskmill.hookimpl``)."""


# -- handlers -------------------------------------------------------------------------


@hookspec
def taskmill_register_handlers(registry: HandlerRegistrar) -> None:
    """Register the plugin's task handlers.

    Called once per plugin when the plugins are loaded: at ``Taskmill.open()`` (or
    ``Taskmill.load_plugins()``), or at once for a plugin added with
    ``Taskmill.add_plugin()`` afterwards. Must be a plain ``def``. Every handler
    registered here is recorded as the plugin's (``taskmill plugins`` lists them), and a
    second registration of the same ``(app_id, task_type)``, by another plugin or by the
    application, raises :class:`~taskmill.HandlerConflict` naming both. An exception
    raised here makes ``open()`` fail with :class:`~taskmill.PluginError`.

    :param registry: call ``registry.register(task_type, handler, *, app_id=None,
        max_retries=None, timeout=None, concurrency=None)`` for each handler; the
        options are those of ``Taskmill.handler``. Give the plugin's handlers an
        ``app_id`` of their own unless they are meant to serve the host's tasks.
    """


@hookspec
def taskmill_register_schedules() -> Iterable[Schedule]:
    """Return the plugin's periodic tasks (:class:`taskmill.periodic.Schedule` objects).

    Called when the plugins are loaded (after ``taskmill_register_handlers``), and for a
    plugin added with ``Taskmill.add_plugin()`` afterwards. Must be a plain ``def``.
    The schedules join the application's (``tm.schedules``), and every worker fires
    them (docs/scheduling.md). A schedule whose name (and app) another schedule has
    raises :class:`~taskmill.ConfigurationError`; anything raised here makes ``open()``
    fail with :class:`~taskmill.PluginError`.
    """
    return ()


# -- task headers -------------------------------------------------------------------


def headers_of(task: Task) -> dict[str, str]:
    """The headers stored with ``task`` (what the :func:`taskmill_task_headers`
    implementations returned when it was enqueued), or ``{}`` when it has none; a value
    that is not a string is left out. They are kept in ``task.params`` under the
    reserved key ``"taskmill.headers"`` (``taskmill.headers.HEADERS_KEY``). Also
    importable as ``taskmill.headers_of``."""
    stored = task.params.get(HEADERS_KEY)
    if not isinstance(stored, dict):
        return {}
    return {key: value for key, value in stored.items() if isinstance(value, str)}


@hookspec
def taskmill_task_headers(spec: TaskSpec, task_id: str) -> Mapping[str, str] | None:
    """Return headers to store with a task about to be enqueued, or None.

    For context propagation: a tracing plugin returns the current trace context (a W3C
    ``traceparent``, say), and reads it back in the worker with :func:`headers_of`.
    Called once per task, in the process that enqueues it, before it is checked and
    stored, by ``enqueue``, ``enqueue_many``, ``batch_children``, ``ctx.spawn`` and the
    tasks of ``chain``, ``group`` and ``chord``; in the caller's context (a handler's,
    for a task enqueued by a handler), so ``contextvars`` the caller set are seen. Not
    called for the tasks a scheduler fires, nor for a group's root task. Must be a plain
    ``def`` (it runs inline for every task: keep it quick).

    The returned mappings of every implementation are merged (for a key two of them
    return, the implementation called first wins) and stored with the task, in its
    params, under the reserved key ``"taskmill.headers"``; nothing is stored when all
    return None or nothing. Keys and values must be strings: another key or value is
    left out, logged. An exception is logged with the plugin's name and ignored (the
    task is enqueued without that plugin's headers); the headers count towards the
    params' size limit. When no plugin implements this hook, the enqueue path does not
    call it.

    :param spec: the task's spec, ``app_id`` resolved for an app-bound enqueue.
    :param task_id: the id the task will be stored under (an alias made by a
        ``dedupe_key`` keeps its own id, ``alias_of`` names its leader).
    :returns: the headers (string keys and values), or None.
    """


# -- task lifecycle -------------------------------------------------------------------


@hookspec
def taskmill_task_enqueued(task: Task) -> None:
    """A task was stored by ``enqueue``, ``enqueue_many``, ``batch_children`` or
    ``ctx.spawn``.

    Called once per stored task (aliases included: ``task.alias_of`` is set on them), in
    the process that enqueued it, after the storage call returned.

    :param task: the task as stored (PENDING).
    """


@hookspec
def taskmill_task_started(task: Task, worker_id: str) -> None:
    """A worker is about to run a handler for ``task``.

    Called in the worker's process, once per attempt, just before the
    :func:`taskmill_handler_context` context managers are entered. Every call is
    followed by exactly one :func:`taskmill_task_finished` or, when the handler handed
    the attempt over (:class:`~taskmill.Detached`), one :func:`taskmill_task_detached`
    for the same attempt in the same process (unless the process dies, or its outcome
    cannot be written at all at shutdown).

    :param task: the claimed snapshot: RUNNING, ``attempts`` already counting this
        attempt.
    :param worker_id: the id of the worker running it.
    """


@hookspec
def taskmill_task_finished(
    task: Task, outcome: AttemptOutcome, elapsed_ms: float, error: str | None
) -> None:
    """An attempt ended and its outcome was stored.

    Called in the worker's process, once per attempt that fired
    :func:`taskmill_task_started`, after the outcome was written. Also called when the
    task was taken from the worker while its handler ran or before its outcome was
    written: with ``outcome`` CANCELLED when it was cancelled (USER, PREEMPTED), LOST
    when another worker rescued it. :func:`taskmill_task_retried`,
    :func:`taskmill_task_dead_lettered` or :func:`taskmill_task_cancelled` follow when
    the attempt had that effect.

    A detached attempt (see :func:`taskmill_task_detached`) is not finished by its
    worker: this hook is called, once, in the process that stores the outcome its new
    owner reports (the taskmill-http service, for ``POST /v1/tasks/{id}/status``, or for
    a ``/progress`` report that gives the task back on a suspension), with no
    :func:`taskmill_task_started` before it in that process. A detached owner that
    stops reporting gets no call: its task is rescued (``retried`` or
    ``dead_lettered``) like a dead worker's.

    :param task: the task after the outcome was stored (COMPLETED, FAILED, CANCELLED, or
        PENDING for a retry or an interrupted attempt).
    :param outcome: how the attempt ended, as the execution log records it: COMPLETED,
        FAILED, TIMED_OUT, CANCELLED, INTERRUPTED (shutdown or suspension: the task is
        back to PENDING without spending the attempt) or LOST.
    :param elapsed_ms: the attempt's wall time, from its claim, in milliseconds.
    :param error: the attempt's error message, or None when it completed.
    """


@hookspec
def taskmill_task_detached(task: Task, worker_id: str) -> None:
    """A worker handed an attempt over to another owner: its handler raised
    :class:`~taskmill.Detached` (an ``HttpHandler`` whose receiver answered 202).

    Called in the worker's process instead of :func:`taskmill_task_finished`, once per
    such attempt, after the worker freed the slot: the handler is no longer running
    here, no outcome was stored, and the task stays RUNNING under the attempt's lease
    until the new owner reports its outcome (then :func:`taskmill_task_finished` is
    called in the process that stores it) or stops renewing the lease (then the task
    is rescued like any other).

    :param task: the claimed snapshot (RUNNING, ``attempts`` counting this attempt).
    :param worker_id: the id of the worker that handed it over.
    """


@hookspec
def taskmill_task_retried(task: Task, error: str | None, delay: float) -> None:
    """A failed attempt sent the task back to PENDING to be tried again.

    Called once per such attempt: in the worker that wrote the outcome (after
    :func:`taskmill_task_finished`), or in the worker that rescued the task from an
    expired lease (error "lease expired"). Not called for an interrupted attempt
    (shutdown, suspension), which spends no attempt.

    :param task: the task as stored: PENDING, ``attempts`` counting the failed attempt.
    :param error: why the attempt failed.
    :param delay: seconds until the task is due again.
    """


@hookspec
def taskmill_task_dead_lettered(task: Task, error: str | None) -> None:
    """The task ended FAILED, the dead-letter state: its handler raised
    :class:`~taskmill.Fail`, or its retries are exhausted.

    Called once per task, in the worker that wrote the outcome (after
    :func:`taskmill_task_finished`) or that rescued the task from an expired lease.
    ``Taskmill.retry()`` can redrive it; a second failure calls this hook again.

    :param task: the task as stored (FAILED).
    :param error: the final error message.
    """


@hookspec
def taskmill_task_cancelled(task: Task, reason: CancelReason) -> None:
    """The task ended CANCELLED.

    Called once per task, in the process that cancelled it: the one that called
    ``cancel``, ``cancel_by_filter`` or ``preempt`` (once for every task that call
    changed to CANCELLED, cascaded children and aliases included), or the worker whose
    handler raised :class:`~taskmill.Cancelled` on its own. The worker that was running
    a cancelled task, in whatever process, calls :func:`taskmill_task_finished` with
    outcome CANCELLED for that attempt. Suspension and shutdown do not cancel tasks:
    they send them back to PENDING.

    :param task: the task as stored (CANCELLED).
    :param reason: USER or PREEMPTED.
    """


# -- workers --------------------------------------------------------------------------


@hookspec
def taskmill_worker_started(worker: Worker) -> None:
    """A worker started serving (``worker.run()`` or ``worker.run_until_idle()``; not
    ``worker.tick()``).

    Called before it claims its first task. Open what the plugin serves per worker here
    (a metrics port, a connection); ``worker.taskmill`` is the ``Taskmill`` it serves.

    :param worker: the worker (``worker.worker_id``, ``worker.concurrency``, ...).
    """


@hookspec
def taskmill_worker_stopped(worker: Worker) -> None:
    """A worker stopped serving.

    Called once, after it stopped claiming, its handlers ended and every outcome it
    could write was written (and every :func:`taskmill_task_finished` for them was
    called). Release what :func:`taskmill_worker_started` opened.

    :param worker: the worker (``worker.processed`` counts the attempts it finished).
    """


# -- wrapping handlers ----------------------------------------------------------------


@hookspec
def taskmill_handler_context(
    task: Task, ctx: Context
) -> AbstractAsyncContextManager[Any] | AbstractContextManager[Any] | None:
    """Return a context manager to enter around one run of a handler, or None.

    For tracing spans, metrics and context propagation. Called in the worker for every
    attempt, after :func:`taskmill_task_started`. Every context manager returned is
    entered on the worker's event loop, in hook order (the implementation called first
    is outermost), around the whole handler call including its timeout; a plain ``def``
    handler's thread runs in a copy of the context the managers set up, so
    ``contextvars`` they set (an OpenTelemetry span, say) are seen by sync and async
    handlers alike. Async (``__aenter__``/``__aexit__``) and plain context managers
    both work.

    ``__exit__`` sees the handler's exception, if any (``TimeoutError`` for a timeout,
    ``asyncio.CancelledError`` for a cancellation). The managers observe the outcome;
    they cannot change it: an exception they suppress is raised anyway. A manager whose
    ``__enter__`` raises is skipped, and one whose ``__exit__`` raises is ignored; both
    are logged with the plugin's name.

    :param task: the claimed snapshot (RUNNING).
    :param ctx: the handler's :class:`~taskmill.Context`.
    :returns: a context manager, an async context manager, or None (nothing to wrap).
    """


# -- the command line -------------------------------------------------------------------

CommandRun = Callable[[argparse.Namespace, Any], Awaitable[int]]
"""What a plugin command runs: ``async def run(args, settings) -> int``."""
LoopFactory = Callable[[], asyncio.AbstractEventLoop]
"""What makes the event loop of a plugin's command (``CommandRegistrar.add``)."""


class CommandRegistrar:
    """What ``taskmill_register_commands`` receives as ``commands``: adds the plugin's
    commands to the ``taskmill`` command line."""

    def __init__(
        self, add: Callable[[str, Any, str, str], argparse.ArgumentParser], source: str
    ) -> None:
        self._add = add
        self.source = source
        """The plugin adding commands through this object, as warnings name it."""
        self.names: list[str] = []
        """The commands added through this object, in order."""

    def add(
        self,
        name: str,
        run: CommandRun,
        summary: str,
        description: str = "",
        *,
        loop_factory: LoopFactory | None = None,
    ) -> argparse.ArgumentParser:
        """Add command ``name`` running ``run(args, settings)``; returns its parser.

        :param loop_factory: makes the event loop ``run`` runs on (for instance
            ``uvloop.new_event_loop``); default: asyncio's own.
        :raises PluginError: the name is taken (by taskmill or another plugin).
        """
        try:
            parser = self._add(name, run, summary, description)
        except argparse.ArgumentError as exc:
            raise PluginError(f"{self.source}: cannot add command {name!r}: {exc}") from None
        if loop_factory is not None:
            parser.set_defaults(loop_factory=loop_factory)
        self.names.append(name)
        return parser


@hookspec
def taskmill_register_commands(commands: CommandRegistrar) -> None:
    """Add commands to the ``taskmill`` command line (datasette's ``register_commands``).

    Called once when ``taskmill`` builds its argument parser, with the installed plugins
    that the ``enable_plugins`` and ``disable_plugins`` settings allow loaded from their
    entry points (a plugin that cannot be loaded is left out with a warning there, so
    the command line still works). Must be a plain ``def``. A command whose name is
    taken (by taskmill or by another plugin) is left out with a warning.

    :param commands: call ``commands.add(name, run, summary, description="", *,
        loop_factory=None)`` for each command; it returns the command's
        ``argparse.ArgumentParser`` for its options. ``loop_factory`` makes the event
        loop the command runs on (default: asyncio's).
        ``run(args, settings)`` is an ``async def`` that gets the parsed
        ``argparse.Namespace`` and the command's :class:`~taskmill.settings.Settings`
        (``settings.url``, ``settings.taskmill_options()``, ...) and returns the exit
        status; a :class:`~taskmill.TaskmillError` it raises is printed as
        ``error: <message>`` with exit status 2, like taskmill's own commands.
    """
