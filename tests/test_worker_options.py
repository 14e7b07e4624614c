"""``WorkerOptions`` (how a worker runs) and ``WorkerHost`` (what a worker uses of its
``Taskmill``): the options are checked when built, the keyword arguments of
``tm.worker`` are the same options, and the worker reaches its host only through the
protocol."""

from __future__ import annotations

import ast
import inspect
from datetime import timedelta
from pathlib import Path

import attrs
import pytest
import taskmill.worker
from taskmill import RetryPolicy, Taskmill, WorkerArgs, WorkerHost, WorkerOptions


def test_the_keyword_arguments_are_the_options_with_their_types():
    constructor = inspect.signature(WorkerOptions).parameters
    arguments = WorkerArgs.__annotations__
    assert list(arguments) == [f.name for f in attrs.fields(WorkerOptions)]
    for name, annotation in arguments.items():
        assert annotation.__forward_arg__ == constructor[name].annotation, name
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in constructor.values())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "concurrency must be >= 1, got 0"),
        ({"reserved_high_priority_slots": -1}, "reserved_high_priority_slots must be >= 0"),
        (
            {"concurrency": 2, "reserved_high_priority_slots": 2},
            "reserved_high_priority_slots=2 leaves no slot for normal-priority tasks with "
            "concurrency=2: reserve at most 1",
        ),
        ({"lease_seconds": 0}, "lease_seconds must be > 0"),
    ],
)
def test_options_a_worker_could_not_run_with_are_refused_when_built(options, message):
    with pytest.raises(ValueError, match=message):
        WorkerOptions(**options)
    with pytest.raises(ValueError, match=message):
        Taskmill("memory://", plugins=False).worker(**options)


def test_keyword_arguments_override_the_options_given_first():
    tm = Taskmill("memory://", plugins=False)
    base = WorkerOptions(concurrency=4, lease_seconds=12.0, task_types=["a", "b"])
    worker = tm.worker(base, concurrency=1, worker_id="w-1")
    assert worker.options == attrs.evolve(base, concurrency=1, worker_id="w-1")
    assert base.concurrency == 4  # frozen: the options given are not changed
    assert (worker.concurrency, worker.lease_seconds, worker.worker_id) == (1, 12.0, "w-1")
    assert worker.task_types == frozenset({"a", "b"})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        base.concurrency = 2  # type: ignore[misc]


def test_the_worker_resolves_the_defaults_that_depend_on_other_options():
    tm = Taskmill("memory://", plugins=False)
    default = tm.worker()
    assert default.options == WorkerOptions()
    assert default.reserved_high_priority_slots == 1  # one slot kept for urgent work
    assert default.rescue_interval == 10.0  # a third of the 30 s lease
    assert default.retry_policy == RetryPolicy()
    assert default.event_retention == timedelta(minutes=2)
    one_slot = tm.worker(concurrency=1, lease_seconds=0.03, poll_interval=0.01)
    assert one_slot.reserved_high_priority_slots == 0  # its only slot is not reserved
    assert one_slot.rescue_interval == 0.05  # never below 0.05 s
    assert one_slot.poll_interval == one_slot.min_poll_interval == 0.05


def test_a_taskmill_satisfies_the_host_protocol_and_the_worker_uses_nothing_else():
    members = {
        name
        for name, value in vars(WorkerHost).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }
    assert members == {
        "storage",
        "registry",
        "plugins",
        "attach_worker",
        "detach_worker",
        "spawn_child",
    }
    tm = Taskmill("memory://", plugins=False)
    for name in members:
        assert hasattr(tm, name), name
    # Every use of the host in worker.py names a member of the protocol.
    source = Path(inspect.getfile(taskmill.worker)).read_text()
    used = {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "_host"
    }
    assert used and used <= members, used - members
