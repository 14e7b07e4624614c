"""``taskmill workers`` lists the workers registered in the store by a real worker
running in another process, on SQLite and PostgreSQL; ``taskmill stats`` warns about
pending tasks of types no live worker serves (docs/cli.md, docs/workers.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from taskmill import Taskmill

from tests.cli_support import CLI, ok, stored, wait_until

pytest_plugins = ("tests.cli_fixtures",)
pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "worker_process.py"
FAST_STOP = ("--concurrency", "3", "--shutdown-grace", "1")


@pytest.fixture(params=["sqlite", "postgres"])
def worker_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of a backend that keeps a worker registry."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'workers.db'}"
    from taskmill_postgres import PostgresStorage

    if not PostgresStorage.capabilities.worker_registry:  # pragma: no cover - not landed
        pytest.skip("PostgreSQL keeps no worker registry yet")
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def worker(worker_store: str, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """tests/worker_process.py running against the store (concurrency 3), stopped by its
    pid at the end."""
    stored(worker_store, lambda tm: tm.progress_summary())  # create the store first
    log = tmp_path / "runs.log"
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), "--url", worker_store, "--log", str(log), *FAST_STOP],
        cwd=ROOT,
        text=True,
    )
    try:
        wait_until(lambda: log.exists() and "worker-ready" in log.read_text(), "worker ready")
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


def listed(cli: CLI, url: str) -> list[dict]:
    return json.loads(ok(cli("--url", url, "workers", "--json")))["workers"]


def test_workers_lists_a_worker_of_another_process_with_its_tasks(
    cli: CLI, worker_store: str, worker: subprocess.Popen[str]
) -> None:
    async def start(tm: Taskmill) -> str:
        return (await tm.enqueue("block-first", {})).id

    task_id = stored(worker_store, start)

    def busy() -> bool:
        found = listed(cli, worker_store)
        return bool(found) and found[0]["busy"] == 1

    wait_until(busy, "the worker to report a busy slot", timeout=60)
    (found,) = listed(cli, worker_store)
    assert found["pid"] == worker.pid
    assert found["alive"] is True
    assert found["concurrency"] == 3
    assert found["running"] == [task_id]
    assert found["id"].split(":")[1] == str(worker.pid)
    types = {h["task_type"] for h in found["handlers"]}
    assert {"record", "block-first", "steps", "taskmill.group"} <= types
    assert found["heartbeat_age_seconds"] >= 0

    table = ok(cli("--url", worker_store, "workers"))
    header, _, row = table.splitlines()[:3]
    for column in ("worker", "host", "pid", "version", "started", "heartbeat", "state"):
        assert column in header
    assert found["id"] in row and str(worker.pid) in row
    assert "alive" in row and "1/3" in row and "block-first" in row

    # Stopped, the worker removes its registration.
    os.kill(worker.pid, signal.SIGTERM)
    worker.wait(timeout=60)
    assert listed(cli, worker_store) == []
    assert "no workers registered" in ok(cli("--url", worker_store, "workers"))


def test_a_killed_worker_is_listed_dead(cli: CLI, worker_store: str, tmp_path: Path) -> None:
    stored(worker_store, lambda tm: tm.progress_summary())
    log = tmp_path / "runs.log"
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), "--url", worker_store, "--log", str(log), "--lease", "1"],
        cwd=ROOT,
    )
    try:
        wait_until(lambda: bool(listed(cli, worker_store)), "the worker to register")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def dead() -> bool:
        found = listed(cli, worker_store)
        return len(found) == 1 and found[0]["alive"] is False

    wait_until(dead, "the killed worker to be listed dead")
    assert "dead" in ok(cli("--url", worker_store, "workers"))


def test_stats_warns_about_pending_tasks_no_live_worker_serves(
    cli: CLI, worker_store: str, worker: subprocess.Popen[str]
) -> None:
    async def enqueue(tm: Taskmill) -> None:
        await tm.enqueue("nobody.runs.this")
        await tm.for_app("photos").enqueue("nobody.runs.this")
        await tm.enqueue("record", {"sleep": 0}, delay=3600)  # served: no warning

    stored(worker_store, enqueue)
    done = cli("--url", worker_store, "stats")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "no live worker serves" in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("warning: 2 pending tasks of types no live worker serves")
    assert "'nobody.runs.this' (1 task)" in lines[0]
    assert "'nobody.runs.this' of app 'photos' (1 task)" in lines[0]
    assert "'record'" not in lines[0]


def test_workers_on_a_store_without_a_registry_says_so(tmp_path: Path) -> None:
    from taskmill.backends.sqlite import SQLiteStorage

    assert SQLiteStorage.capabilities.worker_registry
    url = f"sqlite:///{tmp_path / 'old.db'}"

    async def enqueue(tm: Taskmill) -> None:
        await tm.enqueue("nobody.runs.this")

    stored(url, enqueue)
    # Stand in for a store that keeps no registry (a backend without the capability).
    script = (
        "import sys, attrs\n"
        "from taskmill.backends.sqlite import SQLiteStorage\n"
        "SQLiteStorage.capabilities = attrs.evolve("
        "SQLiteStorage.capabilities, worker_registry=False)\n"
        "from taskmill.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", script, "--url", url, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = run("workers")
    assert done.returncode == 2, done.stderr
    assert "keeps no worker registry" in done.stderr
    # stats still warns that no handler loaded here serves it, but says nothing of
    # live workers on such a store.
    done = run("stats")
    assert done.returncode == 0, done.stderr
    assert "no handler loaded here serves" in done.stderr
    assert "no live worker" not in done.stderr


def test_workers_on_a_store_that_does_not_exist_creates_none(cli: CLI, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing.db'}"
    done = cli("--url", url, "workers")
    assert done.returncode == 2
    assert "there is no taskmill store" in done.stderr
    assert not (tmp_path / "missing.db").exists()
