"""The fixtures of the ``taskmill`` command's tests; a test module loads them with
``pytest_plugins = ("tests.cli_fixtures",)``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli_support import CLI, HANDLERS, SCRIPT, cli_env


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 't.db'}"


@pytest.fixture
def cli(tmp_path: Path) -> CLI:
    """Run ``taskmill ARGS...`` in ``tmp_path`` (where ``cli_handlers`` is importable)
    and return the finished process; keyword arguments are environment variables."""
    assert SCRIPT.exists(), f"the console script is not installed at {SCRIPT}"
    (tmp_path / "cli_handlers.py").write_text(HANDLERS)

    def run(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=tmp_path,
            env=cli_env(tmp_path, **env),
            check=False,
        )

    return run
