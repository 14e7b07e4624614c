"""How a test that runs past its timeout ends: it fails with a dump of where everything
was, and the run goes on to its summary; a test that even that cannot end stops the run.

A pytest plugin (loaded by ``tests/conftest.py``) on top of pytest-timeout, which keeps
its settings (``timeout`` in pyproject.toml, ``@pytest.mark.timeout(...)``,
``--timeout``):

- With ``timeout_method = "signal"`` (this workspace's setting) the timer is a SIGALRM
  whose handler raises ``pytest.fail`` in the main thread, wherever the test is blocked
  (a ``join()``, a ``select()`` under the event loop, a ``time.sleep``). The failure
  message holds the stack of every other thread and of every asyncio task of the
  running loop, down the chain of awaits; the main thread's stack is the failure's
  traceback. The test's teardown runs and the next test starts.
- A test blocked where that exception never arrives (a C call that does not return to
  Python, SIGALRM blocked, the exception swallowed by a task that is not the test's)
  would stall the run forever. So every test with a timeout also arms faulthandler's
  watchdog thread ``timeout_backstop`` seconds (ini option, default 120) after its
  timeout: if the test still runs then, every thread's stack is written to the
  terminal's stderr and the process exits with status 1, without a summary.

faulthandler has one watchdog per process: do not also set pytest's
``faulthandler_timeout``.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

BACKSTOP = "timeout_backstop"
_TERMINAL_STDERR = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        BACKSTOP,
        "seconds past a test's timeout after which, if the timeout could not fail the "
        "test, every thread's stack is dumped and the run exits (0 disables)",
        default="120",
    )


def pytest_configure(config: pytest.Config) -> None:
    # The terminal's stderr, kept before any test captures fd 2: the watchdog writes
    # there even while a test's output is being captured.
    config.stash[_TERMINAL_STDERR] = os.dup(sys.stderr.fileno())


def pytest_unconfigure(config: pytest.Config) -> None:
    faulthandler.cancel_dump_traceback_later()
    fd = config.stash.get(_TERMINAL_STDERR, None)
    if fd is not None:
        os.close(fd)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """Arm the backstop, and take the signal method over (returns True) so that the
    failure carries the stack dump."""
    backstop = float(item.config.getini(BACKSTOP))
    if backstop > 0:
        faulthandler.dump_traceback_later(
            settings.timeout + backstop, exit=True, file=item.config.stash[_TERMINAL_STDERR]
        )
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own timer

    def on_timeout(signum: int, frame: FrameType | None) -> None:
        __tracebackhide__ = True
        dump = "".join(_thread_stacks()) + "".join(_task_stacks())
        pytest.fail(
            f"Timeout: the test ran longer than {settings.timeout:g} s; the main thread's "
            f"stack is the traceback below.\n{dump}"
        )

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # pytest-timeout's cancel calls it
    signal.signal(signal.SIGALRM, on_timeout)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    faulthandler.cancel_dump_traceback_later()  # pytest-timeout's hook cancels the timer


def _thread_stacks() -> Iterator[str]:
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if ident != threading.get_ident():
            yield f"\n--- thread {names.get(ident, '?')} ({ident}) ---\n"
            yield "".join(traceback.format_stack(frame))


def _task_stacks() -> Iterator[str]:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # the test was not running the event loop
        return
    for task in asyncio.all_tasks(loop):
        yield f"\n--- asyncio task {task.get_name()} ---\n"
        frames = list(_awaiting_frames(task.get_coro()))
        summary = traceback.StackSummary.extract((f, f.f_lineno) for f in frames)
        yield "".join(summary.format()) or "(not started or already done)\n"


def _awaiting_frames(awaitable: object) -> Iterator[FrameType]:
    """The frames of a suspended coroutine and of what it awaits, outermost first."""
    while awaitable is not None:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
        if frame is None:
            return
        yield frame
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
