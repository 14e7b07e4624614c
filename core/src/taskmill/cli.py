"""The ``taskmill`` command line: run workers, enqueue and inspect tasks, run the demo.

``taskmill [--url URL] [--config FILE] COMMAND ...``. Every command reads its settings
(:mod:`taskmill.settings`) from the command line, else ``TASKMILL_*`` variables, else
the configuration file (``taskmill.toml`` or ``[tool.taskmill]`` in ``pyproject.toml``
in the current directory), else the defaults; ``taskmill config`` shows them. With no
URL anywhere the store is ``sqlite:///taskmill.db`` in the current directory, and the
command says so on stderr. Commands that only read (``ls``, ``show``, ``stats``, ...)
never create a store: on a store that does not exist they say so and how to pick one.

Every command is synchronous: it returns once its work is done. Exit status: 0 on
success, 1 when a named task does not exist, 2 for any other error (a bad argument or
a :class:`~taskmill.TaskmillError`, printed as ``error: <message>`` without a
traceback), 130 when Ctrl-C interrupts a command. ``taskmill worker`` exits 0 after a
graceful stop (the first SIGTERM or SIGINT: every task finished or was released back to
pending) and 128 + the signal's number (130 for SIGINT, 143 for SIGTERM) when a second
signal forced the stop.

Commands load the installed plugins (``taskmill plugins`` lists them), so a worker runs
the handlers of every installed handler plugin. A plugin that cannot be loaded stops
the commands that run or enqueue tasks, and is left out, with a warning, by those that
only read. Handler modules (``--import MODULE``, or the ``imports`` setting) expose
``register(tm: Taskmill) -> None``, which registers more handlers on the ``Taskmill``
the command built.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from datetime import UTC, datetime, timedelta
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
from taskmill.errors import StorageUnavailable, TaskmillError, TaskNotFound
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
from taskmill.operations import handler_hint, unserved_type_message
from taskmill.plugins import ENTRY_POINT_GROUP, BrokenPlugin, PluginInfo, add_plugin_commands
from taskmill.registry import Handler
from taskmill.serialization import to_dict
from taskmill.settings import (
    COMMAND_LINE,
    CONFIG_ENV,
    DEFAULT,
    ENV_VARS,
    HOST_APP,
    LOG_FORMATS,
    LOG_LEVELS,
    SETTING_NAMES,
    Settings,
    find_config_file,
    load_settings,
    parse_seconds,
    parse_setting,
    setting_doc,
)
from taskmill.storage import utcnow
from taskmill.supervisor import Supervisor
from taskmill.worker import Worker

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

Command = Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``taskmill`` command line with ``argv`` (default: ``sys.argv[1:]``) and
    return the exit status."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    command: Command = args.command
    try:
        settings = load_settings(_command_line_settings(args), config_file=args.config)
        if command is not _demo:
            _configure_logging(settings)
        return asyncio.run(command(args, settings))
    except TaskNotFound as exc:
        _error(str(exc))
        return EXIT_NOT_FOUND
    except TaskmillError as exc:
        _error(str(exc))
        return EXIT_ERROR
    except KeyboardInterrupt:
        # A driver's half-open connection, abandoned by the interrupt, can report
        # "Future exception was never retrieved" when it is collected: noise, not news.
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        _error("interrupted")
        return EXIT_INTERRUPTED


_messages = logging.getLogger("taskmill.cli")


def _tell(level: int, prefix: str, message: str) -> None:
    """A message for the user on stderr: ``prefix: message``, or, when the log is
    JSON lines, a log record like every other line there."""
    if any(
        h.get_name() == _LOG_HANDLER and isinstance(h.formatter, _JsonLines)
        for h in logging.getLogger().handlers
    ):
        _messages.log(level, message)
    else:
        print(f"{prefix}{message}", file=sys.stderr)


def _error(message: str) -> None:
    _tell(logging.ERROR, "error: ", message)


def _note(message: str) -> None:
    _tell(logging.INFO, "note: ", message)


def _warn(message: str) -> None:
    _tell(logging.WARNING, "warning: ", message)


def _progress_line(message: str) -> None:
    """A line about what a command is doing (a worker starting or stopping)."""
    _tell(logging.INFO, "", message)


# -- argument parsing ---------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every ``taskmill`` command."""
    parser = argparse.ArgumentParser(
        prog="taskmill",
        description="Durable background tasks: run workers, enqueue and inspect tasks.",
        epilog=f"The storage URL comes from --url, else $TASKMILL_URL, else the url setting "
        f"of the configuration file, else {DEFAULT_URL}. `taskmill config` shows every "
        "setting and where it came from; docs/configuration.md describes them.",
    )
    _add_global_options(parser, default=None)
    # The global options are accepted after the command too; SUPPRESS keeps the ones
    # given before it otherwise.
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, default=argparse.SUPPRESS)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    def add(
        name: str, command: Command, summary: str, description: str = ""
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            parents=[common],
            help=summary,
            description=f"{summary} {description}".strip(),
        )
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
        "--concurrency",
        dest="demo_concurrency",
        type=_positive_int,
        default=8,
        metavar="N",
        help="worker slots (default 8)",
    )

    cmd = add(
        "worker",
        _worker,
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
    _add_setting(cmd, "--concurrency", "concurrency", "N", "tasks run at once")
    _add_setting(
        cmd,
        "--processes",
        "processes",
        "N",
        "run N worker processes, each with --concurrency slots, under a supervisor that "
        "forwards SIGINT/SIGTERM and restarts a process that dies (default 1)",
    )
    _add_setting(
        cmd,
        "--reserved-high",
        "reserved_high_priority_slots",
        "N",
        "slots only tasks of priority >= user_action may take (default: 1 when "
        "--concurrency is more than 1, else 0; so --concurrency 2 runs one normal task "
        "at a time); at most concurrency - 1",
    )
    cmd.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once no task of this worker's types is due soon, then report pending "
        "tasks no handler of this worker serves",
    )
    _add_setting(
        cmd,
        "--lease",
        "lease_seconds",
        "SECONDS",
        "lease length; a crashed worker's tasks run again after it",
    )
    _add_setting(
        cmd,
        "--shutdown-grace",
        "shutdown_grace",
        "SECONDS",
        "on SIGTERM/SIGINT, how long running tasks may finish before they are put back to pending",
    )
    _add_setting(
        cmd, "--poll-interval", "poll_interval", "SECONDS", "longest wait between polls when idle"
    )
    _add_setting(
        cmd,
        "--cancel-check-interval",
        "cancel_check_interval",
        "SECONDS",
        "how often running tasks are checked for cancel requests",
    )
    cmd.add_argument(
        "--task-type",
        dest="task_types",
        action="append",
        default=None,
        metavar="TYPE",
        help="claim only tasks of this type; repeatable (default: every type with a handler)",
    )
    cmd.add_argument(
        "--app-id",
        dest="app_ids",
        action="append",
        default=None,
        metavar="APP",
        help=f"claim only with the handlers of this app ({HOST_APP}: the host's own "
        "handlers); repeatable (default: all)",
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
    _add_handler_options(
        cmd,
        purpose="so that the task gets its handler's max_retries and no warning says "
        "that no handler serves it",
    )

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
        "registered; then the plugins that are disabled or failed to load.",
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
    _add_handler_options(cmd, purpose="to count pending tasks no handler serves")

    cmd = add(
        "config",
        _config,
        "Print the effective settings and where each came from (command line, "
        "environment variable, configuration file or default).",
    )
    cmd.add_argument("--json", action="store_true", help="print the settings as JSON")
    add_plugin_commands(add)  # taskmill_register_commands: e.g. `serve` (taskmill-http)
    return parser


def _add_global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--url",
        default=default,
        help=f"storage URL (default: $TASKMILL_URL, else the configuration file's url, "
        f"else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--config",
        default=default,
        metavar="FILE",
        help=f"the configuration file (default: ${CONFIG_ENV}, else taskmill.toml, else "
        "[tool.taskmill] of pyproject.toml, in the current directory)",
    )
    parser.add_argument(
        "--log-level",
        dest="log_level",
        default=default,
        type=_setting_type("log_level"),
        metavar="LEVEL",
        help=f"{'/'.join(LOG_LEVELS).lower()} (default info)",
    )
    parser.add_argument(
        "--log-format",
        dest="log_format",
        default=default,
        type=_setting_type("log_format"),
        metavar="FORMAT",
        help=f"{' or '.join(LOG_FORMATS)}: one JSON object per line (default plain)",
    )


def _setting_type(name: str) -> Callable[[str], Any]:
    """An argparse ``type`` that reads setting ``name`` like its variable is read."""

    def parse(text: str) -> Any:
        try:
            return parse_setting(name, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _add_setting(
    cmd: argparse.ArgumentParser, flag: str, name: str, metavar: str, text: str
) -> None:
    default = getattr(Settings(), name)
    shown = "" if default is None or "default" in text else f" (default {default:g})"
    cmd.add_argument(
        flag,
        dest=name,
        type=_setting_type(name),
        default=None,
        metavar=metavar,
        help=f"{text}{shown}; also {ENV_VARS[name]}",
    )


def _add_handler_options(cmd: argparse.ArgumentParser, purpose: str = "") -> None:
    suffix = f", {purpose}" if purpose else ""
    cmd.add_argument(
        "--import",
        dest="imports",
        action="extend",
        nargs="+",
        default=None,
        metavar="MODULE",
        help=f"import MODULE and call its register(tm) to register handlers{suffix}; "
        "repeatable (default: the imports setting)",
    )


def _command_line_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gave (None: not given)."""
    given: dict[str, Any] = {}
    for name in SETTING_NAMES:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name == "app_ids":
            value = parse_setting(name, ",".join(value))
        elif name == "task_types" and args.command is _worker:
            value = tuple(dict.fromkeys(value))
        elif name == "task_types":
            continue  # ls/stats/cancel --type is a filter of that command, not a setting
        elif name == "imports":
            value = tuple(dict.fromkeys(value))
        given[name] = value
    return given


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


def _duration(text: str) -> timedelta:
    try:
        seconds = parse_seconds(text)
    except (ValueError, IndexError):
        seconds = -1.0
    if seconds < 0:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r}; use seconds or a number with s, m, h, d or w"
        )
    return timedelta(seconds=seconds)


# -- logging ------------------------------------------------------------------------


class _JsonLines(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, and
    the traceback as ``exc`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def _configure_logging(settings: Settings) -> None:
    """Log to stderr at the configured level, as plain lines or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(_JsonLines())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.set_name(_LOG_HANDLER)
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == _LOG_HANDLER:  # an earlier main() in this process
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.log_level)


_LOG_HANDLER = "taskmill-cli"


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


def _new_taskmill(settings: Settings, *, plugins: bool = True) -> Taskmill:
    """The ``Taskmill`` the settings describe (not open, no plugins loaded yet)."""
    tm = Taskmill(settings.url, plugins=plugins, **settings.taskmill_options())
    if settings.source("url") == DEFAULT:
        default_file = os.path.abspath(DEFAULT_URL.removeprefix("sqlite:///"))
        _note(
            f"using the default store {DEFAULT_URL} ({default_file}): no --url, "
            "$TASKMILL_URL or url setting names one"
        )
    return tm


def _load_plugins(tm: Taskmill, settings: Settings, *, strict: bool) -> None:
    """Load the plugins the settings allow; ``strict`` False leaves out a plugin that
    cannot be loaded, with a warning, instead of failing the command."""
    tm.load_plugins(
        strict=strict,
        enable=settings.enable_plugins,
        disable=settings.disable_plugins,
        enable_from=_origin(settings, "enable_plugins"),
        disable_from=_origin(settings, "disable_plugins"),
    )


def _origin(settings: Settings, name: str) -> str:
    """How messages name where setting ``name`` came from."""
    source = settings.source(name)
    if source == DEFAULT:
        return f"the default {name}"
    if source == COMMAND_LINE:
        return f"the command line's {name}"
    if source == ENV_VARS.get(name):
        return source
    return f"{name} in {source}"


@contextlib.asynccontextmanager
async def _open(
    settings: Settings,
    command: str,
    *,
    reads: bool,
    handlers: bool = False,
    strict_plugins: bool = True,
) -> AsyncIterator[Taskmill]:
    """The open ``Taskmill`` of a command, closed afterwards.

    :param reads: the command only works on tasks already stored: a store that does not
        exist is an error that says how to pick one, never created empty.
    :param handlers: import the handler modules of the ``imports`` setting.
    :param strict_plugins: a plugin that cannot be loaded fails the command (False:
        it is left out with a warning).
    """
    tm = _new_taskmill(settings)
    if handlers:
        _load_handlers(tm, settings.imports)
    _load_plugins(tm, settings, strict=strict_plugins)
    if reads and not await tm.storage.exists():
        raise StorageUnavailable(_no_store(tm, settings, command))
    async with tm:
        yield tm


def _no_store(tm: Taskmill, settings: Settings, command: str) -> str:
    source = settings.source("url")
    if source == DEFAULT:
        where = f"{DEFAULT_URL} ({os.path.abspath(DEFAULT_URL.removeprefix('sqlite:///'))})"
    else:
        where = f"{_redacted(tm.url)} (from {'--url' if source == COMMAND_LINE else source})"
    return (
        f"there is no taskmill store at {where}; `taskmill {command}` only reads and does "
        "not create one. Pick the store with --url URL, $TASKMILL_URL or the url setting "
        f"of {CONFIG_FILE_HINT} (`taskmill config` shows the settings), or create this "
        "one with `taskmill migrate`"
    )


CONFIG_FILE_HINT = "taskmill.toml"


def _label(key: tuple[str | None, str]) -> str:
    app_id, task_type = key
    return task_type if app_id is None else f"{app_id}/{task_type}"


async def _pending_of(tm: Taskmill, pending: TaskFilter, app_id: str | None, task_type: str) -> int:
    """Pending tasks of ``task_type`` (of ``app_id``; None: of every app) within
    ``pending``."""
    if pending.task_types is not None and task_type not in pending.task_types:
        return 0
    if app_id is not None and pending.app_id not in (None, app_id):
        return 0
    scope = attrs.evolve(pending, task_types=(task_type,), app_id=app_id or pending.app_id)
    return (await tm.progress_summary(scope)).pending


_UNSERVED_SCAN = 5000
"""How many pending tasks are read, at most, to name the types no handler serves."""


async def _unserved_pending(
    tm: Taskmill, served: Sequence[Handler], scope: TaskFilter
) -> tuple[int, Counter[tuple[str | None, str]], bool]:
    """Pending tasks within ``scope`` that none of the ``served`` handlers would run.

    :returns: how many there are (counted by the store), their ``(app_id,
        task_type)`` keys with counts among the first pending tasks read, and whether
        those counts cover them all.
    """
    pending = attrs.evolve(scope, statuses=(TaskStatus.PENDING,))
    total = (await tm.progress_summary(pending)).pending
    if not total:
        return 0, Counter(), True
    served_keys = {h.key for h in served}
    app_keys = [h.key for h in tm.registry if h.app_id is not None]
    count = 0
    for app_id, task_type in served_keys:
        count += await _pending_of(tm, pending, app_id, task_type)
        if app_id is None:
            # An app with a handler of its own for the type is not served by the
            # host's: its tasks count only when that handler is served (above).
            for other, same in app_keys:
                if same == task_type:
                    count -= await _pending_of(tm, pending, other, same)
    unserved = total - count
    keys: Counter[tuple[str | None, str]] = Counter()
    if unserved <= 0:
        return 0, keys, True
    read = 0
    while read < min(total, _UNSERVED_SCAN):
        page = await tm.query(pending, limit=500, offset=read)
        if not page:
            break
        read += len(page)
        for task in page:
            handler = tm.registry.lookup(task.app_id, task.task_type)
            if handler is None or handler.key not in served_keys:
                keys[(task.app_id, task.task_type)] += 1
    return unserved, keys, read >= total


async def _report_unserved(
    tm: Taskmill, served: Sequence[Handler], scope: TaskFilter, whose: str
) -> None:
    """Say on stderr how many pending tasks no handler of ``whose`` serves, and of
    which types (with close matches among the handlers' types)."""
    unserved, keys, complete = await _unserved_pending(tm, served, scope)
    if not unserved:
        return
    parts = []
    for (app_id, task_type), n in keys.most_common(10):
        name = repr(task_type) + ("" if app_id is None else f" of app {app_id!r}")
        hint = handler_hint(served, app_id, task_type)
        count = f"{n}{'' if complete else '+'} task{'' if n == 1 and complete else 's'}"
        parts.append(f"{name} ({count}{'; ' + hint if hint else ''})")
    types = f": {', '.join(parts)}" if parts else ""
    _warn(
        f"{unserved} pending task{'' if unserved == 1 else 's'} of types no handler "
        f"{whose} serves{types}; they wait for a worker with handlers for them "
        "(installed plugins, --import modules or the imports setting)"
    )


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


async def _worker(args: argparse.Namespace, settings: Settings) -> int:
    if settings.processes > 1:
        return await _supervise(args, settings)
    async with _open(settings, "worker", reads=False, handlers=True) as tm:
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
                f"handlers are: {', '.join(sorted(_label(h.key) for h in tm.registry))}"
            )
        reserved = worker.reserved_high_priority_slots
        slots = f"concurrency {worker.concurrency}"
        if reserved:
            slots += f" ({reserved} reserved for priority >= user_action)"
        _progress_line(
            f"worker {worker.worker_id} on {_redacted(tm.url)}: {slots}, handlers: "
            f"{', '.join(sorted(_label(h.key) for h in served))}"
        )
        if args.until_idle:
            await worker.run_until_idle()
        else:
            await worker.run()
        attempts = f"{worker.processed} attempt{'' if worker.processed == 1 else 's'}"
        _progress_line(f"worker {worker.worker_id} stopped after {attempts}")
        if args.until_idle and worker.stop_signal is None:
            await _report_unserved(tm, served, TaskFilter(), "of this worker")
    if worker.forced and worker.stop_signal is not None:
        return 128 + int(worker.stop_signal)
    return EXIT_OK


async def _supervise(args: argparse.Namespace, settings: Settings) -> int:
    """``worker --processes N``: check the worker can start here once, then run N
    single-process copies of this command under a :class:`Supervisor`."""
    async with _open(settings, "worker", reads=False, handlers=True) as tm:
        if not len(tm.registry):
            raise TaskmillError(
                "no handlers to run: pass --import MODULE (a module with a register(tm) "
                "function), set the imports setting, or install a handler plugin (see "
                "`taskmill plugins`)"
            )
        try:
            tm.worker(**settings.worker_options())
        except ValueError as exc:
            raise TaskmillError(str(exc)) from None
        where = _redacted(tm.url)
    base = settings.worker_id

    def child_environ(number: int) -> dict[str, str]:
        return {} if base is None else {ENV_VARS["worker_id"]: f"{base}-{number}"}

    supervisor = Supervisor(
        [sys.executable, "-m", "taskmill", *args.argv, "--processes", "1"],
        settings.processes,
        until_idle=args.until_idle,
        child_environ=child_environ,
    )
    _progress_line(f"supervisor {os.getpid()} on {where}: {settings.processes} worker processes")
    status = await supervisor.run()
    if supervisor.gave_up:
        raise TaskmillError(
            "a worker process kept dying right after its start (its errors are above); "
            "the supervisor stopped the others"
        )
    _progress_line(
        f"supervisor {os.getpid()} stopped ({supervisor.restarts} restart"
        f"{'' if supervisor.restarts == 1 else 's'})"
    )
    return status


async def _enqueue(args: argparse.Namespace, settings: Settings) -> int:
    async with _open(settings, "enqueue", reads=False, handlers=True) as tm:
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
        if tm.registry.lookup(task.app_id, task.task_type) is None:
            _warn(
                f"{unserved_type_message(tm.registry, task.app_id, task.task_type)}. The "
                "task is stored and stays pending until a worker with a handler for it "
                "runs (handlers come from installed plugins, --import modules or the "
                "imports setting)"
            )
    if args.json:
        _print_json(to_dict(task))
    else:
        print(task.id)
    if task.alias_of is not None:
        _note(
            f"an active task holds dedupe key {task.dedupe_key!r}; this task is "
            f"an alias of {task.alias_of} and takes its outcome"
        )
    return EXIT_OK


async def _ls(args: argparse.Namespace, settings: Settings) -> int:
    selection = TaskFilter(
        app_id=args.app_id, task_types=args.task_types, statuses=args.statuses, user_id=args.user_id
    )
    async with _open(settings, "ls", reads=True, strict_plugins=False) as tm:
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


async def _show(args: argparse.Namespace, settings: Settings) -> int:
    async with _open(settings, "show", reads=True, strict_plugins=False) as tm:
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


async def _retry(args: argparse.Namespace, settings: Settings) -> int:
    async with _open(settings, "retry", reads=True) as tm:
        task = await _find_task(tm, args.task_id)
        task = await tm.retry(task.id)
    print(f"{task.id} {task.status.value}")
    return EXIT_OK


async def _cancel(args: argparse.Namespace, settings: Settings) -> int:
    reason = CancelReason(args.reason)
    cascade = not args.no_cascade
    if (args.task_id is None) == (not args.task_types):
        raise TaskmillError("give a TASK_ID or --type (not both)")
    async with _open(settings, "cancel", reads=True) as tm:
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


async def _suspend(args: argparse.Namespace, settings: Settings) -> int:
    async with _open(settings, "suspend", reads=False) as tm:
        interrupted = await tm.suspend(args.task_type, app_id=args.app_id)
    print(
        f"suspended {_scope_text(args.task_type, args.app_id)}; "
        f"{interrupted} running tasks sent back to pending"
    )
    return EXIT_OK


async def _resume(args: argparse.Namespace, settings: Settings) -> int:
    async with _open(settings, "resume", reads=True) as tm:
        existed = await tm.resume(args.task_type, app_id=args.app_id)
    scope = _scope_text(args.task_type, args.app_id)
    if not existed:
        _error(f"no suspension of {scope} is stored (see `taskmill suspensions`)")
        return EXIT_ERROR
    print(f"resumed {scope}")
    return EXIT_OK


async def _suspensions(args: argparse.Namespace, settings: Settings) -> int:
    async with _open(settings, "suspensions", reads=True, strict_plugins=False) as tm:
        scopes = await tm.suspensions()
    for scope in scopes:
        print(_scope_text(scope.task_type, scope.app_id))
    if not scopes:
        print("no suspensions")
    return EXIT_OK


async def _cleanup(args: argparse.Namespace, settings: Settings) -> int:
    async with _open(settings, "cleanup", reads=True) as tm:
        deleted = await tm.cleanup(args.older_than, include_failed=args.include_failed)
    print(f"deleted {deleted} tasks")
    return EXIT_OK


async def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    # Not through open(): it refuses the older schema this command is there to upgrade.
    tm = _new_taskmill(settings, plugins=False)
    try:
        version = await tm.storage.migrate()
    finally:
        await tm.storage.close()
    print(f"schema version {version} ({_redacted(tm.url)})")
    return EXIT_OK


async def _plugins(args: argparse.Namespace, settings: Settings) -> int:
    # The plugins do not depend on the storage: list them without touching it.
    tm = Taskmill("memory://")
    _load_plugins(tm, settings, strict=False)
    plugins = list(tm.plugins)
    listed = tm.plugins
    if args.json:
        _print_json(
            {
                "plugins": [_plugin_document(p) for p in plugins],
                "disabled": list(listed.disabled),
                "not_enabled": list(listed.not_enabled),
                "broken": [attrs.asdict(b) for b in listed.broken],
                "unmatched": list(listed.unmatched),
            }
        )
        return EXIT_OK
    console = _console()
    if plugins:
        console.print(_plugin_table(plugins))
    elif not listed.broken:
        console.print(f"no plugins loaded (entry-point group {ENTRY_POINT_GROUP})")
    if listed.broken:
        console.print(_broken_table(listed.broken))
    if listed.disabled:
        console.print(
            f"disabled by {_origin(settings, 'disable_plugins')}: {', '.join(listed.disabled)}"
        )
    if listed.not_enabled:
        console.print(
            f"not enabled by {_origin(settings, 'enable_plugins')}: {', '.join(listed.not_enabled)}"
        )
    return EXIT_OK


def _broken_table(broken: Sequence[BrokenPlugin]) -> Table:
    table = Table(
        title="failed to load",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
    )
    for name in ("plugin", "distribution", "version", "error"):
        table.add_column(name, no_wrap=name != "error", overflow="fold")
    for plugin in broken:
        table.add_row(
            Text(plugin.name),
            Text(plugin.distribution or "-"),
            Text(plugin.version or "-"),
            Text(plugin.error, style="red"),
        )
    return table


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


async def _stats(args: argparse.Namespace, settings: Settings) -> int:
    base = TaskFilter(app_id=args.app_id, user_id=args.user_id)
    scopes: list[tuple[str, TaskFilter]] = [
        (task_type, attrs.evolve(base, task_types=(task_type,)))
        for task_type in dict.fromkeys(args.task_types or ())
    ]
    if len(scopes) != 1:
        scopes.append(
            ("all" if not scopes else "total", attrs.evolve(base, task_types=args.task_types))
        )
    async with _open(settings, "stats", reads=True, handlers=True, strict_plugins=False) as tm:
        summaries = [(name, await tm.progress_summary(scope)) for name, scope in scopes]
        if args.json:
            _print_json({name: dict(to_dict(s), pct=s.pct) for name, s in summaries})
        else:
            _console().print(_summary_table(summaries))
        sys.stdout.flush()
        await _report_unserved(
            tm,
            list(tm.registry),
            attrs.evolve(base, task_types=args.task_types),
            "loaded here",
        )
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


async def _config(args: argparse.Namespace, settings: Settings) -> int:
    path, how = find_config_file(args.config)
    rows = [
        (name, DEFAULT_URL if name == "url" and value is None else value, source)
        for name, value, source in settings.as_rows()
    ]
    rows = [
        (name, _redacted(value) if name == "url" else value, source) for name, value, source in rows
    ]
    if args.json:
        _print_json(
            {
                "config_file": None if path is None else str(path),
                "config_file_found": how,
                "settings": {
                    name: {
                        "value": list(value) if isinstance(value, tuple) else value,
                        "source": source,
                        "env": ENV_VARS.get(name),
                    }
                    for name, value, source in rows
                },
            }
        )
        return EXIT_OK
    console = _console()
    console.print(Text(f"configuration file: {path or 'none'} ({how})"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("setting", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("from", no_wrap=True)
    table.add_column("meaning", overflow="fold")
    for name, value, source in rows:
        table.add_row(
            Text(name),
            Text(_setting_text(name, value)),
            Text(source, style="dim" if source == DEFAULT else "bold"),
            Text(setting_doc(name) if name in SETTING_NAMES else "storage option", style="dim"),
        )
    console.print(table)
    return EXIT_OK


def _setting_text(name: str, value: Any) -> str:
    if value is None:
        return {"reserved_high_priority_slots": "auto", "rescue_interval": "auto"}.get(
            name, "off" if name == "cleanup_older_than" else "all" if name.endswith("s") else "-"
        )
    if isinstance(value, tuple):
        return ", ".join(HOST_APP if v is None else str(v) for v in value) or "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


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


async def _demo(args: argparse.Namespace, settings: Settings) -> int:
    run = f"demo-{uuid.uuid4().hex[:8]}"
    console = _console()
    _quiet_worker_logs(console)
    tm = _new_taskmill(settings)
    # Plugins first: without a demo plugin there is nothing to do, and no database to
    # create. The run's tasks carry its id as user_id: everything below counts only
    # them, so tasks an earlier run left in the same database do not skew the numbers.
    _load_plugins(tm, settings, strict=True)
    found = await tm.plugins.demo_workload(args.tasks, run, uuid.uuid4().int)
    if found is None:
        raise TaskmillError(_no_demo_plugin(tm, settings))
    workload, plugin = found
    async with tm:
        console.print(
            Text.assemble(
                "taskmill demo ",
                (run, "bold"),
                f": {len(workload)} tasks of {plugin.label} on {_redacted(tm.url)}, "
                f"{args.demo_concurrency} worker slots",
            )
        )
        await tm.enqueue_many(workload)
        run_filter = TaskFilter(user_id=run)
        worker = tm.worker(
            concurrency=args.demo_concurrency,
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


def _no_demo_plugin(tm: Taskmill, settings: Settings) -> str:
    if "demo" in tm.plugins.disabled:
        return (
            "taskmill demo runs the tasks of the taskmill-demo plugin, which "
            f"{_origin(settings, 'disable_plugins')} disables; take 'demo' out of it"
        )
    if "demo" in tm.plugins.not_enabled:
        return (
            "taskmill demo runs the tasks of the taskmill-demo plugin, which "
            f"{_origin(settings, 'enable_plugins')} leaves out; add 'demo' to it"
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
