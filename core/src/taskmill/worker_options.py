"""How a worker runs: :class:`WorkerOptions`, and :class:`WorkerArgs`, the same options
as the keyword arguments of ``tm.worker(...)`` and ``tm.run_worker(...)``.

The options are checked when they are built, so a worker that could never run (no slot
left for normal work, a lease of no length) is refused before it starts. docs/semantics.md
explains what each one changes. Each field's metadata also makes it a setting of the
``taskmill`` command (:mod:`taskmill.settable`, :mod:`taskmill.settings`).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import TypedDict

import attrs

from taskmill.backoff import RetryPolicy
from taskmill.settable import (
    HOST_APP,
    boolean,
    duration,
    names,
    optional,
    seconds,
    settable,
    settable_parts,
    text,
    whole,
)
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


def _not_negative_or_auto(
    instance: WorkerOptions, attribute: attrs.Attribute[int | None], value: int | None
) -> None:
    if value is not None and value < 0:
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

    Each field is the one declaration of its option: its metadata
    (:func:`~taskmill.settable.settable`) makes it a setting of the ``taskmill``
    command too, with the same name as file key, ``TASKMILL_<NAME>`` variable and
    ``--kebab-case`` flag (docs/configuration.md).

    :raises ValueError: ``concurrency`` < 1, ``reserved_high_priority_slots`` < 0 or
        leaving no slot for normal-priority tasks, or ``lease_seconds`` <= 0.
    """

    concurrency: int = attrs.field(
        default=10,
        validator=_at_least_one,
        metadata=settable("task slots of a worker: tasks run at once", whole(1), "N"),
    )
    """Tasks run at once: the worker's slots."""
    reserved_high_priority_slots: int | None = attrs.field(
        default=None,
        validator=_leaves_normal_slots,
        metadata=settable(
            "slots only tasks of priority >= USER_ACTION may take; auto: 1 when concurrency "
            "> 1, else 0, so concurrency 2 runs one normal task at a time",
            optional(whole(0), "auto"),
            "N",
            aliases=("--reserved-high",),
        ),
    )
    """Slots only tasks at or above ``Priority.USER_ACTION`` may take. None: 1, or 0 in
    a one-slot worker (reserving its only slot would leave nothing for normal work)."""
    worker_id: str | None = attrs.field(
        default=None,
        validator=_storable_worker_id,
        metadata=settable("the worker's id in the store; unset: host:pid:random", text(), "ID"),
    )
    """The id stored on the tasks it runs (at most 255 characters, no NUL). None:
    ``host:pid:random``."""
    lease_seconds: float = attrs.field(
        default=30.0,
        validator=_positive,
        metadata=settable(
            "lease length: a crashed worker's tasks run again after it",
            seconds(0, exclusive=True),
            "SECONDS",
            aliases=("--lease",),
        ),
    )
    """How long a claimed task is held without a renewal; renewed every third of it."""
    poll_interval: float = attrs.field(
        default=1.0,
        metadata=settable(
            "longest wait between polls of an idle worker", seconds(0, exclusive=True), "SECONDS"
        ),
    )
    """The longest wait between claims when no notification arrives (at least
    ``min_poll_interval``)."""
    min_poll_interval: float = attrs.field(
        default=0.05,
        metadata=settable(
            "shortest wait between polls (right after work); at most poll_interval",
            seconds(0, exclusive=True),
            "SECONDS",
        ),
    )
    """The first wait after a claim that found nothing; waits double up to
    ``poll_interval``."""
    rescue_interval: float | None = attrs.field(
        default=None,
        metadata=settable(
            "how often expired leases are rescued; auto: a third of the lease",
            optional(seconds(0, exclusive=True), "auto"),
            "SECONDS",
        ),
    )
    """Seconds between rescues of expired leases (and event pruning, cleanup). None: a
    third of ``lease_seconds``, at least 0.05."""
    progress_interval: float = attrs.field(
        default=0.5,
        metadata=settable(
            "how often coalesced progress is written", seconds(0, exclusive=False), "SECONDS"
        ),
    )
    """Seconds between coalesced progress writes of each running task."""
    shutdown_grace: float = attrs.field(
        default=30.0,
        metadata=settable(
            "on SIGTERM/SIGINT, how long running tasks may finish before they go back to pending",
            seconds(0, exclusive=False),
            "SECONDS",
        ),
    )
    """Seconds running handlers get to finish on stop before they are interrupted with
    SHUTDOWN (``stop(grace=...)`` overrides it)."""
    retry_policy: RetryPolicy | None = attrs.field(
        default=None, metadata=settable_parts(RetryPolicy, prefix="retry_")
    )
    """The backoff of failed attempts. None: ``RetryPolicy()`` (0.5 s doubling, capped,
    with jitter). Its fields are the settings ``retry_base``, ``retry_factor``,
    ``retry_maximum`` and ``retry_jitter``."""
    # Code only: `taskmill worker` always takes its signals (its exit statuses say so).
    handle_signals: bool = True
    """Take SIGTERM and SIGINT (when run in the main thread, and the host has not)."""
    idle_horizon: float = attrs.field(
        default=60.0,
        metadata=settable(
            "--until-idle: stop when no task is due within this many seconds",
            seconds(0, exclusive=False),
            "SECONDS",
        ),
    )
    """``run_until_idle()`` returns when nothing is due within this many seconds."""
    cancel_check_interval: float = attrs.field(
        default=0.5,
        metadata=settable(
            "how often a worker checks its running tasks for cancel requests",
            seconds(0, exclusive=True),
            "SECONDS",
        ),
    )
    """Seconds between checks for cancellations and suspensions of running tasks (a
    notification makes it sooner)."""
    event_retention: timedelta = attrs.field(
        default=timedelta(minutes=2),
        metadata=settable(
            "seconds events are kept before a worker prunes them",
            duration(0, exclusive=True),
            "SECONDS",
        ),
    )
    """Events older than this are pruned from the event log."""
    cleanup_older_than: timedelta | None = attrs.field(
        default=None,
        metadata=settable(
            "delete finished tasks older than this, periodically; off: never",
            optional(duration(0, exclusive=False), "off"),
            "SECONDS",
        ),
    )
    """Delete finished tasks older than this, every ``cleanup_interval``. None: never."""
    cleanup_interval: float = attrs.field(
        default=300.0,
        metadata=settable("how often that cleanup runs", seconds(0, exclusive=True), "SECONDS"),
    )
    """Seconds between cleanups (with ``cleanup_older_than``)."""
    task_types: frozenset[str] | None = attrs.field(
        default=None,
        converter=_task_types,
        metadata=settable(
            "claim only these task types; unset: every type with a handler",
            names(),
            "TYPE",
            aliases=("--task-type",),
        ),
    )
    """Only these task types are claimed. None: every type with a handler."""
    app_ids: frozenset[str | None] | None = attrs.field(
        default=None,
        converter=_app_ids,
        metadata=settable(
            f"claim only handlers of these apps ({HOST_APP} is the host's own); unset: all",
            names(host=True),
            "APP",
            aliases=("--app-id",),
        ),
    )
    """Only tasks of these apps are claimed (None in it: the host's own). None: all."""
    prefetch: int | None = attrs.field(
        default=None,
        validator=_not_negative_or_auto,
        metadata=settable(
            "tasks claimed ahead of the free slots into a local queue; auto: sized from "
            "the worker's pace (about 0.1 s of work, at most 1000); 0: off",
            optional(whole(0), "auto"),
            "N",
        ),
    )
    """Tasks claimed ahead of the free slots and kept in a local queue (graphile-worker's
    ``localQueue``): a slot whose handler returns starts the next queued task at once,
    without a claim round trip, and claims come in larger batches. Prefetched tasks are
    held (RUNNING in the store, leases renewed) and count against the handlers'
    ``concurrency``; on stop they go back to PENDING at once without spending an
    attempt. 0: claim only into free slots. None (auto): about 0.1 s of work at the rate
    the worker starts tasks, at most :data:`~taskmill.claiming.AUTO_PREFETCH_MAX` (1000)
    tasks, and none while that is less than one task per slot (slow handlers)."""
    delete_completed: bool = attrs.field(
        default=False,
        metadata=settable(
            "delete a task when it completes (no row, no attempt log kept; handlers may "
            "say otherwise)",
            boolean(),
            "BOOL",
        ),
    )
    """Delete each task this worker completes, in the finish's transaction, with its
    attempt log and the aliases it settles, as graphile-worker does (docs/retention.md,
    "Delete on complete"); a handler's own ``delete_completed`` overrides it. False:
    keep every finished task until ``cleanup``."""
    delete_failed: bool = attrs.field(
        default=False,
        metadata=settable(
            "delete a task when it fails for good (handlers may say otherwise)",
            boolean(),
            "BOOL",
        ),
    )
    """Delete each task this worker ends FAILED (its retries spent), as
    ``delete_completed`` does for COMPLETED; a handler's own ``delete_failed``
    overrides it. False: keep the dead letters."""
    finish_window: float = attrs.field(
        default=0.002,
        validator=_not_negative_float,
        metadata=settable(
            "how long outcomes are gathered into one write; 0: write at once",
            seconds(0, exclusive=False),
            "SECONDS",
        ),
    )
    """Seconds the writer waits after the first unwritten outcome to gather more into
    one ``finish_batch`` (on top of the group commit that always happens). 0: write at
    once. A stop writes at once."""


class WorkerArgs(TypedDict, total=False):
    """:class:`WorkerOptions` as keyword arguments (``tm.worker(**args)``); each means
    what the field of the same name does.

    Written out because mypy sees no TypedDict built at run time;
    tests/test_worker_options.py holds its keys and types equal to the fields'."""

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
    prefetch: int | None
    delete_completed: bool
    delete_failed: bool
    finish_window: float
