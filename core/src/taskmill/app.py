"""``Taskmill``: the application's entry point — handlers, task operations, workers."""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

from taskmill.discovery import resolve_url, storage_for_url
from taskmill.errors import InvalidTaskSpec, TaskmillError, TaskNotFound, WaitTimeout
from taskmill.model import (
    Attempt,
    Priority,
    ProgressSummary,
    Task,
    TaskFilter,
    TaskSpec,
    TaskStatus,
)
from taskmill.registry import Handler, HandlerFunc, HandlerRegistry
from taskmill.serialization import encode_params
from taskmill.storage import Finish, NewTask, TaskStorage, utcnow
from taskmill.worker import Worker

F = TypeVar("F", bound=HandlerFunc)

DEFAULT_MAX_RETRIES = 3
DEFAULT_MAX_PARAMS_BYTES = 1024 * 1024


class Taskmill:
    """Durable background tasks on the storage ``url`` names.

    ``url`` None means ``$TASKMILL_URL``, else ``sqlite:///taskmill.db``. Use it as
    ``async with Taskmill(...) as tm:`` or call :meth:`open` / :meth:`close`.

    :param max_params_bytes: largest accepted params, as JSON (default 1 MiB).
    :param default_max_retries: retries for tasks whose handler and enqueue call do not
        say (default 3).
    :param auto_migrate: migrate an older schema on open instead of refusing.
    :param storage_options: passed to the backend (see docs/backends.md).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        plugins: bool = True,
        max_params_bytes: int = DEFAULT_MAX_PARAMS_BYTES,
        default_max_retries: int = DEFAULT_MAX_RETRIES,
        auto_migrate: bool = False,
        **storage_options: Any,
    ) -> None:
        self.url = resolve_url(url)
        self.storage: TaskStorage = storage_for_url(self.url, **storage_options)
        self.registry = HandlerRegistry()
        self.max_params_bytes = max_params_bytes
        self.default_max_retries = default_max_retries
        self.auto_migrate = auto_migrate
        self.load_plugins = plugins
        self._opened = False
        self._workers: weakref.WeakSet[Worker] = weakref.WeakSet()

    # -- lifecycle ---------------------------------------------------------------------

    async def open(self) -> Taskmill:
        """Connect to the storage (creating the schema of an empty database).

        :raises SchemaVersionError: the database needs ``taskmill migrate``.
        :raises StorageUnavailable: the database cannot be reached.
        """
        if not self._opened:
            await self.storage.open(auto_migrate=self.auto_migrate)
            self._opened = True
        return self

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

    def _check_open(self) -> None:
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
    ) -> Callable[[F], F]:
        """Decorator: register the function as the handler of ``task_type``.

        The handler is ``async def`` or plain ``def`` (run in a worker thread), takes
        ``(ctx, params)`` and returns a JSON value or None.
        """

        def decorate(func: F) -> F:
            self.register(
                task_type,
                func,
                app_id=app_id,
                max_retries=max_retries,
                timeout=timeout,
                concurrency=concurrency,
            )
            return func

        return decorate

    def register(
        self,
        task_type: str,
        handler: HandlerFunc,
        *,
        app_id: str | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        concurrency: int | None = None,
    ) -> Handler:
        """Register ``handler`` for ``(app_id, task_type)``; see :meth:`handler`.

        :raises HandlerConflict: the key already has a handler.
        """
        return self.registry.register(
            task_type,
            handler,
            app_id=app_id,
            max_retries=max_retries,
            timeout=timeout,
            concurrency=concurrency,
        )

    # -- enqueueing --------------------------------------------------------------------

    def _new_task(self, spec: TaskSpec) -> NewTask:
        params = {} if spec.params is None else spec.params
        params_json = encode_params(params, max_bytes=self.max_params_bytes)
        if spec.run_at is not None and spec.delay is not None:
            raise InvalidTaskSpec("give run_at or delay, not both")
        run_at = spec.run_at
        if spec.delay is not None:
            delay = (
                spec.delay if isinstance(spec.delay, timedelta) else timedelta(seconds=spec.delay)
            )
            run_at = utcnow() + delay
        max_retries = spec.max_retries
        if max_retries is None:
            handler = self.registry.lookup(spec.app_id, spec.task_type)
            max_retries = handler.max_retries if handler is not None else None
        if max_retries is None:
            max_retries = self.default_max_retries
        if max_retries < 0:
            raise InvalidTaskSpec(f"max_retries must be >= 0, got {max_retries}")
        if not isinstance(spec.priority, int):
            raise InvalidTaskSpec(f"priority must be an int, got {spec.priority!r}")
        if not spec.task_type or not isinstance(spec.task_type, str):
            raise InvalidTaskSpec("task_type must be a non-empty string")
        return NewTask(
            id=str(uuid.uuid4()),
            task_type=spec.task_type,
            params=params,
            params_json=params_json,
            app_id=spec.app_id,
            priority=int(spec.priority),
            max_retries=max_retries,
            run_at=run_at,
            dedupe_key=spec.dedupe_key,
            parent_id=spec.parent_id,
            user_id=spec.user_id,
        )

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
    ) -> Task:
        """Store a new task and return its snapshot.

        With a ``dedupe_key`` held by an active task of the same ``(app_id, task_type)``
        the new task is an alias of it (``alias_of``) and takes its outcome.

        :raises InvalidParams: params is not a JSON object or is too large.
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
            )
        except ValueError as exc:
            raise InvalidTaskSpec(str(exc)) from None
        (task,) = await self._enqueue_specs([spec])
        return task

    async def enqueue_many(self, specs: Iterable[TaskSpec | Mapping[str, Any]]) -> list[Task]:
        """Store many tasks in one storage call (all or none).

        A spec is a :class:`TaskSpec` or a dict of :meth:`enqueue`'s arguments.

        :raises InvalidParams: any spec's params is invalid; nothing is stored then.
        """
        return await self._enqueue_specs([TaskSpec.from_value(s) for s in specs])

    async def _enqueue_specs(self, specs: list[TaskSpec]) -> list[Task]:
        self._check_open()
        if not specs:
            return []
        new_tasks = [self._new_task(spec) for spec in specs]
        tasks = await self.storage.enqueue(new_tasks)
        for worker in self._workers:
            worker.notify()
        return tasks

    # -- reading and managing ----------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        """The task's current snapshot, or None."""
        self._check_open()
        return await self.storage.get(task_id)

    async def query(
        self,
        filter: TaskFilter | None = None,
        *,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = False,
    ) -> list[Task]:
        """Tasks matching ``filter``, oldest first (or newest first)."""
        self._check_open()
        return await self.storage.query(
            filter or TaskFilter(), limit=limit, offset=offset, newest_first=newest_first
        )

    async def wait(self, task_id: str, *, timeout: float | None = None) -> Task:
        """Return the task once it is COMPLETED, FAILED or CANCELLED.

        :raises TaskNotFound: no such task.
        :raises WaitTimeout: still active after ``timeout`` seconds.
        """
        self._check_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.005
        while True:
            task = await self.storage.get(task_id)
            if task is None:
                raise TaskNotFound(f"no task {task_id}")
            if task.status.terminal:
                return task
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"task {task_id} is still {task.status.value} after {timeout} s")
            pause = delay if deadline is None else min(delay, deadline - time.monotonic())
            await asyncio.sleep(max(0.0, pause))
            delay = min(0.25, delay * 1.5)

    async def retry(self, task_id: str) -> Task:
        """Put a FAILED or CANCELLED task back to PENDING with a fresh attempt budget.

        :raises TaskNotFound: no such task.
        :raises InvalidTransition: the task is not FAILED or CANCELLED.
        """
        self._check_open()
        task = await self.storage.retry(task_id)
        for worker in self._workers:
            worker.notify()
        return task

    async def attempts(self, task_id: str) -> list[Attempt]:
        """The task's execution log, one row per attempt, oldest first."""
        self._check_open()
        return await self.storage.attempts(task_id)

    async def progress_summary(self, filter: TaskFilter | None = None) -> ProgressSummary:
        """Counts by status (and the share finished) of the tasks ``filter`` selects."""
        self._check_open()
        return await self.storage.summary(filter or TaskFilter())

    async def cleanup(self, older_than: timedelta, *, include_failed: bool = False) -> int:
        """Delete COMPLETED and CANCELLED tasks (and FAILED ones with
        ``include_failed``) that finished more than ``older_than`` ago, with their
        execution logs. Returns how many were deleted."""
        self._check_open()
        statuses = {TaskStatus.COMPLETED, TaskStatus.CANCELLED}
        if include_failed:
            statuses.add(TaskStatus.FAILED)
        return await self.storage.cleanup(older_than, statuses=frozenset(statuses))

    # -- workers -----------------------------------------------------------------------

    def worker(self, **options: Any) -> Worker:
        """A :class:`~taskmill.worker.Worker` for this object's handlers and storage.

        Options: ``concurrency`` (10), ``reserved_high_priority_slots`` (1),
        ``worker_id``, ``lease_seconds`` (30), ``poll_interval`` (1.0),
        ``shutdown_grace`` (30), ``retry_policy``, ``handle_signals`` (True),
        ``idle_horizon`` (60), ``progress_interval`` (0.5), ``rescue_interval``.
        """
        return Worker(self, **options)

    async def run_worker(self, *, until_idle: bool = False, **options: Any) -> Worker:
        """Build a worker and run it (until idle, or until stopped); returns it."""
        self._check_open()
        worker = self.worker(**options)
        if until_idle:
            await worker.run_until_idle()
        else:
            await worker.run()
        return worker

    # -- seams used by the worker ------------------------------------------------------

    def _attach_worker(self, worker: Worker) -> None:
        self._check_open()
        self._workers.add(worker)

    def _detach_worker(self, worker: Worker) -> None:
        self._workers.discard(worker)

    async def _worker_started(self, worker: Worker) -> None:
        return None

    async def _worker_stopped(self, worker: Worker) -> None:
        return None

    async def _before_handler(self, task: Task, ctx: Any) -> None:
        return None

    async def _after_finish(
        self, finish: Finish, stored: Task | None, claimed: Task | None
    ) -> None:
        return None
