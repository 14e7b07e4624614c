"""Schemathesis against the live service's ``/openapi.json``: generated requests to
every operation never get a 500, every response matches the document (status, content
type, body schema), and the document states every limit the server enforces:

- ``positive_data_acceptance``: a request the document admits is not refused as
  malformed (no 400/422: "valid request rejected");
- ``negative_data_rejection``: a request the document refuses is refused (4xx).

The event stream is left out: it never ends. The positive check runs with admin tokens:
an app token's body naming an ``app_id`` is refused (422 ``app_id_not_allowed``)
whatever the document says, since only the token decides the app. Two deliberate
differences from JSON Schema's reading are told to Schemathesis, not hidden:

- an integer field takes an integer written without a fraction (``2``, not ``2.0``: "a
  float is not an int", tests/test_http_limits.py), which JSON Schema cannot say, so the
  hooks spell generated whole floats as integers;
- a listing cursor of the right shape that names no stored task is 410
  ``cursor_expired`` (as one whose task was cleaned up), an answer about the store's
  state like 404 and 409.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from taskmill import Taskmill
from taskmill_http import create_app

from tests.http_support import TOKENS, serve

pytestmark = pytest.mark.timeout(300)

CONFORMANCE = (
    "not_a_server_error",
    "response_schema_conformance",
    "status_code_conformance",
    "content_type_conformance",
    "negative_data_rejection",
)

HOOKS = """
import schemathesis

_EXACT = 2**53


def _whole(value):
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT:
        return int(value)
    if isinstance(value, list):
        return [_whole(item) for item in value]
    if isinstance(value, dict):
        return {key: _whole(item) for key, item in value.items()}
    return value


@schemathesis.hook
def map_body(ctx, body):
    return _whole(body)
"""
"""Schemathesis hooks: whole floats spelled as integers (see the module docstring)."""

CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "410", "429", "5xx"]
"""
"""schemathesis.toml: 410 is an answer about the store's state (see the docstring)."""


@pytest.fixture(
    params=[("sqlite", "tok-photos"), ("sqlite", "tok-admin"), ("postgres", "tok-admin")],
    ids=["sqlite-app", "sqlite-admin", "postgres-admin"],
)
async def service(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    backend, token = request.param
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'tasks.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    # Any handler host: the allow-list is the deployment's choice, not the document's
    # (tests/test_http_allowlist.py tests it); every URL of the document's shape passes.
    app = create_app(tm := Taskmill(url, plugins=False), TOKENS, handler_hosts=["*"])
    async with tm, serve(app) as base:
        await tm.for_app("photos").enqueue("seeded", {"n": 1})
        yield base, token


async def run_schemathesis(base: str, token: str, checks: list[str], cwd: Path) -> str:
    """Schemathesis' output of a run against ``base`` with ``checks``; the run failed
    the test when it found anything."""
    (cwd / "taskmill_schemathesis_hooks.py").write_text(HOOKS)
    (cwd / "schemathesis.toml").write_text(CONFIG)
    schemathesis = Path(sys.executable).with_name("schemathesis")
    process = await asyncio.create_subprocess_exec(
        str(schemathesis),
        "--config-file",
        str(cwd / "schemathesis.toml"),
        "run",
        f"{base}/openapi.json",
        "--checks",
        ",".join(checks),
        "--header",
        f"Authorization: Bearer {token}",
        "--max-examples",
        "15",
        "--exclude-path",
        "/v1/events",
        "--phases",
        "coverage,fuzzing",
        "--seed",
        "1",
        "--continue-on-failure",
        "--generation-database",
        ":memory:",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={
            **os.environ,
            "NO_COLOR": "1",
            "SCHEMATHESIS_HOOKS": "taskmill_schemathesis_hooks",
            "PYTHONPATH": str(cwd),
        },
        cwd=cwd,
    )
    try:
        output, _ = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = output.decode()
    assert process.returncode == 0, text[-6000:]
    # Every generated case passed every check ("N generated, N passed").
    assert re.search(r"\b(\d+) generated, \1 passed\b", text), text[-4000:]
    return text


async def test_no_generated_request_gets_a_500_and_every_response_and_limit_matches_the_schema(
    service: tuple[str, str], tmp_path: Path
):
    base, token = service
    checks = list(CONFORMANCE)
    if token == "tok-admin":
        checks.append("positive_data_acceptance")
    await run_schemathesis(base, token, checks, tmp_path)
