"""SubprocessHandler: tasks run by real programs (small Python scripts), through a real
worker: results, exit codes, progress lines, cancellation and timeouts, bad output."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from taskmill import (
    AttemptOutcome,
    SubprocessHandler,
    Task,
    Taskmill,
    TaskStatus,
)
from taskmill.testing import wait_until

from tests.test_worker import Background, drain


def script(tmp_path: Path, name: str, source: str) -> list[str]:
    """Write a Python program and return the argv that runs it."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return [sys.executable, str(path)]


def alive(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:  # pragma: no cover - no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state != "Z"


async def gone(*pids: int) -> bool:
    """True once none of ``pids`` is alive (for ``wait_until``)."""
    return not any(alive(pid) for pid in pids)


async def stored(tm: Taskmill, task: Task) -> Task:
    current = await tm.get(task.id)
    assert current is not None
    return current


async def test_a_program_gets_params_on_argv_and_stdin_and_its_json_output_is_the_result(
    tm: Taskmill, tmp_path: Path
):
    argv = script(
        tmp_path,
        "greet",
        """
        import json, os, sys
        params = json.load(sys.stdin)
        print(json.dumps({
            "argv": sys.argv[1:],
            "stdin": params,
            "task": [os.environ[k] for k in (
                "TASKMILL_TASK_ID", "TASKMILL_TASK_TYPE", "TASKMILL_APP_ID", "TASKMILL_ATTEMPT"
            )],
            "extra": os.environ["GREETING"],
        }))
        """,
    )
    handler = SubprocessHandler(
        [*argv, "--name={name}", "{count:03d}", "{tags}"], env={"GREETING": "hi"}
    )
    tm.register("greet", handler, app_id="mail")

    params = {"name": "Ada Lovelace", "count": 7, "tags": ["a", "b"]}
    task = await tm.enqueue("greet", params, app_id="mail")
    await drain(tm)

    done = await stored(tm, task)
    assert done.status is TaskStatus.COMPLETED, done.error
    assert done.result == {
        "argv": ["--name=Ada Lovelace", "007", '["a", "b"]'],
        "stdin": params,
        "task": [task.id, "greet", "mail", "1"],
        "extra": "hi",
    }


async def test_empty_output_is_a_none_result_and_stdin_can_be_left_out(
    tm: Taskmill, tmp_path: Path
):
    argv = script(tmp_path, "quiet", "import sys; assert sys.stdin.read() == ''")
    tm.register("quiet", SubprocessHandler(argv, stdin=False))
    task = await tm.enqueue("quiet", {"ignored": True})
    await drain(tm)
    done = await stored(tm, task)
    assert done.status is TaskStatus.COMPLETED, done.error
    assert done.result is None


async def test_progress_lines_on_stderr_are_reported_into_the_task_while_it_runs(
    tm: Taskmill, tmp_path: Path
):
    release = tmp_path / "release"
    argv = script(
        tmp_path,
        "pages",
        f"""
        import json, os, sys, time
        def progress(**report):
            print("taskmill-progress " + json.dumps(report), file=sys.stderr, flush=True)
        print("starting", file=sys.stderr, flush=True)
        progress(done=0, total=3, message="page 1")
        progress(done=2, message="page 3")
        print("taskmill-progress {{not json", file=sys.stderr, flush=True)
        while not os.path.exists({str(release)!r}):
            time.sleep(0.01)
        progress(done=3, total=3, message="done")
        print(json.dumps({{"pages": 3}}))
        """,
    )
    tm.register("ocr", SubprocessHandler(argv))
    task = await tm.enqueue("ocr")

    async with Background(tm, progress_interval=0.02):

        async def midway() -> Task | None:
            current = await stored(tm, task)
            return current if current.progress.done == 2 else None

        running = await wait_until(midway)
        assert running is not None
        assert running.status is TaskStatus.RUNNING
        assert (running.progress.total, running.progress.message) == (3, "page 3")
        release.touch()
        done = await tm.wait(task.id, timeout=10)

    assert done.status is TaskStatus.COMPLETED, done.error
    assert done.result == {"pages": 3}
    assert (done.progress.done, done.progress.total, done.progress.message) == (3, 3, "done")


async def test_a_failing_exit_status_fails_the_attempt_with_the_end_of_stderr_and_is_retried(
    tm: Taskmill, tmp_path: Path
):
    argv = script(
        tmp_path,
        "full",
        """
        import sys
        for i in range(30):
            print(f"line {i}", file=sys.stderr)
        print("disk full", file=sys.stderr)
        sys.exit(3)
        """,
    )
    tm.register("copy", SubprocessHandler(argv, error_lines=2), max_retries=1)
    task = await tm.enqueue("copy")
    await drain(tm)

    dead = await stored(tm, task)
    assert dead.status is TaskStatus.FAILED
    first, second = await tm.attempts(task.id)
    assert first.outcome is second.outcome is AttemptOutcome.FAILED
    assert first.error == (
        f"ProxyError: {Path(argv[0]).name} exited with status 3; stderr ends with:\n"
        "line 29\ndisk full"
    )
    assert dead.error is not None and dead.error.endswith("(gave up after 2 attempts)")


async def test_exit_status_65_fails_at_once_and_75_asks_for_a_retry(tm: Taskmill, tmp_path: Path):
    argv = script(
        tmp_path,
        "sysexits",
        """
        import json, os, sys
        params = json.load(sys.stdin)
        if params["mode"] == "bad-input":
            print("field 'email' is empty", file=sys.stderr)
            sys.exit(65)
        if os.environ["TASKMILL_ATTEMPT"] == "1":
            print("server busy", file=sys.stderr)
            sys.exit(75)
        print(json.dumps("ok on attempt " + os.environ["TASKMILL_ATTEMPT"]))
        """,
    )
    tm.register("import", SubprocessHandler(argv), max_retries=3)
    bad = await tm.enqueue("import", {"mode": "bad-input"})
    busy = await tm.enqueue("import", {"mode": "busy"})
    await drain(tm)

    rejected = await stored(tm, bad)
    assert rejected.status is TaskStatus.FAILED and rejected.attempts == 1
    program = Path(argv[0]).name
    assert rejected.error == (
        f"{program} rejected the task (exit status 65); stderr ends with:\nfield 'email' is empty"
    )
    retried = await stored(tm, busy)
    assert retried.status is TaskStatus.COMPLETED and retried.result == "ok on attempt 2"
    (first, _) = await tm.attempts(busy.id)
    assert (
        first.error
        == f"{program} asked for a retry (exit status 75); stderr ends with:\nserver busy"
    )


async def test_output_that_is_not_json_fails_the_task_saying_so(tm: Taskmill, tmp_path: Path):
    argv = script(tmp_path, "chatty", "print('Converted 3 files.')")
    tm.register("convert", SubprocessHandler(argv), max_retries=3)
    task = await tm.enqueue("convert")
    await drain(tm)

    dead = await stored(tm, task)
    assert dead.status is TaskStatus.FAILED and dead.attempts == 1
    assert dead.error is not None
    assert dead.error.startswith(f"{Path(argv[0]).name} exited 0 but its stdout is not JSON (")
    assert dead.error.endswith("'Converted 3 files.'")


async def test_a_missing_param_or_program_is_a_clear_error(tm: Taskmill, tmp_path: Path):
    tm.register("needs-input", SubprocessHandler(["cat", "{input}"]), max_retries=2)
    tm.register("no-program", SubprocessHandler([str(tmp_path / "nope")]), max_retries=0)
    missing_param = await tm.enqueue("needs-input", {"output": "x"})
    missing_program = await tm.enqueue("no-program")
    await drain(tm)

    failed = await stored(tm, missing_param)
    assert failed.status is TaskStatus.FAILED and failed.attempts == 1
    assert (
        failed.error
        == "the command line of cat needs params['input'], which this task does not have"
    )
    lost = await stored(tm, missing_program)
    assert lost.status is TaskStatus.FAILED
    assert lost.error == (
        f"ProxyError: cannot run {str(tmp_path / 'nope')!r}: No such file or directory "
        "(gave up after 1 attempts)"
    )


def test_bad_templates_are_refused_when_the_handler_is_built():
    with pytest.raises(ValueError, match="must name one param"):
        SubprocessHandler(["convert", "{input.__class__}"])
    with pytest.raises(ValueError, match="non-empty list of strings"):
        SubprocessHandler("convert {input}")


HANGS = """
import os, pathlib, signal, subprocess, sys, time
here = pathlib.Path(sys.argv[1])
if sys.argv[2] == "ignore-sigterm":
    def shrug(signum, frame):  # noted, and carries on: only SIGKILL ends it
        (here / "ignored-sigterm").touch()
    signal.signal(signal.SIGTERM, shrug)
else:
    def stop(signum, frame):
        (here / "got-sigterm").touch()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
(here / "pids").write_text(f"{os.getpid()} {child.pid}")
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("behaviour", ["stops-on-sigterm", "ignore-sigterm"])
async def test_cancelling_a_running_program_stops_it_and_its_children(
    tm: Taskmill, tmp_path: Path, behaviour: str
):
    argv = script(tmp_path, "hangs", HANGS)
    tm.register("hang", SubprocessHandler([*argv, str(tmp_path), "{behaviour}"], cancel_grace=0.3))
    task = await tm.enqueue("hang", {"behaviour": behaviour})
    pids_file = tmp_path / "pids"

    async with Background(tm, cancel_check_interval=0.02):

        async def pids() -> list[int]:
            return [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []

        program, child = await wait_until(pids)
        assert alive(program) and alive(child)
        cancelled = await tm.cancel(task.id)
        assert cancelled.status is TaskStatus.CANCELLED
        await wait_until(lambda: gone(program, child), timeout=10)

    assert (tmp_path / "got-sigterm").exists() is (behaviour == "stops-on-sigterm")
    # A program that ignores SIGTERM got it first (its grace), then SIGKILL ended it.
    assert (tmp_path / "ignored-sigterm").exists() is (behaviour == "ignore-sigterm")
    assert [a.outcome for a in await tm.attempts(task.id)] == [AttemptOutcome.CANCELLED]


async def test_a_program_that_overruns_the_timeout_is_stopped_and_timed_out(
    tm: Taskmill, tmp_path: Path
):
    argv = script(tmp_path, "hangs", HANGS)
    handler = SubprocessHandler([*argv, str(tmp_path), "ignore-sigterm"], cancel_grace=0.1)
    tm.register("hang", handler, timeout=1.0, max_retries=0)
    task = await tm.enqueue("hang")
    await drain(tm)

    program, child = (int(p) for p in (tmp_path / "pids").read_text().split())
    await wait_until(lambda: gone(program, child), timeout=10)
    dead = await stored(tm, task)
    assert dead.status is TaskStatus.FAILED
    assert [a.outcome for a in await tm.attempts(task.id)] == [AttemptOutcome.TIMED_OUT]


async def test_a_worker_shutdown_stops_the_program_and_requeues_the_task(
    tm: Taskmill, tmp_path: Path
):
    argv = script(tmp_path, "hangs", HANGS)
    tm.register("hang", SubprocessHandler([*argv, str(tmp_path), "stops"], cancel_grace=0.5))
    task = await tm.enqueue("hang")
    pids_file = tmp_path / "pids"

    async with Background(tm) as worker:

        async def started() -> bool:
            return pids_file.exists()

        await wait_until(started)
        await worker.stop(grace=0)

    program, child = (int(p) for p in pids_file.read_text().split())
    await wait_until(lambda: gone(program, child), timeout=10)
    assert (tmp_path / "got-sigterm").exists()
    requeued = await stored(tm, task)
    assert requeued.status is TaskStatus.PENDING and requeued.attempts == 0
