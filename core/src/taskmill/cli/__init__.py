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

The package: :mod:`~taskmill.cli.parser` (the parser and global options),
:mod:`~taskmill.cli.commands` (taskmill's own commands, by group),
:mod:`~taskmill.cli.session` (the ``Taskmill`` a command opens),
:mod:`~taskmill.cli.rendering` (tables and JSON), :mod:`~taskmill.cli.messages`
(``error:``/``warning:`` lines, the log, exit statuses) and
:mod:`~taskmill.cli.arguments` (argument types, for plugin commands too).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from taskmill.cli.arguments import Command
from taskmill.cli.messages import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    configure_logging,
    error,
)
from taskmill.cli.parser import (
    UnknownCommand,
    build_parser,
    command_line_settings,
    config_file_option,
)
from taskmill.errors import TaskmillError, TaskNotFound
from taskmill.settings import Settings, load_settings

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "build_parser",
    "main",
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
