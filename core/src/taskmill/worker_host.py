"""``WorkerHost``: what a worker uses of the :class:`~taskmill.Taskmill` that built it.

The worker reaches its host through this protocol only, never through private methods,
so the seam between the two is typed and written down: the store and the handlers it
serves, the plugins it notifies, where a handler's children are enqueued, and the set
of running workers that in-process enqueues wake (and ``close()`` stops).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from taskmill.model import JSON, Task
    from taskmill.plugins import Plugins
    from taskmill.registry import HandlerRegistry
    from taskmill.storage import TaskStorage
    from taskmill.worker import Worker


class WorkerHost(Protocol):
    """The worker's view of its :class:`~taskmill.Taskmill` (which satisfies it)."""

    @property
    def storage(self) -> TaskStorage:
        """The store the worker claims from and writes outcomes to."""

    @property
    def registry(self) -> HandlerRegistry:
        """The handlers the worker serves (read at every claim: registrations made
        while it runs are served)."""

    @property
    def plugins(self) -> Plugins:
        """The plugins whose lifecycle hooks the worker calls and that wrap its
        handlers."""

    def attach_worker(self, worker: Worker) -> None:
        """``worker`` starts serving: in-process enqueues wake it, and closing the
        host stops it.

        :raises TaskmillError: the host is not open.
        """

    def detach_worker(self, worker: Worker) -> None:
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
