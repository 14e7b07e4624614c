"""Periodic tasks: schedules, their fire times, and the loop a worker runs to enqueue them.

A :class:`Schedule` names a task to enqueue at every fire time of a cron expression
(parsed by `cronsim <https://pypi.org/project/cronsim/>`_, in the schedule's IANA time
zone) or of a fixed ``every`` interval (aligned to the Unix epoch, so that every process
computes the same fire times). Each fire is enqueued with a deterministic task id,
:meth:`Schedule.fire_id` (a uuid5 of the app, schedule name and UTC fire time); the
store's duplicate-id rule (``TaskStorage.enqueue``) turns every enqueue of a fire after
the first into a no-op, so any number of workers on any number of machines can run
:class:`Scheduler` at once and each fire time is enqueued exactly once. There is no
leader. See docs/scheduling.md for the guarantees and their limits.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from cronsim import CronSim, CronSimError

from taskmill.errors import (
    ConfigurationError,
    DuplicateTaskId,
    InvalidTaskSpec,
    log_retried_failure,
)
from taskmill.model import JSON, Priority, TaskSpec
from taskmill.storage import NewTask, utcnow
from taskmill.validation import (
    APP_ID_MAX,
    MAX_RETRIES_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    SCHEDULE_NAME_MAX,
    TASK_TYPE_MAX,
    check_int,
    check_key,
)

if TYPE_CHECKING:
    from taskmill.hosts import ScheduleHost
    from taskmill.model import Task

__all__ = [
    "DEFAULT_CATCH_UP",
    "DEFAULT_CATCH_UP_WINDOW",
    "CatchUp",
    "Schedule",
    "Scheduler",
    "Schedules",
    "schedule_from_config",
]

log = logging.getLogger("taskmill.periodic")

CatchUp = Literal["skip", "latest", "all"]
"""What a scheduler starting up does with fire times that passed while no worker ran:
``skip`` them, enqueue only the ``latest`` one, or ``all`` of them (each bounded by
the schedule's ``catch_up_window``)."""

DEFAULT_CATCH_UP: Final[CatchUp] = "latest"
DEFAULT_CATCH_UP_WINDOW: Final = timedelta(hours=1)
"""How far back a starting scheduler looks for missed fires. Keep ``cleanup``'s
``older_than`` longer than this (see docs/scheduling.md, "Limits")."""

_NAMESPACE: Final = uuid.UUID("6f1f3c1e-3a51-5b7e-9d0b-7a6d1b0f2e41")
"""The uuid5 namespace of fire ids (fixed forever: changing it would re-fire)."""

_MIN_LOOKBACK: Final = timedelta(minutes=1)
"""The least a running scheduler looks back (so that a pass delayed by a slow store,
even with ``catch_up_window`` 0, loses no fire)."""

_MAX_FIRES_PER_PASS: Final = 10_000
"""Most fires one pass enqueues for one schedule (a guard against a tiny interval)."""


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(
            f"unknown time zone {name!r}; use an IANA name such as 'UTC' or 'Europe/Berlin'"
        ) from exc


@attrs.frozen
class Schedule:
    """One periodic task: enqueue ``task_type`` with ``params`` at every fire time.

    Give exactly one of ``cron`` (5 fields, or 6 with seconds first; local time in
    ``timezone``) and ``every`` (a fixed interval of at least one second, aligned to the
    Unix epoch in UTC). ``name`` identifies the schedule in the store's fire ids: two
    schedules with one name and app would share fires, and renaming a schedule makes its
    next fires new tasks.
    """

    name: str
    task_type: str
    cron: str | None = None
    every: timedelta | None = None
    params: dict[str, JSON] = attrs.field(factory=dict)
    app_id: str | None = None
    timezone: str = "UTC"
    catch_up: CatchUp = DEFAULT_CATCH_UP
    catch_up_window: timedelta = DEFAULT_CATCH_UP_WINDOW
    priority: int = Priority.NORMAL
    max_retries: int | None = None

    def __attrs_post_init__(self) -> None:
        where = f"schedule {self.name!r}"
        if not self.name or not isinstance(self.name, str):
            raise ConfigurationError("a schedule needs a non-empty name")
        if not self.task_type or not isinstance(self.task_type, str):
            raise ConfigurationError(f"{where} needs a non-empty task_type")
        try:  # the limits of every task spec, checked once here rather than at each fire
            check_key("schedule name", self.name, SCHEDULE_NAME_MAX)
            check_key("task_type", self.task_type, TASK_TYPE_MAX)
            if self.app_id is not None:
                check_key("app_id", self.app_id, APP_ID_MAX)
            check_int("priority", self.priority, PRIORITY_MIN, PRIORITY_MAX)
            if self.max_retries is not None:
                check_int("max_retries", self.max_retries, 0, MAX_RETRIES_MAX)
        except InvalidTaskSpec as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError(
                f"{where}: give exactly one of cron='*/5 * * * *' or every=timedelta(...)"
            )
        if self.every is not None and (
            not isinstance(self.every, timedelta)
            or self.every < timedelta(seconds=1)
            or self.every % timedelta(seconds=1)
        ):
            raise ConfigurationError(
                f"{where}: every must be a timedelta of whole seconds, at least one second"
            )
        if self.cron is not None:
            try:
                CronSim(self.cron, datetime(2000, 1, 1, tzinfo=UTC))
            except CronSimError as exc:
                raise ConfigurationError(
                    f"{where}: bad cron expression {self.cron!r} ({exc}); use five fields"
                    " 'minute hour day month weekday' (or six, seconds first)"
                ) from exc
        _zone(self.timezone)
        if self.catch_up not in get_args(CatchUp):
            raise ConfigurationError(
                f"{where}: catch_up must be one of {', '.join(get_args(CatchUp))},"
                f" not {self.catch_up!r}"
            )
        if self.catch_up_window < timedelta(0):
            raise ConfigurationError(f"{where}: catch_up_window must not be negative")

    @property
    def key(self) -> tuple[str | None, str]:
        """``(app_id, name)``: what identifies the schedule."""
        return (self.app_id, self.name)

    @property
    def expression(self) -> str:
        """The cron expression, or ``every <seconds>s``, for display."""
        if self.cron is not None:
            return self.cron
        assert self.every is not None
        return f"every {int(self.every.total_seconds())}s"

    def fires_after(self, after: datetime) -> Iterator[datetime]:
        """The fire times strictly after ``after`` (aware), ascending, in UTC.

        Cron local times follow cronsim: a fire time that does not exist (skipped by a
        DST jump forward) fires at the first moment after the gap; a fixed-hour fire
        in a repeated hour (DST back) fires once, at its first occurrence, while
        expressions with a wildcard or stepped hour fire in both occurrences.
        """
        if after.tzinfo is None:
            raise ValueError("after must be an aware datetime")
        if self.every is not None:
            step = int(self.every.total_seconds())
            epoch = int(after.timestamp()) // step * step
            t = datetime.fromtimestamp(epoch, UTC)
            while True:
                if t > after:
                    yield t
                t += self.every
        assert self.cron is not None
        zone = _zone(self.timezone)
        local = after.astimezone(zone)
        for fire in CronSim(self.cron, local):
            fire_utc = fire.astimezone(UTC)
            if fire_utc > after:
                yield fire_utc

    def next_fire(self, after: datetime | None = None) -> datetime:
        """The first fire time strictly after ``after`` (default: now), in UTC."""
        return next(self.fires_after(after or utcnow()))

    def last_fire(self, at: datetime | None = None) -> datetime | None:
        """The latest fire time at or before ``at`` (default: now) within the
        ``catch_up_window`` (or one day, if the window is shorter), or None."""
        at = at or utcnow()
        span = max(self.catch_up_window, timedelta(days=1))
        last = None
        for fire in self.fires_after(at - span):
            if fire > at:
                break
            last = fire
        return last

    @property
    def lookback(self) -> timedelta:
        """The oldest fire a running scheduler enqueues after a store outage:
        ``catch_up_window``, but at least a minute."""
        return max(self.catch_up_window, _MIN_LOOKBACK)

    def fire_id(self, at: datetime) -> str:
        """The task id of the fire at ``at``: the same in every process, forever."""
        stamp = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return str(uuid.uuid5(_NAMESPACE, f"{self.app_id or ''}\x00{self.name}\x00{stamp}"))

    def due(self, after: datetime, until: datetime) -> list[datetime]:
        """The fire times in ``(after, until]``, at most a guard's worth."""
        fires: list[datetime] = []
        for fire in self.fires_after(after):
            if fire > until or len(fires) >= _MAX_FIRES_PER_PASS:
                break
            fires.append(fire)
        return fires

    def missed(self, started: datetime) -> list[datetime]:
        """The fires a scheduler starting at ``started`` enqueues per ``catch_up``:
        none, the latest, or all of those in ``[started - catch_up_window, started]``."""
        if self.catch_up == "skip" or not self.catch_up_window:
            return []
        fires = self.due(started - self.catch_up_window - timedelta(microseconds=1), started)
        return fires[-1:] if self.catch_up == "latest" else fires


class Schedules:
    """The schedules of one :class:`~taskmill.Taskmill`, by ``(app_id, name)``."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str | None, str], Schedule] = {}

    def add(self, schedule: Schedule) -> Schedule:
        """Add ``schedule``; the same one again is a no-op.

        :raises ConfigurationError: another schedule has its name (and app).
        """
        known = self._by_key.get(schedule.key)
        if known is not None and known != schedule:
            raise ConfigurationError(
                f"two different schedules are named {schedule.name!r}"
                + (f" in app {schedule.app_id!r}" if schedule.app_id else "")
                + "; give each schedule its own name"
            )
        self._by_key[schedule.key] = schedule
        return schedule

    def __iter__(self) -> Iterator[Schedule]:
        return iter(sorted(self._by_key.values(), key=lambda s: (s.app_id or "", s.name)))

    def __len__(self) -> int:
        return len(self._by_key)

    def __bool__(self) -> bool:
        return bool(self._by_key)


def schedule_from_config(name: str, value: object) -> Schedule:
    """A :class:`Schedule` from one entry of the ``schedules`` config table: keys as
    :class:`Schedule`'s fields, ``every`` and ``catch_up_window`` in seconds.

    :raises ConfigurationError: the entry is not a table or has a bad field.
    """
    if not isinstance(value, dict):
        raise ConfigurationError(f"schedules.{name} must be a table of schedule fields")
    fields: dict[str, Any] = dict(value)
    unknown = set(fields) - set(attrs.fields_dict(Schedule)) - {"name"}
    if unknown:
        raise ConfigurationError(
            f"schedules.{name}: unknown field(s) {', '.join(sorted(unknown))}; known:"
            f" {', '.join(f for f in attrs.fields_dict(Schedule) if f != 'name')}"
        )
    for field in ("every", "catch_up_window"):
        if field in fields:
            seconds = fields[field]
            if not isinstance(seconds, int | float) or isinstance(seconds, bool):
                raise ConfigurationError(f"schedules.{name}.{field} is a number of seconds")
            fields[field] = timedelta(seconds=seconds)
    fields.setdefault("name", name)
    try:
        return Schedule(**fields)
    except TypeError as exc:
        raise ConfigurationError(f"schedules.{name}: {exc}") from exc


class Scheduler:
    """The loop a worker runs: enqueue the due fires of every schedule of ``taskmill``.

    At start it enqueues the missed fires each schedule's ``catch_up`` asks for, then,
    every ``interval`` seconds (sooner when a fire is due), the fires that came due
    since its last pass. Every enqueue uses the fire's deterministic id, so running
    many schedulers at once enqueues each fire once.

    ``taskmill`` (a :class:`~taskmill.Taskmill`) is used through
    :class:`~taskmill.hosts.ScheduleHost` only: its schedules, its store, and its check
    of a task spec (``new_task``).
    """

    def __init__(self, taskmill: ScheduleHost[Schedule], *, interval: float = 1.0) -> None:
        self.taskmill = taskmill
        self.interval = interval
        self._marks: dict[tuple[str | None, str], datetime] = {}

    def has_schedules(self) -> bool:
        """True when the host has a schedule to fire (now; schedules may be added)."""
        return next(iter(self.taskmill.schedules), None) is not None

    def check_against_cleanup(self, older_than: timedelta | None) -> None:
        """Refuse a cleanup that deletes finished tasks after ``older_than`` (None:
        never) when a starting scheduler may enqueue fires from further back: a fire
        deleted and enqueued again would run twice (see docs/scheduling.md).

        :raises ConfigurationError: a schedule looks back ``older_than`` or further.
        """
        if older_than is None:
            return
        for schedule in self.taskmill.schedules:
            if schedule.lookback >= older_than:
                raise ConfigurationError(
                    f"schedule {schedule.name!r} may enqueue fires from the last"
                    f" {schedule.lookback} but this worker deletes finished tasks"
                    f" after {older_than}, so a fire could run twice; make"
                    " cleanup_older_than longer than the schedule's catch_up_window, or"
                    " the window shorter"
                )

    def fire(self, schedule: Schedule, at: datetime) -> NewTask:
        """The task of ``schedule``'s fire at ``at``: its fire id, due at ``at``."""
        spec = TaskSpec(
            task_type=schedule.task_type,
            params=schedule.params,
            app_id=schedule.app_id,
            priority=schedule.priority,
            max_retries=schedule.max_retries,
        )
        new = self.taskmill.new_task(spec)
        return attrs.evolve(new, id=schedule.fire_id(at), run_at=at)

    async def run_once(self, now: datetime | None = None) -> list[Task]:
        """One pass: enqueue the fires due by ``now`` (default: the clock), one enqueue
        call per schedule. A schedule's mark moves to ``now`` only once its fires are
        stored, so a failed enqueue is tried again in full by the next pass. A fire
        whose id is stored for other params (the schedule's params changed, see
        docs/scheduling.md) is logged and left as stored; the schedule's other fires
        go on.

        :returns: the stored snapshots of the fires enqueued (or found already stored).
        """
        now = now or utcnow()
        stored: list[Task] = []
        for schedule in self.taskmill.schedules:
            mark = self._marks.get(schedule.key)
            if mark is None:
                fires = schedule.missed(now)
            else:  # after an outage of the store, never further back than the window
                fires = schedule.due(max(mark, now - schedule.lookback), now)
            try:
                stored += await self._enqueue(schedule, fires)
            except Exception as exc:  # the others go on; the next pass tries it again
                log.warning("enqueueing the fires of schedule %r failed: %s", schedule.name, exc)
                continue
            self._marks[schedule.key] = now
        return stored

    async def _enqueue(self, schedule: Schedule, fires: Sequence[datetime]) -> list[Task]:
        storage = self.taskmill.storage
        tasks = [self.fire(schedule, at) for at in fires]
        stored: list[Task] = []
        for start in range(0, len(tasks), 500):
            chunk = tasks[start : start + 500]
            try:
                stored += await storage.enqueue(chunk)
            except DuplicateTaskId:
                for task in chunk:  # find the conflicting fire(s); keep the others
                    try:
                        stored += await storage.enqueue([task])
                    except DuplicateTaskId as exc:
                        log.warning(
                            "schedule %r: the fire at %s is already stored with other"
                            " params; keeping it (%s)",
                            schedule.name,
                            task.run_at,
                            exc,
                        )
        return stored

    def seconds_until_next(self, now: datetime | None = None) -> float:
        """Seconds until the next fire of any schedule, at most ``interval``."""
        now = now or utcnow()
        wait = self.interval
        for schedule in self.taskmill.schedules:
            wait = min(wait, (schedule.next_fire(now) - now).total_seconds())
        return max(wait, 0.0)

    async def run(self, on_enqueued: Sequence[Any] = ()) -> None:
        """Run passes until cancelled; a failing pass is logged and retried."""
        while True:
            try:
                stored = await self.run_once()
                for callback in on_enqueued:
                    callback(stored)
            except asyncio.CancelledError:
                raise
            except Exception:
                log_retried_failure(log, "the scheduler pass failed; retrying")
            await asyncio.sleep(self.seconds_until_next() + 0.001)
