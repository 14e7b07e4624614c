"""Shared fixtures: the backends every API-level test runs against."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from taskmill import Taskmill

API_BACKENDS = ["memory", "sqlite"]


def url_for(backend: str, tmp_path: Path) -> str:
    """A fresh, empty store of ``backend``."""
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'tasks.db'}"
    raise ValueError(backend)


@pytest.fixture(params=API_BACKENDS)
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return url_for(request.param, tmp_path)


@pytest.fixture
async def tm(backend_url: str) -> AsyncIterator[Taskmill]:
    """An opened ``Taskmill`` on a fresh store, without plugins."""
    async with Taskmill(backend_url, plugins=False) as taskmill:
        yield taskmill
