"""The ``taskmill`` command line: run workers, enqueue and inspect tasks.

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
the handlers of every installed handler plugin, and plugins add commands of their own
(``taskmill_register_commands``: ``demo`` comes from taskmill-demo, ``serve`` from
taskmill-http). A plugin that cannot be loaded stops the commands that run or enqueue
tasks, and is left out, with a warning, by those that only read. Handler modules
(``--import MODULE``, or the ``imports`` setting) expose ``register(tm: Taskmill) ->
None``, which registers more handlers on the ``Taskmill`` the command built.

This package's names (``__all__``) are its public API, and all a plugin command needs
to behave like taskmill's own commands (docs/plugins.md, "Adding commands"): the
:class:`CommandRegistrar` it is added through and the :class:`Settings` it runs with;
the ``Taskmill`` its settings describe (:func:`new_taskmill`, :func:`load_plugins`,
:func:`open_taskmill`); argument types that fail with taskmill's messages
(:func:`positive_int`, ...); the stdout :func:`console` and the small formats of
taskmill's tables (:func:`short`, :func:`redacted`, ...); the ``error:``/``warning:``
lines and the exit statuses. Plugins import these from ``taskmill.cli`` only: its
submodules are internal.

The package: :mod:`~taskmill.cli.parser` (the parser and global options),
:mod:`~taskmill.cli.commands` (taskmill's own commands, by group),
:mod:`~taskmill.cli.session` (the ``Taskmill`` a command opens),
:mod:`~taskmill.cli.rendering` (tables and JSON), :mod:`~taskmill.cli.messages`
(``error:``/``warning:`` lines, the log, exit statuses) and
:mod:`~taskmill.cli.arguments` (argument types).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from taskmill.cli.arguments import (
    Command,
    duration,
    json_object,
    non_negative_float,
    non_negative_int,
    positive_int,
    priority,
    status,
)
from taskmill.cli.messages import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    configure_logging,
    error,
    note,
    warn,
)
from taskmill.cli.parser import (
    UnknownCommand,
    build_parser,
    command_line_settings,
    config_file_option,
)
from taskmill.cli.rendering import (
    console,
    pct,
    print_json,
    priority_name,
    redacted,
    short,
    truncate,
)
from taskmill.cli.session import load_plugins, new_taskmill, open_taskmill
from taskmill.discovery import DEFAULT_URL
from taskmill.errors import TaskmillError, TaskNotFound
from taskmill.hookspecs import CommandRegistrar
from taskmill.settings import Settings, load_settings, misspelt_variables

__all__ = [
    "DEFAULT_URL",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "CommandRegistrar",
    "Settings",
    "build_parser",
    "console",
    "duration",
    "error",
    "json_object",
    "load_plugins",
    "main",
    "new_taskmill",
    "non_negative_float",
    "non_negative_int",
    "note",
    "open_taskmill",
    "pct",
    "positive_int",
    "print_json",
    "priority",
    "priority_name",
    "redacted",
    "short",
    "status",
    "truncate",
    "warn",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``taskmill`` command line with ``argv`` (default: ``sys.argv[1:]``) and
    return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(_plugin_settings(argv)).parse_args(argv)
    except UnknownCommand as exc:
        error(str(exc))
        return EXIT_ERROR
    command: Command = args.command
    args.argv = argv  # what a supervisor (worker --processes N) gives its children
    try:
        settings = load_settings(command_line_settings(args), config_file=args.config)
        configure_logging(settings)
        for message in misspelt_variables():
            warn(message)
        # A command may name its event loop (taskmill serve: uvloop when installed).
        with asyncio.Runner(loop_factory=getattr(args, "loop_factory", None)) as runner:
            return runner.run(command(args, settings))
    except TaskNotFound as exc:
        error(str(exc))
        return EXIT_NOT_FOUND
    except TaskmillError as exc:
        error(str(exc))
        return EXIT_ERROR
    except KeyboardInterrupt:
        # A driver's half-open connection, abandoned by the interrupt, can report
        # "Future exception was never retrieved" when it is collected: noise, not news.
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        error("interrupted")
        return EXIT_INTERRUPTED


def _plugin_settings(argv: list[str]) -> Settings | None:
    """The settings the file and the variables give, read before the command line is
    parsed: their plugin lists decide which plugins add commands. None when they cannot
    be read (the command then reports why, once its arguments are parsed)."""
    try:
        return load_settings({}, config_file=config_file_option(argv))
    except TaskmillError:
        return None
