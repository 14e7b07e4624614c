"""The threads that run sync handlers: reused, never bounded.

A worker runs a sync handler on a thread so that its loop keeps claiming, renewing
leases and writing outcomes. Starting a thread per attempt is what it did first, and it
costs more than the thread: ``Thread.start()`` blocks its caller until the new thread
has run, and while other handler threads hold the GIL with pure-Python work that is a
GIL hand-over each way, up to ``sys.getswitchinterval()`` (5 ms) apiece, during which
the event loop stands still.

So threads are kept and reused, as ``Executors.newCachedThreadPool`` does in Java: a
call goes to an idle thread if there is one (a queue put, which does not block the
loop), and only otherwise to a new thread. The pool is not bounded, on purpose: a
handler that overruns its timeout keeps its thread (threads cannot be killed), and must
not hold up the next task by taking a pool thread with it. A thread idle for
:data:`IDLE_SECONDS` ends. All are daemon threads, so a hung handler cannot hold the
process open at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

IDLE_SECONDS = 30.0
"""How long a thread waits for another call before it ends."""

THREAD_NAME = "taskmill-handler"


class HandlerThreads:
    """Run calls on reused daemon threads, each call on a thread free at once."""

    def __init__(self, idle_seconds: float = IDLE_SECONDS) -> None:
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        # Threads waiting for a call, less the calls already queued for them: a call is
        # queued only when this is positive, so every queued call has a thread to take it.
        self._idle = 0

    def submit(self, call: Callable[[], None]) -> None:
        """Start ``call`` now, on an idle thread or a new one (it must not raise)."""
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                self._calls.put(call)
                return
        threading.Thread(target=self._serve, args=(call,), name=THREAD_NAME, daemon=True).start()

    @property
    def idle(self) -> int:
        """Threads waiting for a call now."""
        return self._idle

    def _serve(self, call: Callable[[], None]) -> None:
        while True:
            call()
            del call  # nothing of the finished call outlives it while this thread waits
            with self._lock:
                self._idle += 1
            try:
                call = self._calls.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    # A submit may have counted on this thread between the timeout and
                    # the lock: its call is in the queue, and this thread takes it.
                    try:
                        call = self._calls.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        return


THREADS = HandlerThreads()
"""The process's handler threads, shared by its workers."""


def run_in_thread(loop: asyncio.AbstractEventLoop, call: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run a sync handler on a handler thread (reused, never bounded: see
    :mod:`taskmill.handler_threads`), without blocking the loop."""
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def target() -> None:
        try:
            result, error = call(), None
        except BaseException as exc:  # handed to the awaiting coroutine
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    THREADS.submit(target)
    return future
