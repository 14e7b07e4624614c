"""Proxy handlers: handlers that delegate each task to another process.

A :class:`ProxyHandler` hands the task to a delegate (a subprocess, a sidecar service),
relays the delegate's progress into the task, turns the delegate's answer into the
attempt's outcome, and stops the delegate when the attempt is cancelled, times out or
the worker shuts down. It is registered like any handler, and the worker runs it as an
``async`` handler::

    tm.register("convert", SubprocessHandler(["convert", "{input}", "{output}"]), timeout=300)

:class:`SubprocessHandler` runs a command-line program per task; its protocol (argv
template, JSON on stdin and stdout, exit codes, progress lines on stderr) is documented
on the class and in docs/plugins.md.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import json
import logging
import os
import signal
import string
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import attrs

from taskmill.context import Context
from taskmill.errors import Fail, ProxyError, Retry
from taskmill.model import JSON

log = logging.getLogger("taskmill.proxy")

H = TypeVar("H")

EX_DATAERR = 65
"""sysexits.h: the input data was incorrect. A :class:`SubprocessHandler` fails the
task without retrying (dead letter)."""
EX_TEMPFAIL = 75
"""sysexits.h: a temporary failure. A :class:`SubprocessHandler` retries the task."""
PROGRESS_PREFIX = "taskmill-progress "
"""A stderr line starting with this, then a JSON object ``{"done": 3, "total": 10,
"message": "..."}``, reports progress (``total`` and ``message`` are optional)."""

_LINE_LIMIT = 1024 * 1024


class ProxyHandler(abc.ABC, Generic[H]):
    """A handler that runs each task in another process.

    Subclasses implement three steps; the class runs them and owns the policy around
    them:

    - :meth:`send` hands the task over and returns a handle for this attempt;
    - :meth:`receive` waits for the outcome, relaying progress into ``ctx`` as it comes,
      and returns the result or raises (:class:`~taskmill.Retry`,
      :class:`~taskmill.Fail`, :class:`~taskmill.ProxyError`, ...) like any handler;
    - :meth:`cancel` stops the delegate: asked politely first, forced after
      ``cancel_grace`` seconds. It is called whenever the attempt ends while the delegate
      may still run: a cancellation (USER, PREEMPTED), a suspension, a shutdown, the
      handler's ``timeout``, or an error in :meth:`receive` itself.
    """

    cancel_grace: float = 3.0
    """Seconds the delegate gets to stop after being asked, before it is forced."""

    async def __call__(self, ctx: Context, params: dict[str, Any]) -> JSON:
        """Run one attempt: send, receive, and cancel the delegate if the attempt ends
        any other way than by the delegate's answer."""
        handle = await self.send(ctx, params)
        try:
            return await self.receive(ctx, handle)
        except BaseException:
            try:
                await self.cancel(handle, self.cancel_grace)
            except Exception:
                log.exception("task %s: stopping its delegate failed", ctx.task.id)
            raise

    @abc.abstractmethod
    async def send(self, ctx: Context, params: dict[str, Any]) -> H:
        """Hand the task to the delegate and return the handle of this attempt.

        :raises ProxyError: the delegate could not be reached or started (retried).
        :raises Fail: the task cannot be sent at all (its params do not fit).
        """

    @abc.abstractmethod
    async def receive(self, ctx: Context, handle: H) -> JSON:
        """Wait for the delegate's outcome, reporting its progress with
        ``ctx.progress``; return the result, or raise to fail the attempt."""

    @abc.abstractmethod
    async def cancel(self, handle: H, grace: float) -> None:
        """Stop the delegate: ask it to stop, and force it after ``grace`` seconds.
        Returns once it has stopped; returns at once when it already has. When itself
        cancelled, force the delegate at once before re-raising."""


@attrs.define(eq=False)
class SubprocessRun:
    """One attempt of a :class:`SubprocessHandler`: the process and its readers."""

    process: asyncio.subprocess.Process
    output: asyncio.Task[bytes | None]
    """Reads stdout; None when the program printed more than ``max_output_bytes``."""
    errors: asyncio.Task[None]
    """Reads stderr: progress lines into the task, the rest into ``tail``."""
    feed: asyncio.Task[None] | None
    """Writes the params to stdin."""
    tail: collections.deque[str]
    """The last stderr lines that were not progress."""


class SubprocessHandler(ProxyHandler[SubprocessRun]):
    """Runs a command-line program for each task.

    - **Command line**: ``argv`` is a template. Each element is formatted with the
      task's params (``"{input}"`` takes ``params["input"]``; ``{{`` is a literal
      brace): a string goes in as it is, a number too (so ``"{n:03d}"`` works), and
      anything else as JSON. No shell is involved. A field the params lack fails the
      task (dead letter).
    - **Input**: unless ``stdin=False``, the params as one JSON object on stdin. The
      environment also carries ``TASKMILL_TASK_ID``, ``TASKMILL_TASK_TYPE``,
      ``TASKMILL_APP_ID`` (empty for the host) and ``TASKMILL_ATTEMPT``.
    - **Result**: stdout, parsed as one JSON value, is the task's result; empty stdout
      is None. Output that is not JSON fails the task (dead letter): a program that
      exits 0 with garbage is broken, not unlucky. So does output beyond
      ``max_output_bytes``.
    - **Exit status**: 0 completes the task. A code in ``retry_exit_codes`` (default 75,
      ``EX_TEMPFAIL``) asks for a retry (with backoff, counting an attempt); one in
      ``fail_exit_codes`` (default 65, ``EX_DATAERR``) fails the task at once (dead
      letter). Any other status, or death by a signal, is an error: the attempt fails
      and is retried while retries remain. The error message ends with the last
      ``error_lines`` lines of stderr.
    - **Progress**: a stderr line ``taskmill-progress {"done": 3, "total": 10,
      "message": "page 3"}`` calls ``ctx.progress(3, 10, "page 3")`` (``total`` and
      ``message`` are optional). Every other stderr line is kept for the error message.
    - **Stopping**: the program runs in a session (process group) of its own. When the
      attempt is cancelled, times out or the worker shuts down, the group gets SIGTERM;
      once the program has exited, or ``cancel_grace`` seconds later, whatever is left
      of the group gets SIGKILL.

    :param env: extra environment variables (on top of the worker's environment).
    :param cwd: the working directory (default: the worker's).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        stdin: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        retry_exit_codes: Collection[int] = (EX_TEMPFAIL,),
        fail_exit_codes: Collection[int] = (EX_DATAERR,),
        cancel_grace: float = 3.0,
        error_lines: int = 20,
        max_output_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a non-empty list of strings (no shell is used)")
        for arg in argv:
            _check_template(arg)
        if cancel_grace < 0:
            raise ValueError(f"cancel_grace must be >= 0, got {cancel_grace}")
        self.argv = tuple(argv)
        self.stdin = stdin
        self.env = dict(env or {})
        self.cwd = cwd
        self.retry_exit_codes = frozenset(retry_exit_codes)
        self.fail_exit_codes = frozenset(fail_exit_codes)
        self.cancel_grace = cancel_grace
        self.error_lines = error_lines
        self.max_output_bytes = max_output_bytes

    def __repr__(self) -> str:
        return f"SubprocessHandler({list(self.argv)!r})"

    @property
    def program(self) -> str:
        """The program's name, as messages call it."""
        return Path(self.argv[0]).name

    def command_line(self, params: Mapping[str, Any]) -> list[str]:
        """``argv`` formatted with ``params``.

        :raises Fail: the template names a field that ``params`` lacks.
        """
        values = _ArgumentValues(params)
        try:
            return [arg.format_map(values) for arg in self.argv]
        except KeyError as exc:
            raise Fail(
                f"the command line of {self.program} needs params[{exc.args[0]!r}], which "
                "this task does not have"
            ) from None
        except (ValueError, TypeError) as exc:
            raise Fail(f"cannot build the command line of {self.program}: {exc}") from None

    async def send(self, ctx: Context, params: dict[str, Any]) -> SubprocessRun:
        """Start the program (see the class docstring for the protocol)."""
        argv = self.command_line(params)
        task = ctx.task
        env = {
            **os.environ,
            **self.env,
            "TASKMILL_TASK_ID": task.id,
            "TASKMILL_TASK_TYPE": task.task_type,
            "TASKMILL_APP_ID": task.app_id or "",
            "TASKMILL_ATTEMPT": str(task.attempts),
        }
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if self.stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                limit=_LINE_LIMIT,
            )
        except OSError as exc:
            raise ProxyError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
        assert process.stdout is not None and process.stderr is not None
        tail: collections.deque[str] = collections.deque(maxlen=max(1, self.error_lines))
        feed = None
        if process.stdin is not None:
            feed = asyncio.create_task(_feed(process.stdin, json.dumps(params).encode()))
        return SubprocessRun(
            process=process,
            output=asyncio.create_task(_read_output(process.stdout, self.max_output_bytes)),
            errors=asyncio.create_task(_read_errors(process.stderr, ctx, tail)),
            feed=feed,
            tail=tail,
        )

    async def receive(self, ctx: Context, handle: SubprocessRun) -> JSON:
        """Wait for the program to exit; map its status and output to the outcome."""
        output = await handle.output
        await handle.errors
        status = await handle.process.wait()
        if handle.feed is not None:
            await handle.feed
        if status == 0:
            return self._result(output)
        tail = self._tail(handle)
        if status in self.retry_exit_codes:
            raise Retry(message=f"{self.program} asked for a retry (exit status {status}){tail}")
        if status in self.fail_exit_codes:
            raise Fail(f"{self.program} rejected the task (exit status {status}){tail}")
        if status < 0:
            name = signal.Signals(-status).name if -status in signal.valid_signals() else -status
            raise ProxyError(f"{self.program} was killed by signal {name}{tail}")
        raise ProxyError(f"{self.program} exited with status {status}{tail}")

    def _result(self, output: bytes | None) -> JSON:
        if output is None:
            raise Fail(
                f"{self.program} printed more than {self.max_output_bytes} bytes on stdout; "
                "its result must be one JSON value"
            )
        text = output.decode("utf-8", errors="replace").strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            shown = text if len(text) <= 200 else text[:200] + "..."
            raise Fail(
                f"{self.program} exited 0 but its stdout is not JSON ({exc}): {shown!r}"
            ) from None

    def _tail(self, handle: SubprocessRun) -> str:
        if not handle.tail:
            return " (nothing on stderr)"
        return "; stderr ends with:\n" + "\n".join(handle.tail)

    async def cancel(self, handle: SubprocessRun, grace: float) -> None:
        """SIGTERM to the program's process group, SIGKILL after ``grace`` seconds."""
        process = handle.process
        try:
            if process.returncode is None:
                _signal_group(process, signal.SIGTERM)
                try:
                    async with asyncio.timeout(grace):
                        await process.wait()
                except TimeoutError:
                    log.warning(
                        "%s (pid %d) ignored SIGTERM for %.1f s; killing it",
                        self.program,
                        process.pid,
                        grace,
                    )
                    _signal_group(process, signal.SIGKILL)
                    await process.wait()
        finally:
            # Whatever is left of its group (children the program did not stop) goes too.
            _signal_group(process, signal.SIGKILL)
            readers = [t for t in (handle.output, handle.errors, handle.feed) if t is not None]
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


def _signal_group(process: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    # The whole group: a shell script's children go too. The group outlives its
    # leader, so signal it even when the leader has just exited.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)


class _ArgumentValues(dict[str, Any]):
    """Params as ``str.format_map`` sees them in a command-line template."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        super().__init__(params)

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        if isinstance(value, str) or (
            isinstance(value, int | float) and not isinstance(value, bool)
        ):
            return value
        return json.dumps(value)


def _check_template(arg: str) -> None:
    """Reject templates that reach into values (``{a.b}``, ``{a[0]}``) or are
    malformed: only whole params are substituted."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(arg) if f is not None]
    except ValueError as exc:
        raise ValueError(f"bad command-line template {arg!r}: {exc}") from None
    for field in fields:
        if not field.isidentifier():
            raise ValueError(
                f"bad command-line template {arg!r}: {{{field}}} must name one param, "
                "like {input}"
            )


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    # A program that exits without reading its input is fine.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(data)
        await stdin.drain()
        stdin.close()
        await stdin.wait_closed()


async def _read_output(stream: asyncio.StreamReader, limit: int) -> bytes | None:
    """All of stdout, or None past ``limit`` bytes (still read to the end, so that the
    program is not blocked on a full pipe)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.read(65536):
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        else:
            chunks.clear()
    return None if size > limit else b"".join(chunks)


async def _read_errors(
    stream: asyncio.StreamReader, ctx: Context, tail: collections.deque[str]
) -> None:
    while True:
        try:
            raw = await stream.readline()
        except ValueError:  # a line longer than the limit: dropped, the rest is read on
            tail.append(f"[a stderr line longer than {_LINE_LIMIT} bytes was dropped]")
            continue
        if not raw:
            return
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if line.startswith(PROGRESS_PREFIX) and await _report_progress(ctx, line):
            continue
        tail.append(line)


async def _report_progress(ctx: Context, line: str) -> bool:
    """Report a progress line; False when it is malformed (kept as plain stderr)."""
    try:
        report = json.loads(line[len(PROGRESS_PREFIX) :])
        if not isinstance(report, dict):
            return False
        message = report.get("message")
        await ctx.progress(
            report["done"], report.get("total"), None if message is None else str(message)
        )
    except (ValueError, KeyError, TypeError):
        return False
    return True
