"""Task operations: what an application does with tasks, host-wide or bound to one app.

:class:`TaskOperations` holds every operation once. ``Taskmill`` is the host-wide one;
``tm.for_app(app_id)`` returns an :class:`AppTasks` bound to one app, which stamps that
``app_id`` on what it creates and sees or touches nothing of another app's tasks (a
foreign task id behaves exactly like an unknown one).

The operations use their ``Taskmill`` through :class:`~taskmill.hosts.TaskHost` only:
its store, its plugins, its check of a task spec (``new_task``), ``check_open`` and
``notify_workers``.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

import attrs

from taskmill import canvas, canvas_plan
from taskmill.canvas import Chain, Chord, Group
from taskmill.errors import InvalidTaskSpec, TaskNotFound, WaitTimeout
from taskmill.headers import HEADERS_KEY
from taskmill.model import (
    ACTIVE_STATUSES,
    Attempt,
    CancelReason,
    Priority,
    ProgressSummary,
    SuspensionScope,
    Task,
    TaskEvent,
    TaskFilter,
    TaskSpec,
    TaskStatus,
    slot_builder,
)
from taskmill.storage import NewTask, StoreChange
from taskmill.validation import APP_ID_MAX, TASK_TYPE_MAX, check_key, check_page, is_task_id

if TYPE_CHECKING:
    from taskmill.hosts import TaskHost
    from taskmill.registry import Handler, HandlerRegistry

TaskSpecLike = TaskSpec | Mapping[str, Any]
_EVENTS = frozenset({StoreChange.EVENTS})


def handler_hint(handlers: Iterable[Handler], app_id: str | None, task_type: str) -> str:
    """What the caller may have meant by ``task_type`` (of ``app_id``) that none of
    ``handlers`` serves: the same type registered for other apps, else close matches
    among the handlers' types (also written ``app/type``). Empty when nothing is close.
    """
    handlers = list(handlers)
    apps = sorted({repr(h.app_id) for h in handlers if h.task_type == task_type})
    if apps:
        return f"it has handlers for app {' and '.join(apps)} only: give that app_id"
    # The caller's own app first, so that a typo is matched within its app.
    handlers.sort(key=lambda h: h.app_id != app_id)
    types: dict[str, list[Handler]] = {}
    for h in handlers:
        types.setdefault(h.task_type, []).append(h)
    close = [types[t][0] for t in difflib.get_close_matches(task_type, list(types), n=2)]
    if not close and "/" in task_type:
        # "app/type" written as the task type, the way listings show app handlers.
        labels = {f"{h.app_id}/{h.task_type}": h for h in handlers if h.app_id is not None}
        close = [labels[name] for name in difflib.get_close_matches(task_type, list(labels), n=2)]
    named = dict.fromkeys(_handler_name(h) for h in close)
    return f"did you mean {' or '.join(named)}?" if named else ""


def _handler_name(handler: Handler) -> str:
    if handler.app_id is None:
        return repr(handler.task_type)
    return f"{handler.task_type!r} of app {handler.app_id!r}"


def unserved_type_message(registry: HandlerRegistry, app_id: str | None, task_type: str) -> str:
    """Says that no handler in ``registry`` serves ``task_type`` (of ``app_id``), with
    what the caller may have meant (see :func:`handler_hint`)."""
    handlers = list(registry)
    scope = f" of app {app_id!r}" if app_id is not None else ""
    hint = handler_hint(handlers, app_id, task_type)
    known = ", ".join(sorted(_handler_name(h) for h in handlers)) or "none"
    return (
        f"no handler registered here serves task type {task_type!r}{scope}"
        f"{'; ' + hint if hint else ''} (registered: {known})"
    )


def event_matches(filter: TaskFilter | None, event: TaskEvent) -> bool:
    """True when ``event`` is selected by ``filter``; statuses match the status the
    change produced, the other fields match the task."""
    if filter is None:
        return True
    if filter.statuses is not None:
        if event.status not in filter.statuses:
            return False
        filter = attrs.evolve(filter, statuses=None)
    return filter.matches(event.task)


class TaskOperations:
    """Every task operation, optionally bound to one app (``app_id``)."""

    def __init__(self, host: TaskHost, app_id: str | None) -> None:
        self._host = host
        self._app_id = app_id

    @property
    def app_id(self) -> str | None:
        """The app these operations are bound to (None: the host, every app)."""
        return self._app_id

    # -- scoping -------------------------------------------------------------------

    def _visible(self, task: Task | None) -> Task | None:
        if task is None or (self._app_id is not None and task.app_id != self._app_id):
            return None
        return task

    def _scoped(self, filter: TaskFilter | None) -> TaskFilter:
        filter = filter or TaskFilter()
        if self._app_id is None or filter.app_id == self._app_id:
            return filter
        if filter.app_id is not None:
            raise InvalidTaskSpec(
                f"these operations are bound to app {self._app_id!r} and cannot select "
                f"tasks of app {filter.app_id!r}"
            )
        return attrs.evolve(filter, app_id=self._app_id)

    def _stamped(self, spec: TaskSpec) -> TaskSpec:
        if self._app_id is None or spec.app_id == self._app_id:
            return spec
        if spec.app_id is not None:
            raise InvalidTaskSpec(
                f"these operations are bound to app {self._app_id!r} and cannot create "
                f"tasks of app {spec.app_id!r}"
            )
        return attrs.evolve(spec, app_id=self._app_id)

    async def _require(self, task_id: str) -> Task:
        task = self._visible(await self._stored(task_id))
        if task is None:
            raise TaskNotFound(f"no task {task_id}")
        return task

    def _scope(self, task_type: str | None, app_id: str | None) -> SuspensionScope:
        if task_type is not None:
            check_key("task_type", task_type, TASK_TYPE_MAX, empty=False)
        if app_id is not None:
            check_key("app_id", app_id, APP_ID_MAX)
        if self._app_id is not None:
            if app_id not in (None, self._app_id):
                raise InvalidTaskSpec(f"these operations are bound to app {self._app_id!r}")
            app_id = self._app_id
        return SuspensionScope(task_type=task_type, app_id=app_id)

    # -- enqueueing --------------------------------------------------------------------

    async def enqueue(
        self,
        task_type: str,
        params: dict[str, Any] | None = None,
        *,
        app_id: str | None = None,
        priority: int = Priority.NORMAL,
        dedupe_key: str | None = None,
        run_at: Any = None,
        delay: timedelta | float | None = None,
        parent_id: str | None = None,
        max_retries: int | None = None,
        user_id: str | None = None,
        after: Iterable[str] = (),
        after_policy: str = "completed",
        headers: Mapping[str, str] | None = None,
    ) -> Task:
        """Store a new task and return its snapshot.

        With a ``dedupe_key`` held by an active task of the same ``(app_id, task_type)``
        the new task is an alias of it (``alias_of``) and takes its outcome.

        ``after`` names stored tasks (of the same app) this one waits for: it stays
        PENDING, never claimed, until every one of them has COMPLETED. When one ends
        FAILED or CANCELLED it is cancelled (reason PREEMPTED, an error naming that
        dependency), or, with ``after_policy="always"``, it runs once all have ended.
        See docs/dependencies.md.

        :raises InvalidParams: params is not a JSON object or is too large.
        :raises InvalidTaskSpec: the options are inconsistent (run_at with delay, a
            naive run_at, a negative max_retries, ...).
        :raises UnknownTaskType: the ``Taskmill`` was built with ``strict_types=True``
            and no handler registered in it serves ``task_type``.
        :raises InvalidTaskSpec: also when a dependency does not exist, belongs to
            another app, or ``after`` is combined with a ``dedupe_key``; nothing is
            stored.
        """
        try:
            spec = TaskSpec(
                task_type=task_type,
                params=params,
                app_id=app_id,
                priority=priority,
                dedupe_key=dedupe_key,
                run_at=run_at,
                delay=delay,
                parent_id=parent_id,
                max_retries=max_retries,
                user_id=user_id,
                after=after,  # the converter makes it a tuple (refusing a str)
                after_policy=after_policy,
                headers=headers,
            )
        except InvalidTaskSpec:
            raise  # it names its field
        except (TypeError, ValueError) as exc:
            raise InvalidTaskSpec(str(exc)) from None
        (task,) = await self._enqueue_specs([spec])
        return task

    async def enqueue_many(self, specs: Iterable[TaskSpecLike]) -> list[Task]:
        """Store many tasks in one storage call (all or none).

        A spec is a :class:`TaskSpec` or a dict of :meth:`enqueue`'s arguments.

        :raises InvalidParams: any spec's params is invalid; nothing is stored then.
        """
        return await self._enqueue_specs([TaskSpec.from_value(s) for s in specs])

    async def _enqueue_specs(self, specs: list[TaskSpec]) -> list[Task]:
        host = self._host
        host.check_open()
        if not specs:
            return []
        specs = await host.with_published_options([self._stamped(spec) for spec in specs])
        if self._app_id is not None:
            for parent_id in {s.parent_id for s in specs if s.parent_id is not None}:
                await self._require(parent_id)
        ids = _fresh_ids(len(specs))
        new_tasks = [
            self._new_task(spec, task_id) for spec, task_id in zip(specs, ids, strict=True)
        ]
        return await self._store(new_tasks)

    def _new_task(self, spec: TaskSpec, task_id: str) -> NewTask:
        """``host.new_task`` for ``spec``, with the headers the plugins give it stored
        under the reserved params key (``taskmill_task_headers``, docs/plugins.md).

        :raises InvalidTaskSpec: the params use the reserved key themselves.
        """
        params = spec.params
        if isinstance(params, dict) and HEADERS_KEY in params:
            raise InvalidTaskSpec(
                f"params key {HEADERS_KEY!r} is reserved for the headers plugins store with "
                "a task (docs/plugins.md#taskmill_task_headers); give the value another key",
                field="params",
            )
        plugins = self._host.plugins
        if (spec.headers or plugins.provides_headers) and (
            params is None or isinstance(params, dict)
        ):  # the common case (no header, no plugin giving any) builds nothing here
            headers: dict[str, Any] = dict(spec.headers or {})
            if plugins.provides_headers:
                headers.update(plugins.task_headers(spec, task_id))
            if headers:
                spec = attrs.evolve(spec, params={**(params or {}), HEADERS_KEY: headers})
        return self._host.new_task(spec, task_id)

    async def _store(self, new_tasks: list[NewTask], *, wake: bool = True) -> list[Task]:
        """Store checked tasks in one call, wake this process's workers (unless not
        ``wake``) and tell the plugins."""
        host = self._host
        tasks = await host.storage.enqueue(new_tasks)
        if wake:
            host.notify_workers()
        if host.plugins.observes_enqueues:
            await host.plugins.tasks_enqueued(tasks)
        return tasks

    async def batch_children(self, parent_id: str, specs: Iterable[TaskSpecLike]) -> list[Task]:
        """Enqueue ``specs`` as children of ``parent_id`` in one call (all or none).

        Children default to their parent's ``app_id``. Cancelling the parent with
        ``cascade=True`` cancels them; ``progress_summary(TaskFilter(parent_id=...))``
        aggregates them.

        :raises TaskNotFound: no such parent (for an app-bound client: not its task).
        """
        self._host.check_open()
        parent = await self._require(parent_id)
        children = []
        for value in specs:
            spec = TaskSpec.from_value(value)
            if spec.parent_id not in (None, parent_id):
                raise InvalidTaskSpec(f"a child of {parent_id} cannot name another parent")
            changes: dict[str, Any] = {"parent_id": parent_id}
            if spec.app_id is None:
                changes["app_id"] = parent.app_id
            children.append(attrs.evolve(spec, **changes))
        return await self._enqueue_specs(children)

    # -- chains, groups and chords (docs/canvas.md) --------------------------------------

    async def chain(
        self,
        *links: TaskSpecLike,
        pass_result: bool | str = False,
        link_error: TaskSpecLike | None = None,
    ) -> Chain:
        """Store a chain: each link runs once the previous one has COMPLETED; a link
        that fails or is cancelled cancels the links after it.

        ``pass_result=True`` passes each link's result to the next one as its params
        key ``"input"`` (a str: that key), read from the store when the next link's
        attempt starts. The chain's ``id`` is its last link's, whose result is the
        chain's; the earlier links are its children, so ``tm.cancel(chain.id)`` cancels
        them all. A link may itself be a canvas described with :mod:`taskmill.canvas`
        (``canvas.group(...)``, ``canvas.chain(...)``, ``canvas.chord(...)``).
        ``link_error``: a task that runs only if the chain fails, with the failure in
        its params key ``"failure"`` (the handle's ``errback``; docs/canvas.md).

        :raises InvalidTaskSpec: no link, a link with a ``dedupe_key``, a
            ``parent_id`` or an ``after_policy``, links of several apps, or a link whose
            params already have the key the result is passed in. Nothing is stored.
        """
        _check_input_key(pass_result)
        if link_error is not None:  # stored with its errback (docs/canvas.md, link_error)
            described = canvas.chain(*links, pass_result=pass_result, link_error=link_error)
            return await described.apply(self)
        specs = self._canvas_specs(links)
        plan = canvas_plan.plan_chain(specs, pass_result, self._new_task)
        await self._store_plan(plan)
        return Chain(plan.root, ops=self, links=plan.members)

    async def group(
        self, members: Iterable[TaskSpecLike], *, link_error: TaskSpecLike | None = None
    ) -> Group:
        """Store a group: its members run independently, as children of a root task
        (``group.id``, type ``taskmill.group``, served by every worker) that ends once
        they all have: COMPLETED with the list of their results in order, or FAILED
        naming those that did not complete. ``tm.cancel(group.id)`` cancels them all.

        :raises InvalidTaskSpec: see :meth:`chain`.
        """
        if link_error is not None:
            return await canvas.group(members, link_error=link_error).apply(self)
        specs = self._canvas_specs(members)
        plan = canvas_plan.plan_group(specs, self._new_task)
        await self._store_plan(plan)
        return Group(plan.root, ops=self, members=plan.members)

    async def chord(
        self,
        members: Iterable[TaskSpecLike],
        callback: TaskSpecLike,
        *,
        pass_result: bool | str = True,
        link_error: TaskSpecLike | None = None,
    ) -> Chord:
        """Store a chord: ``members`` run independently, as children of ``callback``
        (``chord.id``), which runs once every one of them has COMPLETED, with their
        results in order as its params key ``"input"`` (``pass_result``: another key,
        or False for none). A member that fails or is cancelled cancels the callback.

        :raises InvalidTaskSpec: see :meth:`chain`.
        """
        _check_input_key(pass_result)
        if link_error is not None:
            described = canvas.chord(
                members, callback, pass_result=pass_result, link_error=link_error
            )
            return await described.apply(self)
        specs = self._canvas_specs(members)
        (last,) = self._canvas_specs([callback])
        plan = canvas_plan.plan_chord(specs, last, pass_result, self._new_task)
        await self._store_plan(plan)
        return Chord(plan.root, ops=self, members=plan.members)

    def _canvas_specs(self, values: Iterable[TaskSpecLike]) -> list[TaskSpec]:
        self._host.check_open()
        if not self._host.storage.capabilities.dependencies:
            raise InvalidTaskSpec(
                "chains, groups and chords need a store that keeps task dependencies, and "
                f"{type(self._host.storage).__name__} does not (docs/backends.md)"
            )
        if isinstance(values, TaskSpec | Mapping):
            raise InvalidTaskSpec("give the tasks of a group or chord as a list of specs")
        return [self._stamped(TaskSpec.from_value(value)) for value in values]

    async def _store_plan(self, plan: canvas_plan.CanvasPlan) -> None:
        # This process's workers are woken once the whole canvas is stored: one that
        # started the first task earlier would find the root missing and store the rest
        # itself (harmless: the same ids; but it is the path for a creator that died).
        await canvas_plan.store_plan(
            plan,
            get=self._host.storage.get,
            enqueue=functools.partial(self._store, wake=False),
            rollback=self._roll_back,
        )
        self._host.notify_workers()

    async def _roll_back(self, task_ids: list[str]) -> None:
        """Cancel the tasks of a canvas whose storing failed half-way."""
        changed = await self._host.storage.cancel(task_ids=task_ids, cascade=False)
        await self._cancelled(changed)

    # -- reading -----------------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        """The task's current snapshot, or None."""
        self._host.check_open()
        return self._visible(await self._stored(task_id))

    async def _stored(self, task_id: str) -> Task | None:
        """The stored snapshot of ``task_id``; None for an id no task can have (not a
        str, too long, a NUL or a lone surrogate: no store holds such an id)."""
        if not is_task_id(task_id):
            return None
        return await self._host.storage.get(task_id)

    async def query(
        self,
        filter: TaskFilter | None = None,
        *,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
        after: str | None = None,
    ) -> list[Task]:
        """Tasks matching ``filter``, oldest first (or newest first).

        :param after: a task id: start right after that task's place in this order
            (keyset paging; see :meth:`TaskStorage.query`). An id this API cannot see
            (unknown, or another app's) selects nothing.
        :raises InvalidTaskSpec: ``limit`` or ``offset`` is not an int from 0 to 2**31-1.
        """
        self._host.check_open()
        check_page(limit, offset)
        if after is not None and (
            not is_task_id(after) or (self._app_id is not None and await self.get(after) is None)
        ):
            return []
        return await self._host.storage.query(
            self._scoped(filter),
            limit=limit,
            offset=offset,
            newest_first=newest_first,
            after=after,
        )

    async def wait(self, task_id: str, *, timeout: float | None = None) -> Task:
        """Return the task once it is COMPLETED, FAILED or CANCELLED.

        A task deleted by its finish (``delete_completed``, ``delete_failed``) is
        returned as its last snapshot, its result included, while the event log keeps
        its events (the workers' ``event_retention``, 2 minutes by default); see
        docs/retention.md.

        :raises TaskNotFound: no such task (or one deleted longer ago).
        :raises WaitTimeout: still active after ``timeout`` seconds.
        :raises InvalidTaskSpec: ``timeout`` is not None or a finite number >= 0.
        """
        self._host.check_open()
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 <= timeout < math.inf
        ):
            raise InvalidTaskSpec(
                f"timeout must be None or a finite number of seconds >= 0, got {timeout!r}",
                field="timeout",
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.005
        while True:
            task = self._visible(await self._stored(task_id))
            if task is None:
                # Deleted by its finish (delete_completed, delete_failed): its tombstone,
                # while the event log keeps it, else it is unknown.
                if is_task_id(task_id):
                    task = self._visible(await self._host.storage.deleted_task(task_id))
                if task is None:
                    raise TaskNotFound(f"no task {task_id}")
            if task.status.terminal:
                return task
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"task {task_id} is still {task.status.value} after {timeout} s")
            pause = delay if deadline is None else min(delay, deadline - time.monotonic())
            await asyncio.sleep(max(0.0, pause))
            delay = min(0.25, delay * 1.5)

    async def attempts(self, task_id: str) -> list[Attempt]:
        """The task's execution log, one row per attempt, oldest first (empty for an
        unknown or foreign id)."""
        self._host.check_open()
        if not is_task_id(task_id) or (
            self._app_id is not None and await self.get(task_id) is None
        ):
            return []
        return await self._host.storage.attempts(task_id)

    async def progress_summary(self, filter: TaskFilter | None = None) -> ProgressSummary:
        """Counts by status (and the share finished) of the tasks ``filter`` selects,
        computed by the store."""
        self._host.check_open()
        return await self._host.storage.summary(self._scoped(filter))

    def events(
        self,
        filter: TaskFilter | None = None,
        *,
        since: str | None = None,
        poll_interval: float = 0.1,
    ) -> AsyncIterator[TaskEvent]:
        """Every change to the selected tasks, from every process sharing the store: an
        endless async iterator (break out of it to stop).

        It starts where the log is when iteration begins, or right after cursor
        ``since`` (an ``event.cursor`` seen earlier, an opaque token: resume without a
        gap; a token the store did not write raises
        :class:`~taskmill.errors.InvalidCursor` on the first read). Use
        :meth:`subscribe` to fix the starting point before iterating. Delivery is at
        least once and in commit order (so in order per task). ``event.task`` is the
        snapshot when the event is read; ``event.status`` is the status the change
        produced. The store is polled, 10 ms after activity, backing off to
        ``poll_interval``. A subscriber that falls behind by more than the workers'
        ``event_retention`` misses the pruned events.
        """
        return self._event_stream(filter, since, poll_interval)

    async def subscribe(
        self, filter: TaskFilter | None = None, *, poll_interval: float = 0.1
    ) -> AsyncIterator[TaskEvent]:
        """Like :meth:`events`, but the subscription starts now, before this returns:
        every change committed after the ``await`` is delivered."""
        self._host.check_open()
        _, cursor = await self._host.storage.read_events(None)
        return self._event_stream(filter, cursor, poll_interval)

    async def _event_stream(
        self, filter: TaskFilter | None, since: str | None, poll_interval: float
    ) -> AsyncIterator[TaskEvent]:
        self._host.check_open()
        selected = self._scoped(filter) if (filter or self._app_id) else None
        storage = self._host.storage
        cursor = since
        if cursor is None:
            _, cursor = await storage.read_events(None)
        listener = await storage.change_listener()
        try:
            delay = 0.01
            while True:
                batch, next_cursor = await storage.read_events(cursor)
                for event in batch:
                    if event_matches(selected, event):
                        yield event
                if next_cursor == cursor:
                    if listener is None:
                        await asyncio.sleep(delay)
                    else:  # pushed: wake at once, poll as the fallback
                        await listener.wait(_EVENTS, delay)
                    delay = min(poll_interval, delay * 2)
                else:
                    delay = 0.01
                cursor = next_cursor
        finally:
            if listener is not None:
                await listener.close()

    # -- managing ----------------------------------------------------------------------

    async def retry(self, task_id: str) -> Task:
        """Put a FAILED or CANCELLED task back to PENDING with a fresh attempt budget.

        :raises TaskNotFound: no such task.
        :raises InvalidTransition: the task is not FAILED or CANCELLED.
        """
        self._host.check_open()
        await self._require(task_id)
        task = await self._host.storage.retry(task_id)
        self._host.notify_workers()
        return task

    async def cancel(
        self, task_id: str, *, reason: CancelReason = CancelReason.USER, cascade: bool = True
    ) -> Task:
        """Cancel a task and return its snapshot afterwards.

        USER and PREEMPTED end it (CANCELLED) at once, wherever it is; a running
        handler is interrupted (at its next ``await``, or when it checks
        ``ctx.cancelled``) within about a second, even in another process. SUSPENDED and
        SHUTDOWN send a running task back to PENDING without spending an attempt.
        ``cascade`` also cancels its descendants; aliases always follow their leader. A
        finished task is returned unchanged.

        :raises TaskNotFound: no such task.
        :raises InvalidTaskSpec: ``reason`` is not a :class:`CancelReason`.
        """
        self._host.check_open()
        reason = _cancel_reason(reason)
        await self._require(task_id)
        changed = await self._host.storage.cancel(
            task_ids=[task_id], reason=reason, cascade=cascade
        )
        await self._cancelled(changed)
        return await self._require(task_id)

    async def cancel_by_filter(
        self,
        filter: TaskFilter,
        *,
        reason: CancelReason = CancelReason.USER,
        cascade: bool = True,
    ) -> int:
        """Cancel every active task ``filter`` selects; returns how many tasks changed
        (cascaded children and aliases included)."""
        self._host.check_open()
        reason = _cancel_reason(reason)
        scoped = self._scoped(filter)
        wanted = ACTIVE_STATUSES if scoped.statuses is None else set(scoped.statuses)
        active = tuple(s for s in TaskStatus if s in wanted and s in ACTIVE_STATUSES)
        if not active:
            return 0
        scoped = attrs.evolve(scoped, statuses=active)
        changed = await self._host.storage.cancel(filter=scoped, reason=reason, cascade=cascade)
        await self._cancelled(changed)
        return len(changed)

    async def _cancelled(self, changed: list[Task]) -> None:
        plugins = self._host.plugins
        if plugins.observes_cancels:
            await plugins.tasks_cancelled(changed)

    async def preempt(
        self, task_type: str, *, app_id: str | None = None, dedupe_key: str | None = None
    ) -> int:
        """Cancel the active tasks of ``task_type`` (of ``app_id``; with ``dedupe_key``
        only those) with reason PREEMPTED: a newer request made them obsolete.
        Returns how many tasks changed."""
        scope = self._scope(task_type, app_id)
        return await self.cancel_by_filter(
            TaskFilter(task_types=(task_type,), app_id=scope.app_id, dedupe_key=dedupe_key),
            reason=CancelReason.PREEMPTED,
        )

    async def suspend(self, task_type: str | None = None, *, app_id: str | None = None) -> int:
        """Stop claiming tasks of this scope on every worker (all tasks when both are
        None), and send its running tasks back to PENDING without spending an attempt.
        Stored, so it holds across processes and restarts until :meth:`resume`.
        Returns how many running tasks were interrupted."""
        self._host.check_open()
        return await self._host.storage.suspend(self._scope(task_type, app_id))

    async def resume(self, task_type: str | None = None, *, app_id: str | None = None) -> bool:
        """Lift exactly the suspension ``suspend(task_type, app_id=...)`` stored.
        Returns whether there was one."""
        self._host.check_open()
        resumed = await self._host.storage.resume(self._scope(task_type, app_id))
        self._host.notify_workers()
        return resumed

    async def suspensions(self) -> list[SuspensionScope]:
        """The stored suspensions (for an app-bound client: those of its app)."""
        self._host.check_open()
        scopes = await self._host.storage.suspensions()
        if self._app_id is None:
            return scopes
        return [s for s in scopes if s.app_id == self._app_id]


class AppTasks(TaskOperations):
    """Task operations bound to one app: see :meth:`Taskmill.for_app`."""

    def __init__(self, host: TaskHost, app_id: str) -> None:
        if not app_id or not isinstance(app_id, str):
            raise InvalidTaskSpec("an app id is a non-empty string", field="app_id")
        check_key("app_id", app_id, APP_ID_MAX)
        super().__init__(host, app_id)

    def __repr__(self) -> str:
        return f"AppTasks(app_id={self._app_id!r}, url={self._host.url!r})"


def _check_input_key(pass_result: object) -> None:
    """Refuse to pass a canvas result in the reserved headers key (the handler would
    never see it)."""
    if pass_result == HEADERS_KEY:
        raise InvalidTaskSpec(
            f"params key {HEADERS_KEY!r} is reserved for the headers plugins store with a "
            "task: pass the result in another key",
            field="pass_result",
        )


def _cancel_reason(reason: object) -> CancelReason:
    try:
        return CancelReason(reason)
    except ValueError:
        choices = ", ".join(r.value for r in CancelReason)
        raise InvalidTaskSpec(
            f"reason must be a CancelReason ({choices}), not {reason!r}", field="reason"
        ) from None


new_task_from_values: Final[Callable[..., NewTask]] = slot_builder(NewTask)
"""``NewTask(*values)``: every field, positionally in the field order of ``NewTask``
(defaults included); it checks nothing, as ``NewTask`` itself does not. For
``Taskmill.new_task``, which builds one per task enqueued."""


def _fresh_ids(n: int) -> list[str]:
    """``n`` random (version 4) UUIDs as ``str(uuid.uuid4())`` gives them, from one
    ``os.urandom`` call instead of one per id (a system call each)."""
    pool = bytearray(os.urandom(16 * n))
    ids: list[str] = []
    for start in range(0, 16 * n, 16):
        pool[start + 6] = (pool[start + 6] & 0x0F) | 0x40  # version 4
        pool[start + 8] = (pool[start + 8] & 0x3F) | 0x80  # the RFC 4122 variant
        h = pool[start : start + 16].hex()
        ids.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return ids
