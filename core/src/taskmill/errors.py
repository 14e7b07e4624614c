"""Every error taskmill raises, under one root: :class:`TaskmillError`.

Each subclass's docstring is its default message; raise it with a message that says
what went wrong and what to do about it.
"""

from __future__ import annotations

import logging
import math
import sys


class TaskmillError(Exception):
    """A taskmill operation failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidURL(TaskmillError):
    """The storage URL is not one taskmill can open.

    Use one of: memory://, sqlite:///path/to/file.db, postgresql://..., mysql://...,
    mongodb://...
    """


class BackendNotInstalled(TaskmillError):
    """The storage URL names a backend whose package is not installed."""


class StorageUnavailable(TaskmillError):
    """The storage could not be reached or opened."""


class SchemaVersionError(TaskmillError):
    """The database schema does not match this version of taskmill."""


class InvalidInput(TaskmillError, ValueError):
    """A value taskmill was given is refused; the message names the field, the limit
    and the value (docs/semantics.md, "Limits"). Nothing was stored.

    ``field`` names the refused field when there is one (``"task_type"``,
    ``"params"``, ...), for an HTTP 422 or a form to point at.
    """

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidParams(InvalidInput):
    """Task parameters must be a JSON object of at most the configured size."""

    def __init__(self, message: str | None = None, *, field: str | None = "params") -> None:
        super().__init__(message, field=field)


class InvalidTaskSpec(InvalidInput):
    """A task's options are inconsistent or out of range (see the message)."""


class DuplicateTaskId(InvalidTaskSpec):
    """A task with this id is already stored with a different task type, app or
    params. Give the new task its own id, or leave ``id`` unset to get a fresh one."""


class UnknownTaskType(InvalidTaskSpec):
    """No handler registered in this ``Taskmill`` serves the task type, and it was
    built with ``strict_types=True``.

    The message names close matches among the registered task types. Register the
    handler (or load the plugin that has it) before enqueueing, or build the
    ``Taskmill`` without ``strict_types`` when another process serves the type.
    """


class TaskNotFound(TaskmillError):
    """No task with that id exists (or it belongs to another app)."""


class InvalidTransition(TaskmillError):
    """The task is not in a state that allows this operation."""


class InvalidCursor(TaskmillError, ValueError):
    """The event cursor was not written by this store.

    Pass back only a cursor this store handed out: an event's ``TaskEvent.cursor``,
    or the cursor ``read_events`` returns alongside its events (``tm.events(since=...)``
    takes the same). Cursors are opaque tokens; one from another store, or one built
    by hand, is refused.
    """


class HandlerConflict(TaskmillError):
    """Two handlers were registered for the same (app_id, task_type)."""


class InvalidHandler(TaskmillError, TypeError):
    """A handler must be a callable taking ``(ctx, params)``."""


class ConfigurationError(TaskmillError):
    """A setting (command-line option, ``TASKMILL_*`` variable or configuration file
    key) has a value taskmill cannot use.

    The message names where the value came from and what it expects; see
    docs/configuration.md.
    """


class PluginError(TaskmillError):
    """A taskmill plugin could not be loaded.

    The message names the plugin and its distribution. Fix or reinstall the
    distribution, or skip the plugin with ``TASKMILL_DISABLE_PLUGINS=<name>``.
    """


class ProxyError(TaskmillError):
    """The process a proxy handler delegated the task to failed; the attempt is
    retried like any other handler error."""


class Detached(TaskmillError):
    """Raised by a handler that handed its attempt over to another owner (an HTTP
    receiver that answered 202 Accepted): the worker frees the slot, writes no outcome
    and stops renewing the lease, leaving the task RUNNING under that lease. The new
    owner reports progress and the outcome itself, fenced by the lease; an owner that
    stops reporting loses the lease and the task is rescued like any other."""


class Cancelled(TaskmillError):
    """The task was cancelled; raised by ``Context.check_cancelled()``."""


DELAY_MAX = 100 * 365.25 * 24 * 3600
"""The longest delay, in seconds (100 years): of an enqueue, a :class:`Retry` and a
backoff. Declared here, where ``Retry`` checks it; :mod:`taskmill.validation` holds the
other limits and re-exports it."""


def check_retry_delay(delay: object, *, name: str) -> None:
    """Check that ``delay`` (``name`` in the message) is None or a delay a retry may
    wait: a finite number of seconds (not a bool) from 0 to :data:`DELAY_MAX`.

    The one check of ``Retry(delay=...)`` and of a reported retry's ``retry_in``
    (``Taskmill.report_detached``). Declared here, beside :data:`DELAY_MAX`, for
    :class:`Retry`; :mod:`taskmill.validation` re-exports it (it imports this module, so
    this one cannot import it).

    :raises ValueError: ``delay`` is not such a number.
    """
    if delay is not None and not (
        isinstance(delay, int | float)
        and not isinstance(delay, bool)
        and math.isfinite(delay)
        and 0 <= delay <= DELAY_MAX
    ):
        raise ValueError(
            f"{name} takes a finite number of seconds from 0 to {DELAY_MAX:.0f}"
            f" (100 years), got {delay!r}"
        )


class Retry(TaskmillError):
    """Raised by a handler to ask for another attempt.

    ``delay`` (seconds) overrides the exponential backoff for this retry. The retry
    still counts as an attempt: a task never runs more than ``max_retries + 1`` times.

    :raises ValueError: ``delay`` is not a finite number of seconds from 0 to 100 years
        (raised where the handler builds the ``Retry``, so the attempt fails with that
        message and is retried with the backoff; an infinite delay would be a task due
        never).
    """

    def __init__(self, delay: float | None = None, message: str | None = None) -> None:
        check_retry_delay(delay, name="Retry(delay=...)")
        self.delay = delay
        super().__init__(message or "handler asked for a retry")


class Fail(TaskmillError):
    """Raised by a handler to fail the task at once, without retrying (dead letter)."""


class WaitTimeout(TaskmillError, TimeoutError):
    """The task did not reach a terminal state within the timeout."""


def log_retried_failure(logger: logging.Logger, message: str, *args: object) -> None:
    """Log the exception being handled, for an operation that will be tried again.

    An unreachable store (:class:`StorageUnavailable`, expected while a server restarts)
    is one warning line ending with the store's own message; anything else is logged
    with its traceback. A worker retrying through an outage thus logs a line per retry,
    not a traceback of a hundred lines.
    """
    error = sys.exc_info()[1]
    if isinstance(error, StorageUnavailable):
        logger.warning(message + ": %s", *args, error)
    else:
        logger.exception(message, *args)
