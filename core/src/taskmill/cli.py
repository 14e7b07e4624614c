"""The ``taskmill`` command line: run workers, enqueue and inspect tasks, run the demo.

``taskmill [--url URL] COMMAND ...``; the URL defaults to ``$TASKMILL_URL``, else
``sqlite:///taskmill.db``. Every command is synchronous: it returns once its work is
done. Exit status: 0 on success, 1 when a named task does not exist, 2 for any other
error (a bad argument or a :class:`~taskmill.TaskmillError`, printed as
``error: <message>`` without a traceback), 130 when interrupted.

Every command loads the installed plugins (``taskmill plugins`` lists them), so a
worker runs the handlers of every installed handler plugin. Handler modules
(``--import MODULE``) expose ``register(tm: Taskmill) -> None``, which registers more
handlers on the ``Taskmill`` the command built.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attrs
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.logging import RichHandler
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from taskmill.app import Taskmill
from taskmill.discovery import DEFAULT_URL
from taskmill.errors import TaskmillError, TaskNotFound
from taskmill.model import (
    Attempt,
    CancelReason,
    Priority,
    Progress,
    ProgressSummary,
    Task,
    TaskFilter,
    TaskSpec,
    TaskStatus,
)
from taskmill.plugins import DISABLE_ENV, ENTRY_POINT_GROUP, PluginInfo
from taskmill.serialization import to_dict
from taskmill.storage import utcnow
from taskmill.worker import Worker

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``taskmill`` command line with ``argv`` (default: ``sys.argv[1:]``) and
    return the exit status."""
    args = build_parser().parse_args(argv)
    command: Command = args.command
    try:
        return asyncio.run(command(args))
    except TaskNotFound as exc:
        _error(str(exc))
        return EXIT_NOT_FOUND
    except TaskmillError as exc:
        _error(str(exc))
        return EXIT_ERROR
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED


def _error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


# -- argument parsing ---------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every ``taskmill`` command."""
    parser = argparse.ArgumentParser(
        prog="taskmill",
        description="Durable background tasks: run workers, enqueue and inspect tasks.",
        epilog=f"The storage URL comes from --url, else $TASKMILL_URL, else {DEFAULT_URL}.",
    )
    parser.add_argument("--url", default=None, help=_URL_HELP)
    # --url is accepted after the command too; SUPPRESS keeps the global one otherwise.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help=_URL_HELP)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    def add(name: str, command: Command, summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=summary, description=summary)
        sub.set_defaults(command=command)
        return sub

    cmd = add(
        "demo",
        _demo,
        "Enqueue the sample tasks of the taskmill-demo plugin and run them with a live "
        "progress view.",
    )
    cmd.add_argument(
        "--tasks",
        type=_positive_int,
        default=40,
        metavar="N",
        help="how many tasks to enqueue (default 40)",
    )
    cmd.add_argument(
        "--concurrency", type=_positive_int, default=8, metavar="N", help="worker slots (default 8)"
    )

    cmd = add("worker", _worker, "Run a worker with the handlers of the given modules.")
    cmd.add_argument(
        "--concurrency",
        type=_positive_int,
        default=10,
        metavar="N",
        help="tasks run at once (default 10)",
    )
    cmd.add_argument(
        "--reserved-high",
        type=_non_negative_int,
        default=1,
        metavar="N",
        help="slots kept for tasks of priority >= USER_ACTION (default 1)",
    )
    cmd.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once no task of this worker's types is due soon",
    )
    cmd.add_argument(
        "--lease",
        type=_positive_float,
        default=30.0,
        metavar="SECONDS",
        help="lease length; a crashed worker's tasks run again after it (default 30)",
    )
    cmd.add_argument(
        "--shutdown-grace",
        type=_non_negative_float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long running tasks "
        "may finish before they are put back to pending (default 30)",
    )
    _add_handler_options(cmd)

    cmd = add("enqueue", _enqueue, "Enqueue a task and print its id.")
    cmd.add_argument("task_type", metavar="TASK_TYPE")
    cmd.add_argument(
        "--params",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="the task's parameters, a JSON object",
    )
    cmd.add_argument(
        "--priority",
        type=_priority,
        default=Priority.NORMAL,
        metavar="N|NAME",
        help=f"an int or one of {', '.join(p.name.lower() for p in Priority)} (default normal)",
    )
    cmd.add_argument("--app-id", default=None, help="the app that owns the task")
    cmd.add_argument(
        "--dedupe-key", default=None, help="make the task an alias of an active task with this key"
    )
    cmd.add_argument(
        "--delay",
        type=_non_negative_float,
        default=None,
        metavar="SECONDS",
        help="run no earlier than this many seconds from now",
    )
    cmd.add_argument(
        "--max-retries",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="retries after the first attempt (default: the handler's, else 3)",
    )
    cmd.add_argument("--user-id", default=None, help="who asked for the task")
    cmd.add_argument("--json", action="store_true", help="print the task as JSON")
    _add_handler_options(cmd, purpose="so that the task gets its handler's max_retries")

    cmd = add("ls", _ls, "List tasks, newest first.")
    cmd.add_argument(
        "--status",
        dest="statuses",
        action="extend",
        nargs="+",
        type=_status,
        metavar="S",
        help=f"only these statuses ({', '.join(s.value for s in TaskStatus)})",
    )
    cmd.add_argument(
        "--type",
        dest="task_types",
        action="extend",
        nargs="+",
        metavar="T",
        help="only these task types",
    )
    cmd.add_argument("--app-id", default=None, help="only this app's tasks")
    cmd.add_argument("--user-id", default=None, help="only tasks this user asked for")
    cmd.add_argument(
        "--limit",
        type=_positive_int,
        default=50,
        metavar="N",
        help="show at most N tasks (default 50)",
    )
    cmd.add_argument("--json", action="store_true", help="print the tasks as JSON")

    cmd = add("show", _show, "Show every field of a task and its attempt log.")
    cmd.add_argument("task_id", metavar="TASK_ID", help="a task id or a unique prefix of one")
    cmd.add_argument("--json", action="store_true", help="print the task as JSON")

    cmd = add("retry", _retry, "Put a failed or cancelled task back to pending.")
    cmd.add_argument("task_id", metavar="TASK_ID", help="a task id or a unique prefix of one")

    cmd = add("cancel", _cancel, "Cancel a task (and its children), or every task of a type.")
    cmd.add_argument(
        "task_id", nargs="?", metavar="TASK_ID", help="a task id or a unique prefix of one"
    )
    cmd.add_argument(
        "--type",
        dest="task_types",
        action="extend",
        nargs="+",
        metavar="T",
        help="instead of one task: every active task of these types",
    )
    cmd.add_argument("--app-id", default=None, help="with --type: only this app's tasks")
    cmd.add_argument(
        "--reason",
        choices=[r.value for r in CancelReason],
        default=CancelReason.USER.value,
        help="user/preempted end the task; suspended/shutdown put a running task back "
        "to pending (default user)",
    )
    cmd.add_argument("--no-cascade", action="store_true", help="leave the task's children alone")

    for name, command, summary in (
        ("suspend", _suspend, "Stop every worker from starting tasks of a scope."),
        ("resume", _resume, "Lift a suspension stored by `taskmill suspend`."),
    ):
        cmd = add(name, command, summary)
        cmd.add_argument(
            "task_type", nargs="?", metavar="TASK_TYPE", help="the task type (default: all)"
        )
        cmd.add_argument("--app-id", default=None, help="only this app's tasks")

    cmd = add("suspensions", _suspensions, "List the stored suspensions.")

    cmd = add("cleanup", _cleanup, "Delete finished tasks older than a given age.")
    cmd.add_argument(
        "--older-than",
        type=_duration,
        required=True,
        metavar="AGE",
        help="e.g. 3600, 90s, 30m, 12h, 7d",
    )
    cmd.add_argument(
        "--include-failed", action="store_true", help="delete failed (dead-letter) tasks too"
    )

    add("migrate", _migrate, "Bring the database schema up to date; print its version.")

    cmd = add(
        "plugins",
        _plugins,
        "List the installed plugins: distribution, version, hooks and the handlers each "
        "registered.",
    )
    cmd.add_argument("--json", action="store_true", help="print the list as JSON")

    cmd = add("stats", _stats, "Count tasks by status.")
    cmd.add_argument(
        "--type",
        dest="task_types",
        action="extend",
        nargs="+",
        metavar="T",
        help="one row per task type given",
    )
    cmd.add_argument("--app-id", default=None, help="only this app's tasks")
    cmd.add_argument("--user-id", default=None, help="only tasks this user asked for")
    cmd.add_argument("--json", action="store_true", help="print the counts as JSON")
    return parser


_URL_HELP = f"storage URL (default: $TASKMILL_URL, else {DEFAULT_URL})"


def _add_handler_options(cmd: argparse.ArgumentParser, purpose: str = "") -> None:
    suffix = f", {purpose}" if purpose else ""
    cmd.add_argument(
        "--import",
        dest="imports",
        action="extend",
        nargs="+",
        default=[],
        metavar="MODULE",
        help=f"import MODULE and call its register(tm) to register handlers{suffix}; repeatable",
    )


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _positive_float(text: str) -> float:
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"task params must be a JSON object like '{{\"key\": 1}}', got {text!r}"
        )
    return value


def _priority(text: str) -> int:
    name = text.strip().upper().replace("-", "_")
    if name in Priority.__members__:
        return Priority[name]
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a priority: {text!r}; give an int or one of "
            f"{', '.join(p.name.lower() for p in Priority)}"
        ) from None


def _status(text: str) -> TaskStatus:
    try:
        return TaskStatus(text.lower())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a status: {text!r}; one of {', '.join(s.value for s in TaskStatus)}"
        ) from None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _duration(text: str) -> timedelta:
    number, unit = (text[:-1], text[-1]) if text[-1:].isalpha() else (text, "s")
    if unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r}; use seconds or a number with s, m, h, d or w"
        )
    return timedelta(seconds=_non_negative_float(number) * _UNITS[unit])


# -- output helpers -----------------------------------------------------------------


def _console() -> Console:
    """A stdout console for tables: wide on a pipe or file, so that rows do not wrap."""
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 160
    return console


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _redacted(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _short(task_id: str) -> str:
    return task_id[:8]


def _priority_name(priority: int) -> str:
    try:
        return Priority(priority).name.lower()
    except ValueError:
        return str(priority)


def _age(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    return _seconds((now - moment).total_seconds())


def _seconds(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _pct(task: Task) -> str:
    pct = task.progress.pct
    if pct is None:
        return "100%" if task.status is TaskStatus.COMPLETED else "-"
    return f"{pct:.0f}%"


def _truncate(text: str | None, width: int) -> str:
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.isoformat(sep=" ", timespec="milliseconds")


_STATUS_STYLE = {
    TaskStatus.PENDING: "yellow",
    TaskStatus.RUNNING: "cyan",
    TaskStatus.COMPLETED: "green",
    TaskStatus.FAILED: "bold red",
    TaskStatus.CANCELLED: "magenta",
}


def _status_text(status: TaskStatus) -> Text:
    return Text(status.value, style=_STATUS_STYLE[status])


# -- shared steps -------------------------------------------------------------------


def _load_handlers(tm: Taskmill, modules: Iterable[str]) -> None:
    """Register each module's handlers, through its ``register(tm)``.

    :raises TaskmillError: a module cannot be imported or has no ``register``.
    """
    # Like `python -m`, find modules in the current directory.
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise TaskmillError(f"cannot import handler module {name!r}: {exc}") from None
        register = getattr(module, "register", None)
        if not callable(register):
            raise TaskmillError(
                f"handler module {name!r} has no register(tm) function; define "
                "`def register(tm: taskmill.Taskmill) -> None` that registers its handlers"
            )
        register(tm)


async def _find_task(tm: Taskmill, ref: str) -> Task:
    """The task whose id is ``ref``, or whose id starts with ``ref`` (as ``ls`` prints).

    :raises TaskNotFound: no task matches.
    :raises TaskmillError: the prefix matches several tasks.
    """
    task = await tm.get(ref)
    if task is not None:
        return task
    if len(ref) < 36:
        matches: list[Task] = []
        page_size, offset = 1000, 0
        while True:
            page = await tm.query(limit=page_size, offset=offset, newest_first=True)
            matches.extend(t for t in page if t.id.startswith(ref))
            if len(page) < page_size:
                break
            offset += page_size
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise TaskmillError(
                f"task id prefix {ref!r} matches {len(matches)} tasks "
                f"({', '.join(t.id for t in matches[:3])}, ...); give more of the id"
            )
    raise TaskNotFound(f"no task with id {ref!r}")


# -- commands -----------------------------------------------------------------------


async def _worker(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    tm = Taskmill(args.url)
    _load_handlers(tm, args.imports)
    async with tm:
        if not len(tm.registry):
            raise TaskmillError(
                "no handlers to run: pass --import MODULE (a module with a register(tm) "
                "function), or install a handler plugin (see `taskmill plugins`)"
            )
        worker = tm.worker(
            concurrency=args.concurrency,
            reserved_high_priority_slots=args.reserved_high,
            lease_seconds=args.lease,
            shutdown_grace=args.shutdown_grace,
        )
        types = ", ".join(
            sorted(
                h.task_type if h.app_id is None else f"{h.app_id}/{h.task_type}"
                for h in tm.registry
            )
        )
        print(
            f"worker {worker.worker_id} on {_redacted(tm.url)}: concurrency "
            f"{worker.concurrency}, handlers: {types}",
            file=sys.stderr,
        )
        if args.until_idle:
            await worker.run_until_idle()
        else:
            await worker.run()
        attempts = f"{worker.processed} attempt{'' if worker.processed == 1 else 's'}"
        print(f"worker {worker.worker_id} stopped after {attempts}", file=sys.stderr)
    return EXIT_OK


async def _enqueue(args: argparse.Namespace) -> int:
    tm = Taskmill(args.url)
    _load_handlers(tm, args.imports)
    async with tm:
        task = await tm.enqueue(
            args.task_type,
            args.params,
            app_id=args.app_id,
            priority=args.priority,
            dedupe_key=args.dedupe_key,
            delay=args.delay,
            max_retries=args.max_retries,
            user_id=args.user_id,
        )
    if args.json:
        _print_json(to_dict(task))
    else:
        print(task.id)
    if task.alias_of is not None:
        print(
            f"note: an active task holds dedupe key {task.dedupe_key!r}; this task is "
            f"an alias of {task.alias_of} and takes its outcome",
            file=sys.stderr,
        )
    return EXIT_OK


async def _ls(args: argparse.Namespace) -> int:
    selection = TaskFilter(
        app_id=args.app_id, task_types=args.task_types, statuses=args.statuses, user_id=args.user_id
    )
    async with Taskmill(args.url) as tm:
        tasks = await tm.query(selection, limit=args.limit, newest_first=True)
    if args.json:
        _print_json([to_dict(t) for t in tasks])
        return EXIT_OK
    now = utcnow()
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, justify in (
        ("id", "left"),
        ("type", "left"),
        ("app", "left"),
        ("status", "left"),
        ("priority", "right"),
        ("attempts", "right"),
        ("progress", "right"),
        ("age", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("error", overflow="ellipsis", no_wrap=True, max_width=60)
    for task in tasks:
        table.add_row(
            _short(task.id),
            Text(task.task_type),
            Text(task.app_id or "-"),
            _status_text(task.status),
            _priority_name(task.priority),
            f"{task.attempts}/{task.max_retries + 1}",
            _pct(task),
            _age(task.created_at, now),
            Text(_truncate(task.error, 60), style="red"),
        )
    console = _console()
    if tasks:
        console.print(table)
    else:
        console.print("no tasks")
    return EXIT_OK


async def _show(args: argparse.Namespace) -> int:
    async with Taskmill(args.url) as tm:
        task = await _find_task(tm, args.task_id)
        attempts = await tm.attempts(task.id)
    if args.json:
        _print_json(
            {
                "task": to_dict(task),
                "attempts": [dict(to_dict(a), elapsed_ms=a.elapsed_ms) for a in attempts],
            }
        )
        return EXIT_OK
    console = _console()
    console.print(_task_fields(task))
    if attempts:
        console.print(_attempt_log(attempts))
    else:
        console.print("no attempts yet")
    return EXIT_OK


def _task_fields(task: Task) -> Table:
    """Every field of ``task``, one per row."""
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False, show_edge=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for field in attrs.fields(Task):
        value = getattr(task, field.name)
        cell: Text
        if field.name == "status":
            cell = _status_text(value)
        elif field.name == "priority":
            name = _priority_name(value)
            cell = Text(str(value) if name == str(value) else f"{value} ({name})")
        elif field.name == "progress" and value == Progress():
            cell = Text("-", style="dim")
        elif field.name == "progress":
            pct = value.pct
            total = "?" if value.total is None else f"{value.total:g}"
            shown = f"{value.done:g}/{total}" + ("" if pct is None else f" ({pct:.0f}%)")
            cell = Text(shown + (f" {value.message}" if value.message else ""))
        elif isinstance(value, datetime):
            cell = Text(_when(value))
        elif field.name in ("params", "data") or (field.name == "result" and value is not None):
            cell = Text(json.dumps(value, ensure_ascii=False))
        elif value is None:
            cell = Text("-", style="dim")
        elif hasattr(value, "value"):  # enums
            cell = Text(str(value.value))
        else:
            cell = Text(str(value))
        table.add_row(field.name, cell)
    return table


def _attempt_log(attempts: Sequence[Attempt]) -> Table:
    table = Table(
        title="attempts", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False
    )
    table.add_column("#", justify="right")
    table.add_column("outcome")
    table.add_column("started")
    table.add_column("elapsed", justify="right")
    table.add_column("worker", no_wrap=True)
    table.add_column("error", overflow="fold")
    for attempt in attempts:
        table.add_row(
            str(attempt.number),
            attempt.outcome.value,
            _when(attempt.started_at),
            f"{attempt.elapsed_ms:.0f} ms",
            Text(attempt.worker_id),
            Text(attempt.error or "", style="red"),
        )
    return table


async def _retry(args: argparse.Namespace) -> int:
    async with Taskmill(args.url) as tm:
        task = await _find_task(tm, args.task_id)
        task = await tm.retry(task.id)
    print(f"{task.id} {task.status.value}")
    return EXIT_OK


async def _cancel(args: argparse.Namespace) -> int:
    reason = CancelReason(args.reason)
    cascade = not args.no_cascade
    if (args.task_id is None) == (not args.task_types):
        raise TaskmillError("give a TASK_ID or --type (not both)")
    async with Taskmill(args.url) as tm:
        if args.task_id is not None:
            task = await _find_task(tm, args.task_id)
            task = await tm.cancel(task.id, reason=reason, cascade=cascade)
            print(f"{task.id} {task.status.value}")
            return EXIT_OK
        changed = await tm.cancel_by_filter(
            TaskFilter(task_types=tuple(args.task_types), app_id=args.app_id),
            reason=reason,
            cascade=cascade,
        )
    print(f"cancelled {changed} tasks ({reason.value})")
    return EXIT_OK


def _scope_text(task_type: str | None, app_id: str | None) -> str:
    what = f"task type {task_type!r}" if task_type else "all task types"
    return what + (f" of app {app_id!r}" if app_id else "")


async def _suspend(args: argparse.Namespace) -> int:
    async with Taskmill(args.url) as tm:
        interrupted = await tm.suspend(args.task_type, app_id=args.app_id)
    print(
        f"suspended {_scope_text(args.task_type, args.app_id)}; "
        f"{interrupted} running tasks sent back to pending"
    )
    return EXIT_OK


async def _resume(args: argparse.Namespace) -> int:
    async with Taskmill(args.url) as tm:
        existed = await tm.resume(args.task_type, app_id=args.app_id)
    scope = _scope_text(args.task_type, args.app_id)
    if not existed:
        _error(f"no suspension of {scope} is stored (see `taskmill suspensions`)")
        return EXIT_ERROR
    print(f"resumed {scope}")
    return EXIT_OK


async def _suspensions(args: argparse.Namespace) -> int:
    async with Taskmill(args.url) as tm:
        scopes = await tm.suspensions()
    for scope in scopes:
        print(_scope_text(scope.task_type, scope.app_id))
    if not scopes:
        print("no suspensions")
    return EXIT_OK


async def _cleanup(args: argparse.Namespace) -> int:
    async with Taskmill(args.url) as tm:
        deleted = await tm.cleanup(args.older_than, include_failed=args.include_failed)
    print(f"deleted {deleted} tasks")
    return EXIT_OK


async def _migrate(args: argparse.Namespace) -> int:
    # Not through open(): it refuses the older schema this command is there to upgrade.
    tm = Taskmill(args.url, plugins=False)
    try:
        version = await tm.storage.migrate()
    finally:
        await tm.storage.close()
    print(f"schema version {version} ({_redacted(tm.url)})")
    return EXIT_OK


async def _plugins(args: argparse.Namespace) -> int:
    # The plugins do not depend on the storage: list them without touching it.
    tm = Taskmill("memory://")
    tm.load_plugins()
    plugins = list(tm.plugins)
    disabled = list(tm.plugins.disabled)
    if args.json:
        _print_json({"plugins": [_plugin_document(p) for p in plugins], "disabled": disabled})
        return EXIT_OK
    console = _console()
    if plugins:
        console.print(_plugin_table(plugins))
    else:
        console.print(f"no plugins installed (entry-point group {ENTRY_POINT_GROUP})")
    if disabled:
        console.print(f"disabled by {DISABLE_ENV}: {', '.join(disabled)}")
    return EXIT_OK


def _plugin_document(plugin: PluginInfo) -> dict[str, Any]:
    return {
        "name": plugin.name,
        "distribution": plugin.distribution,
        "version": plugin.version,
        "hooks": list(plugin.hooks),
        "handlers": [
            {
                "app_id": h.app_id,
                "task_type": h.task_type,
                "max_retries": h.max_retries,
                "timeout": h.timeout,
                "concurrency": h.concurrency,
            }
            for h in plugin.handlers
        ],
    }


def _plugin_table(plugins: Sequence[PluginInfo]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("plugin", "distribution", "version", "handlers", "hooks"):
        table.add_column(name, no_wrap=name != "hooks")
    for plugin in plugins:
        handlers = [
            h.task_type if h.app_id is None else f"{h.app_id}/{h.task_type}"
            for h in plugin.handlers
        ]
        table.add_row(
            Text(plugin.name),
            Text(plugin.distribution or "(added in code)"),
            Text(plugin.version or "-"),
            Text("\n".join(handlers) or "-"),
            Text(", ".join(h.removeprefix("taskmill_") for h in plugin.hooks)),
        )
    return table


async def _stats(args: argparse.Namespace) -> int:
    base = TaskFilter(app_id=args.app_id, user_id=args.user_id)
    scopes: list[tuple[str, TaskFilter]] = [
        (task_type, attrs.evolve(base, task_types=(task_type,)))
        for task_type in dict.fromkeys(args.task_types or ())
    ]
    if len(scopes) != 1:
        scopes.append(
            ("all" if not scopes else "total", attrs.evolve(base, task_types=args.task_types))
        )
    async with Taskmill(args.url) as tm:
        summaries = [(name, await tm.progress_summary(scope)) for name, scope in scopes]
    if args.json:
        _print_json({name: dict(to_dict(s), pct=s.pct) for name, s in summaries})
        return EXIT_OK
    _console().print(_summary_table(summaries))
    return EXIT_OK


def _summary_table(summaries: Sequence[tuple[str, ProgressSummary]]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("tasks", no_wrap=True)
    for name in ("total", "pending", "running", "completed", "failed", "cancelled", "done"):
        table.add_column(name, justify="right")
    for name, s in summaries:
        table.add_row(
            Text(name),
            str(s.total),
            str(s.pending),
            str(s.running),
            str(s.completed),
            str(s.failed),
            str(s.cancelled),
            f"{s.pct:.0f}%",
        )
    return table


# -- the demo -----------------------------------------------------------------------


@attrs.frozen
class _TypeTally:
    """What the demo summary says about one task type."""

    task_type: str
    tasks: int
    completed: int
    failed: int
    unfinished: int
    retries: int
    mean_attempt_seconds: float | None


async def _demo(args: argparse.Namespace) -> int:
    run = f"demo-{uuid.uuid4().hex[:8]}"
    console = _console()
    _quiet_worker_logs(console)
    tm = Taskmill(args.url)
    # Plugins first: without a demo plugin there is nothing to do, and no database to
    # create. The run's tasks carry its id as user_id: everything below counts only
    # them, so tasks an earlier run left in the same database do not skew the numbers.
    tm.load_plugins()
    found = await tm.plugins.demo_workload(args.tasks, run, uuid.uuid4().int)
    if found is None:
        raise TaskmillError(_no_demo_plugin(tm))
    workload, plugin = found
    async with tm:
        console.print(
            Text.assemble(
                "taskmill demo ",
                (run, "bold"),
                f": {len(workload)} tasks of {plugin.label} on {_redacted(tm.url)}, "
                f"{args.concurrency} worker slots",
            )
        )
        await tm.enqueue_many(workload)
        run_filter = TaskFilter(user_id=run)
        worker = tm.worker(
            concurrency=args.concurrency,
            progress_interval=0.2,
            poll_interval=0.25,
            shutdown_grace=5.0,
        )
        elapsed = await _run_with_live_view(tm, worker, run_filter, console)
        tasks = await tm.query(run_filter, limit=len(workload))
        logs = await asyncio.gather(*(tm.attempts(t.id) for t in tasks))
    tallies = _demo_tallies(_task_types(plugin, workload), tasks, logs)
    console.print(_demo_summary(tallies, elapsed))
    url_option = "" if tm.url == DEFAULT_URL else f" --url {_redacted(tm.url)}"
    console.print(Text(f"list this run's tasks: taskmill{url_option} ls --user-id {run}"))
    for task in tasks:
        if task.status is TaskStatus.FAILED:
            console.print(
                Text(
                    f"{task.task_type} {_short(task.id)} failed: {_truncate(task.error, 80)}\n"
                    f"  inspect it: taskmill{url_option} show {_short(task.id)}\n"
                    f"  redrive it: taskmill{url_option} retry {_short(task.id)}"
                )
            )
    unfinished = sum(t.unfinished for t in tallies)
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


def _no_demo_plugin(tm: Taskmill) -> str:
    if "demo" in tm.plugins.disabled:
        return (
            f"taskmill demo runs the tasks of the taskmill-demo plugin, which {DISABLE_ENV} "
            "disables; take 'demo' out of it"
        )
    return (
        "taskmill demo runs the tasks of the taskmill-demo plugin, which is not installed "
        "(no installed plugin implements taskmill_demo_workload); install it with: "
        "pip install taskmill-demo"
    )


def _task_types(plugin: PluginInfo, workload: Sequence[TaskSpec]) -> list[str]:
    """The workload's task types: the plugin's handlers' order, then any others."""
    used = {spec.task_type for spec in workload}
    ordered = [h.task_type for h in plugin.handlers] + [s.task_type for s in workload]
    return [t for t in dict.fromkeys(ordered) if t in used]


async def _run_with_live_view(
    tm: Taskmill, worker: Worker, run_filter: TaskFilter, console: Console
) -> float:
    """Run ``worker`` until idle (or a signal) while a live display, refreshed from the
    store a few times a second, shows the tasks ``run_filter`` selects. Returns the
    seconds it ran."""
    started = time.monotonic()
    running_filter = attrs.evolve(run_filter, statuses=(TaskStatus.RUNNING,))
    with Live(console=console, auto_refresh=False, transient=False) as live:

        async def refresh(*, final: bool = False) -> None:
            running = await tm.query(running_filter, limit=worker.concurrency * 2)
            summary = await tm.progress_summary(run_filter)
            elapsed = time.monotonic() - started
            live.update(_demo_view(summary, running, elapsed, final=final), refresh=True)

        async def keep_refreshing() -> None:
            while True:
                await refresh()
                await asyncio.sleep(0.25)

        refresher = asyncio.create_task(keep_refreshing())
        try:
            await worker.run_until_idle()
        finally:
            refresher.cancel()
            await asyncio.gather(refresher, return_exceptions=True)
        await refresh(final=True)
    if not console.is_terminal:
        console.line()  # on a pipe, Live leaves its last frame unterminated
    console.line()
    return time.monotonic() - started


def _quiet_worker_logs(console: Console) -> None:
    """Log through the live display, and only errors: the demo's failing attempts are
    expected and show up in its summary instead."""
    handler = RichHandler(console=console, show_path=False)
    logger = logging.getLogger("taskmill")
    logger.addHandler(handler)
    logger.setLevel(logging.ERROR)
    logger.propagate = False


def _demo_view(
    summary: ProgressSummary, running: Sequence[Task], elapsed: float, *, final: bool = False
) -> RenderableType:
    """The live display: an overall bar, then one row per running task (``final``: the
    last frame, drawn after the worker stopped)."""
    overall = Table.grid(padding=(0, 1))
    overall.add_row(
        ProgressBar(total=max(summary.total, 1), completed=summary.finished, width=40),
        Text(f"{summary.finished}/{summary.total} done", style="bold"),
        Text(f"{summary.completed} completed", style="green"),
        Text(f"{summary.failed} failed", style="red"),
        Text(f"{summary.running} running", style="cyan"),
        Text(f"{summary.pending} pending", style="yellow"),
        Text(f"{elapsed:.1f}s", style="dim"),
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("task", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("priority", no_wrap=True)
    table.add_column("attempt", justify="right")
    table.add_column("progress", no_wrap=True)
    table.add_column("%", justify="right")
    table.add_column("message", no_wrap=True, overflow="ellipsis", max_width=44)
    for task in sorted(running, key=lambda t: (t.started_at or t.created_at, t.id)):
        progress = task.progress
        table.add_row(
            _short(task.id),
            Text(task.task_type),
            _priority_name(task.priority),
            str(task.attempts),
            # No total yet (the handler has not reported): an empty bar, not a guess.
            ProgressBar(
                total=progress.total or 1,
                completed=progress.done if progress.total else 0,
                width=24,
            ),
            _pct(task),
            Text(progress.message or ""),
        )
    if not running:
        if summary.finished == summary.total:
            state = "all tasks finished"
        elif final:
            state = f"stopped with {summary.total - summary.finished} tasks unfinished"
        else:
            state = "waiting for retries to come due"
        return Group(overall, Text(state, style="dim"))
    return Group(overall, table)


def _demo_tallies(
    task_types: Sequence[str], tasks: Sequence[Task], logs: Sequence[Sequence[Attempt]]
) -> list[_TypeTally]:
    """Per task type of the run, in the order given: outcomes, retries and mean attempt
    time.

    ``logs`` holds each task's attempt log, in the order of ``tasks``.
    """
    tallies = []
    for task_type in task_types:
        mine = [(t, log) for t, log in zip(tasks, logs, strict=True) if t.task_type == task_type]
        if not mine:
            continue
        times = [a.elapsed_ms / 1000 for _, log in mine for a in log]
        tallies.append(
            _TypeTally(
                task_type=task_type,
                tasks=len(mine),
                completed=sum(t.status is TaskStatus.COMPLETED for t, _ in mine),
                failed=sum(t.status is TaskStatus.FAILED for t, _ in mine),
                unfinished=sum(t.status.active for t, _ in mine),
                retries=sum(max(0, t.attempts - 1) for t, _ in mine),
                mean_attempt_seconds=sum(times) / len(times) if times else None,
            )
        )
    return tallies


def _demo_summary(tallies: Sequence[_TypeTally], elapsed: float) -> Table:
    table = Table(
        title=f"summary ({elapsed:.1f}s)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        show_footer=True,
    )
    table.add_column("type", footer="total", no_wrap=True)
    for name, total in (
        ("tasks", sum(t.tasks for t in tallies)),
        ("completed", sum(t.completed for t in tallies)),
        ("failed", sum(t.failed for t in tallies)),
        ("retries", sum(t.retries for t in tallies)),
    ):
        table.add_column(name, footer=str(total), justify="right")
    table.add_column("mean attempt", justify="right")
    for tally in tallies:
        mean = tally.mean_attempt_seconds
        table.add_row(
            Text(tally.task_type),
            str(tally.tasks),
            str(tally.completed),
            Text(str(tally.failed), style="red" if tally.failed else ""),
            str(tally.retries),
            "-" if mean is None else f"{mean:.2f}s",
        )
    return table


if __name__ == "__main__":
    sys.exit(main())
