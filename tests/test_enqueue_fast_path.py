"""The fast paths of ``enqueue_many`` give exactly what the general code gives.

Three fast paths serve the common enqueue: ``TaskSpec.from_value`` builds a spec from a
plain dict without the attrs ``__init__`` (``model._spec_from_fields``),
``Taskmill.new_task`` builds its ``NewTask`` the same way
(``operations.new_task_from_values``), and ``serialization.dumps`` encodes a small dict
of scalars without a circular-reference memo (``serialization._encode_flat``). Each
test runs the same specs with the fast paths and with them replaced by the general code
(the attrs constructors, the memo encoder), and compares what comes out: the same
``TaskSpec``, ``NewTask`` and stored ``Task``, or the same error (class, message,
``field``).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import attrs
import pytest
from taskmill import Taskmill, app, model, serialization
from taskmill.model import Priority, Task, TaskSpec
from taskmill.storage import NewTask

EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


class Text(str):
    """A str subclass: never on a fast path."""


SPECS: list[dict[Any, Any]] = [
    {"task_type": "noop", "params": {"i": 1}},
    {"task_type": "noop"},
    {"task_type": "noop", "params": None, "priority": Priority.URGENT, "max_retries": 0},
    {"task_type": "noop", "params": {"big": 2**200, "neg": -0.0, "b": True, "n": None}},
    {"task_type": "noop", "params": {"s": "é\x00 ✓ 😀", "f": 1e308, "i": -(2**63)}},
    {"task_type": "noop", "params": {1: "int", 2.5: "float", False: "bool", None: "none"}},
    {"task_type": "noop", "params": {(1, 2): "a tuple key"}},
    {"task_type": "noop", "params": {"nan": math.nan}},
    {"task_type": "noop", "params": {"inf": -math.inf}},
    {"task_type": "noop", "params": {"lone": "\ud800"}},
    {"task_type": "noop", "params": {"\udc80": 1}},
    {"task_type": "noop", "params": {str(i): i for i in range(8)}},
    {"task_type": "noop", "params": {str(i): i for i in range(9)}},
    {"task_type": "noop", "params": {"nested": {"a": [1, {"b": None}]}}},
    {"task_type": "noop", "params": {"sub": Text("x"), "e": Priority.URGENT}},
    {"task_type": "noop", "params": {"when": EPOCH}},
    {"task_type": "noop", "params": ["a", "list"]},
    {"task_type": "noop", "params": {"taskmill.headers": {}}},
    {"task_type": "noop", "params": {"blob": "x" * 2000}},
    {"task_type": "noop", "priority": True},
    {"task_type": "noop", "priority": 2**40},
    {"task_type": "noop", "priority": 1.5},
    {"task_type": "noop", "priority": -(2**31)},
    {"task_type": "noop", "max_retries": -1},
    {"task_type": "noop", "max_retries": False},
    {"task_type": "noop", "max_retries": 10**12},
    {"task_type": ""},
    {"task_type": 5},
    {"task_type": None},
    {"task_type": "x" * 256},
    {"task_type": "é" * 255},
    {"task_type": "a\udc80b"},
    {"task_type": "a\x00b"},
    {"task_type": Text("noop")},
    {"task_type": "noop", "app_id": "app", "dedupe_key": "k", "user_id": "u", "parent_id": "p"},
    {"task_type": "noop", "dedupe_key": "k" * 1025},
    {"task_type": "noop", "user_id": 7},
    {"task_type": "noop", "parent_id": ""},
    {"task_type": "noop", "after": "a-task-id"},
    {"task_type": "noop", "after": None},
    {"task_type": "noop", "after": ()},
    {"task_type": "noop", "after": []},
    {"task_type": "noop", "after": ["missing", "missing"]},
    {"task_type": "noop", "after": [""]},
    {"task_type": "noop", "after_policy": "sometimes"},
    {"task_type": "noop", "headers": {"traceparent": "00-abc-def-01"}},
    {"task_type": "noop", "headers": {}},
    {"task_type": "noop", "headers": None},
    {"task_type": "noop", "headers": ["not", "a", "mapping"]},
    {"task_type": "noop", "headers": {"": "empty name"}},
    {"task_type": "noop", "run_at": datetime(2030, 1, 1, tzinfo=UTC)},
    {"task_type": "noop", "run_at": datetime(2030, 1, 1)},
    {"task_type": "noop", "run_at": "2030-01-01"},
    {"task_type": "noop", "delay": math.nan},
    {"task_type": "noop", "delay": -1},
    {"task_type": "noop", "run_at": EPOCH, "delay": 1},
    {"task_type": "noop", "unknown": 1},
    {"params": {}},
    {},
]


def _noop(ctx: object, params: dict[str, Any]) -> None:
    pass


def _error(phase: str, exc: Exception) -> tuple[Any, ...]:
    return (phase, type(exc), str(exc), getattr(exc, "field", None))


def _fixed(task: Task) -> Task:
    # Ids and clocks differ between two runs; everything else must not.
    changes: dict[str, Any] = {"id": "fixed", "created_at": EPOCH, "updated_at": EPOCH}
    if task.run_at == task.created_at:
        changes["run_at"] = EPOCH
    return task.evolve(**changes)


async def _outcome(value: Any) -> tuple[Any, ...]:
    """What each step of an enqueue makes of ``value``: the spec, the checked task and
    the stored one, or the first error (the step, its class, message and field)."""
    try:
        spec = TaskSpec.from_value(value)
    except Exception as exc:
        return _error("from_value", exc)
    async with Taskmill("memory://", plugins=False) as tm:
        tm.register("noop", _noop)
        try:
            new = tm.new_task(spec, "fixed-id")
        except Exception as exc:
            return _error("new_task", exc)
        try:
            (task,) = await tm.enqueue_many([value])
        except Exception as exc:
            return _error("enqueue_many", exc)
    return ("stored", spec, repr(spec), new, repr(new), _fixed(task), repr(_fixed(task)))


def _general_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace every fast path by the general code it stands for."""
    monkeypatch.setattr(model, "_spec_from_fields", TaskSpec)
    monkeypatch.setattr(app, "new_task_from_values", NewTask)
    monkeypatch.setattr(serialization, "_encode_flat", None)


async def test_the_fast_paths_give_the_same_specs_tasks_and_errors(
    monkeypatch: pytest.MonkeyPatch,
):
    fast = [await _outcome(value) for value in SPECS]
    _general_code(monkeypatch)
    general = [await _outcome(value) for value in SPECS]
    for value, one, other in zip(SPECS, fast, general, strict=True):
        assert one == other, value
    # The specs reach every step, and some are stored.
    assert {outcome[0] for outcome in general} == {
        "from_value",
        "new_task",
        "enqueue_many",
        "stored",
    }


@pytest.mark.parametrize("value", SPECS, ids=range(len(SPECS)))
async def test_a_plain_dict_and_another_mapping_give_the_same(value: dict[Any, Any]):
    # A mapping that is not a dict goes through TaskSpec(**value), the general path.
    assert await _outcome(value) == await _outcome(MappingProxyType(value))


def test_from_value_takes_the_fast_path_for_a_plain_dict(monkeypatch: pytest.MonkeyPatch):
    calls: list[dict[str, Any]] = []
    build = model._spec_from_fields

    def spy(**fields: Any) -> TaskSpec:
        calls.append(fields)
        return build(**fields)

    monkeypatch.setattr(model, "_spec_from_fields", spy)
    spec = TaskSpec.from_value({"task_type": "noop", "params": {"i": 1}})
    assert calls == [{"task_type": "noop", "params": {"i": 1}}]
    assert spec == TaskSpec("noop", {"i": 1})
    assert type(spec.priority) is Priority and spec.after == () and spec.headers is None
    TaskSpec.from_value(MappingProxyType({"task_type": "noop"}))
    assert len(calls) == 1  # not for another mapping


def test_new_task_builds_every_field_in_its_place():
    """``Taskmill.new_task`` passes NewTask's fields by position: a distinct value in
    each shows none is swapped or missing."""
    tm = Taskmill("memory://", plugins=False)
    run_at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    spec = TaskSpec(
        "kind",
        {"p": 1},
        app_id="app",
        priority=7,
        dedupe_key=None,
        run_at=run_at,
        parent_id="parent",
        max_retries=9,
        user_id="user",
        after=("dep-1", "dep-2", "dep-1"),
        after_policy="always",
    )
    expected = NewTask(
        id="the-id",
        task_type="kind",
        params={"p": 1},
        params_json='{"p":1}',
        app_id="app",
        priority=7,
        max_retries=9,
        run_at=run_at,
        dedupe_key=None,
        parent_id="parent",
        user_id="user",
        after=("dep-1", "dep-2"),
        after_always=True,
    )
    new = tm.new_task(spec, "the-id")
    assert attrs.asdict(new, recurse=False) == attrs.asdict(expected, recurse=False)
    assert new == expected
    keyed = tm.new_task(
        attrs.evolve(
            spec, after=(), after_policy="completed", dedupe_key="key", run_at=None, delay=5
        )
    )
    assert keyed.dedupe_key == "key" and keyed.after == () and not keyed.after_always
    assert keyed.run_at is not None and keyed.run_at > datetime.now(UTC) + timedelta(seconds=4)
    assert len(keyed.id) == 36


def _json(value: Any) -> tuple[Any, ...]:
    try:
        return ("text", serialization.dumps(value))
    except Exception as exc:
        return (type(exc), str(exc))


def _stdlib_json(value: Any) -> tuple[Any, ...]:
    try:
        return (
            "text",
            json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False),
        )
    except Exception as exc:
        return (type(exc), str(exc))


FLAT_VALUES: list[Any] = [
    {},
    {"i": 1},
    {"a": "é\x00😀", "b": -0.0, "c": 2**100, "d": None, "e": False, "f": 1.5e-300},
    {"lone": "\ud800"},
    {1: 1, 2.5: 2, False: 3, None: 4, "1": 5},
    {(1,): "tuple key"},
    {"nan": math.nan},
    {"inf": math.inf},
    {"k": math.inf, (2,): 1},
    {str(i): i for i in range(8)},
    {str(i): i for i in range(9)},
    {"e": Priority.URGENT},
    {"s": Text("x")},
    {"x": [1]},
    {"x": object()},
    [1, 2],
    "text",
]


@pytest.mark.parametrize("value", FLAT_VALUES, ids=range(len(FLAT_VALUES)))
def test_dumps_gives_the_text_and_errors_of_the_json_module(value: Any):
    assert _json(value) == _stdlib_json(value)


@pytest.mark.parametrize("value", FLAT_VALUES, ids=range(len(FLAT_VALUES)))
def test_dumps_gives_the_same_without_its_flat_encoder(value: Any, monkeypatch: pytest.MonkeyPatch):
    fast = _json(value)
    monkeypatch.setattr(serialization, "_encode_flat", None)
    assert _json(value) == fast


def test_dumps_finds_a_circular_reference_beyond_the_flat_case():
    looped: dict[str, Any] = {}
    looped["self"] = looped
    with pytest.raises(ValueError, match="Circular reference detected"):
        serialization.dumps(looped)
    assert serialization.dumps({"i": 1}) == '{"i":1}'  # the flat encoder keeps no state
