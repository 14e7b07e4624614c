"""How a worker runs: :class:`WorkerOptions`, and :class:`WorkerArgs`, the same options
as the keyword arguments of ``tm.worker(...)`` and ``tm.run_worker(...)``.

The options are checked when they are built, so a worker that could never run (no slot
left for normal work, a lease of no length) is refused before it starts. docs/semantics.md
explains what each one changes.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import TypedDict

import attrs

from taskmill.backoff import RetryPolicy
from taskmill.validation import WORKER_ID_MAX, check_key


def _storable_worker_id(
    instance: WorkerOptions, attribute: attrs.Attribute[str | None], value: str | None
) -> None:
    if value is not None:
        check_key("worker_id", value, WORKER_ID_MAX, empty=False)


def _at_least_one(instance: WorkerOptions, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"concurrency must be >= 1, got {value}")


def _leaves_normal_slots(
    instance: WorkerOptions, attribute: attrs.Attribute[int | None], value: int | None
) -> None:
    if value is None:
        return
    if value < 0:
        raise ValueError(f"reserved_high_priority_slots must be >= 0, got {value}")
    if value >= instance.concurrency:
        raise ValueError(
            f"reserved_high_priority_slots={value} leaves no slot for normal-priority tasks "
            f"with concurrency={instance.concurrency}: reserve at most "
            f"{instance.concurrency - 1}, or raise the concurrency"
        )


def _not_negative(instance: WorkerOptions, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be at least 0, got {value}")


def _not_negative_float(
    instance: WorkerOptions, attribute: attrs.Attribute[float], value: float
) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be at least 0, got {value}")


def _positive(instance: WorkerOptions, attribute: attrs.Attribute[float], value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0")


def _task_types(values: Collection[str] | None) -> frozenset[str] | None:
    return None if values is None else frozenset(values)


def _app_ids(values: Collection[str | None] | None) -> frozenset[str | None] | None:
    return None if values is None else frozenset(values)


@attrs.frozen(kw_only=True)
class WorkerOptions:
    """Everything a :class:`~taskmill.worker.Worker` can be told, with its default.

    Frozen: build a variant with ``attrs.evolve(options, concurrency=4)``, or pass the
    fields as keyword arguments (``tm.worker(concurrency=4)``), which start from the
    defaults or from the options given first (``tm.worker(options, concurrency=4)``).

    :raises ValueError: ``concurrency`` < 1, ``reserved_high_priority_slots`` < 0 or
        leaving no slot for normal-priority tasks, or ``lease_seconds`` <= 0.
    """

    concurrency: int = attrs.field(default=10, validator=_at_least_one)
    """Tasks run at once: the worker's slots."""
    reserved_high_priority_slots: int | None = attrs.field(
        default=None, validator=_leaves_normal_slots
    )
    """Slots only tasks at or above ``Priority.USER_ACTION`` may take. None: 1, or 0 in
    a one-slot worker (reserving its only slot would leave nothing for normal work)."""
    worker_id: str | None = attrs.field(default=None, validator=_storable_worker_id)
    """The id stored on the tasks it runs (at most 255 characters, no NUL). None:
    ``host:pid:random``."""
    lease_seconds: float = attrs.field(default=30.0, validator=_positive)
    """How long a claimed task is held without a renewal; renewed every third of it."""
    poll_interval: float = 1.0
    """The longest wait between claims when no notification arrives (at least
    ``min_poll_interval``)."""
    min_poll_interval: float = 0.05
    """The first wait after a claim that found nothing; waits double up to
    ``poll_interval``."""
    rescue_interval: float | None = None
    """Seconds between rescues of expired leases (and event pruning, cleanup). None: a
    third of ``lease_seconds``, at least 0.05."""
    progress_interval: float = 0.5
    """Seconds between coalesced progress writes of each running task."""
    shutdown_grace: float = 30.0
    """Seconds running handlers get to finish on stop before they are interrupted with
    SHUTDOWN (``stop(grace=...)`` overrides it)."""
    retry_policy: RetryPolicy | None = None
    """The backoff of failed attempts. None: ``RetryPolicy()`` (0.5 s doubling, capped,
    with jitter)."""
    handle_signals: bool = True
    """Take SIGTERM and SIGINT (when run in the main thread, and the host has not)."""
    idle_horizon: float = 60.0
    """``run_until_idle()`` returns when nothing is due within this many seconds."""
    cancel_check_interval: float = 0.5
    """Seconds between checks for cancellations and suspensions of running tasks (a
    notification makes it sooner)."""
    event_retention: timedelta = timedelta(minutes=2)
    """Events older than this are pruned from the event log."""
    cleanup_older_than: timedelta | None = None
    """Delete finished tasks older than this, every ``cleanup_interval``. None: never."""
    cleanup_interval: float = 300.0
    """Seconds between cleanups (with ``cleanup_older_than``)."""
    task_types: frozenset[str] | None = attrs.field(default=None, converter=_task_types)
    """Only these task types are claimed. None: every type with a handler."""
    app_ids: frozenset[str | None] | None = attrs.field(default=None, converter=_app_ids)
    """Only tasks of these apps are claimed (None in it: the host's own). None: all."""
    prefetch: int = attrs.field(default=0, validator=_not_negative)
    """Tasks claimed ahead of the free slots and kept in a local queue (graphile-worker's
    ``localQueue``): a slot whose handler returns starts the next queued task at once,
    without a claim round trip, and claims come in larger batches. Prefetched tasks are
    held (RUNNING in the store, leases renewed) and count against the handlers'
    ``concurrency``; on stop they go back to PENDING at once without spending an
    attempt. 0: claim only into free slots."""
    finish_window: float = attrs.field(default=0.0, validator=_not_negative_float)
    """Seconds the writer waits after the first unwritten outcome to gather more into
    one ``finish_batch`` (on top of the group commit that always happens). 0: write at
    once. A stop writes at once."""


class WorkerArgs(TypedDict, total=False):
    """:class:`WorkerOptions` as keyword arguments (``tm.worker(**args)``); each means
    what the field of the same name does, and a test keeps the two in step."""

    concurrency: int
    reserved_high_priority_slots: int | None
    worker_id: str | None
    lease_seconds: float
    poll_interval: float
    min_poll_interval: float
    rescue_interval: float | None
    progress_interval: float
    shutdown_grace: float
    retry_policy: RetryPolicy | None
    handle_signals: bool
    idle_horizon: float
    cancel_check_interval: float
    event_retention: timedelta
    cleanup_older_than: timedelta | None
    cleanup_interval: float
    task_types: Collection[str] | None
    app_ids: Collection[str | None] | None
    prefetch: int
    finish_window: float
