"""``Context``: what a running handler sees of its task and how it talks back.

What one attempt's handler reported, and whether it was asked to stop, is held by an
:class:`AttemptControl` that the handler's :class:`Context` writes through its public
methods. The worker gets that control with the context (:meth:`Context.with_control`)
and uses it as a :class:`~taskmill.hosts.HandlerControl`: it interrupts the handler,
times it out, and reads back its reports. Neither touches the other's private state.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Generic, TypeAlias, TypeVar

from taskmill.errors import Cancelled, InvalidParams, TaskmillError
from taskmill.model import JSON, CancelReason, Progress, Task
from taskmill.serialization import dumps, is_finite_number
from taskmill.validation import PROGRESS_MESSAGE_MAX, check_key, is_text

T = TypeVar("T")
Spawner: TypeAlias = Callable[
    [Task, str, "dict[str, JSON] | None", dict[str, Any]], Coroutine[Any, Any, Task]
]


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


class Deferred(Generic[T]):
    """The result of :meth:`Context.spawn`: await it in an async handler, or call
    :meth:`result` in a threaded one (where the work has already been done)."""

    __slots__ = ("_coroutine", "_value")

    def __init__(
        self, *, coroutine: Coroutine[Any, Any, T] | None = None, value: T | None = None
    ) -> None:
        self._coroutine = coroutine
        self._value = value

    def __await__(self) -> Generator[Any, None, T]:
        if self._coroutine is not None:
            return self._coroutine.__await__()
        return self._ready().__await__()

    async def _ready(self) -> T:
        return self.result()

    def result(self) -> T:
        """The value, in a threaded handler.

        :raises TaskmillError: called in an async handler (await it instead).
        """
        if self._coroutine is not None:
            self._coroutine.close()
            raise TaskmillError("in an async handler, await ctx.spawn(...) instead")
        assert self._value is not None
        return self._value


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class AttemptControl:
    """The state one attempt's handler shares with its worker: the progress and data it
    reported, and whether it was asked to stop.

    Its :class:`Context` reports through :meth:`report_progress` and :meth:`merge_data`
    and reads :attr:`cancel_reason` and :attr:`timed_out`; the worker uses the rest
    (:class:`~taskmill.hosts.HandlerControl`). Safe across threads: a plain ``def``
    handler reports from its own thread.
    """

    __slots__ = (
        "_cancel_reason",
        "_data",
        "_data_chars",
        "_data_dirty",
        "_lock",
        "_max_data_bytes",
        "_on_cancel",
        "_progress",
        "_progress_dirty",
        "_timed_out",
        "_touched",
    )

    def __init__(
        self,
        task: Task,
        *,
        on_cancel: Callable[[], None] | None = None,
        max_data_bytes: int | None = None,
    ) -> None:
        self._max_data_bytes = max_data_bytes
        self._data_chars = 0 if max_data_bytes is None or not task.data else len(dumps(task.data))
        self._lock = threading.Lock()
        self._progress = task.progress
        self._data: dict[str, JSON] = dict(task.data)
        self._progress_dirty = False
        self._data_dirty = False
        self._touched = False  # progress or data reported at all during this attempt
        self._cancel_reason: CancelReason | None = None
        self._timed_out = False
        self._on_cancel = on_cancel

    # -- the handler's side (through its Context) ------------------------------------

    @property
    def cancel_reason(self) -> CancelReason | None:
        """Why the handler was asked to stop, or None."""
        return self._cancel_reason

    @property
    def timed_out(self) -> bool:
        """True once the handler ran past its timeout."""
        return self._timed_out

    def report_progress(self, done: float, total: float | None, message: str | None) -> None:
        """Record progress (checked by the caller): ``total`` None keeps the previous
        total.

        :raises ValueError: ``total`` is not a finite number > 0.
        """
        with self._lock:
            if total is None:
                total = self._progress.total
            elif not isinstance(total, int | float) or not is_finite_number(total) or (total <= 0):
                raise ValueError(f"progress total must be a number > 0, got {total!r}")
            self._progress = Progress(done=done, total=total, message=message)
            self._progress_dirty = self._touched = True

    def merge_data(self, values: dict[str, JSON], text: str) -> None:
        """Merge ``values`` (``text`` is their JSON) into the runtime data.

        :raises InvalidParams: the data would grow past ``max_data_bytes`` as JSON.
        """
        with self._lock:
            limit = self._max_data_bytes
            # An upper bound of the merged data's JSON length, in characters: the exact
            # size is computed only when four bytes a character could pass the limit.
            bound = self._data_chars + len(text)
            if limit is not None and bound * 4 > limit:
                merged = dumps({**self._data, **values})
                size = len(merged.encode())
                bound = len(merged)
                if size > limit:
                    raise InvalidParams(
                        f"task data would be {size} bytes as JSON, over the {limit} bytes"
                        " the store keeps in one value; keep large data elsewhere and store"
                        " a reference",
                        field="data",
                    )
            self._data_chars = bound
            self._data.update(values)
            self._data_dirty = self._touched = True

    # -- the worker's side (taskmill.hosts.HandlerControl) -----------------------------

    def on_cancel(self, call: Callable[[], None]) -> None:
        """Have :meth:`interrupt` call ``call`` (an async handler's task is known only
        once its context exists)."""
        self._on_cancel = call

    def interrupt(self, reason: CancelReason) -> None:
        """Ask the handler to stop. The first reason wins."""
        if self._cancel_reason is None:
            self._cancel_reason = reason
            if self._on_cancel is not None:
                self._on_cancel()

    def expire(self) -> None:
        """The handler ran past its timeout (a sync handler's thread keeps running)."""
        self._timed_out = True

    def take_changes(self) -> tuple[Progress | None, dict[str, JSON] | None]:
        """What the handler changed since the last call (for a coalesced write)."""
        with self._lock:
            progress = self._progress if self._progress_dirty else None
            data = dict(self._data) if self._data_dirty else None
            self._progress_dirty = self._data_dirty = False
        return progress, data

    def final_state(self) -> tuple[Progress | None, dict[str, JSON] | None]:
        """Everything the handler changed over the attempt (for the finish write)."""
        if not self._touched:  # most handlers report nothing: skip the lock and compare
            return None, None
        # Everything reported, not just what differs from the claimed snapshot: a
        # coalesced write may have stored an intermediate value meanwhile.
        with self._lock:
            progress = self._progress
            data = dict(self._data)
        return progress, data


class Context:
    """The running handler's view of its task.

    Safe to use from an ``async def`` handler and from a plain ``def`` handler running in
    a worker thread. Progress and data are kept here and persisted by the worker in
    coalesced writes (at most one per ``progress_interval`` per task, and always with
    the final outcome), so calling ``progress`` in a tight loop costs no I/O.
    """

    def __init__(
        self,
        task: Task,
        *,
        on_cancel: Callable[[], None] | None = None,
        spawner: Spawner | None = None,
        max_data_bytes: int | None = None,
    ) -> None:
        self._task = task
        self._spawner = spawner
        self._control = AttemptControl(task, on_cancel=on_cancel, max_data_bytes=max_data_bytes)
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    @classmethod
    def with_control(
        cls, task: Task, *, spawner: Spawner | None = None, max_data_bytes: int | None = None
    ) -> tuple[Context, AttemptControl]:
        """A context for a handler a worker runs, and the worker's control of it (see
        :class:`~taskmill.hosts.HandlerControl`). A handler never needs this."""
        ctx = cls(task, spawner=spawner, max_data_bytes=max_data_bytes)
        return ctx, ctx._control

    @property
    def task(self) -> Task:
        """The task as it was claimed (status RUNNING, this attempt counted)."""
        return self._task

    @property
    def cancelled(self) -> bool:
        """True once the task has been asked to stop (cancel, suspension, shutdown, or
        its handler's timeout passed)."""
        control = self._control
        return control.cancel_reason is not None or control.timed_out

    @property
    def cancel_reason(self) -> CancelReason | None:
        """Why the task was asked to stop, or None."""
        return self._control.cancel_reason

    def check_cancelled(self) -> None:
        """Raise :class:`~taskmill.Cancelled` if the task has been asked to stop.

        Let it propagate: the worker then records the attempt as cancelled (USER,
        PREEMPTED) or puts the task back without spending the attempt (SUSPENDED,
        SHUTDOWN).
        """
        reason = self._control.cancel_reason
        if reason is not None:
            raise Cancelled(f"task {self._task.id} was cancelled ({reason.value})")
        if self._control.timed_out:
            raise Cancelled(f"task {self._task.id} ran past its timeout")

    def progress(
        self, done: float, total: float | None = None, message: str | None = None
    ) -> Awaitable[None]:
        """Report progress: ``done`` of ``total`` units, with an optional message.

        ``total`` None keeps the previous total. Persisted (coalesced) and emitted as an
        event; the last value reported is always stored with the task's outcome.

        :raises ValueError: ``done`` or ``total`` is not a finite number, or total <= 0.
        :raises InvalidTaskSpec: ``message`` is not text every store keeps (at most
            4,096 characters, no NUL or lone surrogate).
        """
        if not isinstance(done, int | float) or not is_finite_number(done):
            raise ValueError(f"progress done must be a finite number, got {done!r}")
        if message is not None:
            check_key("progress message", message, PROGRESS_MESSAGE_MAX)
        self._control.report_progress(done, total, message)
        return _DONE

    def set_data(self, **values: JSON) -> Awaitable[None]:
        """Merge ``values`` into the task's runtime ``data`` (persisted like progress).

        :raises InvalidParams: a value is not JSON-serializable, holds a lone surrogate,
            or the data would grow past what the store keeps in one value
            (``max_value_bytes``, docs/semantics.md "Limits").
        """
        try:
            text = dumps(values)
        except (TypeError, ValueError) as exc:
            raise InvalidParams(
                f"task data must be JSON-serializable: {exc}", field="data"
            ) from None
        if not text.isascii() and not is_text(text):
            raise InvalidParams(
                "task data must be valid Unicode text: a string in it holds a lone surrogate"
                " (often bytes decoded with errors='surrogateescape'); decode it properly",
                field="data",
            )
        self._control.merge_data(values, text)
        return _DONE

    def spawn(
        self, task_type: str, params: dict[str, JSON] | None = None, **enqueue_options: Any
    ) -> Deferred[Task]:
        """Enqueue a child of this task (``parent_id`` set; ``app_id`` defaults to this
        task's). Takes :meth:`Taskmill.enqueue`'s options.

        In an ``async def`` handler: ``child = await ctx.spawn(...)``. In a plain
        ``def`` handler (a worker thread): ``child = ctx.spawn(...).result()``, which
        blocks until the child is stored.
        """
        spawner = self._spawner
        if spawner is None:
            raise TaskmillError("ctx.spawn works only inside a handler run by a worker")
        coroutine = spawner(self._task, task_type, params, enqueue_options)
        loop = self._loop
        if loop is not None and not _on_loop_thread(loop):
            return Deferred(value=asyncio.run_coroutine_threadsafe(coroutine, loop).result())
        return Deferred(coroutine=coroutine)
