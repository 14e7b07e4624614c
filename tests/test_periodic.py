"""Periodic tasks in one process: fire times (cron with time zones and DST edges, fixed
intervals), fire ids, catch-up policies, the scheduler pass against a real store, and
registration in code, through a plugin and in the configuration file."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from taskmill import ConfigurationError, PluginError, TaskFilter, Taskmill, TaskStatus, hookimpl
from taskmill.periodic import Schedule, Scheduler, schedule_from_config
from taskmill.settings import load_settings
from taskmill.testing import wait_until

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, sec: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, sec, tzinfo=UTC)


def local(zone: ZoneInfo, y: int, mo: int, d: int, h: int, mi: int, *, fold: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, tzinfo=zone, fold=fold)


def fires(schedule: Schedule, after: datetime, n: int) -> list[datetime]:
    it = schedule.fires_after(after)
    return [next(it) for _ in range(n)]


# -- fire times ---------------------------------------------------------------------------


def test_cron_fires_in_its_time_zone() -> None:
    s = Schedule("s", "t", cron="0 9 * * MON-FRI", timezone="America/New_York")
    got = fires(s, utc(2026, 7, 3, 0), 3)  # a Friday in summer (UTC-4)
    assert got == [utc(2026, 7, 3, 13), utc(2026, 7, 6, 13), utc(2026, 7, 7, 13)]
    assert all(t.tzinfo is UTC for t in got)


def test_cron_fires_strictly_after_the_given_time() -> None:
    s = Schedule("s", "t", cron="*/5 * * * *")
    assert s.next_fire(utc(2026, 1, 1, 0, 5)) == utc(2026, 1, 1, 0, 10)
    assert s.next_fire(utc(2026, 1, 1, 0, 4, 59) + timedelta(microseconds=999999)) == utc(
        2026, 1, 1, 0, 5
    )


def test_cron_with_seconds() -> None:
    s = Schedule("s", "t", cron="*/10 * * * * *")
    assert fires(s, utc(2026, 1, 1, 0, 0, 5), 2) == [
        utc(2026, 1, 1, 0, 0, 10),
        utc(2026, 1, 1, 0, 0, 20),
    ]


def test_a_nonexistent_local_time_fires_once_just_after_the_gap() -> None:
    # Europe/Berlin jumps from 02:00 to 03:00 on 2026-03-29: 02:30 does not exist.
    s = Schedule("s", "t", cron="30 2 * * *", timezone="Europe/Berlin")
    got = fires(s, utc(2026, 3, 28, 12), 2)
    assert got[0] == local(BERLIN, 2026, 3, 29, 3, 0).astimezone(UTC) == utc(2026, 3, 29, 1)
    assert got[1] == local(BERLIN, 2026, 3, 30, 2, 30).astimezone(UTC)


def test_stepped_hours_skip_the_missing_hour() -> None:
    s = Schedule("s", "t", cron="*/30 * * * *", timezone="Europe/Berlin")
    got = fires(s, local(BERLIN, 2026, 3, 29, 1, 20).astimezone(UTC), 3)
    assert [t.astimezone(BERLIN).strftime("%H:%M%z") for t in got] == [
        "01:30+0100",
        "03:00+0200",
        "03:30+0200",
    ]
    assert got[1] - got[0] == timedelta(minutes=30)


def test_a_fixed_local_time_in_a_repeated_hour_fires_once() -> None:
    # Europe/Berlin repeats 02:00-03:00 on 2026-10-25: 02:30 happens twice.
    s = Schedule("s", "t", cron="30 2 * * *", timezone="Europe/Berlin")
    got = fires(s, utc(2026, 10, 24, 12), 2)
    assert got[0] == local(BERLIN, 2026, 10, 25, 2, 30, fold=0).astimezone(UTC)
    assert got[0] == utc(2026, 10, 25, 0, 30)  # the first 02:30 (CEST)
    assert got[1] == utc(2026, 10, 26, 1, 30)  # the next day, CET


def test_a_wildcard_hour_fires_in_both_occurrences_of_a_repeated_hour() -> None:
    s = Schedule("s", "t", cron="0,30 * * * *", timezone="Europe/Berlin")
    got = fires(s, utc(2026, 10, 24, 23, 50), 6)  # 01:50 CEST
    assert got == [
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST
        utc(2026, 10, 25, 1, 0),  # 02:00 CET
        utc(2026, 10, 25, 1, 30),  # 02:30 CET
        utc(2026, 10, 25, 2, 0),  # 03:00 CET
        utc(2026, 10, 25, 2, 30),
    ]
    assert len({s.fire_id(t) for t in got}) == 6


def test_every_is_aligned_to_the_epoch_whatever_the_start() -> None:
    s = Schedule("s", "t", every=timedelta(seconds=10))
    assert fires(s, utc(2026, 1, 1, 0, 0, 3), 2) == [
        utc(2026, 1, 1, 0, 0, 10),
        utc(2026, 1, 1, 0, 0, 20),
    ]
    assert s.next_fire(utc(2026, 1, 1, 0, 0, 10)) == utc(2026, 1, 1, 0, 0, 20)
    # DST means nothing to an interval
    h = Schedule("h", "t", every=timedelta(hours=1), timezone="Europe/Berlin")
    got = fires(h, utc(2026, 10, 24, 23, 30), 3)
    assert [b - a for a, b in itertools.pairwise(got)] == [timedelta(hours=1)] * 2


def test_fire_ids_are_deterministic_and_distinct() -> None:
    a = Schedule("report", "t", cron="* * * * *")
    again = Schedule("report", "t", cron="*/1 * * * *", params={"x": 1})
    other_app = Schedule("report", "t", cron="* * * * *", app_id="billing")
    t = utc(2026, 5, 1, 12, 0)
    assert a.fire_id(t) == again.fire_id(t) == a.fire_id(t.astimezone(NEW_YORK))
    assert a.fire_id(t) != a.fire_id(t + timedelta(minutes=1))
    assert a.fire_id(t) != other_app.fire_id(t)
    assert a.fire_id(t) != Schedule("other", "t", cron="* * * * *").fire_id(t)


# -- catch-up -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("skip", []),
        ("latest", [utc(2026, 1, 1, 11, 55)]),
        ("all", [utc(2026, 1, 1, 11, m) for m in (0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55)]),
    ],
)
def test_catch_up_policies(policy: str, expected: list[datetime]) -> None:
    s = Schedule("s", "t", cron="*/5 * * * *", catch_up=policy)  # type: ignore[arg-type]
    assert s.missed(utc(2026, 1, 1, 11, 58)) == expected


def test_catch_up_never_looks_past_its_window() -> None:
    s = Schedule("s", "t", cron="0 3 * * *", catch_up="all", catch_up_window=timedelta(hours=2))
    assert s.missed(utc(2026, 1, 1, 6)) == []
    assert s.missed(utc(2026, 1, 1, 4, 30)) == [utc(2026, 1, 1, 3)]


def test_the_default_is_latest_within_an_hour() -> None:
    s = Schedule("s", "t", cron="* * * * *")
    assert s.catch_up == "latest" and s.catch_up_window == timedelta(hours=1)


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"cron": "61 * * * *"}, "bad cron expression"),
        ({"cron": "* * *"}, "bad cron expression"),
        ({}, "exactly one of"),
        ({"cron": "* * * * *", "every": timedelta(seconds=5)}, "exactly one of"),
        ({"every": timedelta(milliseconds=500)}, "at least one second"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"cron": "* * * * *", "catch_up": "some"}, "catch_up must be one of"),
    ],
)
def test_bad_schedules_say_what_to_do(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        Schedule("s", "t", **fields)  # type: ignore[arg-type]


def test_two_schedules_with_one_name_are_refused() -> None:
    tm = Taskmill("memory://", plugins=False)
    tm.add_schedule(Schedule("s", "t", cron="* * * * *"))
    tm.add_schedule(Schedule("s", "t", cron="* * * * *"))  # the same one: fine
    with pytest.raises(ConfigurationError, match="give each schedule its own name"):
        tm.add_schedule(Schedule("s", "u", cron="* * * * *"))
    tm.add_schedule(Schedule("s", "u", cron="* * * * *", app_id="other"))
    assert len(tm.schedules) == 2


# -- the scheduler against a store ----------------------------------------------------------


async def test_many_schedulers_enqueue_each_fire_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    apps = [Taskmill(url, plugins=False) for _ in range(4)]
    try:
        for tm in apps:
            tm.add_schedule(Schedule("s", "t", cron="*/5 * * * *", catch_up="all"))
            await tm.open()
        schedulers = [Scheduler(tm) for tm in apps]
        start = utc(2026, 1, 1, 12, 2)
        await asyncio.gather(*(s.run_once(start) for s in schedulers))
        for minute in (7, 13, 31):
            await asyncio.gather(*(s.run_once(start.replace(minute=minute)) for s in schedulers))
        tasks = await apps[0].query(TaskFilter(), limit=100)
        times = sorted(t.run_at for t in tasks)
        # the hour before 12:02 (catch-up "all"), then every fire up to 12:31
        assert times == [utc(2026, 1, 1, 11, m) for m in range(5, 60, 5)] + [
            utc(2026, 1, 1, 12, m) for m in (0, 5, 10, 15, 20, 25, 30)
        ]
        assert all(t.status is TaskStatus.PENDING and t.task_type == "t" for t in tasks)
    finally:
        for tm in apps:
            await tm.close()


async def test_a_finished_fire_is_not_enqueued_again() -> None:
    async with Taskmill("memory://", plugins=False) as tm:
        ran: list[str] = []

        @tm.periodic("*/5 * * * *", params={"k": 1}, catch_up="latest")
        async def report(ctx: object, params: dict[str, int]) -> None:
            ran.append("x")

        now = utc(2026, 1, 1, 12, 2)
        (fire,) = await Scheduler(tm).run_once(now)
        assert fire.run_at == utc(2026, 1, 1, 12, 0) and fire.params == {"k": 1}
        await tm.worker(concurrency=1).run_until_idle()
        assert ran == ["x"]
        # a worker starting later catches up the same latest fire: a no-op
        (again,) = await Scheduler(tm).run_once(now + timedelta(minutes=1))
        assert again.id == fire.id and again.status is TaskStatus.COMPLETED
        await tm.worker(concurrency=1).run_until_idle()
        assert ran == ["x"]


async def test_changed_params_keep_the_stored_fire_and_block_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    old, new = Taskmill(url, plugins=False), Taskmill(url, plugins=False)
    old.add_schedule(Schedule("s", "t", cron="*/5 * * * *", params={"v": 1}))
    new.add_schedule(Schedule("s", "t", cron="*/5 * * * *", params={"v": 2}))
    new.add_schedule(Schedule("other", "t", cron="*/5 * * * *"))
    async with old, new:
        now = utc(2026, 1, 1, 12, 2)
        (kept,) = await Scheduler(old).run_once(now)
        scheduler = Scheduler(new)
        stored = await scheduler.run_once(now)
        assert [t.id for t in stored] == [
            Schedule("other", "t", cron="* * * * *").fire_id(kept.run_at)
        ]
        assert "already stored with other params" in caplog.text
        assert (await new.get(kept.id)) == kept and kept.params == {"v": 1}
        later = await scheduler.run_once(now + timedelta(minutes=5))  # the 12:05 fires
        assert sorted(t.params.get("v", 0) for t in later) == [0, 2]


async def test_after_a_store_outage_a_pass_looks_back_no_further_than_the_window() -> None:
    async with Taskmill("memory://", plugins=False) as tm:
        tm.add_schedule(Schedule("s", "t", cron="*/5 * * * *", catch_up="skip"))
        scheduler = Scheduler(tm)
        start = utc(2026, 1, 1, 12, 2)
        assert await scheduler.run_once(start) == []  # skip: nothing before the start
        later = await scheduler.run_once(start + timedelta(hours=3))  # the passes between failed
        times = sorted(t.run_at for t in later)
        assert times == [utc(2026, 1, 1, 14, 5) + timedelta(minutes=5 * i) for i in range(12)]


async def test_a_running_worker_fires_its_schedules() -> None:
    async with Taskmill("memory://", plugins=False) as tm:
        seen: list[datetime] = []

        @tm.periodic(every=timedelta(seconds=1), catch_up="skip")
        async def beat(ctx: object, params: dict[str, int]) -> None:
            seen.append(ctx.task.run_at)  # type: ignore[attr-defined]

        worker = tm.worker(concurrency=2, poll_interval=0.2, handle_signals=False)
        run = asyncio.create_task(worker.run())

        async def two_beats() -> bool:
            return len(seen) >= 2

        await wait_until(two_beats, timeout=30)
        await worker.stop()
        await run
        assert len(set(seen)) == len(seen)
        assert all(t.microsecond == 0 for t in seen)


async def test_a_worker_refuses_a_cleanup_that_could_double_fire() -> None:
    async with Taskmill("memory://", plugins=False) as tm:
        tm.add_schedule(Schedule("s", "t", cron="* * * * *", catch_up_window=timedelta(hours=2)))
        worker = tm.worker(cleanup_older_than=timedelta(hours=1), handle_signals=False)
        with pytest.raises(ConfigurationError, match="could run twice"):
            await worker.run()


# -- registration ---------------------------------------------------------------------------


class SchedulePlugin:
    @hookimpl
    def taskmill_register_schedules(self) -> list[Schedule]:
        return [Schedule("plugged", "t", every=timedelta(minutes=1))]


class BadSchedulePlugin:
    @hookimpl
    def taskmill_register_schedules(self) -> list[object]:
        return ["not a schedule"]


def test_a_plugin_registers_schedules() -> None:
    tm = Taskmill("memory://", plugins=[SchedulePlugin()])
    tm.load_plugins()
    assert [s.name for s in tm.schedules] == ["plugged"]


def test_a_plugin_returning_something_else_is_a_plugin_error() -> None:
    tm = Taskmill("memory://", plugins=[BadSchedulePlugin()])
    with pytest.raises(PluginError, match=r"return taskmill\.periodic\.Schedule objects"):
        tm.load_plugins()


def test_schedules_from_the_configuration_file(tmp_path: Path) -> None:
    (tmp_path / "taskmill.toml").write_text(
        "[schedules.nightly]\n"
        'task_type = "report"\n'
        'cron = "0 3 * * *"\n'
        'timezone = "Europe/Berlin"\n'
        "params = { kind = 'full' }\n"
        "[schedules.beat]\n"
        'task_type = "ping"\n'
        "every = 30\n"
        'catch_up = "skip"\n'
    )
    settings = load_settings(environ={}, cwd=tmp_path)
    by_name = {s.name: s for s in settings.schedules}
    assert by_name["nightly"].params == {"kind": "full"}
    assert by_name["nightly"].timezone == "Europe/Berlin"
    assert by_name["beat"].every == timedelta(seconds=30) and by_name["beat"].catch_up == "skip"


def test_a_bad_schedule_table_names_the_file_and_the_field(tmp_path: Path) -> None:
    (tmp_path / "taskmill.toml").write_text(
        '[schedules.x]\ntask_type = "t"\nevery = 10\ncolor = 1\n'
    )
    with pytest.raises(ConfigurationError, match=r"taskmill.toml: schedules.x: unknown field"):
        load_settings(environ={}, cwd=tmp_path)
    with pytest.raises(ConfigurationError, match="number of seconds"):
        schedule_from_config("y", {"task_type": "t", "every": "10s"})
