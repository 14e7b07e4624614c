"""The fast paths that build task snapshots and read stored JSON keep the checks and
results of the slow ones: ``Task.evolve`` and ``task_from_values`` against ``Task(...)``,
and ``serialization.loads`` against ``json.loads``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
from taskmill.lifecycle import enqueued
from taskmill.model import CancelReason, Progress, Task, TaskStatus, task_from_values
from taskmill.serialization import loads
from taskmill.testing import new_task

NOW = datetime(2026, 12, 2, 13, 0, tzinfo=UTC)
TIMESTAMPS = ("created_at", "run_at", "updated_at", "started_at", "finished_at", "lease_expires_at")


def full_task() -> Task:
    """A snapshot with every field set to something other than its default."""
    return Task(
        id="t-1",
        task_type="mail.send",
        status=TaskStatus.RUNNING,
        created_at=NOW,
        run_at=NOW + timedelta(seconds=1),
        updated_at=NOW + timedelta(seconds=2),
        app_id="app",
        params={"to": ["a@example.com"], "n": 1.5},
        data={"k": "v"},
        priority=7,
        attempts=2,
        max_retries=5,
        result={"ok": True},
        error="boom",
        progress=Progress(3, 10, "three"),
        dedupe_key="key",
        alias_of="t-0",
        parent_id="p-1",
        user_id="u-1",
        cancel_reason=CancelReason.USER,
        started_at=NOW + timedelta(seconds=3),
        finished_at=NOW + timedelta(seconds=4),
        worker_id="w-1",
        lease_expires_at=NOW + timedelta(seconds=5),
    )


def test_task_from_values_builds_the_snapshot_task_builds():
    task = full_task()
    values = [getattr(task, f.name) for f in attrs.fields(Task)]
    built = task_from_values(*values)
    assert type(built) is Task
    assert built == task
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        built.status = TaskStatus.PENDING  # type: ignore[misc]


def test_evolve_changes_only_what_it_is_given():
    task = full_task()
    later = NOW + timedelta(minutes=1)
    evolved = task.evolve(status=TaskStatus.COMPLETED, finished_at=later, worker_id=None)
    assert evolved == attrs.evolve(
        task, status=TaskStatus.COMPLETED, finished_at=later, worker_id=None
    )
    assert task.status is TaskStatus.RUNNING  # the original is untouched


@pytest.mark.parametrize("field", TIMESTAMPS)
def test_evolve_rejects_a_naive_timestamp_as_task_does(field: str):
    task = full_task()
    naive: dict[str, Any] = {field: datetime(2026, 12, 2, 13, 0)}
    with pytest.raises(ValueError, match=f"{field} must be a timezone-aware datetime"):
        attrs.evolve(task, **naive)
    with pytest.raises(ValueError, match=f"{field} must be a timezone-aware datetime"):
        task.evolve(**naive)


def test_evolve_takes_none_for_an_optional_timestamp_and_rejects_unknown_fields():
    task = full_task()
    assert task.evolve(lease_expires_at=None).lease_expires_at is None
    with pytest.raises(TypeError, match="no field 'state'"):
        task.evolve(state="x")


@pytest.mark.parametrize(
    "text",
    ['{"i":1}', "[1,2,3]", "null", '"x"', "1.5", "true", " {} ", '{"a":[{"b":null}]}\n'],
)
def test_loads_reads_what_json_loads_reads(text: str):
    assert loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", "   ", '{"a": }', '{"a":1} x', "nul", "[1,", "NaNx"])
def test_loads_rejects_what_json_loads_rejects_with_the_same_error(text: str):
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as got:
        loads(text)
    assert str(got.value) == str(expected.value)


def test_an_enqueue_snapshot_refuses_naive_timestamps():
    naive = datetime(2026, 12, 2, 13, 0)
    with pytest.raises(ValueError, match="timestamps must be timezone-aware"):
        enqueued(new_task(), now=naive, run_at=NOW, alias_of=None)
    with pytest.raises(ValueError, match="timestamps must be timezone-aware"):
        enqueued(new_task(), now=NOW, run_at=naive, alias_of=None)
    assert enqueued(new_task(), now=NOW, run_at=NOW, alias_of=None).run_at == NOW
