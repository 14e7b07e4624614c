"""A worker's start imports what a worker needs, not the HTTP service's stack: the
taskmill-http plugin (installed here) keeps httpx, Starlette, uvicorn and the dashboard
for ``taskmill serve`` and for stored HTTP handlers. Each module costs start-up time in
every worker process (``--processes N`` starts N of them): about 0.5 s of 1.2 s."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("httpx", "starlette", "uvicorn", "uvloop", "jinja2", "taskmill_http.service")


def _imported(tmp_path: Path, *argv: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "taskmill", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return {
        line.rsplit("|", 1)[1].strip()
        for line in out.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_a_worker_start_leaves_the_http_service_stack_unimported(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    modules = _imported(tmp_path, "--url", url, "worker", "--until-idle")
    assert "taskmill_http.commands" in modules, "the plugin itself was loaded"
    loaded = sorted(m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY)
    assert loaded == []


def test_serve_and_the_package_still_reach_what_they_need(tmp_path: Path):
    helped = subprocess.run(
        [sys.executable, "-m", "taskmill", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert helped.returncode == 0 and "TASKMILL_SESSION_SECRET" in helped.stdout
    probe = (
        "import taskmill_http as h; "
        "print(h.Client.__name__, h.HttpHandler.__name__, h.create_app.__name__, "
        "h.Limits.__name__, h.Service.__name__)"
    )
    names = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert names.stdout.split() == ["Client", "HttpHandler", "create_app", "Limits", "Service"]
