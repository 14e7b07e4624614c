"""The distributions install and run the way users get them: ``.ci/check-wheels`` builds
every workspace member with ``uv build``, installs the wheels with pip into a plain
virtual environment, and runs ``taskmill demo`` and ``taskmill plugins`` there (see the
script's docstring). A package-data file or an entry point missing from a wheel fails it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import POSTGRES_URL, postgres_unreachable, required_backends, skip_or_fail

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "check-wheels"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_built_wheels_install_with_pip_and_run_the_demo_and_the_plugins_command(
    tmp_path: Path,
) -> None:
    env = dict(os.environ)
    unreachable = postgres_unreachable()
    if unreachable is None:
        env["TASKMILL_TEST_POSTGRES_URL"] = POSTGRES_URL  # the demo runs there too
    elif "postgres" in required_backends():
        skip_or_fail("postgres", unreachable)  # fails: PostgreSQL is required
    else:  # the demo runs on SQLite only
        env.pop("TASKMILL_TEST_POSTGRES_URL", None)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1100,
        env=env,
        check=False,
    )
    out = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, out
    assert "every wheel holds its src/ files and declares its entry points" in out
    assert "installed from the built wheels: taskmill," in out
    assert "the demo finished its 6 tasks on sqlite" in out and "check-wheels: ok" in out
    if unreachable is None:
        assert "the demo finished its 6 tasks on postgresql" in out, out
