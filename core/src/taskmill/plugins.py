"""Loading plugins and calling their hooks: a small typed facade over pluggy.

Plugins come from the ``taskmill.plugins`` entry-point group (loaded by
``Taskmill.open()`` unless ``plugins=False``, minus the names in
``$TASKMILL_DISABLE_PLUGINS``) and from the application (``Taskmill(plugins=[obj])``,
``tm.add_plugin(obj)``). The rest of taskmill calls hooks only through :class:`Plugins`,
whose methods say what happened (``task_enqueued``, ``attempt_finished``, ...) and decide
which hooks that fires. The hooks themselves are specified in :mod:`taskmill.hookspecs`.

A plugin that cannot be loaded is fatal by default: loading raises
:class:`~taskmill.PluginError` naming the plugin and its distribution, because a worker
silently missing a plugin's handlers would leave that plugin's tasks unserved. Commands
that only read (``taskmill ls``, ``show``, ``stats``, ``plugins``) load with
``strict=False`` instead: a broken plugin is left out, logged as a warning and listed in
:attr:`Plugins.broken`, so the tool for diagnosing it still works.

Hook calls are cheap when nobody listens: which plugins implement which hook is worked
out once per registration, and the ``observes_*``/``intercepts_handlers`` flags let the
hot paths skip a hook without a call.

Why one long module: the :class:`Plugins` facade is the one place that calls hooks
(STYLE: no ``pm.hook.x`` scattered through the code), so every hook's call, with its
error handling, lives here.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import logging
import os
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from datetime import datetime
from importlib.metadata import entry_points
from typing import Any, TypeVar

import attrs
import pluggy

from taskmill import hookspecs
from taskmill.context import Context
from taskmill.errors import HandlerConflict, PluginError
from taskmill.hookspecs import CommandRegistrar as CommandRegistrar  # its old home
from taskmill.model import AttemptOutcome, CancelReason, Task, TaskSpec, TaskStatus
from taskmill.periodic import Schedule
from taskmill.registry import Handler, HandlerRegistrar, HandlerRegistry
from taskmill.storage import Finish, FinishKind, utcnow

ENTRY_POINT_GROUP = "taskmill.plugins"
DISABLE_ENV = "TASKMILL_DISABLE_PLUGINS"
"""Comma-separated entry-point names of plugins not to load."""
ENABLE_ENV = "TASKMILL_ENABLE_PLUGINS"
"""Comma-separated entry-point names of the only plugins to load (unset or empty: all)."""

HOOK_NAMES: tuple[str, ...] = tuple(
    name for name in vars(hookspecs) if name.startswith(f"{hookspecs.PROJECT}_")
)
"""Every hook a plugin can implement, in the order :mod:`taskmill.hookspecs` defines
them."""

log = logging.getLogger("taskmill.plugins")

T = TypeVar("T")


@attrs.frozen
class PluginInfo:
    """A loaded plugin, as ``taskmill plugins`` lists it."""

    name: str
    """The entry-point name (or, for a plugin added in code, the name it was given)."""
    distribution: str | None = None
    """The distribution that installed it; None for a plugin added in code."""
    version: str | None = None
    """That distribution's version."""
    hooks: tuple[str, ...] = ()
    """The hooks it implements."""
    handlers: tuple[Handler, ...] = ()
    """The handlers it registered through ``taskmill_register_handlers``."""

    @property
    def label(self) -> str:
        """How messages name it: ``plugin 'demo' (taskmill-demo 0.1.0)``."""
        if self.distribution is None:
            return f"plugin {self.name!r} (added in code)"
        return f"plugin {self.name!r} ({self.distribution} {self.version})"


@attrs.frozen
class BrokenPlugin:
    """An installed plugin that could not be loaded (with ``strict=False``)."""

    name: str
    """The entry-point name."""
    distribution: str | None
    """The distribution that installed it."""
    version: str | None
    """That distribution's version."""
    error: str
    """Why it could not be loaded, and what to do (the :class:`PluginError` message)."""


def add_plugin_commands(
    add: Callable[[str, Any, str, str], argparse.ArgumentParser],
    *,
    enable: Collection[str] | None = None,
    disable: Collection[str] | None = None,
) -> Plugins:
    """Let the installed plugins add their commands (``taskmill_register_commands``)
    through ``add(name, run, summary, description)``, the command line's own way of
    adding one. A plugin that cannot be loaded, or whose hook fails, is left out with a
    warning: the command line must work to diagnose it.

    :param enable: load only these names (default: ``$TASKMILL_ENABLE_PLUGINS``).
    :param disable: never load these names (default: ``$TASKMILL_DISABLE_PLUGINS``).
    :returns: the plugins loaded, whose ``disabled``, ``not_enabled`` and ``broken``
        say why a plugin added no commands.
    """
    plugins = Plugins()
    # Quietly: the command that runs loads the plugins again and reports what is broken
    # or unmatched by its own policy (a failure for commands that run tasks).
    plugins.load_entry_points(enable=enable, disable=disable, strict=False, warn=False)
    plugins.register_commands(add)
    return plugins


def disabled_names(environ: Mapping[str, str] = os.environ) -> frozenset[str]:
    """The entry-point names ``$TASKMILL_DISABLE_PLUGINS`` lists."""
    return frozenset(n.strip() for n in environ.get(DISABLE_ENV, "").split(",") if n.strip())


def enabled_names(environ: Mapping[str, str] = os.environ) -> frozenset[str] | None:
    """The entry-point names ``$TASKMILL_ENABLE_PLUGINS`` lists; None when it is unset
    or empty (every plugin may load)."""
    names = frozenset(n.strip() for n in environ.get(ENABLE_ENV, "").split(",") if n.strip())
    return names or None


def _broken(info: PluginInfo, error: Exception, *, warn: bool = True) -> BrokenPlugin:
    if warn:
        log.warning("%s (left out: this command goes on without it)", error)
    return BrokenPlugin(
        name=info.name, distribution=info.distribution, version=info.version, error=str(error)
    )


def _plugin_name(plugin: object) -> str:
    name = getattr(plugin, "__name__", None)
    return name if isinstance(name, str) else type(plugin).__name__


class Plugins:
    """The plugins of one ``Taskmill``, and the one place that calls their hooks."""

    def __init__(self) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._infos: dict[str, PluginInfo] = {}
        self._from_entry_points: set[str] = set()
        self._with_handlers: set[str] = set()
        self._impls: dict[str, tuple[pluggy.HookImpl, ...]] = {}
        self.disabled: tuple[str, ...] = ()
        """Installed entry points skipped because the disable list
        (``$TASKMILL_DISABLE_PLUGINS`` by default) names them (filled by
        :meth:`load_entry_points`)."""
        self.not_enabled: tuple[str, ...] = ()
        """Installed entry points skipped because an enable list
        (``$TASKMILL_ENABLE_PLUGINS`` by default) leaves them out."""
        self.unmatched: tuple[str, ...] = ()
        """Names in the enable or disable list that match no installed plugin."""
        self.broken: tuple[BrokenPlugin, ...] = ()
        """Installed plugins that failed to load with ``strict=False``."""
        self.provides_headers = False
        """True when some plugin implements ``taskmill_task_headers``."""
        self.observes_enqueues = False
        self.observes_cancels = False
        self.observes_finishes = False
        self.observes_detaches = False
        self.observes_workers = False
        self.intercepts_handlers = False
        """True when some plugin observes handler starts or wraps handlers."""
        self._refresh()

    # -- what is loaded ------------------------------------------------------------

    def __iter__(self) -> Iterator[PluginInfo]:
        """The loaded plugins, in the order they were registered."""
        return iter(list(self._infos.values()))

    def __len__(self) -> int:
        return len(self._infos)

    def get(self, name: str) -> PluginInfo | None:
        """The loaded plugin called ``name``, or None."""
        return self._infos.get(name)

    def _label(self, name: str) -> str:
        info = self._infos.get(name)
        return info.label if info is not None else f"plugin {name!r}"

    # -- registering -----------------------------------------------------------------

    def load_entry_points(
        self,
        *,
        enable: Collection[str] | None = None,
        disable: Collection[str] | None = None,
        strict: bool = True,
        enable_from: str = ENABLE_ENV,
        disable_from: str = DISABLE_ENV,
        warn: bool = True,
    ) -> None:
        """Load and register every plugin of the ``taskmill.plugins`` entry-point group
        that is not loaded yet, except those the lists leave out.

        When one distribution is found twice on ``sys.path``, the first one wins. A name
        in either list that matches no installed plugin is logged as a warning (a typo
        there would otherwise go unnoticed) and kept in :attr:`unmatched`.

        :param enable: load only these names (default: ``$TASKMILL_ENABLE_PLUGINS``,
            and every plugin when that is unset).
        :param disable: never load these names (default: ``$TASKMILL_DISABLE_PLUGINS``).
        :param strict: False records a plugin that fails to load in :attr:`broken`
            (with a warning) and goes on with the others, instead of raising.
        :param enable_from: how warnings name where ``enable`` came from.
        :param disable_from: how warnings name where ``disable`` came from.
        :param warn: False records broken and unmatched plugins without logging them.
        :raises PluginError: (``strict`` only) a plugin failed to import or is not a
            valid plugin; the plugins loaded before it stay loaded (see :meth:`unload`).
        """
        skip = disabled_names() if disable is None else frozenset(disable)
        only = enabled_names() if enable is None else frozenset(enable)
        seen: set[str] = set()
        disabled: list[str] = []
        not_enabled: list[str] = []
        broken = [b for b in self.broken if b.name not in self._infos]
        # By name: the load order (and so the hook order) does not depend on where on
        # sys.path each distribution happens to be.
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
            if ep.name in seen:
                continue
            seen.add(ep.name)
            if ep.name in skip:
                disabled.append(ep.name)
                continue
            if only is not None and ep.name not in only:
                not_enabled.append(ep.name)
                continue
            if ep.name in self._infos or any(b.name == ep.name for b in broken):
                continue
            dist = ep.dist
            info = PluginInfo(
                name=ep.name,
                distribution=dist.metadata["Name"] if dist is not None else ep.value,
                version=dist.version if dist is not None else "?",
            )
            try:
                try:
                    plugin = ep.load()
                except Exception as exc:
                    raise PluginError(
                        f"{info.label} failed to import: {type(exc).__name__}: {exc} "
                        f"(entry point {ep.name} = {ep.value} in group {ENTRY_POINT_GROUP}); "
                        f"reinstall or remove {info.distribution}, or skip it with "
                        f"{DISABLE_ENV}={ep.name}"
                    ) from exc
                self._register(plugin, info)
            except PluginError as exc:
                if strict:
                    raise
                broken.append(_broken(info, exc, warn=warn))
                continue
            self._from_entry_points.add(ep.name)
        self.disabled = tuple(disabled)
        self.not_enabled = tuple(not_enabled)
        self.broken = tuple(broken)
        unmatched: list[str] = []
        for names, source in ((skip, disable_from), (only or (), enable_from)):
            for name in sorted(set(names) - seen):
                close = difflib.get_close_matches(name, sorted(seen), n=1)
                if warn:
                    log.warning(
                        "%s names %r, which matches no installed plugin%s; installed: %s",
                        source,
                        name,
                        f" (did you mean {close[0]!r}?)" if close else "",
                        ", ".join(sorted(seen)) or "none",
                    )
                unmatched.append(name)
        self.unmatched = tuple(unmatched)

    def add(self, plugin: object, name: str | None = None) -> PluginInfo:
        """Register a plugin object (a module, class instance, ...) from code.

        :param name: how listings and messages name it (default: its ``__name__``, else
            its class name); unique among the loaded plugins.
        :raises PluginError: the name is taken, the object is already registered, or it
            is not a valid plugin.
        """
        return self._register(plugin, PluginInfo(name=name or _plugin_name(plugin)))

    def _register(self, plugin: object, info: PluginInfo) -> PluginInfo:
        if info.name in self._infos:
            raise PluginError(
                f"{info.label} cannot be registered: a plugin named {info.name!r} is "
                "already loaded; give it another name"
            )
        try:
            self._pm.register(plugin, info.name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"{info.label} is not a valid taskmill plugin: {exc}") from exc
        except ValueError as exc:
            raise PluginError(f"{info.label} cannot be registered: {exc}") from exc
        try:
            hooks = self._validate(plugin, info)
        except PluginError:
            self._pm.unregister(name=info.name)
            raise
        info = attrs.evolve(info, hooks=hooks)
        self._infos[info.name] = info
        self._refresh()
        return info

    def _validate(self, plugin: object, info: PluginInfo) -> tuple[str, ...]:
        """The hooks ``plugin`` implements; raises for anything taskmill cannot call."""
        callers = self._pm.get_hookcallers(plugin) or []
        unknown = sorted(c.name for c in callers if not c.has_spec())
        if unknown:
            hints = [
                f"{name} (did you mean {close[0]}?)" if close else name
                for name in unknown
                for close in [difflib.get_close_matches(name, HOOK_NAMES, n=1)]
            ]
            raise PluginError(
                f"{info.label} implements unknown hook(s) {', '.join(hints)}; the hooks "
                f"of this taskmill are: {', '.join(HOOK_NAMES)} (is the plugin written "
                "for another version of taskmill?)"
            )
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:  # pragma: no cover - caught above
            raise PluginError(f"{info.label} is not a valid taskmill plugin: {exc}") from exc
        implemented = {c.name for c in callers}
        for caller in callers:
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper):
                    raise PluginError(
                        f"{info.label}: {caller.name} is a pluggy wrapper, which taskmill "
                        "does not support; wrap handlers with taskmill_handler_context"
                    )
        for impl in self._pm.hook.taskmill_task_headers.get_hookimpls():
            if impl.plugin is plugin and inspect.iscoroutinefunction(impl.function):
                raise PluginError(
                    f"{info.label}: taskmill_task_headers must be a plain def: it is "
                    "called inline for every task enqueued"
                )
        for name in HOOK_NAMES:
            if name not in implemented and callable(getattr(plugin, name, None)):
                raise PluginError(
                    f"{info.label} defines {name} without marking it with "
                    "@taskmill.hookimpl, so it would never be called"
                )
        return tuple(name for name in HOOK_NAMES if name in implemented)

    def register_handlers(self, registry: HandlerRegistry, *, strict: bool = True) -> None:
        """Call ``taskmill_register_handlers`` of every plugin that has not registered
        its handlers yet, in plugin order, into ``registry``.

        A plugin whose registration fails keeps none of its handlers. With ``strict``
        False it is also unregistered and recorded in :attr:`broken` (with a warning)
        instead of raising.

        :raises HandlerConflict: a plugin registered a key that already has a handler
            (the message names both registrants).
        :raises PluginError: a plugin's hook raised anything else, or is ``async``.
        """
        impls = {i.plugin_name: i for i in self._impls["taskmill_register_handlers"]}
        for name, info in list(self._infos.items()):
            if name in self._with_handlers:
                continue
            impl = impls.get(name)
            if impl is None:
                self._with_handlers.add(name)
                continue
            registrar = HandlerRegistrar(registry, info.label)
            kwargs = {"registry": registrar}
            try:
                result = impl.function(*[kwargs[arg] for arg in impl.argnames])
                if inspect.isawaitable(result):
                    if inspect.iscoroutine(result):
                        result.close()
                    raise PluginError(
                        f"{info.label}: taskmill_register_handlers must be a plain def, not async"
                    )
            except Exception as exc:
                registry.unregister_source(info.label)
                error = exc
                if not isinstance(exc, HandlerConflict | PluginError):
                    error = PluginError(
                        f"{info.label}: taskmill_register_handlers raised "
                        f"{type(exc).__name__}: {exc}"
                    )
                if strict:
                    if error is exc:
                        raise
                    raise error from exc
                self.remove(name, registry)
                self.broken = (*self.broken, _broken(info, error))
                continue
            self._infos[name] = attrs.evolve(info, handlers=tuple(registrar.handlers))
            self._with_handlers.add(name)

    def remove(self, name: str, registry: HandlerRegistry) -> None:
        """Unregister the plugin called ``name`` and the handlers it registered."""
        info = self._infos.pop(name, None)
        if info is None:
            return
        registry.unregister_source(info.label)
        self._with_handlers.discard(name)
        self._from_entry_points.discard(name)
        self._pm.unregister(name=name)
        self._refresh()

    def unload(self, registry: HandlerRegistry) -> None:
        """Undo :meth:`load_entry_points` and :meth:`register_handlers`: unregister the
        entry-point plugins and every plugin's handlers. Plugins added in code stay
        registered (their handlers are registered again by the next
        :meth:`register_handlers`)."""
        for name, info in list(self._infos.items()):
            registry.unregister_source(info.label)
            self._with_handlers.discard(name)
            if name in self._from_entry_points:
                self._pm.unregister(name=name)
                del self._infos[name]
            else:
                self._infos[name] = attrs.evolve(info, handlers=())
        self._from_entry_points.clear()
        self._refresh()

    def _refresh(self) -> None:
        # pluggy calls implementations last-registered first (tryfirst/trylast aside).
        self._impls = {
            name: tuple(reversed(getattr(self._pm.hook, name).get_hookimpls()))
            for name in HOOK_NAMES
        }
        has = {name for name, impls in self._impls.items() if impls}
        self.provides_headers = "taskmill_task_headers" in has
        self.observes_enqueues = "taskmill_task_enqueued" in has
        self.observes_cancels = "taskmill_task_cancelled" in has
        self.observes_finishes = bool(
            has
            & {
                "taskmill_task_finished",
                "taskmill_task_retried",
                "taskmill_task_dead_lettered",
                "taskmill_task_cancelled",
            }
        )
        self.observes_detaches = "taskmill_task_detached" in has
        self.observes_workers = bool(has & {"taskmill_worker_started", "taskmill_worker_stopped"})
        self.intercepts_handlers = bool(has & {"taskmill_task_started", "taskmill_handler_context"})

    # -- calling hooks -------------------------------------------------------------

    async def _notify(self, hook: str, **kwargs: Any) -> None:
        """Call every implementation of a notification hook, awaiting what is
        awaitable; an exception is logged with the plugin's name and goes no further."""
        for impl in self._impls[hook]:
            try:
                result = impl.function(*[kwargs[name] for name in impl.argnames])
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("%s: %s failed (ignored)", self._label(impl.plugin_name), hook)

    def task_headers(self, spec: TaskSpec, task_id: str) -> dict[str, str]:
        """The headers to store with the task ``spec`` describes: the merged results of
        ``taskmill_task_headers`` (the implementation called first wins a key). An
        exception, or a key or value that is not a string, is logged and left out."""
        headers: dict[str, str] = {}
        kwargs = {"spec": spec, "task_id": task_id}
        for impl in self._impls["taskmill_task_headers"]:
            try:
                returned: Any = impl.function(*[kwargs[name] for name in impl.argnames])
                if returned is None:
                    continue
                for key, value in returned.items():
                    if isinstance(key, str) and isinstance(value, str):
                        headers.setdefault(key, value)
                    else:
                        log.error(
                            "%s: taskmill_task_headers returned %r: %r, not strings (left out)",
                            self._label(impl.plugin_name),
                            key,
                            value,
                        )
            except Exception:
                log.exception(
                    "%s: taskmill_task_headers failed (ignored)", self._label(impl.plugin_name)
                )
        return headers

    async def tasks_enqueued(self, tasks: list[Task]) -> None:
        """``tasks`` were stored by this process: ``taskmill_task_enqueued`` for each."""
        for task in tasks:
            await self._notify("taskmill_task_enqueued", task=task)

    async def tasks_cancelled(self, tasks: list[Task]) -> None:
        """A cancel call in this process changed ``tasks``:
        ``taskmill_task_cancelled`` for each one that is now CANCELLED."""
        for task in tasks:
            if task.status is TaskStatus.CANCELLED:
                reason = task.cancel_reason or CancelReason.USER
                await self._notify("taskmill_task_cancelled", task=task, reason=reason)

    async def attempt_finished(self, finish: Finish, stored: Task) -> None:
        """A worker stored the outcome of an attempt (that fired
        ``taskmill_task_started``): ``taskmill_task_finished``, then ``retried``,
        ``dead_lettered`` or ``cancelled`` as the stored task says."""
        status = stored.status
        # The store turns a failure into a release when a suspension or shutdown was
        # requested meanwhile: the attempt is given back, not spent.
        released = status is TaskStatus.PENDING and (
            finish.kind is FinishKind.RELEASE or stored.attempts < finish.lease.attempt
        )
        outcome = AttemptOutcome.INTERRUPTED if released else finish.outcome
        elapsed_ms = (finish.finished_at - finish.started_at).total_seconds() * 1000.0
        error = None if outcome is AttemptOutcome.COMPLETED else finish.error
        if self._impls["taskmill_task_finished"]:
            await self._notify(
                "taskmill_task_finished",
                task=stored,
                outcome=outcome,
                elapsed_ms=elapsed_ms,
                error=error,
            )
        if status is TaskStatus.COMPLETED:
            return
        if status is TaskStatus.PENDING and not released:
            await self._notify(
                "taskmill_task_retried", task=stored, error=finish.error, delay=finish.retry_in
            )
        elif status is TaskStatus.FAILED:
            await self._notify("taskmill_task_dead_lettered", task=stored, error=stored.error)
        elif status is TaskStatus.CANCELLED:
            reason = stored.cancel_reason or finish.cancel_reason or CancelReason.USER
            await self._notify("taskmill_task_cancelled", task=stored, reason=reason)

    async def attempt_taken(
        self, claimed: Task, current: Task | None, started_at: datetime, ended_at: datetime
    ) -> None:
        """A worker learned, at ``ended_at``, that the task it was running is no longer
        its own (``current`` is the task now, None if it was deleted):
        ``taskmill_task_finished`` with outcome CANCELLED or LOST."""
        if current is not None and current.status is TaskStatus.CANCELLED:
            outcome = AttemptOutcome.CANCELLED
            reason = current.cancel_reason or CancelReason.USER
            error: str | None = f"cancelled ({reason.value})"
        else:
            outcome = AttemptOutcome.LOST
            error = "lease expired" if current is not None else "task deleted"
        await self._notify(
            "taskmill_task_finished",
            task=current or claimed,
            outcome=outcome,
            elapsed_ms=(ended_at - started_at).total_seconds() * 1000.0,
            error=error,
        )

    async def attempt_detached(self, claimed: Task, worker_id: str) -> None:
        """A worker handed the attempt of ``claimed`` over to another owner (its
        handler raised :class:`~taskmill.Detached`): ``taskmill_task_detached``."""
        await self._notify("taskmill_task_detached", task=claimed, worker_id=worker_id)

    async def tasks_rescued(self, tasks: list[Task]) -> None:
        """This worker took ``tasks`` back from expired leases: ``retried``,
        ``dead_lettered`` or ``cancelled`` for each, as its new state says."""
        now = utcnow()
        for task in tasks:
            if task.status is TaskStatus.FAILED:
                await self._notify("taskmill_task_dead_lettered", task=task, error=task.error)
            elif task.status is TaskStatus.CANCELLED:
                reason = task.cancel_reason or CancelReason.USER
                await self._notify("taskmill_task_cancelled", task=task, reason=reason)
            elif task.status is TaskStatus.PENDING and task.error == "lease expired":
                # (A rescue that honoured a suspension gives the attempt back instead.)
                delay = max(0.0, (task.run_at - now).total_seconds())
                await self._notify(
                    "taskmill_task_retried", task=task, error=task.error, delay=delay
                )

    async def worker_started(self, worker: object) -> None:
        """``taskmill_worker_started`` (``worker``: the :class:`~taskmill.Worker`)."""
        await self._notify("taskmill_worker_started", worker=worker)

    async def worker_stopped(self, worker: object) -> None:
        """``taskmill_worker_stopped``."""
        await self._notify("taskmill_worker_stopped", worker=worker)

    async def run_handler(
        self, task: Task, ctx: Context, worker_id: str, call: Callable[[], Awaitable[T]]
    ) -> T:
        """Run one attempt's handler (``call``) the way the plugins ask:
        ``taskmill_task_started``, then ``call()`` inside every context manager
        ``taskmill_handler_context`` returned. Returns or raises what ``call()`` does."""
        if self._impls["taskmill_task_started"]:
            await self._notify("taskmill_task_started", task=task, worker_id=worker_id)
        if not self._impls["taskmill_handler_context"]:
            return await call()
        entered = await self._enter_contexts(task, ctx)
        if not entered:
            return await call()
        try:
            result = await call()
        except BaseException as exc:
            await self._exit_contexts(entered, exc)
            raise
        await self._exit_contexts(entered, None)
        return result

    async def _enter_contexts(self, task: Task, ctx: Context) -> list[tuple[str, Any]]:
        entered: list[tuple[str, Any]] = []
        for impl in self._impls["taskmill_handler_context"]:
            kwargs = {"task": task, "ctx": ctx}
            label = self._label(impl.plugin_name)
            try:
                manager: Any = impl.function(*[kwargs[name] for name in impl.argnames])
                if inspect.isawaitable(manager):
                    manager = await manager
                if manager is None:
                    continue
                if hasattr(manager, "__aenter__"):
                    await manager.__aenter__()
                elif hasattr(manager, "__enter__"):
                    manager.__enter__()
                else:
                    log.error(
                        "%s: taskmill_handler_context returned %r, not a context manager (ignored)",
                        label,
                        manager,
                    )
                    continue
            except Exception:
                log.exception("%s: entering its handler context failed (skipped)", label)
                continue
            entered.append((label, manager))
        return entered

    async def _exit_contexts(
        self, entered: list[tuple[str, Any]], exc: BaseException | None
    ) -> None:
        exc_info = (None, None, None) if exc is None else (type(exc), exc, exc.__traceback__)
        for label, manager in reversed(entered):
            try:
                if hasattr(manager, "__aexit__"):
                    await manager.__aexit__(*exc_info)
                else:
                    manager.__exit__(*exc_info)
            except Exception:
                log.exception("%s: leaving its handler context failed (ignored)", label)

    def schedules(self) -> list[Schedule]:
        """Every plugin's ``taskmill_register_schedules``, in plugin order.

        :raises PluginError: a plugin's hook raised, is ``async``, or returned something
            other than :class:`~taskmill.periodic.Schedule` objects.
        """
        found: list[Schedule] = []
        for impl in reversed(self._impls["taskmill_register_schedules"]):
            label = self._label(impl.plugin_name)
            try:
                result = impl.function()
                if inspect.isawaitable(result):
                    if inspect.iscoroutine(result):
                        result.close()
                    raise PluginError(f"{label}: taskmill_register_schedules must be a plain def")
                if result is None:
                    result = ()
                if not isinstance(result, Iterable):
                    raise PluginError(
                        f"{label}: taskmill_register_schedules returned {result!r}; return"
                        " a list of taskmill.periodic.Schedule objects"
                    )
                items = list(result)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(
                    f"{label}: taskmill_register_schedules raised {type(exc).__name__}: {exc}"
                ) from exc
            for item in items:
                if not isinstance(item, Schedule):
                    raise PluginError(
                        f"{label}: taskmill_register_schedules returned {item!r}; return"
                        " taskmill.periodic.Schedule objects"
                    )
                found.append(item)
        return found

    def register_commands(
        self, add: Callable[[str, Any, str, str], argparse.ArgumentParser]
    ) -> None:
        """Call every plugin's ``taskmill_register_commands`` with a
        :class:`CommandRegistrar` over ``add``; a failure is logged as a warning and the
        other plugins go on."""
        for impl in self._impls["taskmill_register_commands"]:
            registrar = CommandRegistrar(add, self._label(impl.plugin_name))
            kwargs = {"commands": registrar}
            try:
                result = impl.function(*[kwargs[name] for name in impl.argnames])
                if inspect.isawaitable(result):
                    if inspect.iscoroutine(result):
                        result.close()
                    raise PluginError(
                        f"{registrar.source}: taskmill_register_commands must be a plain def"
                    )
            except Exception as exc:
                log.warning("%s: adding its commands failed (left out): %s", registrar.source, exc)
