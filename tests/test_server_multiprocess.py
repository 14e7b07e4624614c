"""Several real processes on one database of each server backend (PostgreSQL, MySQL /
MariaDB, MongoDB): exactly-once execution by three worker processes, a ``kill -9``
rescued by another worker, a cancel reaching another process, dedupe and ``migrate``
raced from four processes, and a server restart in the middle of a run (only when the
backend's ``$TASKMILL_TEST_<BACKEND>_RESTART`` holds the command that restarts the test
server; ``.ci/run`` sets them).

One module for the three backends, so that they are held to the same tests: only the
server, the storage class of the ``migrate`` race and the restart variable differ. The
workers are ``tests/worker_process.py`` (the script the SQLite tests run too); handlers
append a line per run to an ``O_APPEND`` log, so the tests count exactly how often each
handler ran, and in which process.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
from taskmill import AttemptOutcome, TaskFilter, Taskmill, TaskStatus
from taskmill.errors import StorageUnavailable
from taskmill.testing import wait_until

from tests.conftest import skip_or_fail
from tests.process_support import run_together
from tests.test_multiprocess_sqlite import Cluster, lines_appear, wait_exit

pytestmark = pytest.mark.slow


def _postgres_version() -> int:
    from taskmill_postgres import latest_version

    return latest_version()


def _mysql_version() -> int:
    from taskmill_mysql import latest_version

    return latest_version()


def _mongo_version() -> int:
    from taskmill_mongo import SCHEMA_VERSION

    return SCHEMA_VERSION


@attrs.frozen
class Server:
    """What differs between the server backends in these tests."""

    backend: str
    """The name ``TASKMILL_REQUIRE_BACKENDS`` uses."""
    url_fixture: str
    """The conftest fixture giving a URL of a fresh database of this test alone."""
    storage: str
    """``module:class`` of the storage, for the ``migrate`` race."""
    schema_version: Callable[[], int]
    """The version ``migrate`` brings a database to."""
    restart_variable: str
    """Holds the shell command that restarts the test server; without it the restart
    test is skipped."""


SERVERS = {
    s.backend: s
    for s in (
        Server(
            "postgres",
            "postgres_url",
            "taskmill_postgres:PostgresStorage",
            _postgres_version,
            "TASKMILL_TEST_POSTGRES_RESTART",
        ),
        Server(
            "mysql",
            "mysql_url",
            "taskmill_mysql:MySQLStorage",
            _mysql_version,
            "TASKMILL_TEST_MYSQL_RESTART",
        ),
        Server(
            "mongo",
            "mongo_url",
            "taskmill_mongo:MongoStorage",
            _mongo_version,
            "TASKMILL_TEST_MONGO_RESTART",
        ),
    )
}


@pytest.fixture(params=list(SERVERS))
def server(request: pytest.FixtureRequest) -> Server:
    return SERVERS[request.param]


@pytest.fixture
def server_url(server: Server, request: pytest.FixtureRequest) -> str:
    """A URL of a fresh database of this test alone on ``server``."""
    url = request.getfixturevalue(server.url_fixture)
    assert isinstance(url, str)
    return url


@pytest.fixture
def cluster(server_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(server_url, tmp_path / "runs.log")
    yield c
    c.close()


async def test_three_worker_processes_run_600_tasks_each_exactly_once(
    cluster: Cluster, tmp_path: Path
):
    total = 600
    async with Taskmill(cluster.url, plugins=False) as tm:
        tasks = await tm.enqueue_many(
            [{"task_type": "record", "params": {"sleep": 0.005}} for _ in range(total)]
        )
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        cluster.start(
            "--until-idle", "--concurrency", "8", "--barrier", str(barrier), "--parties", "3"
        )
        for _ in range(3)
    ]
    for proc in procs:
        await asyncio.to_thread(wait_exit, proc, 180)

    runs = cluster.lines("ran")
    counts = Counter(row[0] for row in runs)
    assert set(counts) == {t.id for t in tasks}
    assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1]
    assert len({row[1] for row in runs}) == 3, "every worker process took part"
    async with Taskmill(cluster.url, plugins=False) as tm:
        summary = await tm.progress_summary()
        assert summary.completed == total and summary.total == total
        done = await tm.query(TaskFilter(), limit=total)
        assert all(t.attempts == 1 for t in done)


async def test_a_killed_workers_task_is_completed_by_another_with_the_attempt_counted(
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
        await lines_appear(cluster, "stopped", 1, timeout=15)
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(wait_exit, proc, 30)
        done = await tm.get(task.id)
        assert done is not None and done.status is TaskStatus.CANCELLED
        assert cluster.lines("ran") == []


_READY_THEN = """
import asyncio, importlib, sys
from taskmill import Taskmill

async def main():
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()
{body}

asyncio.run(main())
"""
_DEDUPE = _READY_THEN.format(
    body=(
        "    async with Taskmill(sys.argv[1], plugins=False) as tm:\n"
        "        for _ in range(25):\n"
        "            await tm.enqueue('render', {'page': 1}, dedupe_key='page-1')\n"
        "    print('done')"
    )
)
_MIGRATE = _READY_THEN.format(
    body=(
        "    module, name = sys.argv[2].split(':')\n"
        "    storage = getattr(importlib.import_module(module), name)\n"
        "    print(await storage.from_url(sys.argv[1]).migrate())"
    )
)


async def test_concurrent_enqueues_of_one_dedupe_key_from_four_processes_make_one_leader(
    server_url: str,
):
    async with Taskmill(server_url, plugins=False):
        pass  # create the schema once, so the processes race on enqueue only
    assert await asyncio.to_thread(run_together, _DEDUPE, server_url, processes=4) == ["done"] * 4
    async with Taskmill(server_url, plugins=False) as tm:
        tasks = await tm.query(limit=1000)
    leaders = [t for t in tasks if t.alias_of is None]
    assert len(tasks) == 100
    assert len(leaders) == 1
    assert all(t.alias_of == leaders[0].id for t in tasks if t is not leaders[0])


async def test_concurrent_migrations_from_four_processes_leave_one_working_schema(
    server: Server, server_url: str
):
    results = await asyncio.to_thread(
        run_together, _MIGRATE, server_url, server.storage, processes=4
    )
    version = server.schema_version()
    assert results == [str(version)] * 4
    async with Taskmill(server_url, plugins=False) as tm:
        assert await tm.storage.migrate() == version  # nothing left to apply
        task = await tm.enqueue("after-migrate", {"n": 1})
        assert await tm.get(task.id) == task


async def _completed_when_reachable(url: str) -> int | None:
    try:
        async with Taskmill(url, plugins=False) as tm:
            return (await tm.progress_summary()).completed
    except StorageUnavailable:
        return None


def _restart_command(server: Server) -> str:
    """The restart command, checked when it is one simple command: its program exists
    (and pg_ctlcluster runs as root, which it needs to drop to the postgres user). A
    shell script (``.ci/run``'s nx-27017 restart) is left to bash."""
    given = os.environ[server.restart_variable]  # the restarts_server mark skips without it
    program = shlex.split(given)[:1]
    if any(c in given for c in ";|&$()") or (program and "=" in program[0]):
        return given
    if not program or shutil.which(program[0]) is None:
        skip_or_fail(server.backend, f"cannot restart the test server: {given!r} not found")
    if program == ["pg_ctlcluster"] and os.geteuid() != 0:
        skip_or_fail(server.backend, "restarting the test server with pg_ctlcluster needs root")
    return given


@pytest.mark.parametrize(
    "server",
    [
        pytest.param(s, id=s.backend, marks=pytest.mark.restarts_server(s.restart_variable))
        for s in SERVERS.values()
    ],
)
async def test_a_server_restart_mid_run_loses_nothing_and_runs_nothing_twice(
    server: Server, cluster: Cluster
):
    command = _restart_command(server)
    total = 600
    async with Taskmill(cluster.url, plugins=False) as tm:
        tasks = await tm.enqueue_many(
            [{"task_type": "record", "params": {"sleep": 0.1}} for _ in range(total)]
        )
    # A lease well beyond the outage: a task whose handler ran must not be rescued and
    # run again while its worker waits to write the outcome.
    procs = [cluster.start("--concurrency", "4", "--lease", "20") for _ in range(3)]
    await lines_appear(cluster, "ran", 60, timeout=60)
    restarted = await asyncio.to_thread(
        subprocess.run, ["bash", "-c", command], capture_output=True, text=True, timeout=120
    )
    assert restarted.returncode == 0, restarted.stderr
    assert len(cluster.lines("ran")) < total, "the restart came too late to interrupt the run"

    async def all_completed() -> bool:
        return await _completed_when_reachable(cluster.url) == total

    await wait_until(all_completed, timeout=180, interval=0.5)  # fails past 180 s
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
