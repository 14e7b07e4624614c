"""A worker process always stops: many SIGINT/SIGTERM stops with tasks in flight and
notifications arriving, and a second signal that ends a stuck stop within about a second.

Each round starts a real worker process (``tests/worker_process.py``), waits until it
runs tasks, enqueues and cancels more while it stops (so work, control and event
notifications arrive during the shutdown), sends SIGINT or SIGTERM (alternating), and
requires the process to exit within ``grace + 2 s`` with every task accounted for: none
left RUNNING, no attempt lost. ``$TASKMILL_STOP_STRESS_ROUNDS`` sets the rounds per
backend (default 50).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from taskmill import Attempt, AttemptOutcome, CancelReason, TaskFilter, Taskmill, TaskStatus
from taskmill.testing import wait_until

from tests.conftest import POSTGRES_URL

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("worker_process.py")
ROUNDS = int(os.environ.get("TASKMILL_STOP_STRESS_ROUNDS", "50"))
GRACE = 0.5
"""The shutdown grace of the stressed workers: long tasks outlive it, short ones not."""


class Worker:
    """One worker process, its output in a file (a pipe nobody reads could fill up and
    block it), always reaped by the test that started it."""

    def __init__(self, url: str, tmp_path: Path, name: str, *args: str) -> None:
        self.out = tmp_path / f"{name}.out"
        with self.out.open("wb") as sink:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    "--url",
                    url,
                    "--log",
                    str(tmp_path / "runs.log"),
                    *args,
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.kill()


@pytest.fixture
async def tm(store_url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(store_url, plugins=False) as taskmill:
        yield taskmill


async def _running(tm: Taskmill) -> int:
    return (await tm.progress_summary()).running


async def _exit_within(worker: Worker, timeout: float) -> tuple[int, float]:
    """The exit code and how long after now the process ended."""
    began = time.monotonic()
    deadline = began + timeout
    while worker.proc.poll() is None:
        if time.monotonic() > deadline:
            # Dump every thread's stack (faulthandler is on in the worker) before killing.
            os.kill(worker.proc.pid, signal.SIGABRT)
            worker.kill()
            raise AssertionError(
                f"worker did not exit within {timeout} s of the signal; output:\n"
                + worker.output()[-6000:]
            )
        await asyncio.sleep(0.01)
    return worker.proc.returncode, time.monotonic() - began


def _spec(task_type: str, **params: Any) -> dict[str, Any]:
    return {"task_type": task_type, "params": params}


@pytest.mark.timeout(900)  # 50 worker processes, one after the other
async def test_a_worker_always_stops_within_grace_with_every_task_accounted_for(
    tm: Taskmill, store_url: str, tmp_path: Path, workers: list[Worker]
) -> None:
    slowest = 0.0
    signals = [signal.SIGINT, signal.SIGTERM]
    for round_no in range(ROUNDS):
        # Long tasks outlive the grace (interrupted, released); short ones drain.
        await tm.enqueue_many(
            [_spec("steps", steps=100, step_seconds=0.02) for _ in range(2)]
            + [_spec("record", sleep=0.2) for _ in range(4)]
        )
        worker = Worker(
            store_url,
            tmp_path,
            f"round-{round_no}",
            "--concurrency",
            "4",
            "--shutdown-grace",
            str(GRACE),
            "--cancel-check-interval",
            "0.05",
            "--lease",
            "30",
        )
        workers.append(worker)

        async def busy(worker: Worker = worker) -> bool:
            assert worker.proc.poll() is None, worker.output()
            return await _running(tm) >= 2

        await wait_until(busy, timeout=30)
        # Notifications arriving while the worker stops: new work, a cancel (control),
        # and the events both write.
        extra = await tm.enqueue_many([_spec("record") for _ in range(3)])
        sig = signals[round_no % 2]
        worker.proc.send_signal(sig)
        await tm.enqueue("record")
        await tm.cancel(extra[0].id, reason=CancelReason.USER)
        code, took = await _exit_within(worker, GRACE + 2.0)
        assert code == 0, worker.output()[-4000:]
        slowest = max(slowest, took)
        held = await tm.query(TaskFilter(statuses=[TaskStatus.RUNNING]), limit=10)
        assert held == [], f"round {round_no}: tasks left RUNNING: {held}"
        workers.remove(worker)

    # Every task ends COMPLETED or CANCELLED once a worker drains the rest, and no
    # attempt was ever lost: each stop released what it held.
    drain = Worker(store_url, tmp_path, "drain", "--until-idle", "--concurrency", "8")
    workers.append(drain)
    code, _ = await _exit_within(drain, 300)
    assert code == 0, drain.output()[-4000:]
    tasks = await tm.query(limit=100_000)
    assert {t.status for t in tasks} <= {TaskStatus.COMPLETED, TaskStatus.CANCELLED}
    lost: list[Attempt] = []
    for task in tasks:
        lost.extend(a for a in await tm.attempts(task.id) if a.outcome is AttemptOutcome.LOST)
    assert lost == []
    print(f"{ROUNDS} stops, slowest exit {slowest:.2f} s after the signal (grace {GRACE} s)")
    (tmp_path / "figures").write_text(f"{ROUNDS} {slowest:.3f}\n")


@pytest.mark.parametrize(("first", "second"), [("SIGTERM", "SIGINT"), ("SIGINT", "SIGTERM")])
async def test_a_second_signal_ends_a_stop_that_the_store_holds_up_within_a_second(
    tm: Taskmill,
    store_url: str,
    tmp_path: Path,
    workers: list[Worker],
    first: str,
    second: str,
) -> None:
    await tm.enqueue_many([_spec("steps", steps=1000, step_seconds=0.05) for _ in range(2)])
    worker = Worker(store_url, tmp_path, "stuck", "--concurrency", "2", "--shutdown-grace", "0.2")
    workers.append(worker)

    async def busy() -> bool:
        assert worker.proc.poll() is None, worker.output()
        return await _running(tm) == 2

    await wait_until(busy, timeout=30)
    async with _store_locked(store_url):
        # The first signal's stop cannot write the releases: the store does not answer.
        worker.proc.send_signal(getattr(signal, first))

        async def stop_reached_the_write() -> bool:  # the grace is over: it writes now
            return "stopping: interrupting" in worker.output()

        await wait_until(stop_reached_the_write, timeout=30)
        assert worker.proc.poll() is None, "the worker stopped although the store was locked"
        sig = getattr(signal, second)
        worker.proc.send_signal(sig)
        code, took = await _exit_within(worker, 3.0)
    assert code == 128 + int(sig), worker.output()[-4000:]
    assert "exiting now" in worker.output()
    print(f"forced exit {took:.2f} s after the second signal")


class _store_locked:
    """Hold the store's write path from another connection: the tasks table locked
    on PostgreSQL, the event cursor row on MySQL, SQLite's write lock on a SQLite file."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._release: Any = None

    async def __aenter__(self) -> None:
        if self.url.startswith("sqlite"):
            import sqlite3

            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")

            async def release_sqlite() -> None:
                conn.execute("ROLLBACK")
                conn.close()

            self._release = release_sqlite
            return
        if self.url.startswith("mysql"):
            import aiomysql
            from taskmill_mysql.options import parse_url

            p = parse_url(self.url, {})
            my = await aiomysql.connect(
                host=p.host, port=p.port, user=p.user, password=p.password, db=p.database
            )
            await my.begin()
            async with my.cursor() as cursor:
                # Every write that records an event (a release does) waits for this row.
                await cursor.execute("SELECT value FROM event_cursor WHERE id = 1 FOR UPDATE")

            async def release_mysql() -> None:
                await my.rollback()
                my.close()

            self._release = release_mysql
            return
        import asyncpg

        schema = self.url.split("schema=")[1].split("&")[0]
        pg = await asyncpg.connect(POSTGRES_URL)
        tx = pg.transaction()
        await tx.start()
        await pg.execute(f'LOCK TABLE "{schema}".tasks IN EXCLUSIVE MODE')

        async def release_pg() -> None:
            await tx.rollback()
            await pg.close()

        self._release = release_pg

    async def __aexit__(self, *exc: object) -> None:
        await self._release()
