"""The counterexamples the reliability suite's fuzzing found, kept as regression tests.

Each crashed (an exception that was not a TaskmillError) or stored a task no backend
could read back before the fix in core/src/taskmill/serialization.py or
core/src/taskmill/discovery.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from taskmill import InvalidParams, InvalidURL, Taskmill
from taskmill.discovery import storage_for_url
from taskmill.serialization import MAX_PARAMS_DEPTH


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


async def test_a_lone_surrogate_in_params_is_refused_clearly(tm: Taskmill) -> None:
    # Was: UnicodeEncodeError from the size check.
    with pytest.raises(InvalidParams, match="lone surrogate"):
        await tm.enqueue("t", {"name": "a\ud800b"})
    with pytest.raises(InvalidParams, match="lone surrogate"):
        await tm.enqueue("t", {"\udfff": 1})
    assert await tm.query() == []


async def test_params_nested_deeper_than_the_limit_are_refused_and_the_limit_is_stored(
    tm: Taskmill,
) -> None:
    # Was: stored, then every read of the store failed with RecursionError (SQLite) or
    # the encoder's RecursionError escaped the enqueue.
    with pytest.raises(InvalidParams, match=f"more than {MAX_PARAMS_DEPTH} levels"):
        await tm.enqueue("t", nested(MAX_PARAMS_DEPTH + 1))
    with pytest.raises(InvalidParams, match="nest"):
        await tm.enqueue("t", nested(5000))
    task = await tm.enqueue("t", nested(MAX_PARAMS_DEPTH))
    [stored] = await tm.query()
    assert stored.id == task.id and stored.params == nested(MAX_PARAMS_DEPTH)


def test_a_url_with_an_unbalanced_bracket_is_refused_clearly() -> None:
    # Was: ValueError("Invalid IPv6 URL") from urllib.
    with pytest.raises(InvalidURL, match="malformed storage URL"):
        storage_for_url("postgresql://[::1/db")
    with pytest.raises(InvalidURL, match="malformed storage URL"):
        storage_for_url("sqlite://[")
