"""SIGTERM and SIGINT for the workers of one event loop, and the second signal's exit.

A first signal stops a worker gracefully; a second one cuts the grace period short and,
whatever the worker is doing, ends the process about a second later
(:func:`exit_after_second_signal`). A host process that installed its own handlers keeps
them (:class:`SignalRouter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import ClassVar

log = logging.getLogger("taskmill.worker")

FORCED_EXIT_AFTER = 1.0
"""Seconds between a second signal and the end of the process."""

SignalDelivery = Callable[[signal.Signals], None]
"""What a worker does on a signal."""


def signal_is_free(handler: object) -> bool:
    """Whether a signal whose Python-level handler is ``handler`` belongs to nobody."""
    if handler in (signal.SIG_DFL, signal.default_int_handler):
        return True
    # asyncio.run()'s SIGINT handler (a bound Runner.on_sigint in a partial) is the
    # default Ctrl-C behaviour of a plain asyncio program, not a host's choice.
    owner = getattr(getattr(handler, "func", None), "__self__", None)
    return isinstance(owner, asyncio.Runner)


class SignalRouter:
    """SIGTERM and SIGINT for every worker running on one event loop.

    The first worker to start on a loop takes each signal that is free (its handler is
    the default, or ``asyncio.run()``'s own Ctrl-C handler); a host that installed its
    own handler (uvicorn, Django, ``loop.add_signal_handler``) keeps it and stops the
    workers from its own shutdown path. A signal then reaches every worker of the loop,
    so one Ctrl-C stops two workers run side by side. When the last worker leaves, the
    handlers found at the start are put back.
    """

    _by_loop: ClassVar[dict[asyncio.AbstractEventLoop, SignalRouter]] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.workers: list[SignalDelivery] = []
        self.previous: dict[signal.Signals, object] = {}

    @classmethod
    def join(cls, loop: asyncio.AbstractEventLoop, deliver: SignalDelivery) -> Callable[[], None]:
        """Have the signals of ``loop`` call ``deliver`` (one worker's reaction);
        returns what undoes it."""
        router = cls._by_loop.get(loop)
        if router is None:
            router = cls._by_loop[loop] = cls(loop)
            router._install()
        router.workers.append(deliver)
        return functools.partial(router._leave, deliver)

    def _install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            if previous == signal.SIG_IGN:
                # A non-interactive shell starts a background job (`taskmill worker &`)
                # with SIGINT ignored; the worker leaves it so, but says so once.
                log.warning(
                    "%s is ignored in this process (inherited from whatever started it, "
                    "as a shell does for a background job): it will not stop the worker; "
                    "stop it with %s",
                    sig.name,
                    "SIGTERM" if sig is signal.SIGINT else "SIGINT",
                )
                continue
            if not signal_is_free(previous):
                log.debug("%s is handled by the host process; not taking it", sig.name)
                continue
            try:
                self.loop.add_signal_handler(sig, self._deliver, sig)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix
                continue
            self.previous[sig] = previous

    def _deliver(self, sig: signal.Signals) -> None:
        for deliver in list(self.workers):
            deliver(sig)

    def _leave(self, deliver: SignalDelivery) -> None:
        with contextlib.suppress(ValueError):
            self.workers.remove(deliver)
        if self.workers:
            return
        del self._by_loop[self.loop]
        for sig, previous in self.previous.items():
            self.loop.remove_signal_handler(sig)
            with contextlib.suppress(TypeError, ValueError, OSError):
                signal.signal(sig, previous)  # type: ignore[arg-type]


def exit_after_second_signal(worker_id: str, sig: signal.Signals) -> threading.Timer:
    """Start the timer that ends the process :data:`FORCED_EXIT_AFTER` seconds from
    now, whatever the worker is doing (a store that does not answer, a stuck handler);
    what it held is rescued once its leases expire. Cancel the timer to call it off."""
    timer = threading.Timer(FORCED_EXIT_AFTER, _exit_now, (worker_id, sig))
    timer.daemon = True
    timer.start()
    return timer


def _exit_now(worker_id: str, sig: signal.Signals) -> None:
    """End the process at once (from a timer thread): the second signal's promise."""
    log.error(
        "worker %s did not stop within %.1f s of a second %s: exiting now; the tasks it "
        "held run again once their leases expire",
        worker_id,
        FORCED_EXIT_AFTER,
        sig.name,
    )
    logging.shutdown()
    os._exit(128 + int(sig))
