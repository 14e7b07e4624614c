"""taskmill-demo: sample media-library handlers, and the ``taskmill demo`` command.

A taskmill plugin. Installed, it registers its handlers under the app id ``media``
(through ``taskmill_register_handlers``), so they run only tasks enqueued for that app
and never take a host task type; and it adds ``taskmill demo`` to the command line
(through ``taskmill_register_commands``), which enqueues a sample workload of those
handlers' tasks and runs it with a live progress view.

- :mod:`taskmill_demo.handlers`: the handlers, honest examples of the handler API.
- :mod:`taskmill_demo.workload`: the tasks a run enqueues.
- :mod:`taskmill_demo.command` and :mod:`taskmill_demo.view`: the command and what it
  shows.
"""

from __future__ import annotations

from taskmill import HandlerRegistrar, hookimpl
from taskmill.cli import CommandRegistrar

from taskmill_demo import handlers
from taskmill_demo.command import add_demo
from taskmill_demo.handlers import (
    APP_ID,
    BAD_RECORD_EMAIL,
    FETCH,
    FETCH_MAX_RETRIES,
    OCR,
    SCAN,
    TASK_TYPES,
    THUMBNAIL,
    VALIDATE,
)
from taskmill_demo.workload import workload

__all__ = [
    "APP_ID",
    "BAD_RECORD_EMAIL",
    "FETCH",
    "FETCH_MAX_RETRIES",
    "OCR",
    "SCAN",
    "TASK_TYPES",
    "THUMBNAIL",
    "VALIDATE",
    "taskmill_register_commands",
    "taskmill_register_handlers",
    "workload",
]


@hookimpl
def taskmill_register_handlers(registry: HandlerRegistrar) -> None:
    """Register the demo handlers under the ``media`` app."""
    handlers.register(registry)


@hookimpl
def taskmill_register_commands(commands: CommandRegistrar) -> None:
    """``taskmill demo``."""
    add_demo(commands)
