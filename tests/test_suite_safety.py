"""The test suite never harms its machine: a test that restarts a server it did not start
runs only when asked to, and a hung test fails on its own, with a stack dump, while the
run goes on to its summary (or, if even that cannot end it, the run stops).

Each test runs pytest in a subprocess with this workspace's configuration.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _pytest(*args: str, cwd: Path, env: dict[str, str], timeout: float) -> str:
    """Run pytest with ``args``; its whole output (stdout then stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env.update(extra)
    return env


def _run_with_project_config(test_file: Path, *options: str, timeout: float) -> str:
    """Run ``test_file`` (outside the tests folder) under this workspace's pytest
    configuration and the plugin ``tests/conftest.py`` loads (``tests.timeouts``)."""
    return _pytest(
        "-c",
        str(ROOT / "pyproject.toml"),
        "--rootdir",
        str(test_file.parent),
        "-p",
        "tests.timeouts",
        "-v",
        *options,
        str(test_file),
        cwd=test_file.parent,
        env=_environment(PYTHONPATH=str(ROOT)),
        timeout=timeout,
    )


def test_the_suite_loads_the_timeout_plugin(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.has_plugin("tests.timeouts")
    assert request.config.getini("timeout_method") == "signal"


def test_a_test_that_restarts_a_server_is_skipped_unless_its_variable_is_set(
    tmp_path: Path,
) -> None:
    # Trip wires: if a test tried to restart a server anyway, it would run these.
    wires = tmp_path / "bin"
    wires.mkdir()
    tripped = tmp_path / "tripped"
    for name in ("pg_ctlcluster", "pg_ctl", "systemctl", "service"):
        wire = wires / name
        wire.write_text(f'#!/bin/sh\necho "$0 $*" >> {tripped}\nexit 1\n')
        wire.chmod(0o755)
    env = {
        k: v for k, v in _environment().items() if not re.fullmatch(r"TASKMILL_TEST_\w+_RESTART", k)
    }
    env["PATH"] = f"{wires}{os.pathsep}{env['PATH']}"
    env["TASKMILL_REQUIRE_BACKENDS"] = "postgres"  # as in CI: skipping is not a failure
    out = _pytest(
        str(ROOT / "tests"),
        "-m",
        "restarts_server",
        "-v",
        "-rs",
        "--basetemp",
        str(tmp_path / "run"),
        cwd=ROOT,
        env=env,
        timeout=240,
    )
    assert not tripped.exists(), tripped.read_text()
    assert out.startswith("exit 0\n"), out
    skipped = re.findall(r"^(tests/\S+::\S+) SKIPPED", out, re.MULTILINE)
    assert (
        "tests/test_server_multiprocess.py::test_a_server_restart_mid_run_loses_nothing_and_runs_nothing_twice[postgres]"
        in skipped
    ), out
    summary = out.strip().splitlines()[-1]
    assert re.search(rf"= {len(skipped)} skipped, \d+ deselected in ", summary), out
    reasons = re.findall(r"^SKIPPED \[(\d+)\] \S+: (.*)$", out, re.MULTILINE)
    assert sum(int(n) for n, _ in reasons) == len(skipped), out
    assert all(re.search(r"set TASKMILL_TEST_\w+_RESTART to ", r) for _, r in reasons), out
    assert "set TASKMILL_TEST_POSTGRES_RESTART to the restart command" in out


HUNG_TESTS = """
import asyncio
import threading


def test_hangs_joining_a_thread():
    never = threading.Event()
    helper = threading.Thread(target=never.wait, name="hung-helper", daemon=True)
    helper.start()
    helper.join()


async def awaits_forever():
    await asyncio.Event().wait()


async def test_hangs_on_the_event_loop():
    await awaits_forever()


def test_runs_after_the_hung_ones():
    pass
"""


def test_a_hung_test_fails_with_a_stack_dump_and_the_run_reaches_its_summary(
    tmp_path: Path,
) -> None:
    test_file = tmp_path / "test_hung.py"
    test_file.write_text(textwrap.dedent(HUNG_TESTS))
    out = _run_with_project_config(test_file, "-o", "timeout=2", timeout=120)

    assert out.startswith("exit 1\n"), out
    assert re.search(r"test_hung.py::test_hangs_joining_a_thread FAILED", out), out
    assert re.search(r"test_hung.py::test_hangs_on_the_event_loop FAILED", out), out
    assert re.search(r"test_hung.py::test_runs_after_the_hung_ones PASSED", out), out
    assert re.search(r"=+ 2 failed, 1 passed in [\d.]+s", out), out
    assert out.count("Timeout: the test ran longer than 2 s") >= 2, out
    # The dump: the main thread's stack as the traceback, the other threads' stacks ...
    assert "helper.join()" in out, out
    assert "--- thread hung-helper" in out and "self._target(" in out, out
    # ... and every asyncio task's chain of awaits.
    assert re.search(
        r"--- asyncio task .*\n.*in test_hangs_on_the_event_loop\nE?\s+await awaits_forever\(\)\n"
        r".*in awaits_forever\nE?\s+await asyncio.Event\(\).wait\(\)",
        out,
    ), out


BLOCKED_TEST = """
import signal
import time


def test_blocks_the_timeout_signal():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)


def test_never_reached():
    pass
"""


def test_a_test_its_timeout_cannot_end_stops_the_run_with_every_stack_dumped(
    tmp_path: Path,
) -> None:
    test_file = tmp_path / "test_blocked.py"
    test_file.write_text(textwrap.dedent(BLOCKED_TEST))
    # The subprocess timeout is the proof that the run does not stall: the test sleeps
    # for 600 s, the backstop ends the run 1 + 2 s after it started.
    out = _run_with_project_config(
        test_file, "-o", "timeout=1", "-o", "timeout_backstop=2", timeout=120
    )

    assert out.startswith("exit 1\n"), out
    assert "Timeout (0:00:03)!" in out, out
    assert re.search(r'File ".*test_blocked.py", line \d+ in test_blocks_the_timeout_signal', out)
    assert "test_never_reached" not in out, out
