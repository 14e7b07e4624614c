"""``taskmill demo``: enqueue a sample workload and run it with a live progress view
(added to the command line through ``taskmill_register_commands``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterator

from rich.console import Console
from rich.logging import RichHandler
from rich.text import Text
from taskmill import TaskFilter, TaskmillError, TaskStatus
from taskmill.cli import (
    DEFAULT_URL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CommandRegistrar,
    Settings,
    load_plugins,
    new_taskmill,
    positive_int,
    redacted,
    short,
    truncate,
)
from taskmill.cli import console as stdout_console

from taskmill_demo.handlers import TASK_TYPES
from taskmill_demo.view import run_with_live_view, summary, tallies
from taskmill_demo.workload import workload

PLUGIN_NAME = "demo"
"""The plugin's entry-point name (pyproject.toml)."""


def add_demo(commands: CommandRegistrar) -> None:
    """Add ``demo`` to the command line."""
    cmd = commands.add(
        "demo",
        run_demo,
        "Enqueue the sample tasks of the taskmill-demo plugin and run them with a live "
        "progress view.",
    )
    cmd.add_argument(
        "--tasks",
        type=positive_int,
        default=40,
        metavar="N",
        help="how many tasks to enqueue (default 40)",
    )
    cmd.add_argument(
        "--concurrency",
        dest="demo_concurrency",
        type=positive_int,
        default=8,
        metavar="N",
        help="worker slots (default 8)",
    )


async def run_demo(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``args.tasks`` demo tasks on the settings' store; 0 when all finished, 130
    when the run stopped (a signal) with tasks unfinished."""
    run = f"demo-{uuid.uuid4().hex[:8]}"
    console = stdout_console()
    tm = new_taskmill(settings)
    # Plugins first: a plugin that cannot be loaded stops the demo before any database
    # is created. The run's tasks carry its id as user_id: everything below counts only
    # them, so tasks an earlier run left in the same database do not skew the numbers.
    load_plugins(tm, settings, strict=True)
    plugin = tm.plugins.get(PLUGIN_NAME)
    if plugin is None:
        raise TaskmillError(
            "taskmill demo runs the handlers of the taskmill-demo plugin, which the "
            f"settings do not load (entry point {PLUGIN_NAME!r}); see `taskmill plugins`"
        )
    tasks_to_run = workload(args.tasks, user_id=run, seed=uuid.uuid4().int)
    with _worker_logs_through(console):
        async with tm:
            console.print(
                Text.assemble(
                    "taskmill demo ",
                    (run, "bold"),
                    f": {len(tasks_to_run)} tasks of {plugin.label} on {redacted(tm.url)}, "
                    f"{args.demo_concurrency} worker slots",
                )
            )
            await tm.enqueue_many(tasks_to_run)
            run_filter = TaskFilter(user_id=run)
            worker = tm.worker(
                concurrency=args.demo_concurrency,
                progress_interval=0.2,
                poll_interval=0.25,
                shutdown_grace=5.0,
            )
            elapsed = await run_with_live_view(tm, worker, run_filter, console)
            tasks = await tm.query(run_filter, limit=len(tasks_to_run))
            logs = await asyncio.gather(*(tm.attempts(t.id) for t in tasks))
    tallied = tallies(TASK_TYPES, tasks, logs)
    console.print(summary(tallied, elapsed))
    url_option = "" if tm.url == DEFAULT_URL else f" --url {redacted(tm.url)}"
    console.print(Text(f"list this run's tasks: taskmill{url_option} ls --user-id {run}"))
    for task in tasks:
        if task.status is TaskStatus.FAILED:
            console.print(
                Text(
                    f"{task.task_type} {short(task.id)} failed: {truncate(task.error, 80)}\n"
                    f"  inspect it: taskmill{url_option} show {short(task.id)}\n"
                    f"  redrive it: taskmill{url_option} retry {short(task.id)}"
                )
            )
    unfinished = sum(t.unfinished for t in tallied)
    if unfinished:
        console.print(
            Text(
                f"stopped early: {unfinished} tasks are not finished; finish them with: "
                f"taskmill{url_option} worker --until-idle",
                style="yellow",
            )
        )
        return EXIT_INTERRUPTED
    return EXIT_OK


@contextlib.contextmanager
def _worker_logs_through(console: Console) -> Iterator[None]:
    """While the run lasts, taskmill logs through the live display, and only errors:
    the demo's failing attempts are expected and show up in its summary instead."""
    logger = logging.getLogger("taskmill")
    saved = (logger.level, logger.propagate)
    handler = RichHandler(console=console, show_path=False)
    logger.addHandler(handler)
    logger.setLevel(logging.ERROR)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
