"""Several worker processes on one machine: ``taskmill worker --processes N``.

A worker is one asyncio process, so CPU-bound handlers use one core. The supervisor
runs ``N`` ordinary ``taskmill worker`` processes (the same command line, one process
each) and keeps them running, the way Celery's and Dramatiq's process pools do:

- **Signals.** The children run in sessions of their own, so a terminal's Ctrl-C reaches
  only the supervisor, which forwards each SIGINT/SIGTERM it gets, once, to every child.
  The first signal stops every child gracefully (each drains or releases its tasks); a
  second one stops them at once, as it does a single worker. When the supervisor itself
  dies (``kill -9``), the kernel sends each child SIGTERM (Linux's parent-death signal),
  so no child outlives it for long; on other systems they run on until stopped.
- **Crashes.** A child that exits while nobody asked it to stop is restarted, logged
  with its exit status. A child that dies within ``min_uptime`` of its start is a fast
  failure: its restart waits ``backoff`` seconds, doubling per consecutive fast failure
  up to ``max_backoff``; after ``max_fast_failures`` of them in a row the supervisor
  stops the other children and exits with status 2 (a worker that cannot start, a
  broken plugin, a store that refuses it: restarting it forever helps nobody).
- **Tasks.** What a killed child held comes back through lease expiry, like any
  crashed worker's tasks; no task runs twice while its lease is held.

The exit status is 0 after a graceful stop (or, with ``--until-idle``, when every child
found no more work), 128 + the signal's number after a forced stop, and 2 when children
keep dying.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence

import attrs

__all__ = ["RestartPolicy", "Supervisor"]

log = logging.getLogger("taskmill.supervisor")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1

FORCE_KILL_AFTER = 3.0
"""Seconds after a second signal before the children still running are killed."""


@attrs.frozen
class RestartPolicy:
    """When a child that died is started again, and when the supervisor gives up."""

    min_uptime: float = 5.0
    """A child that dies sooner than this after its start is a fast failure (seconds)."""
    backoff: float = 0.5
    """The wait before restarting after the first fast failure (seconds); doubles with
    each consecutive fast failure of that child."""
    max_backoff: float = 30.0
    """The longest wait before a restart (seconds)."""
    max_fast_failures: int = 5
    """This many fast failures of one child in a row stop the supervisor (status 2)."""

    def delay(self, fast_failures: int) -> float:
        """The wait before a restart after ``fast_failures`` in a row (0: none)."""
        if fast_failures <= 0:
            return 0.0
        return float(min(self.max_backoff, self.backoff * 2 ** (fast_failures - 1)))


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to send this process SIGTERM when its parent dies (best effort)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


class Supervisor:
    """Runs ``processes`` copies of one worker command and keeps them running.

    :param command: the argv of one child worker process (a ``taskmill worker`` command
        line that runs one process).
    :param processes: how many children run at once (1 or more).
    :param until_idle: the children run ``--until-idle``: one that exits with status 0
        is done and not restarted.
    :param policy: restarts and giving up.
    :param environ: the children's environment (default: this process's).
    :param child_environ: per child number (1 to ``processes``), variables added to the
        environment of that child (e.g. its worker id).
    """

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        until_idle: bool = False,
        policy: RestartPolicy | None = None,
        environ: dict[str, str] | None = None,
        child_environ: Callable[[int], dict[str, str]] | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be 1 or more, not {processes}")
        self.command = tuple(command)
        self.processes = processes
        self.until_idle = until_idle
        self.policy = policy or RestartPolicy()
        self._environ = dict(os.environ if environ is None else environ)
        self._child_environ = child_environ
        self._children: dict[int, asyncio.subprocess.Process] = {}
        self._stop = asyncio.Event()
        self._forcing: asyncio.Task[None] | None = None
        self.stop_signal: signal.Signals | None = None
        """The signal that stopped the supervisor, if one did."""
        self.forced = False
        """A second signal asked for an immediate stop."""
        self.gave_up = False
        """A child kept dying and the supervisor stopped the rest."""
        self.restarts = 0
        """Children started again after they died."""
        self.started: list[int] = []
        """The pid of every child started, in order."""

    @property
    def pids(self) -> list[int]:
        """The pids of the children running now, by child number."""
        return [p.pid for _, p in sorted(self._children.items()) if p.returncode is None]

    async def run(self) -> int:
        """Start the children, keep them running until a signal (or, ``until_idle``,
        until each is done), and return the exit status."""
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            log.info("supervisor %d: starting %d worker processes", os.getpid(), self.processes)
            outcomes = await asyncio.gather(
                *(self._keep(number) for number in range(1, self.processes + 1))
            )
        finally:
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)
            if self._forcing is not None:
                self._forcing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._forcing
        if self.gave_up:
            return 2
        if self.forced and self.stop_signal is not None:
            return 128 + int(self.stop_signal)
        return 0 if all(code == 0 for code in outcomes) else 2

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stop.is_set():
            if not self.forced:
                self.forced = True
                log.warning("%s received again: stopping every worker process now", sig.name)
                self._forcing = asyncio.get_running_loop().create_task(self._force(sig))
        else:
            self.stop_signal = sig
            self._stop.set()
            log.info(
                "%s received: stopping %d worker processes gracefully", sig.name, len(self.pids)
            )
        self._signal_children(sig)

    async def _force(self, sig: signal.Signals) -> None:
        """Make every child stop now: a signal sent while the child still has the first
        one pending merges with it (POSIX does not queue them), so it is sent again
        until the child is gone, and what still runs after ``FORCE_KILL_AFTER`` seconds
        is killed (its leases expire and its tasks are rescued)."""
        deadline = time.monotonic() + FORCE_KILL_AFTER
        while self.pids and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            self._signal_children(sig)
        if self.pids:
            log.warning("killing worker processes %s", ", ".join(map(str, self.pids)))
            self._signal_children(signal.SIGKILL)

    def _signal_children(self, sig: signal.Signals) -> None:
        for process in self._children.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(sig)

    async def _keep(self, number: int) -> int:
        """Run child ``number`` until the supervisor stops; return its last status."""
        fast_failures = 0
        while True:
            started = time.monotonic()
            process = await self._start(number)
            if self._stop.is_set() and self.stop_signal is not None:
                # The signal came while this child was being started.
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(self.stop_signal)
            code = await process.wait()
            uptime = time.monotonic() - started
            if self._stop.is_set():
                return self._stopped(code)
            if self.until_idle and code == 0:
                log.info("worker process %d (pid %d) is done", number, process.pid)
                return code
            fast_failures = fast_failures + 1 if uptime < self.policy.min_uptime else 0
            how = f"signal {-code}" if code < 0 else f"status {code}"
            if fast_failures >= self.policy.max_fast_failures:
                log.error(
                    "worker process %d (pid %d) exited with %s %.1f s after its start, %d "
                    "times in a row that soon: giving up and stopping the others",
                    number,
                    process.pid,
                    how,
                    uptime,
                    fast_failures,
                )
                self.gave_up = True
                self._stop.set()
                self._signal_children(signal.SIGTERM)
                return code
            delay = self.policy.delay(fast_failures)
            log.warning(
                "worker process %d (pid %d) exited with %s after %.1f s; restarting it%s",
                number,
                process.pid,
                how,
                uptime,
                f" in {delay:g} s" if delay else "",
            )
            if delay:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._stop.wait()
                if self._stop.is_set():
                    return 0  # stopped while waiting to restart: nothing runs there
            self.restarts += 1

    def _stopped(self, code: int) -> int:
        """The status of a child that exited after the supervisor forwarded a stop.

        A child still starting when the signal came dies of it (or exits 128 + its
        number after a KeyboardInterrupt) before it has claimed anything: that is a
        clean stop too, unless the stop was forced."""
        sig = self.stop_signal
        if not self.forced and sig is not None and code in (-int(sig), 128 + int(sig)):
            return 0
        return code

    async def _start(self, number: int) -> asyncio.subprocess.Process:
        environ = dict(self._environ)
        if self._child_environ is not None:
            environ.update(self._child_environ(number))
        process = await asyncio.create_subprocess_exec(
            *self.command,
            env=environ,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self._children[number] = process
        self.started.append(process.pid)
        log.info("worker process %d started (pid %d)", number, process.pid)
        return process
