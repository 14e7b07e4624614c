"""Several real worker processes on one PostgreSQL schema: exactly-once execution, a
``kill -9`` rescued by another worker, and a server restart in the middle of a run (only
when ``$TASKMILL_TEST_POSTGRES_RESTART`` holds the command that restarts the test server).

The workers are ``tests/worker_process.py`` (the same script the SQLite tests run);
handlers append a line per run to an ``O_APPEND`` log, so the tests count exactly how
often each handler ran, and in which process.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from taskmill import AttemptOutcome, TaskFilter, Taskmill, TaskStatus
from taskmill.errors import StorageUnavailable
from taskmill.testing import wait_until

from tests.conftest import skip_or_fail
from tests.test_multiprocess_sqlite import Cluster, lines_appear, wait_exit

pytestmark = pytest.mark.slow

RESTART_VARIABLE = "TASKMILL_TEST_POSTGRES_RESTART"
"""Holds the command that restarts the server of ``$TASKMILL_TEST_POSTGRES_URL`` (such as
``pg_ctlcluster 15 main restart``); without it the restart test is skipped."""


@pytest.fixture
def cluster(postgres_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(postgres_url, tmp_path / "runs.log")
    yield c
    c.close()


async def _summary_when_reachable(url: str) -> tuple[int, int] | None:
    """(completed, total), or None while the server is unreachable."""
    try:
        async with Taskmill(url, plugins=False) as tm:
            summary = await tm.progress_summary()
    except StorageUnavailable:
        return None
    return summary.completed, summary.total


async def test_three_worker_processes_run_each_task_exactly_once(cluster: Cluster, tmp_path: Path):
    async with Taskmill(cluster.url, plugins=False) as tm:
        tasks = await tm.enqueue_many(
            [{"task_type": "record", "params": {"sleep": 0.01}} for _ in range(300)]
        )
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        cluster.start(
            "--until-idle", "--concurrency", "4", "--barrier", str(barrier), "--parties", "3"
        )
        for _ in range(3)
    ]
    for proc in procs:
        await asyncio.to_thread(wait_exit, proc, 120)

    runs = cluster.lines("ran")
    counts = Counter(row[0] for row in runs)
    assert set(counts) == {t.id for t in tasks}
    assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1]
    assert len({row[1] for row in runs}) == 3, "every worker process took part"
    async with Taskmill(cluster.url, plugins=False) as tm:
        summary = await tm.progress_summary()
        assert summary.completed == 300 and summary.total == 300
        done = await tm.query(TaskFilter(), limit=300)
        assert all(t.attempts == 1 for t in done)


async def test_a_killed_workers_task_is_completed_by_another_after_its_lease_expires(
    cluster: Cluster,
):
    async with Taskmill(cluster.url, plugins=False) as tm:
        task = await tm.enqueue("block-first", max_retries=3)
        victim = cluster.start("--lease", "1.0")
        await lines_appear(cluster, "started", 1, timeout=30)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        held = await tm.get(task.id)
        assert held is not None and held.status is TaskStatus.RUNNING

        rescuer = cluster.start("--lease", "1.0", "--rescue-interval", "0.2")
        done = await tm.wait(task.id, timeout=30)
        rescuer.send_signal(signal.SIGTERM)
        await asyncio.to_thread(wait_exit, rescuer, 30)

        assert done.status is TaskStatus.COMPLETED
        assert done.result == rescuer.pid
        assert done.attempts == 2
        log = await tm.attempts(task.id)
        assert [a.outcome for a in log] == [AttemptOutcome.LOST, AttemptOutcome.COMPLETED]
        assert log[0].worker_id.split(":")[1] == str(victim.pid)


async def test_a_cancel_from_this_process_stops_a_handler_in_another(cluster: Cluster):
    async with Taskmill(cluster.url, plugins=False) as tm:
        task = await tm.enqueue("steps", {"steps": 600})
        proc = cluster.start()
        await lines_appear(cluster, "started", 1, timeout=30)
        await tm.cancel(task.id)
        await lines_appear(cluster, "stopped", 1, timeout=10)
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(wait_exit, proc, 30)
        done = await tm.get(task.id)
        assert done is not None and done.status is TaskStatus.CANCELLED
        assert cluster.lines("ran") == []


def _restart_command() -> list[str]:
    given = os.environ[RESTART_VARIABLE]  # the restarts_server mark skips without it
    command = shlex.split(given)
    if not command or shutil.which(command[0]) is None:
        skip_or_fail("postgres", f"cannot restart the test server: {given!r} not found")
    if command[0] == "pg_ctlcluster" and os.geteuid() != 0:
        skip_or_fail("postgres", "restarting the test server with pg_ctlcluster needs root")
    return command


@pytest.mark.restarts_server(RESTART_VARIABLE)
async def test_a_server_restart_mid_run_loses_nothing_and_runs_nothing_twice(
    cluster: Cluster,
):
    command = _restart_command()
    total = 600
    async with Taskmill(cluster.url, plugins=False) as tm:
        tasks = await tm.enqueue_many(
            [{"task_type": "record", "params": {"sleep": 0.1}} for _ in range(total)]
        )
    # A lease well beyond the outage: a task whose handler ran must not be rescued
    # and run again while its worker waits to write the outcome.
    procs = [cluster.start("--concurrency", "4", "--lease", "8") for _ in range(3)]
    await lines_appear(cluster, "ran", 60, timeout=60)
    restarted = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=120
    )
    assert restarted.returncode == 0, restarted.stderr
    ran_before = len(cluster.lines("ran"))
    assert ran_before < total, "the restart came too late to interrupt the run"

    async def all_completed() -> bool:
        counts = await _summary_when_reachable(cluster.url)
        return counts is not None and counts[0] == total

    await wait_until(all_completed, timeout=120, interval=0.5)  # fails past 120 s
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        await asyncio.to_thread(wait_exit, proc, 60)

    counts = Counter(row[0] for row in cluster.lines("ran"))
    assert set(counts) == {t.id for t in tasks}
    twice = [k for k, v in counts.items() if v > 1]
    assert twice == [], f"{len(twice)} handlers ran twice"
    async with Taskmill(cluster.url, plugins=False) as tm:
        done = await tm.query(TaskFilter(statuses=(TaskStatus.COMPLETED,)), limit=total)
        assert len(done) == total
