"""``AttemptHooks``: the plugin calls a worker makes about the attempts it runs.

:class:`~taskmill.plugins.Plugins` satisfies it. The worker's parts (execution, the
finish writer, the lease keeper) take this protocol rather than ``Plugins``, so none of
them imports a module that knows the worker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from taskmill.context import Context
    from taskmill.model import Task
    from taskmill.storage import Finish

T = TypeVar("T")


class AttemptHooks(Protocol):
    """What a worker's parts call of the plugins. Each ``observes_*`` or
    ``intercepts_*`` flag is False when no plugin implements the hooks behind it: the
    worker then skips the call (and the work of preparing it)."""

    @property
    def intercepts_handlers(self) -> bool:
        """A plugin implements ``taskmill_task_started`` or
        ``taskmill_handler_context``: handlers run through :meth:`run_handler`."""

    @property
    def observes_finishes(self) -> bool:
        """A plugin hears of finished, taken or rescued attempts."""

    @property
    def observes_detaches(self) -> bool:
        """A plugin implements ``taskmill_task_detached``."""

    async def run_handler(
        self, task: Task, ctx: Context, worker_id: str, call: Callable[[], Awaitable[T]]
    ) -> T:
        """Run one attempt's handler (``call``) inside the plugins' started hooks and
        handler contexts; returns or raises what ``call()`` does."""

    async def attempt_finished(self, finish: Finish, stored: Task) -> None:
        """The outcome ``finish`` was stored; ``stored`` is the task after it."""

    async def attempt_taken(
        self, claimed: Task, current: Task | None, started_at: datetime, ended_at: datetime
    ) -> None:
        """The attempt of ``claimed`` is no longer this worker's (cancelled, or its
        lease lost); ``current`` is the task now, None if it was deleted."""

    async def attempt_detached(self, claimed: Task, worker_id: str) -> None:
        """The handler handed its attempt over to another owner."""

    async def tasks_rescued(self, tasks: list[Task]) -> None:
        """The worker took ``tasks`` back from expired leases."""
