"""Bad-input fuzzing (issue 16 §4): params, URLs and CLI arguments from Hypothesis.

Whatever comes in: a clear :class:`TaskmillError` (or, from the CLI, an exit status with
a message), never another exception; and the store is not corrupted: after each run
every task stored holds exactly the params it was given and nothing else was stored.
The HTTP service's bodies are fuzzed by tests/test_http_schemathesis.py (never a 500).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from taskmill import Taskmill, TaskmillError
from taskmill.cli import main as cli_main
from taskmill.discovery import storage_for_url

FUZZ = settings(
    max_examples=int(os.environ.get("TASKMILL_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

FUZZ_BACKENDS = {
    "memory": None,
    "sqlite": None,
    "postgres": "postgres_url",
    "mysql": "mysql_url",
    "mongo": "mongo_url",
}
"""Each backend whose stores the params fuzzing fills, with the conftest fixture of its
fresh store URL (None: memory, or a SQLite file in the test's directory)."""

NASTY_TEXT = [
    "",
    "\x00",
    "\ud800",
    "\udfff",
    "a\ud83dz",
    "\u202e",
    "\ufeff",
    "e\u0301",
    "\U0001d518\U0001f600",
    "\\",
    '"',
    "x" * 100_000,
]
keys = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["$where", "$", "a.b", ".", "..", "_id", "$set.x", *NASTY_TEXT[:9]]),
)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(), max_size=30),
    st.sampled_from(NASTY_TEXT),
)
json_like = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=4)
    ),
    max_leaves=25,
)


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


params_strategy = st.one_of(
    st.dictionaries(keys, json_like, max_size=6),
    st.integers(1, 5000).map(nested),
    st.sampled_from([[1], "text", 3, None]),
)


class Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.loop.close()


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values (-0.0 == 0.0, 1 == 1.0 are fine; NaN never stored)."""
    if isinstance(a, float) and math.isnan(a):
        return False
    return bool(a == b)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", list(FUZZ_BACKENDS))
def test_any_params_are_stored_exactly_or_refused_clearly(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, loop: Loop
) -> None:
    fixture = FUZZ_BACKENDS[backend]
    if fixture is not None:
        url = str(request.getfixturevalue(fixture))
    else:
        url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'fuzz.db'}"
    tm = Taskmill(url, plugins=False)
    loop.run(tm.open())
    stored: dict[str, Any] = {}

    @FUZZ
    @given(params=params_strategy)
    def enqueue_anything(params: Any) -> None:
        try:
            task = loop.run(tm.enqueue("fuzz", params))
        except TaskmillError as exc:
            refusal = str(exc)
            assert refusal, "a refusal says why"
            return
        params = {} if params is None else params  # None means no params
        stored[task.id] = params
        again = loop.run(tm.get(task.id))
        assert again is not None and same_json(again.params, params)

    try:
        enqueue_anything()
        # The store holds exactly what was accepted, each task with its own params.
        tasks = loop.run(tm.query(limit=100_000))
        assert sorted(t.id for t in tasks) == sorted(stored)
        for task in tasks:
            assert same_json(task.params, stored[task.id])
        assert loop.run(tm.progress_summary()).pending == len(stored)
    finally:
        loop.run(tm.close())


url_strategy = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda scheme, rest: scheme + rest,
        st.sampled_from(
            [
                "sqlite://",
                "sqlite:///",
                "memory://",
                "postgresql://",
                "mysql://",
                "mongodb://",
                "mongodb+srv://",
                "x://",
                "",
            ]
        ),
        st.text(alphabet=st.characters(), max_size=40),
    ),
    st.builds(
        lambda scheme, query: f"{scheme}u:p@127.0.0.1:1/db?{query}",
        st.sampled_from(["postgresql://", "mysql://", "mongodb://"]),
        st.text(max_size=30),
    ),
)


@FUZZ
@given(url=url_strategy)
def test_any_url_builds_a_store_or_is_refused_clearly(url: str) -> None:
    try:
        storage_for_url(url)
    except TaskmillError as exc:
        refusal = str(exc)
        assert refusal, "a refusal says why"


cli_word = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["--url", "--params", "--json", "--limit", "-1", "{", "[]", "\ud800", "--"]),
)


@pytest.mark.timeout(600)
def test_any_cli_arguments_exit_with_a_status_never_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKMILL_DISABLE_PLUGINS", "demo,http,prometheus")
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'cli.db'}"

    @settings(FUZZ, max_examples=min(FUZZ.max_examples, 40))
    @given(
        command=st.sampled_from(["enqueue", "stats", "list", "show", "retry", "cancel", "nope"]),
        words=st.lists(cli_word, max_size=4),
    )
    def run_cli(command: str, words: list[str]) -> None:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli_main([command, "--url", url, *words])
            except SystemExit as exit:  # argparse refusing the arguments
                status = exit.code if isinstance(exit.code, int) else 2
        assert isinstance(status, int)
        assert "Traceback" not in err.getvalue() + out.getvalue()
        if status != 0:
            assert err.getvalue().strip() or out.getvalue().strip(), "a failure says why"

    run_cli()
