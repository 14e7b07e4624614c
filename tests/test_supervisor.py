"""``taskmill worker --processes N``: real supervisor processes with real worker children,
on SQLite and PostgreSQL. The handlers meet at barriers in the file system (a file per
running handler, named after its process), so the tests wait on conditions, never on
time: three processes running tasks at once, a child killed while it holds a task, a stop
while every child runs one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from taskmill import Attempt, AttemptOutcome, TaskFilter, Taskmill, TaskStatus

from tests.cli_support import cli_env, stored, wait_until

pytestmark = pytest.mark.slow

HANDLERS = textwrap.dedent(
    '''
    """Handlers of the supervisor tests; they meet through files under $BARRIER."""
    import asyncio
    import os
    import pathlib
    import time

    import taskmill

    BARRIER = pathlib.Path(os.environ["BARRIER"])


    def _running():
        return {p.name.split(".")[0] for p in BARRIER.glob("*.running")}


    async def _until(condition, what):
        deadline = time.monotonic() + 60
        while not condition():
            if time.monotonic() > deadline:
                raise taskmill.Fail(f"timed out waiting for {what}")
            await asyncio.sleep(0.02)


    def register(tm):
        @tm.handler("meet")
        async def meet(ctx, params):
            """Runs until ``params['processes']`` processes run a meet task at once."""
            (BARRIER / f"{os.getpid()}.{ctx.task.id}.running").touch()
            await _until(lambda: len(_running()) >= params["processes"], "the others")
            (BARRIER / f"{os.getpid()}.{ctx.task.id}.{ctx.task.attempts}.done").touch()
            return {"pid": os.getpid()}

        @tm.handler("hold")
        async def hold(ctx, params):
            """Runs until the file ``go`` exists."""
            (BARRIER / f"{os.getpid()}.{ctx.task.id}.running").touch()
            await _until(lambda: (BARRIER / "go").exists(), "go")
            (BARRIER / f"{os.getpid()}.{ctx.task.id}.{ctx.task.attempts}.done").touch()
            return {"pid": os.getpid()}

        @tm.handler("quick")
        async def quick(ctx, params):
            (BARRIER / f"{os.getpid()}.{ctx.task.id}.{ctx.task.attempts}.done").touch()
            return {"pid": os.getpid()}
    '''
)

DIES_IN_CHILDREN = textwrap.dedent(
    '''
    """A handler module that registers in the first process that imports it (the
    supervisor's check) and raises in every later one (its children)."""
    import os
    import pathlib


    def register(tm):
        marker = pathlib.Path(os.environ["BARRIER"]) / "registered-once"
        if marker.exists():
            raise RuntimeError("this worker cannot start")
        marker.touch()

        @tm.handler("quick")
        async def quick(ctx, params):
            return None
    '''
)


class Supervisor:
    """A ``taskmill worker --processes N`` process, its output in a file; always reaped
    (with every child it started) by the test that started it."""

    def __init__(
        self, tmp_path: Path, url: str, *args: str, module: str = "sup_handlers", **env: str
    ):
        self.out = tmp_path / "supervisor.out"
        env = cli_env(tmp_path, BARRIER=str(tmp_path / "barrier"), **env)
        with self.out.open("wb") as sink:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "taskmill",
                    "--url",
                    url,
                    "worker",
                    "--import",
                    module,
                    *list(args),
                ],
                cwd=tmp_path,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def children(self) -> list[int]:
        """The pids of the children it started, in order (from its log)."""
        pids = []
        for line in self.output().splitlines():
            if "worker process" in line and "started (pid " in line:
                pids.append(int(line.rsplit("(pid ", 1)[1].rstrip(")")))
        return pids

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the supervisor did not exit:\n{self.output()}") from None

    def reap(self) -> None:
        for pid in self.children():
            _kill(pid)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of the supervisor (not reaped yet) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def barrier(tmp_path: Path) -> Path:
    (tmp_path / "sup_handlers.py").write_text(HANDLERS)
    (tmp_path / "sup_dying.py").write_text(DIES_IN_CHILDREN)
    path = tmp_path / "barrier"
    path.mkdir()
    return path


@pytest.fixture
def supervisors() -> Iterator[list[Supervisor]]:
    started: list[Supervisor] = []
    yield started
    for supervisor in started:
        supervisor.reap()


def _enqueue(url: str, task_type: str, count: int, **params: object) -> list[str]:
    async def go(tm: Taskmill) -> list[str]:
        tasks = await tm.enqueue_many(
            [{"task_type": task_type, "params": dict(params)} for _ in range(count)]
        )
        return [t.id for t in tasks]

    ids: list[str] = stored(url, go)
    return ids


def _done(barrier: Path) -> dict[str, int]:
    """How many times each task's handler completed."""
    counts: dict[str, int] = {}
    for path in barrier.glob("*.done"):
        task_id = path.name.split(".")[1]
        counts[task_id] = counts.get(task_id, 0) + 1
    return counts


def test_three_processes_run_tasks_at_once_and_each_task_once(
    store_url: str, tmp_path: Path, barrier: Path, supervisors: list[Supervisor]
) -> None:
    ids = _enqueue(store_url, "meet", 12, processes=3)
    supervisor = Supervisor(
        tmp_path, store_url, "--processes", "3", "--concurrency", "2", "--until-idle"
    )
    supervisors.append(supervisor)

    assert supervisor.wait() == 0, supervisor.output()

    tasks = stored(store_url, lambda tm: tm.query(TaskFilter(task_types=["meet"]), limit=100))
    assert {t.status for t in tasks} == {TaskStatus.COMPLETED}
    assert len({t.result["pid"] for t in tasks}) == 3
    assert _done(barrier) == dict.fromkeys(ids, 1)
    assert len(supervisor.children()) == 3
    assert "0 restarts" in supervisor.output()


def test_a_killed_child_is_replaced_and_its_task_rescued_and_run_once(
    store_url: str, tmp_path: Path, barrier: Path, supervisors: list[Supervisor]
) -> None:
    (held,) = _enqueue(store_url, "hold", 1)
    supervisor = Supervisor(
        tmp_path, store_url, "--processes", "2", "--concurrency", "2", "--lease", "1"
    )
    supervisors.append(supervisor)
    wait_until(lambda: len(list(barrier.glob(f"*.{held}.running"))) == 1, "the task to run")
    (running,) = barrier.glob(f"*.{held}.running")
    victim = int(running.name.split(".")[0])
    assert victim in supervisor.children()

    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len(supervisor.children()) == 3, "a replacement child")
    # Another child (or the replacement) rescues the task after its lease and runs it.
    wait_until(lambda: len(list(barrier.glob(f"*.{held}.running"))) == 2, "the task to rerun")
    (barrier / "go").touch()
    quick = _enqueue(store_url, "quick", 20)
    wait_until(lambda: set(quick) | {held} <= set(_done(barrier)), "every task to complete")
    supervisor.proc.send_signal(signal.SIGTERM)

    assert supervisor.wait() == 0, supervisor.output()
    assert "exited with signal 9" in supervisor.output()
    assert _done(barrier) == dict.fromkeys([*quick, held], 1)
    task = stored(store_url, lambda tm: tm.get(held))
    assert task.status is TaskStatus.COMPLETED and task.result["pid"] != victim
    outcomes = [a.outcome for a in stored(store_url, lambda tm: tm.attempts(held))]
    assert outcomes == [AttemptOutcome.LOST, AttemptOutcome.COMPLETED]
    assert not any(_alive(pid) for pid in supervisor.children())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_drains_every_child(
    store_url: str,
    tmp_path: Path,
    barrier: Path,
    supervisors: list[Supervisor],
    sig: signal.Signals,
) -> None:
    ids = _enqueue(store_url, "hold", 4)
    supervisor = Supervisor(
        tmp_path,
        store_url,
        "--processes",
        "2",
        "--concurrency",
        "2",
        "--reserved-high",
        "0",
        "--shutdown-grace",
        "60",
    )
    supervisors.append(supervisor)
    wait_until(lambda: len(list(barrier.glob("*.running"))) == 4, "both children to hold two")
    assert len({p.name.split(".")[0] for p in barrier.glob("*.running")}) == 2

    supervisor.proc.send_signal(sig)
    wait_until(lambda: "stopping 2 worker processes gracefully" in supervisor.output(), "stop")
    (barrier / "go").touch()

    assert supervisor.wait() == 0, supervisor.output()
    tasks = stored(store_url, lambda tm: tm.query(TaskFilter(task_types=["hold"]), limit=10))
    assert {t.status for t in tasks} == {TaskStatus.COMPLETED}
    assert _done(barrier) == dict.fromkeys(ids, 1)
    assert not any(_alive(pid) for pid in supervisor.children())


def test_a_second_signal_stops_every_child_at_once(
    store_url: str, tmp_path: Path, barrier: Path, supervisors: list[Supervisor]
) -> None:
    ids = _enqueue(store_url, "hold", 2)
    supervisor = Supervisor(
        tmp_path,
        store_url,
        "--processes",
        "2",
        "--concurrency",
        "1",
        "--shutdown-grace",
        "600",
    )
    supervisors.append(supervisor)
    wait_until(lambda: len(list(barrier.glob("*.running"))) == 2, "both children to hold one")

    supervisor.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "gracefully" in supervisor.output(), "the graceful stop")
    supervisor.proc.send_signal(signal.SIGTERM)

    assert supervisor.wait(timeout=30) == 128 + signal.SIGTERM, supervisor.output()
    assert not any(_alive(pid) for pid in supervisor.children())
    assert not _done(barrier)
    # What the forced stop left RUNNING comes back by lease expiry (docs/cli.md).
    tasks = stored(store_url, lambda tm: tm.query(TaskFilter(task_types=["hold"]), limit=10))
    assert {t.id for t in tasks} == set(ids)
    assert TaskStatus.COMPLETED not in {t.status for t in tasks}


def test_children_that_keep_dying_stop_the_supervisor_with_status_2(
    tmp_path: Path, barrier: Path, supervisors: list[Supervisor]
) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    supervisor = Supervisor(tmp_path, url, "--processes", "2", module="sup_dying")
    supervisors.append(supervisor)

    assert supervisor.wait(timeout=120) == 2, supervisor.output()
    output = supervisor.output()
    assert "this worker cannot start" in output
    assert "giving up and stopping the others" in output
    assert "error: a worker process kept dying right after its start" in output
    assert not any(_alive(pid) for pid in supervisor.children())


def test_the_processes_setting_comes_from_the_environment_and_names_each_worker(
    tmp_path: Path, barrier: Path, supervisors: list[Supervisor]
) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    ids = _enqueue(url, "meet", 4, processes=2)
    supervisor = Supervisor(
        tmp_path,
        url,
        "--until-idle",
        "--concurrency",
        "1",
        TASKMILL_PROCESSES="2",
        TASKMILL_WORKER_ID="box",
    )
    supervisors.append(supervisor)

    assert supervisor.wait() == 0, supervisor.output()
    assert ": 2 worker processes" in supervisor.output()

    async def attempts(tm: Taskmill) -> list[Attempt]:
        return [a for i in ids for a in await tm.attempts(i)]

    workers = {a.worker_id for a in stored(url, attempts)}
    assert workers == {"box-1", "box-2"}
