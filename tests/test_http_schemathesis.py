"""Schemathesis against the live service's ``/openapi.json``: generated requests to
every operation never get a 500, and every response matches the document (status,
content type, body schema). The event stream is left out: it never ends."""

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

pytestmark = pytest.mark.timeout(240)

CHECKS = ",".join(
    (
        "not_a_server_error",
        "response_schema_conformance",
        "status_code_conformance",
        "content_type_conformance",
    )
)


@pytest.fixture(
    params=[("sqlite", "tok-photos"), ("postgres", "tok-admin")],
    ids=["sqlite-app", "postgres-admin"],
)
async def service(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    backend, token = request.param
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'tasks.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    async with Taskmill(url, plugins=False) as tm, serve(create_app(tm, TOKENS)) as base:
        await tm.for_app("photos").enqueue("seeded", {"n": 1})
        yield base, token


async def test_no_generated_request_gets_a_500_and_every_response_matches_the_schema(
    service: tuple[str, str], tmp_path: Path
):
    base, token = service
    schemathesis = Path(sys.executable).with_name("schemathesis")
    process = await asyncio.create_subprocess_exec(
        str(schemathesis),
        "run",
        f"{base}/openapi.json",
        "--checks",
        CHECKS,
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
        env={**os.environ, "NO_COLOR": "1"},
        cwd=tmp_path,
    )
    output, _ = await process.communicate()
    text = output.decode()
    assert process.returncode == 0, text[-4000:]
    # Every generated case passed every check ("N generated, N passed").
    assert re.search(r"\b(\d+) generated, \1 passed\b", text), text[-4000:]
