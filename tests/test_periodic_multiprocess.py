"""Periodic tasks fired by three real worker processes at once, on SQLite and on
PostgreSQL side by side, for about a minute: every fire time is enqueued exactly once.

Each worker process (``tests/worker_process.py --schedule NAME:SECONDS``) runs the
scheduler loop for a 10-second schedule and a 2-second one (more fires, more races).
Midway one worker per store is killed with SIGKILL and a new one started: its
``catch_up="latest"`` enqueues the latest fire again, which the store's duplicate-id rule
turns into a no-op. Both stores run in the same minute to keep CI time near one minute.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from taskmill import TaskFilter, Taskmill
from taskmill.testing import wait_until

from tests.test_multiprocess_sqlite import Cluster, wait_exit

pytestmark = pytest.mark.slow

SCHEDULES = {"ten": 10, "two": 2}
RUN_SECONDS = 60.0


async def _fired_tasks(url: str) -> list[tuple[str, float]]:
    """(schedule name, fire time) of every ``tick`` task in the store."""
    async with Taskmill(url, plugins=False) as tm:
        tasks = await tm.query(TaskFilter(task_types=("tick",)), limit=10_000)
    return [(str(t.params["schedule"]), t.run_at.timestamp()) for t in tasks]


def _check(cluster: Cluster, fired: list[tuple[str, float]], started: float, ended: float) -> None:
    # The store: one task per (schedule, fire time), fire times on the grid, no gap.
    assert len(set(fired)) == len(fired)
    for name, step in SCHEDULES.items():
        times = sorted(t for n, t in fired if n == name)
        assert times, f"schedule {name} never fired"
        assert all(t % step == 0 for t in times)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(g == step for g in gaps), (name, gaps)
        # every fire between the first worker's start and the last one's stop is there
        assert times[0] <= started + 15
        assert times[-1] >= ended - step - 3
        assert len(times) >= int(RUN_SECONDS / step) - 3
    # The runs: each fire task ran once as its first attempt (a re-enqueue that reset a
    # stored fire would run it again as attempt 1).
    runs = Counter((row[0], row[2]) for row in cluster.lines("fired"))
    first_attempts = {task_id for task_id, attempt in runs if attempt == "1"}
    assert all(n == 1 for (_, attempt), n in runs.items() if attempt == "1"), runs
    assert len(first_attempts) >= len(fired) - 2  # the last fires may not have run yet


async def test_three_workers_enqueue_every_fire_once_on_sqlite_and_postgres(
    postgres_url: str, tmp_path: Path
) -> None:
    clusters = [
        Cluster(f"sqlite:///{tmp_path / 'shared.db'}", tmp_path / "sqlite.log"),
        Cluster(postgres_url, tmp_path / "postgres.log"),
    ]
    try:
        for cluster in clusters:  # create the schema before the workers race to
            async with Taskmill(cluster.url, plugins=False):
                pass
        args = [f"--schedule={name}:{step}" for name, step in SCHEDULES.items()]
        args += ["--lease", "5", "--concurrency", "2"]
        started = time.time()
        workers = {id(c): [c.start(*args) for _ in range(3)] for c in clusters}
        for cluster in clusters:

            async def ready(c: Cluster = cluster) -> bool:
                return len(c.lines("worker-ready")) == 3

            await wait_until(ready, timeout=60)
        await asyncio.sleep(RUN_SECONDS / 2)
        for cluster in clusters:
            victim = workers[id(cluster)].pop(0)
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(10)
            workers[id(cluster)].append(cluster.start(*args))
        await asyncio.sleep(started + RUN_SECONDS - time.time())
        ended = time.time()
        for procs in workers.values():
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
        for procs in workers.values():
            for proc in procs:
                assert await asyncio.to_thread(wait_exit, proc, 60) == 0
        for cluster in clusters:
            _check(cluster, await _fired_tasks(cluster.url), started, ended)
            assert len({row[1] for row in cluster.lines("fired")}) >= 2
    finally:
        for cluster in clusters:
            cluster.close()
