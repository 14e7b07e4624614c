"""A worker embedded in someone else's process: the host keeps its signals and its shutdown.

Each example of docs/embedding.md (the files in tests/embedding_apps/) runs here as the
real server process: uvicorn serving Starlette, uvicorn serving ASGI Django, and a plain
asyncio program that leaves the signals to the worker or keeps them itself. Each is
stopped with SIGINT and with SIGTERM while one task is finishing and another will not
finish within the grace period.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
from taskmill import AttemptOutcome, Task, TaskFilter, Taskmill, TaskStatus
from taskmill.storage import utcnow
from taskmill.testing import wait_until

if TYPE_CHECKING:
    # The examples import each other as a user's project does, so mypy checks them
    # through these imports (see mypy_path in pyproject.toml).
    import asyncio_program_signals  # noqa: F401
    import asyncio_worker_signals  # noqa: F401
    import django_site.asgi
    import django_site.settings
    import django_site.urls  # noqa: F401
    import starlette_app  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
APPS = ROOT / "tests" / "embedding_apps"
DOC = ROOT / "docs" / "embedding.md"

GRACE = 5.0
"""What every example gives running tasks when it stops its worker."""
QUICK = {"steps": 1, "step_seconds": 0}
DRAINS = {"steps": 20, "step_seconds": 0.1}
"""About 2 s of work: in flight at the stop, done well within the grace."""
OUTLIVES_GRACE = {"steps": 100_000, "step_seconds": 0.1}
"""Hours of work: still running when the grace ends, so it is given back."""


@attrs.frozen
class Host:
    """How to run one example, and how it ends."""

    argv: tuple[str, ...]
    serves_http: bool
    worker_owns_signals: bool
    exit_codes: Mapping[signal.Signals, int]


UVICORN = (sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", "0")
# uvicorn re-raises the signal it handled once its shutdown is over: SIGINT then ends in
# asyncio.run's KeyboardInterrupt, which uvicorn catches (exit 0), and SIGTERM, whose
# handler is the default again, ends the process as killed by SIGTERM.
UVICORN_EXIT = {signal.SIGINT: 0, signal.SIGTERM: -signal.SIGTERM}
CLEAN_EXIT = {signal.SIGINT: 0, signal.SIGTERM: 0}

HOSTS = {
    "starlette-uvicorn": Host((*UVICORN, "starlette_app:app"), True, False, UVICORN_EXIT),
    "django-uvicorn": Host((*UVICORN, "django_site.asgi:application"), True, False, UVICORN_EXIT),
    "asyncio-worker-owns-signals": Host(
        (sys.executable, "asyncio_worker_signals.py"), False, True, CLEAN_EXIT
    ),
    "asyncio-program-owns-signals": Host(
        (sys.executable, "asyncio_program_signals.py"), False, False, CLEAN_EXIT
    ),
}


class HostProcess:
    """One example running as its own process, its output in files; always reaped."""

    def __init__(self, host: Host, url: str, tmp_path: Path) -> None:
        self.host = host
        self.stdout_path = tmp_path / "stdout.txt"
        self.stderr_path = tmp_path / "stderr.txt"
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env.update(TASKMILL_URL=url, PYTHONDONTWRITEBYTECODE="1")
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(host.argv, cwd=APPS, env=env, stdout=out, stderr=err)

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def describe(self) -> str:
        return f"exit code {self.proc.poll()}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"

    async def port(self) -> int:
        """The port uvicorn listens on, once it serves."""

        async def announced() -> int | None:
            self.check_alive()
            found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", self.stderr)
            return int(found.group(1)) if found else None

        port = await wait_until(announced, timeout=60)
        assert port is not None
        return port

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"the host exited early; {self.describe()}")

    async def wait_exit(self, timeout: float) -> int:
        async def exited() -> bool:
            return self.proc.poll() is not None

        try:
            await wait_until(exited, timeout=timeout, interval=0.05)
        except AssertionError:
            raise AssertionError(
                f"the host did not exit within {timeout} s of the signal; {self.describe()}"
            ) from None
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 201, reply.status
        answer: dict[str, Any] = json.loads(reply.read())
        return answer


async def enqueuer(host: HostProcess, tm: Taskmill) -> Callable[[dict[str, Any]], Awaitable[str]]:
    """Enqueue ``report`` tasks the way the host's users do: through its HTTP endpoint
    when it has one, else straight into the shared store."""
    if host.host.serves_http:
        endpoint = f"http://127.0.0.1:{await host.port()}/reports"

        async def over_http(params: dict[str, Any]) -> str:
            answer = await asyncio.to_thread(post_json, endpoint, params)
            return str(answer["id"])

        return over_http

    async def into_store(params: dict[str, Any]) -> str:
        return (await tm.enqueue("report", params)).id

    return into_store


async def statuses(tm: Taskmill, ids: list[str]) -> list[TaskStatus]:
    tasks = [await tm.get(task_id) for task_id in ids]
    return [task.status for task in tasks if task is not None]


async def wait_for_status(
    tm: Taskmill, host: HostProcess, ids: list[str], status: TaskStatus
) -> None:
    async def reached() -> bool:
        host.check_alive()
        return await statuses(tm, ids) == [status] * len(ids)

    await wait_until(reached, timeout=60, interval=0.02)


async def stored(tm: Taskmill, task_id: str) -> Task:
    task = await tm.get(task_id)
    assert task is not None, task_id
    return task


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize("host_name", list(HOSTS))
async def test_a_stop_signal_runs_the_hosts_shutdown_and_the_worker_drains_or_releases(
    host_name: str, sig: signal.Signals, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    async with Taskmill(url, plugins=False) as tm:  # creates the store before the host
        host = HostProcess(HOSTS[host_name], url, tmp_path)
        try:
            enqueue = await enqueuer(host, tm)
            quick = [await enqueue(QUICK) for _ in range(3)]
            await wait_for_status(tm, host, quick, TaskStatus.COMPLETED)
            released = await enqueue(OUTLIVES_GRACE)
            draining = await enqueue(DRAINS)
            await wait_for_status(tm, host, [draining, released], TaskStatus.RUNNING)

            signalled_at = utcnow()
            host.proc.send_signal(sig)
            code = await host.wait_exit(timeout=GRACE + 30)
        finally:
            host.kill()

        report = host.describe()
        assert code == host.host.exit_codes[sig], report
        assert "shutdown complete" in host.stdout, f"the host's shutdown code did not run; {report}"
        assert "Traceback" not in host.stderr and "KeyboardInterrupt" not in host.stderr, report
        took_signal = re.search(r"SIG\w+ received: stopping gracefully", host.stderr)
        if host.host.worker_owns_signals:
            assert took_signal and took_signal.group().startswith(sig.name), report
        else:
            assert took_signal is None, f"the worker took the host's signal; {report}"

        # Every task is either done or back to PENDING with no attempt spent.
        everything = await tm.query(TaskFilter(), limit=100)
        assert len(everything) == 5
        for task in everything:
            assert task.status is TaskStatus.COMPLETED or (
                task.status is TaskStatus.PENDING and task.attempts == 0
            ), (task, report)

        drained = await stored(tm, draining)
        assert drained.status is TaskStatus.COMPLETED, (drained, report)
        assert drained.finished_at is not None and drained.finished_at > signalled_at, drained
        assert drained.result == {"steps": DRAINS["steps"]}

        given_back = await stored(tm, released)
        assert given_back.status is TaskStatus.PENDING and given_back.attempts == 0, given_back
        assert given_back.worker_id is None
        outcomes = [attempt.outcome for attempt in await tm.attempts(released)]
        assert outcomes == [AttemptOutcome.INTERRUPTED], outcomes


def shown_in_docs() -> dict[str, str]:
    """The code blocks of docs/embedding.md that show a file, by the file's path."""
    pattern = re.compile(
        r"^\[`[^`]+`\]\(\.\./(tests/embedding_apps/[^)]+)\):\n\n```python\n(.*?)^```$",
        re.MULTILINE | re.DOTALL,
    )
    return dict(pattern.findall(DOC.read_text()))


def test_the_embedding_docs_show_every_example_file_as_it_is() -> None:
    shown = shown_in_docs()
    files = sorted(
        str(path.relative_to(ROOT)) for path in APPS.rglob("*.py") if path.name != "__init__.py"
    )
    assert sorted(shown) == files
    for path, code in shown.items():
        assert code == (ROOT / path).read_text(), f"docs/embedding.md shows an old {path}"
