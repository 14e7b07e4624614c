"""What a command says on stderr besides its output, and how it ends.

The ``error:``, ``warning:`` and ``note:`` lines and a command's progress lines go to
stderr as plain text, or, when the log is JSON lines (``--log-format json``), as log
records like every other line there. The exit statuses are the ones docs/cli.md lists.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from taskmill.settings import Settings

EXIT_OK = 0
"""The command did what it was asked."""
EXIT_NOT_FOUND = 1
"""A task the command names does not exist."""
EXIT_ERROR = 2
"""A bad argument or a :class:`~taskmill.TaskmillError`."""
EXIT_INTERRUPTED = 130
"""Ctrl-C interrupted the command (and ``demo`` stopped with tasks unfinished)."""

LOG_HANDLER = "taskmill-cli"
"""The name of the stderr handler :func:`configure_logging` installs on the root logger."""

_messages = logging.getLogger("taskmill.cli")


def tell(level: int, prefix: str, message: str) -> None:
    """A message for the user on stderr: ``prefix: message``, or, when the log is
    JSON lines, a log record at ``level`` like every other line there."""
    if any(
        h.get_name() == LOG_HANDLER and isinstance(h.formatter, JsonLines)
        for h in logging.getLogger().handlers
    ):
        _messages.log(level, message)
    else:
        print(f"{prefix}{message}", file=sys.stderr)


def error(message: str) -> None:
    """``error: message`` on stderr."""
    tell(logging.ERROR, "error: ", message)


def note(message: str) -> None:
    """``note: message`` on stderr."""
    tell(logging.INFO, "note: ", message)


def warn(message: str) -> None:
    """``warning: message`` on stderr."""
    tell(logging.WARNING, "warning: ", message)


def progress_line(message: str) -> None:
    """A line about what a command is doing (a worker starting or stopping)."""
    tell(logging.INFO, "", message)


class JsonLines(logging.Formatter):
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


def configure_logging(settings: Settings) -> None:
    """Log to stderr at the configured level, as plain lines or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.set_name(LOG_HANDLER)
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == LOG_HANDLER:  # an earlier main() in this process
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.log_level)
