"""Several real worker processes on one SQLite file: exactly-once, crashes, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from taskmill import AttemptOutcome, Progress, TaskFilter, Taskmill, TaskStatus
from taskmill.testing import wait_until

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("worker_process.py")
# Where each started worker's output goes, by pid.
_OUTPUTS: dict[int, Path] = {}


def worker_output(proc: subprocess.Popen[bytes]) -> str:
    """What a worker started by :meth:`Cluster.start` has printed so far."""
    path = _OUTPUTS.get(proc.pid)
    if path is not None and path.exists():
        return path.read_bytes().decode(errors="replace")
    if proc.stdout is not None and proc.poll() is not None:
        return proc.stdout.read().decode(errors="replace")
    return ""


class Cluster:
    """Starts worker processes and always reaps them."""

    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        # The output goes to a file, never to a pipe nobody reads while the worker runs:
        # a worker that logs more than a pipe holds (64 KiB of reconnect warnings during
        # a server restart, say) would block in its logging call and stop working.
        output = self.log.with_name(f"worker-{len(self.procs)}.out")
        with output.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, str(WORKER), "--url", self.url, "--log", str(self.log), *args],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        _OUTPUTS[proc.pid] = output
        self.procs.append(proc)
        return proc

    def output(self, proc: subprocess.Popen[bytes]) -> str:
        """What ``proc`` has printed so far."""
        return worker_output(proc)

    def lines(self, kind: str) -> list[list[str]]:
        if not self.log.exists():
            return []
        rows = [line.split() for line in self.log.read_text().splitlines()]
        return [row[1:] for row in rows if row and row[0] == kind]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(f"sqlite:///{tmp_path / 'shared.db'}", tmp_path / "runs.log")
    yield c
    c.close()


def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        out = worker_output(proc)
        raise AssertionError(f"worker did not exit within {timeout} s; output:\n{out}") from None
    if code != 0:
        out = worker_output(proc)
        raise AssertionError(f"worker exited with {code}; output:\n{out}")
    return code


async def lines_appear(cluster: Cluster, kind: str, count: int, timeout: float) -> None:
    async def enough() -> bool:
        return len(cluster.lines(kind)) >= count

    await wait_until(enough, timeout=timeout)


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
        wait_exit(proc, 120)

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


async def _kill_mid_task_then_rescue(
    cluster: Cluster, lease: str, rescue: str | None, deadline: float
) -> None:
    async with Taskmill(cluster.url, plugins=False) as tm:
        task = await tm.enqueue("block-first", max_retries=3)
        victim = cluster.start("--lease", lease)
        await lines_appear(cluster, "started", 1, timeout=30)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        held = await tm.get(task.id)
        assert held is not None and held.status is TaskStatus.RUNNING

        options = ["--lease", lease] + (["--rescue-interval", rescue] if rescue else [])
        rescuer = cluster.start(*options)
        done = await tm.wait(task.id, timeout=deadline)  # raises past the deadline
        rescuer.send_signal(signal.SIGTERM)
        wait_exit(rescuer, 30)

        assert done.status is TaskStatus.COMPLETED
        assert done.result == rescuer.pid
        assert done.attempts == 2
        log = await tm.attempts(task.id)
        assert [a.outcome for a in log] == [AttemptOutcome.LOST, AttemptOutcome.COMPLETED]
        assert log[0].worker_id.split(":")[1] == str(victim.pid)


async def test_a_killed_workers_task_is_completed_by_another_after_its_lease_expires(
    cluster: Cluster,
):
    await _kill_mid_task_then_rescue(cluster, lease="1.0", rescue="0.2", deadline=30)


async def test_with_default_settings_a_killed_workers_task_runs_again_within_a_minute(
    cluster: Cluster,
):
    await _kill_mid_task_then_rescue(cluster, lease="30", rescue=None, deadline=60)


async def test_sigterm_lets_short_tasks_finish(cluster: Cluster):
    async with Taskmill(cluster.url, plugins=False) as tm:
        tasks = await tm.enqueue_many(
            [{"task_type": "steps", "params": {"steps": 5}} for _ in range(3)]
        )
        proc = cluster.start("--concurrency", "3", "--shutdown-grace", "20")
        await lines_appear(cluster, "started", 3, timeout=30)
        proc.send_signal(signal.SIGTERM)
        wait_exit(proc, 30)
        for task in tasks:
            done = await tm.get(task.id)
            assert done is not None and done.status is TaskStatus.COMPLETED


async def test_sigterm_requeues_long_tasks_without_spending_an_attempt(cluster: Cluster):
    async with Taskmill(cluster.url, plugins=False) as tm:
        tasks = await tm.enqueue_many(
            [{"task_type": "steps", "params": {"steps": 600}} for _ in range(3)]
        )
        proc = cluster.start("--concurrency", "3", "--shutdown-grace", "0.3")
        await lines_appear(cluster, "started", 3, timeout=30)
        proc.send_signal(signal.SIGTERM)
        wait_exit(proc, 30)
        for task in tasks:
            back = await tm.get(task.id)
            assert back is not None
            assert back.status is TaskStatus.PENDING
            assert back.attempts == 0 and back.worker_id is None
            assert back.progress == Progress()  # the next attempt starts from nothing
            (log,) = await tm.attempts(task.id)
            assert log.outcome is AttemptOutcome.INTERRUPTED
        assert cluster.lines("ran") == []


async def test_a_second_signal_stops_at_once(cluster: Cluster):
    async with Taskmill(cluster.url, plugins=False) as tm:
        task = await tm.enqueue("steps", {"steps": 600})
        proc = cluster.start("--shutdown-grace", "600")
        await lines_appear(cluster, "started", 1, timeout=30)
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        wait_exit(proc, 30)
        back = await tm.get(task.id)
        assert back is not None and back.status is TaskStatus.PENDING


async def test_a_cancel_from_this_process_stops_a_handler_in_another(cluster: Cluster):
    async with Taskmill(cluster.url, plugins=False) as tm:
        task = await tm.enqueue("steps", {"steps": 600})
        proc = cluster.start()
        await lines_appear(cluster, "started", 1, timeout=30)
        await tm.cancel(task.id)
        # Stopped mid-run: the 600 steps would take a minute.
        await lines_appear(cluster, "stopped", 1, timeout=10)
        proc.send_signal(signal.SIGTERM)
        wait_exit(proc, 30)
        done = await tm.get(task.id)
        assert done is not None and done.status is TaskStatus.CANCELLED
        assert cluster.lines("ran") == []
        (attempt,) = await tm.attempts(task.id)
        assert attempt.outcome is AttemptOutcome.CANCELLED


async def test_a_suspension_stored_here_is_honoured_by_a_worker_process(cluster: Cluster):
    async with Taskmill(cluster.url, plugins=False) as tm:
        task = await tm.enqueue("steps", {"steps": 30, "step_seconds": 0.05})
        proc = cluster.start()
        await lines_appear(cluster, "started", 1, timeout=30)
        assert await tm.suspend("steps") == 1
        await lines_appear(cluster, "stopped", 1, timeout=10)

        async def requeued() -> bool:
            current = await tm.get(task.id)
            return current is not None and current.status is TaskStatus.PENDING

        await wait_until(requeued, timeout=10)
        queued = await tm.get(task.id)
        assert queued is not None and queued.attempts == 0
        other = await tm.enqueue("record")
        assert (await tm.wait(other.id, timeout=10)).status is TaskStatus.COMPLETED
        assert (await tm.get(task.id)).status is TaskStatus.PENDING  # type: ignore[union-attr]
        await tm.resume("steps")
        done = await tm.wait(task.id, timeout=30)
        proc.send_signal(signal.SIGTERM)
        wait_exit(proc, 30)
        assert done.status is TaskStatus.COMPLETED
        assert [a.outcome for a in await tm.attempts(task.id)] == [
            AttemptOutcome.INTERRUPTED,
            AttemptOutcome.COMPLETED,
        ]


async def test_events_from_a_worker_process_reach_a_subscriber_here(cluster: Cluster):
    from taskmill import EventKind, TaskFilter

    async with Taskmill(cluster.url, plugins=False) as tm:
        # The subscription is in place (its cursor taken) before the task exists.
        stream = await tm.subscribe(TaskFilter(task_types=("steps",)))
        first = asyncio.ensure_future(stream.__anext__())
        task = await tm.enqueue("steps", {"steps": 3, "step_seconds": 0.3})
        proc = cluster.start()
        kinds = [(await asyncio.wait_for(first, 30)).kind]
        async for event in stream:
            assert event.task.id == task.id
            kinds.append(event.kind)
            if event.status.terminal:
                break
        proc.send_signal(signal.SIGTERM)
        wait_exit(proc, 30)
        assert kinds[0] is EventKind.ENQUEUED
        assert kinds[1] is EventKind.STARTED
        assert EventKind.PROGRESS in kinds
        assert kinds[-1] is EventKind.COMPLETED


async def test_concurrent_enqueues_with_one_dedupe_key_from_several_processes(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'dedupe.db'}"
    async with Taskmill(url, plugins=False):
        pass  # create the schema once, so the processes race on enqueue only
    script = (
        "import asyncio, sys\n"
        "from taskmill import Taskmill\n"
        "async def main():\n"
        "    async with Taskmill(sys.argv[1], plugins=False) as tm:\n"
        "        for _ in range(25):\n"
        "            await tm.enqueue('render', {'page': 1}, dedupe_key='page-1')\n"
        "asyncio.run(main())\n"
    )
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, url, stderr=subprocess.PIPE
        )
        for _ in range(4)
    ]
    for proc in procs:
        _, stderr = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, stderr.decode()
    async with Taskmill(url, plugins=False) as tm:
        tasks = await tm.query(limit=1000)
    leaders = [t for t in tasks if t.alias_of is None]
    assert len(tasks) == 100
    assert len(leaders) == 1
    assert all(t.alias_of == leaders[0].id for t in tasks if t is not leaders[0])
