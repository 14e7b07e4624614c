"""``taskmill worker``: claim tasks and run them until stopped (or idle)."""

from __future__ import annotations

import argparse
import os
import sys

from taskmill.app import Taskmill
from taskmill.canvas import BUILTIN_SOURCE
from taskmill.cli.arguments import AddCommand, add_handler_options, add_setting
from taskmill.cli.messages import EXIT_OK, progress_line
from taskmill.cli.rendering import redacted
from taskmill.cli.session import open_taskmill
from taskmill.cli.unserved import handler_label, report_unserved
from taskmill.errors import TaskmillError
from taskmill.model import TaskFilter
from taskmill.registry import Handler
from taskmill.settings import ENV_VARS, HOST_APP, WORKER_SETTINGS, Settings
from taskmill.supervisor import Supervisor
from taskmill.worker import Worker


def add_commands(add: AddCommand) -> None:
    """Add ``worker``."""
    cmd = add(
        "worker",
        run_worker,
        "Run a worker: claim tasks and run them with the handlers of the installed "
        "plugins (see `taskmill plugins`) and of the --import modules.",
        "A plugin that cannot be loaded stops it (skip one with TASKMILL_DISABLE_PLUGINS). "
        "One slot is reserved for tasks of priority >= user_action by default, so "
        "--concurrency 2 runs one normal-priority task at a time (and --concurrency 1 "
        "reserves none); set --reserved-high 0 to use every slot for any task. "
        "SIGTERM/SIGINT stop it gracefully (exit status 0); a second signal stops it at "
        "once (exit status 128 + the signal's number). Options not given here come from "
        "TASKMILL_* variables or the configuration file (`taskmill config`).",
    )
    add_setting(cmd, "processes")
    for setting in WORKER_SETTINGS:
        add_setting(cmd, setting.name)
    cmd.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once no task of this worker's types is due soon, then report pending "
        "tasks no handler of this worker serves",
    )
    add_handler_options(cmd)


def _checked_worker(tm: Taskmill, settings: Settings) -> tuple[Worker, list[Handler]]:
    """The worker the settings describe and the handlers it serves.

    :raises TaskmillError: no handler at all, invalid options, or filters that match no
        handler (each message says what to change).
    """
    if not len(tm.registry):
        raise TaskmillError(
            "no handlers to run: pass --import MODULE (a module with a register(tm) "
            "function), set the imports setting, or install a handler plugin (see "
            "`taskmill plugins`)"
        )
    try:
        worker = tm.worker(**settings.worker_options())
    except ValueError as exc:
        raise TaskmillError(str(exc)) from None
    served = worker.served_handlers()
    if not served:
        raise TaskmillError(
            f"no handler matches the worker's filters (task types: "
            f"{', '.join(settings.task_types or ['any'])}; apps: "
            f"{', '.join(a or HOST_APP for a in settings.app_ids or ['any'])}); the "
            f"handlers are: {', '.join(sorted(handler_label(h.key) for h in tm.registry))}"
        )
    return worker, served


async def run_worker(args: argparse.Namespace, settings: Settings) -> int:
    """Run a worker with the settings' options; 0 after a graceful stop, 128 + the
    signal's number after a forced one."""
    if settings.processes > 1:
        return await supervise(args, settings)
    async with open_taskmill(settings, "worker", reads=False, handlers=True) as tm:
        worker, served = _checked_worker(tm, settings)
        reserved = worker.reserved_high_priority_slots
        slots = f"concurrency {worker.concurrency}"
        if reserved:
            slots += f" ({reserved} reserved for priority >= user_action)"
        # The built-in handlers every worker serves (the roots of canvas groups) are
        # not the user's: docs/canvas.md says every worker serves them.
        mine = sorted(handler_label(h.key) for h in served if h.source != BUILTIN_SOURCE)
        progress_line(
            f"worker {worker.worker_id} on {redacted(tm.url)}: {slots}, handlers: {', '.join(mine)}"
        )
        if args.until_idle:
            await worker.run_until_idle()
        else:
            await worker.run()
        attempts = f"{worker.processed} attempt{'' if worker.processed == 1 else 's'}"
        progress_line(f"worker {worker.worker_id} stopped after {attempts}")
        if args.until_idle and worker.stop_signal is None:
            await report_unserved(tm, served, TaskFilter(), "of this worker")
    if worker.forced and worker.stop_signal is not None:
        return 128 + int(worker.stop_signal)
    return EXIT_OK


async def supervise(args: argparse.Namespace, settings: Settings) -> int:
    """``worker --processes N``: check once, here, that a worker can start, then run N
    single-process copies of this command under a :class:`Supervisor`."""
    async with open_taskmill(settings, "worker", reads=False, handlers=True) as tm:
        _checked_worker(tm, settings)
        where = redacted(tm.url)
    base = settings.worker_id

    def child_environ(number: int) -> dict[str, str]:
        return {} if base is None else {ENV_VARS["worker_id"]: f"{base}-{number}"}

    supervisor = Supervisor(
        [sys.executable, "-m", "taskmill", *args.argv, "--processes", "1"],
        settings.processes,
        until_idle=args.until_idle,
        child_environ=child_environ,
    )
    progress_line(f"supervisor {os.getpid()} on {where}: {settings.processes} worker processes")
    status = await supervisor.run()
    if supervisor.gave_up:
        raise TaskmillError(
            "a worker process kept dying right after its start (its errors are above); "
            "the supervisor stopped the others"
        )
    restarts = f"{supervisor.restarts} restart{'' if supervisor.restarts == 1 else 's'}"
    progress_line(f"supervisor {os.getpid()} stopped ({restarts})")
    return status
