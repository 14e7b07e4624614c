"""The host interfaces: what the core's parts use of the objects that own them.

A part of taskmill that needs something of the object that built it (the task
operations of their ``Taskmill``, a scheduler or a worker of theirs, a worker of a
handler's context) takes one of these protocols instead of that object's class, and
uses only what the protocol declares, all of it public and documented. So no part
calls another's private methods, and no part imports the module of its owner: this
module imports only the model, the storage contract, the registry and
:mod:`taskmill.attempt_hooks` (none of which import their users), so the core's import
graph has no cycle (``tests/test_import_graph.py`` checks it, type-only imports
included).

:class:`~taskmill.Taskmill` satisfies :class:`TaskHost`, :class:`ScheduleHost`,
:class:`WorkerHost` and :class:`ServingHost`; :class:`~taskmill.plugins.Plugins`
satisfies :class:`TaskHooks` and :class:`WorkerHooks`; :class:`~taskmill.Worker`
satisfies :class:`AttachedWorker`; the control ``Context.with_control`` returns
satisfies :class:`HandlerControl`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from taskmill.attempt_hooks import AttemptHooks

if TYPE_CHECKING:
    from taskmill.model import JSON, CancelReason, Progress, Task, TaskSpec
    from taskmill.registry import HandlerRegistry
    from taskmill.storage import NewTask, TaskStorage

__all__ = [
    "AttachedWorker",
    "HandlerControl",
    "ScheduleHost",
    "ServingHost",
    "TaskHooks",
    "TaskHost",
    "WorkerHooks",
    "WorkerHost",
]

ScheduleT_co = TypeVar("ScheduleT_co", covariant=True)
"""The type of a host's schedules (:class:`taskmill.periodic.Schedule`; a parameter
only because this module may not import :mod:`taskmill.periodic`, which uses it)."""


# -- task operations ----------------------------------------------------------------


class TaskHooks(Protocol):
    """The plugin calls the task operations make. Each ``observes_*`` flag is False
    when no plugin implements the hooks behind it: the call is then skipped."""

    @property
    def provides_headers(self) -> bool:
        """A plugin implements ``taskmill_task_headers``."""

    @property
    def observes_enqueues(self) -> bool:
        """A plugin implements ``taskmill_task_enqueued``."""

    @property
    def observes_cancels(self) -> bool:
        """A plugin implements ``taskmill_task_cancelled``."""

    def task_headers(self, spec: TaskSpec, task_id: str) -> dict[str, str]:
        """The headers the plugins give the task ``spec`` describes, to store under
        :data:`~taskmill.headers.HEADERS_KEY` (``taskmill_task_headers``)."""

    async def tasks_enqueued(self, tasks: list[Task]) -> None:
        """``tasks`` were stored by an enqueue of this process."""

    async def tasks_cancelled(self, tasks: list[Task]) -> None:
        """A cancel of this process changed ``tasks`` (those now CANCELLED are
        announced)."""


class TaskHost(Protocol):
    """What :class:`~taskmill.operations.TaskOperations` use of the ``Taskmill`` they
    belong to (the ``Taskmill`` itself, or the one ``for_app`` was called on)."""

    @property
    def url(self) -> str:
        """The store's URL, for messages."""

    @property
    def storage(self) -> TaskStorage:
        """The store the operations read and write."""

    @property
    def plugins(self) -> TaskHooks:
        """The plugins told of enqueued and cancelled tasks."""

    def check_open(self) -> None:
        """Refuse to work on a host that is not open.

        :raises TaskmillError: the host is not open.
        """

    def new_task(self, spec: TaskSpec, task_id: str | None = None) -> NewTask:
        """The task ``spec`` describes, checked against the host's limits and handlers,
        as ``enqueue`` stores it; nothing is stored.

        :raises InvalidParams: the params are not a JSON object or are too large.
        :raises InvalidTaskSpec: a field is out of range or the fields disagree.
        :raises UnknownTaskType: the host is strict about task types and serves none
            of this one.
        """

    def notify_workers(self) -> None:
        """Wake the host's running workers in this process: work may be due now."""

    async def with_published_options(self, specs: list[TaskSpec]) -> list[TaskSpec]:
        """``specs``, each without ``max_retries`` and without a handler in this process
        given the ``max_retries`` that the live workers serving its type publish in the
        worker registry (docs/workers.md); the others unchanged."""


# -- periodic tasks -----------------------------------------------------------------


class ScheduleHost(Protocol[ScheduleT_co]):
    """What a :class:`~taskmill.periodic.Scheduler` uses of its ``Taskmill``:
    ``ScheduleHost[Schedule]``."""

    @property
    def storage(self) -> TaskStorage:
        """The store the fires are enqueued into."""

    @property
    def schedules(self) -> Iterable[ScheduleT_co]:
        """The schedules to fire, read at every pass (schedules added meanwhile are
        fired)."""

    def new_task(self, spec: TaskSpec, task_id: str | None = None) -> NewTask:
        """The task ``spec`` describes, checked as :meth:`TaskHost.new_task` does."""


# -- workers ------------------------------------------------------------------------


class AttachedWorker(Protocol):
    """What a host does with a worker serving it: wake it, stop it when the host
    closes, and see whether it is busy."""

    @property
    def running(self) -> int:
        """Handlers running now."""

    def notify(self) -> None:
        """New work may be available (an enqueue in this process)."""

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking tasks and return once the worker has shut down."""


class WorkerHooks(AttemptHooks, Protocol):
    """What a worker calls of the plugins: its parts' :class:`AttemptHooks`, and its
    own start and stop."""

    @property
    def observes_workers(self) -> bool:
        """A plugin implements ``taskmill_worker_started`` or
        ``taskmill_worker_stopped``."""

    async def worker_started(self, worker: object) -> None:
        """``worker`` (the :class:`~taskmill.Worker`) started serving."""

    async def worker_stopped(self, worker: object) -> None:
        """``worker`` stopped serving."""


class WorkerHost(Protocol):
    """What a :class:`~taskmill.Worker` uses of the ``Taskmill`` that built it: the
    store and the handlers it serves, the plugins it notifies, where a handler's
    children are enqueued, and the set of running workers that in-process enqueues
    wake (and ``close()`` stops)."""

    @property
    def storage(self) -> TaskStorage:
        """The store the worker claims from and writes outcomes to."""

    @property
    def registry(self) -> HandlerRegistry:
        """The handlers the worker serves (read at every claim: registrations made
        while it runs are served)."""

    @property
    def plugins(self) -> WorkerHooks:
        """The plugins whose lifecycle hooks the worker calls and that wrap its
        handlers."""

    def attach_worker(self, worker: AttachedWorker) -> None:
        """``worker`` starts serving: in-process enqueues wake it, and closing the
        host stops it.

        :raises TaskmillError: the host is not open.
        """

    def detach_worker(self, worker: AttachedWorker) -> None:
        """``worker`` stopped serving (undoes :meth:`attach_worker`; idempotent)."""

    async def spawn_child(
        self,
        parent: Task,
        task_type: str,
        params: dict[str, JSON] | None,
        options: dict[str, Any],
    ) -> Task:
        """Enqueue a child of the running task ``parent`` (``ctx.spawn``): ``options``
        are ``enqueue``'s; ``parent_id`` is ``parent``'s, and ``app_id`` defaults to it.

        :raises InvalidTaskSpec: ``options`` names another parent.
        """


class ServingHost(WorkerHost, ScheduleHost[ScheduleT_co], Protocol[ScheduleT_co]):
    """What a :class:`~taskmill.Worker` is built for: a :class:`WorkerHost` whose
    schedules its scheduler loop fires (``ServingHost[Schedule]``)."""


# -- the handler context ----------------------------------------------------------------


class HandlerControl(Protocol):
    """The worker's side of a running handler's :class:`~taskmill.Context`: stop it,
    and read back what it reported. A handler never sees this."""

    def interrupt(self, reason: CancelReason) -> None:
        """Ask the handler to stop (``ctx.cancelled`` turns true, an async handler's
        task is cancelled). The first reason wins."""

    def expire(self) -> None:
        """The handler ran past its timeout: ``ctx.cancelled`` turns true (a sync
        handler's thread cannot be killed, and keeps running)."""

    def on_cancel(self, call: Callable[[], None]) -> None:
        """Have :meth:`interrupt` call ``call`` (an async handler's task is known only
        once its context exists)."""

    def take_changes(self) -> tuple[Progress | None, dict[str, JSON] | None]:
        """The progress and data the handler reported since the last call (None when
        unchanged), for a coalesced write."""

    def final_state(self) -> tuple[Progress | None, dict[str, JSON] | None]:
        """Everything the handler reported over the attempt (None when it reported
        nothing), for the finish write."""
