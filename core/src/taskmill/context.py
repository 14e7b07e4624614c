"""``Context``: what a running handler sees of its task and how it talks back."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from taskmill.errors import Cancelled, InvalidParams
from taskmill.model import JSON, CancelReason, Progress, Task
from taskmill.serialization import dumps, is_finite_number


class _Done:
    """An awaitable that is already complete: what ``progress``/``set_data`` return.

    Their writes are coalesced by the worker, so there is nothing to wait for. Being an
    awaitable keeps ``await ctx.progress(...)`` natural in async handlers, while a plain
    ``ctx.progress(...)`` call does the same from a threaded (sync) handler.
    """

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


_DONE = _Done()


class Context:
    """The running handler's view of its task.

    Safe to use from an ``async def`` handler and from a plain ``def`` handler running in
    a worker thread. Progress and data are kept here and persisted by the worker in
    coalesced writes (at most one per ``progress_interval`` per task, and always with
    the final outcome), so calling ``progress`` in a tight loop costs no I/O.
    """

    def __init__(self, task: Task, *, on_cancel: Callable[[], None] | None = None) -> None:
        self._task = task
        self._lock = threading.Lock()
        self._progress = task.progress
        self._data: dict[str, JSON] = dict(task.data)
        self._progress_dirty = False
        self._data_dirty = False
        self._cancel_reason: CancelReason | None = None
        self._timed_out = False
        self._on_cancel = on_cancel

    @property
    def task(self) -> Task:
        """The task as it was claimed (status RUNNING, this attempt counted)."""
        return self._task

    @property
    def cancelled(self) -> bool:
        """True once the task has been asked to stop (cancel, suspension, shutdown, or
        its handler's timeout passed)."""
        return self._cancel_reason is not None or self._timed_out

    @property
    def cancel_reason(self) -> CancelReason | None:
        """Why the task was asked to stop, or None."""
        return self._cancel_reason

    def check_cancelled(self) -> None:
        """Raise :class:`~taskmill.Cancelled` if the task has been asked to stop.

        Let it propagate: the worker then records the attempt as cancelled (USER,
        PREEMPTED) or puts the task back without spending the attempt (SUSPENDED,
        SHUTDOWN).
        """
        reason = self._cancel_reason
        if reason is not None:
            raise Cancelled(f"task {self._task.id} was cancelled ({reason.value})")
        if self._timed_out:
            raise Cancelled(f"task {self._task.id} ran past its timeout")

    def progress(
        self, done: float, total: float | None = None, message: str | None = None
    ) -> Awaitable[None]:
        """Report progress: ``done`` of ``total`` units, with an optional message.

        ``total`` None keeps the previous total. Persisted (coalesced) and emitted as an
        event; the last value reported is always stored with the task's outcome.

        :raises ValueError: ``done`` or ``total`` is not a finite number, or total <= 0.
        """
        if not isinstance(done, int | float) or not is_finite_number(done):
            raise ValueError(f"progress done must be a finite number, got {done!r}")
        with self._lock:
            if total is None:
                total = self._progress.total
            elif not isinstance(total, int | float) or not is_finite_number(total) or (
                total <= 0
            ):
                raise ValueError(f"progress total must be a number > 0, got {total!r}")
            self._progress = Progress(done=done, total=total, message=message)
            self._progress_dirty = True
        return _DONE

    def set_data(self, **values: JSON) -> Awaitable[None]:
        """Merge ``values`` into the task's runtime ``data`` (persisted like progress).

        :raises InvalidParams: a value is not JSON-serializable.
        """
        try:
            dumps(values)
        except (TypeError, ValueError) as exc:
            raise InvalidParams(f"task data must be JSON-serializable: {exc}") from None
        with self._lock:
            self._data.update(values)
            self._data_dirty = True
        return _DONE

    # -- used by the worker -------------------------------------------------------

    def _interrupt(self, reason: CancelReason) -> None:
        """Ask the handler to stop. The first reason wins."""
        if self._cancel_reason is None:
            self._cancel_reason = reason
            if self._on_cancel is not None:
                self._on_cancel()

    def _expire(self) -> None:
        """The handler ran past its timeout (a sync handler's thread keeps running)."""
        self._timed_out = True

    def _take_changes(self) -> tuple[Progress | None, dict[str, JSON] | None]:
        """What changed since the last call (for a coalesced write)."""
        with self._lock:
            progress = self._progress if self._progress_dirty else None
            data = dict(self._data) if self._data_dirty else None
            self._progress_dirty = self._data_dirty = False
        return progress, data

    def _final_state(self) -> tuple[Progress | None, dict[str, JSON] | None]:
        """Everything the handler changed over the attempt (for the finish write)."""
        with self._lock:
            progress = self._progress if self._progress != self._task.progress else None
            data = dict(self._data) if self._data != self._task.data else None
        return progress, data
