"""The worked example of docs/backend-authoring.md, as a third party ships it: the
``taskmill-shelf`` distribution under tests/backends/shelf is built into a wheel,
installed into a directory of its own, found through its ``taskmill.backends`` entry
point, and passes the shipped contract suite in a pytest of its own, skipping exactly
the tests of the one capability it declares missing (notifications) and the SQL
migration checks (it has no SQL migrations)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PROJECT = Path(__file__).with_name("backends") / "shelf"


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    process = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, check=False, env=env
    )
    assert process.returncode == 0, f"{argv} failed:\n{process.stdout}\n{process.stderr}"
    return process


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """taskmill-shelf built with uv and installed (without dependencies: taskmill is
    this environment's) into a directory of its own."""
    uv = shutil.which("uv")
    assert uv, "building the example backend needs uv on PATH"
    root = tmp_path_factory.mktemp("shelf")
    _run([uv, "build", "--wheel", "--out-dir", str(root / "wheels"), str(PROJECT)])
    (wheel,) = (root / "wheels").glob("*.whl")
    target = root / "site"
    _run(
        [
            uv,
            "pip",
            "install",
            "--no-deps",
            "--python",
            sys.executable,
            "--target",
            str(target),
            str(wheel),
        ]
    )
    return target


def _environ(site: Path) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TASKMILL_")}
    environ["PYTHONPATH"] = str(site)
    return environ


def test_the_example_backend_serves_its_url_scheme_through_its_entry_point(
    site: Path, tmp_path: Path
) -> None:
    program = textwrap.dedent(
        """
        import asyncio, sys
        from taskmill import Taskmill, TaskStatus

        async def main(url):
            async with Taskmill(url, plugins=False) as tm:
                @tm.handler("double")
                async def double(ctx, params):
                    return params["n"] * 2
                task = await tm.enqueue("double", {"n": 21})
                await tm.run_worker(until_idle=True, concurrency=2)
                done = await tm.get(task.id)
                print(type(tm.storage).__module__, done.status.value, done.result)

        asyncio.run(main(sys.argv[1]))
        """
    )
    url = f"shelf://{tmp_path / 'tasks.shelf'}"
    out = _run([sys.executable, "-c", program, url], env=_environ(site)).stdout.split()
    assert out == ["taskmill_shelf", "completed", "42"]
    # A second process reads what the first one stored.
    reader = textwrap.dedent(
        """
        import asyncio, sys
        from taskmill import Taskmill

        async def main(url):
            async with Taskmill(url, plugins=False) as tm:
                print((await tm.progress_summary()).completed)

        asyncio.run(main(sys.argv[1]))
        """
    )
    assert _run([sys.executable, "-c", reader, url], env=_environ(site)).stdout.strip() == "1"


def test_the_example_backend_passes_the_whole_suite_but_for_its_declared_gap(
    site: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report.xml"
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_mode=auto",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            f"--junitxml={report}",
            "--rootdir",
            str(PROJECT),
            str(PROJECT / "tests" / "test_contract.py"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
        env=_environ(site),
    )
    assert process.returncode == 0, process.stdout[-5000:] + process.stderr[-2000:]
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).iter("testcase"):
        skipped = case.find("skipped")
        failed = case.find("failure") or case.find("error")
        if failed is not None:
            outcomes[case.get("name", "")] = "failed"
        elif skipped is not None:
            outcomes[case.get("name", "")] = f"skipped: {skipped.get('message', '')}"
        else:
            outcomes[case.get("name", "")] = "passed"
    assert len(outcomes) >= 100
    assert "failed" not in outcomes.values()
    skips = {name: why for name, why in outcomes.items() if why.startswith("skipped")}
    # Its one declared gap, and the SQL migration checks, which need a schema_migrations
    # fixture that a store without SQL migrations has no way to give.
    gap = {n for n, why in skips.items() if "ShelfStorage declares it lacks notifications" in why}
    sql = {n for n, why in skips.items() if "has no versioned migrations to check" in why}
    assert gap and sql and set(skips) == gap | sql, skips
    assert len(skips) <= 5
    assert len(outcomes) - len(skips) >= 100
