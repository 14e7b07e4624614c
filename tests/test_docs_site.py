"""The documentation site (mkdocs.yml) builds in strict mode: a broken link or anchor, a
page left out of the nav, or an API reference entry that names nothing fails here as it
fails `.ci/run`. And the API reference covers the public API."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import taskmill

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"

needs_mkdocs = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None,
    reason="mkdocs is not installed (it is in the workspace's dev dependency group)",
)


def documented_identifiers() -> set[str]:
    """Every object the reference pages render (``::: identifier`` lines)."""
    found: set[str] = set()
    for page in REFERENCE.glob("*.md"):
        found.update(re.findall(r"^::: *([\w.]+) *$", page.read_text(), flags=re.MULTILINE))
    return found


@needs_mkdocs
def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "index.html").exists()  # README.md, the home page
    assert (tmp_path / "bench" / "results" / "throughput-vs-concurrency.png").exists()
    reference = (tmp_path / "reference" / "taskmill" / "index.html").read_text()
    assert 'id="taskmill.Taskmill"' in reference


def test_every_public_name_is_in_the_api_reference() -> None:
    documented = documented_identifiers()
    missing = [
        name
        for name in taskmill.__all__
        if f"taskmill.{name}" not in documented
        and getattr(getattr(taskmill, name), "__module__", None) not in documented
    ]
    assert not missing, f"add `::: taskmill.NAME` to a page of docs/reference/ for {missing}"


@pytest.mark.parametrize("module", ["taskmill.testing", "taskmill.storage", "taskmill.hookspecs"])
def test_the_authors_interfaces_are_in_the_api_reference(module: str) -> None:
    assert module in documented_identifiers()


def site_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "mkdocs_hooks", ROOT / "docs" / "_site" / "mkdocs_hooks.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_mkdocs
def test_links_written_for_the_repository_are_pointed_at_the_site() -> None:
    rewrite = site_hooks().rewrite_links
    readme = (
        "See [cli](docs/cli.md#worker), ![plot](bench/results/throughput-vs-concurrency.png),"
        " [the test](tests/test_docs_site.py) and [gone](docs/gone.md).\n"
        "```python\nx = '[cli](docs/cli.md)'\n```\nand `[cli](docs/cli.md)`\n"
    )
    assert rewrite(readme, "README.md", "index.md") == (
        "See [cli](cli.md#worker), ![plot](bench/results/throughput-vs-concurrency.png),"
        " the test (`tests/test_docs_site.py`) and [gone](docs/gone.md).\n"
        "```python\nx = '[cli](docs/cli.md)'\n```\nand `[cli](docs/cli.md)`\n"
    )
    page = (
        "[README](../README.md#a-tour-of-the-api), [bench](../bench/README.md),"
        " [apps](apps.md), [`reports.py`](../tests/embedding_apps/reports.py),"
        " [the hooks](../core/src/taskmill/hookspecs.py), [web](https://example.org/a.md)"
    )
    assert rewrite(page, "docs/plugins.md", "plugins.md") == (
        "[README](index.md#a-tour-of-the-api), [bench](bench/index.md),"
        " [apps](apps.md), `tests/embedding_apps/reports.py`,"
        " the hooks (`core/src/taskmill/hookspecs.py`), [web](https://example.org/a.md)"
    )
    bench = "[the page](../../docs/benchmarks.md#the-headline), [data](mysql-peers.jsonl)"
    assert rewrite(bench, "bench/results/mysql.md", "bench/results/mysql.md") == (
        "[the page](../../benchmarks.md#the-headline), data (`bench/results/mysql-peers.jsonl`)"
    )
