"""SPEC 5.15: bad input gets a clear TaskmillError and nothing stored is lost."""

from __future__ import annotations

import math
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from taskmill import (
    BackendNotInstalled,
    InvalidParams,
    InvalidTaskSpec,
    InvalidURL,
    SchemaVersionError,
    TaskFilter,
    Taskmill,
    TaskmillError,
)
from taskmill.discovery import KNOWN_PACKAGES, installed_schemes, storage_class


async def _snapshot(tm: Taskmill) -> list[tuple[str, dict]]:
    return [(t.id, t.params) for t in await tm.query(TaskFilter(), limit=1000)]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"when": datetime(2026, 1, 1)}, "JSON-serializable"),
        ({"s": {1, 2}}, "JSON-serializable"),
        ({"nan": math.nan}, "JSON-serializable"),
        ({1: object()}, "JSON-serializable"),
        (["not", "a", "dict"], "must be a dict"),
        ("text", "must be a dict"),
    ],
)
async def test_params_that_are_not_a_json_object_are_refused(
    tm: Taskmill, params: object, message: str
):
    await tm.enqueue("keep", {"n": 1})
    before = await _snapshot(tm)
    with pytest.raises(InvalidParams, match=message):
        await tm.enqueue("t", params)  # type: ignore[arg-type]
    assert await _snapshot(tm) == before


async def test_oversize_params_are_refused_with_the_limit_named(tm: Taskmill):
    await tm.enqueue("keep", {"n": 1})
    before = await _snapshot(tm)
    with pytest.raises(InvalidParams, match=r"over the limit of 1048576 bytes"):
        await tm.enqueue("t", {"blob": "x" * (1024 * 1024)})
    assert await _snapshot(tm) == before


async def test_the_params_limit_is_configurable(backend_url: str):
    async with Taskmill(backend_url, plugins=False, max_params_bytes=64) as small:
        await small.enqueue("t", {"blob": "x" * 40})
        with pytest.raises(InvalidParams, match="limit of 64 bytes"):
            await small.enqueue("t", {"blob": "x" * 80})


async def test_one_bad_spec_in_enqueue_many_stores_nothing(tm: Taskmill):
    await tm.enqueue("keep")
    before = await _snapshot(tm)
    with pytest.raises(InvalidParams):
        await tm.enqueue_many(
            [{"task_type": "a", "params": {"ok": 1}}, {"task_type": "b", "params": {"x": {1}}}]
        )
    assert await _snapshot(tm) == before


def test_unknown_scheme_names_the_scheme_and_what_is_installed():
    with pytest.raises(InvalidURL) as excinfo:
        Taskmill("redis://localhost/0")
    message = str(excinfo.value)
    assert "'redis'" in message
    assert "sqlite://" in message and "memory://" in message


def test_a_url_without_a_scheme_is_invalid():
    with pytest.raises(InvalidURL, match="expected scheme://"):
        Taskmill("tasks.db")


@pytest.mark.parametrize("scheme", sorted(KNOWN_PACKAGES))
def test_known_backends_resolve_or_name_their_pip_package(scheme: str):
    url = f"{scheme}://localhost/x"
    if scheme in installed_schemes():
        assert storage_class(url).__name__.endswith("Storage")
        return
    with pytest.raises(BackendNotInstalled) as excinfo:
        Taskmill(url)
    assert f"pip install {KNOWN_PACKAGES[scheme]}" in str(excinfo.value)
    assert scheme in str(excinfo.value)


def test_every_error_is_a_taskmill_error():
    for error in (InvalidURL, BackendNotInstalled, InvalidParams, SchemaVersionError):
        assert issubclass(error, TaskmillError)


def _set_schema_version(path: Path, version: int) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE taskmill_meta SET value = ? WHERE key = 'schema_version'", (str(version),)
        )


@pytest.mark.parametrize(("version", "advice"), [(0, "taskmill migrate"), (999, "upgrade")])
async def test_a_schema_version_mismatch_is_refused_and_tasks_stay_intact(
    tmp_path: Path, version: int, advice: str
):
    path = tmp_path / "tasks.db"
    url = f"sqlite:///{path}"
    async with Taskmill(url, plugins=False) as tm:
        stored = [await tm.enqueue("t", {"i": i}) for i in range(3)]
    with sqlite3.connect(path) as conn:
        (current,) = conn.execute(
            "SELECT value FROM taskmill_meta WHERE key = 'schema_version'"
        ).fetchone()
    _set_schema_version(path, version)
    with pytest.raises(SchemaVersionError) as excinfo:
        await Taskmill(url, plugins=False).open()
    assert advice in str(excinfo.value)
    _set_schema_version(path, int(current))
    async with Taskmill(url, plugins=False) as tm:
        again = await tm.query()
    assert [(t.id, t.params) for t in again] == [(t.id, t.params) for t in stored]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delay": 1, "run_at": datetime(2030, 1, 1, tzinfo=UTC)}, "not both"),
        ({"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"max_retries": -1}, "max_retries must be from 0 to 1000000000, got -1"),
        ({"priority": "high"}, "priority must be an int"),
    ],
)
async def test_inconsistent_task_options_are_refused(tm: Taskmill, kwargs: dict, message: str):
    await tm.enqueue("keep")
    before = await _snapshot(tm)
    with pytest.raises(InvalidTaskSpec, match=message):
        await tm.enqueue("t", **kwargs)
    with pytest.raises(InvalidTaskSpec):
        await tm.enqueue("", {})
    assert await _snapshot(tm) == before


def test_the_limits_table_in_the_docs_is_the_one_the_core_checks():
    """docs/semantics.md's Limits table holds every row of taskmill.validation.LIMITS,
    word for word, and no other row."""
    from taskmill.validation import LIMITS

    text = (Path(__file__).parent.parent / "docs" / "semantics.md").read_text()
    section = text.split("## Limits\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows == [f"| `{limit.field}` | {limit.admits} |" for limit in LIMITS]


def test_the_backoff_holds_for_any_attempt_number_and_refuses_bad_settings():
    from taskmill.backoff import RetryPolicy
    from taskmill.errors import Retry

    # max_retries may be a billion: the 1,025th attempt's factor**n overflows a float.
    assert RetryPolicy(jitter=0).delay(10**9) == 60.0
    assert RetryPolicy(jitter=0).delay(1025) == 60.0
    for bad in ({"maximum": math.inf}, {"base": -1}, {"factor": math.nan}, {"jitter": 2}):
        with pytest.raises(ValueError, match="RetryPolicy"):
            RetryPolicy(**bad)
    for delay in (math.inf, -1, 1e12, True):
        with pytest.raises(ValueError, match="100 years"):
            Retry(delay=delay)
    assert Retry(delay=3_155_760_000).delay == 3_155_760_000
