"""Model-based testing of the storage contract (issue 16 §3).

A Hypothesis state machine drives a backend and the memory reference model
(:class:`~taskmill.backends.memory.MemoryStorage`) with the same random sequence of
enqueue, claim, finish, renew, rescue, cancel, suspend, resume, retry and cleanup, and
compares after every step what each returned and every task each holds.

Time: a claim takes either a long lease (60 s) or one that has expired by the next step
(1 ms; a rescue waits 20 ms first), so whether a lease has expired never depends on
timing. One store serves every example of a test; each example uses task types of its
own (a fresh prefix), so that earlier examples' tasks never meet it.

Example counts come from the Hypothesis profile: ``ci`` (the default) is CI-sized;
``TASKMILL_HYPOTHESIS_PROFILE=large`` runs many more.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from taskmill.backends.memory import MemoryStorage
from taskmill.discovery import storage_for_url
from taskmill.errors import TaskmillError
from taskmill.model import CancelReason, SuspensionScope, Task
from taskmill.storage import FinishKind, Lease, TaskStorage
from taskmill.testing import claim as claim_request
from taskmill.testing import finish as finish_of
from taskmill.testing import new_task

settings.register_profile(
    "ci",
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "large",
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
PROFILE = os.environ.get("TASKMILL_HYPOTHESIS_PROFILE", "ci")
TIMEOUT = 600 if PROFILE == "ci" else 7200
"""The large profile on a server backend takes over ten minutes on a loaded machine."""

MODEL_BACKENDS: dict[str, str | None] = {
    "sqlite": None,
    "postgres": "postgres_url",
    "mysql": "mysql_url",
    "mongo": "mongo_url",
}
"""Each backend compared with the model, with the conftest fixture of its fresh store URL
(None: a SQLite file in the test's directory). A new backend is one entry."""

SLOW_BACKENDS = {"mongo": 0.4}
"""The share of the profile's examples a slow backend runs (the stand-in nx-27017 with
serializeWrites: every step takes the writer lock)."""

LONG, SHORT = 60.0, 0.001
WORKERS = ("w1", "w2")
KINDS = (FinishKind.COMPLETE, FinishKind.RETRY, FinishKind.FAIL, FinishKind.RELEASE)


def comparable(task: Task | None) -> tuple[Any, ...] | None:
    """What the contract fixes of a task (not the clocks' readings)."""
    if task is None:
        return None
    return (
        task.id,
        task.task_type,
        task.status,
        task.priority,
        task.attempts,
        task.max_retries,
        task.result,
        task.error,
        task.dedupe_key,
        task.alias_of,
        task.cancel_reason,
        task.worker_id,
        task.finished_at is None,
        task.started_at is None,
        task.lease_expires_at is None,
    )


class Loop:
    """One event loop that runs the steps of every example of a test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        self.loop.close()


def outcome_of(loop: Loop, call: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", value)`` or ``("error", the TaskmillError's class name)``."""
    try:
        return ("ok", loop.run(call()))
    except TaskmillError as exc:
        return ("error", type(exc).__name__)
    except ValueError:
        return ("error", "ValueError")


def machine_for(loop: Loop, store: TaskStorage) -> type[RuleBasedStateMachine]:
    class StorageModel(RuleBasedStateMachine):
        """The backend and the model, step by step."""

        def __init__(self) -> None:
            super().__init__()
            self.model = MemoryStorage()
            loop.run(self.model.open())
            self.prefix = uuid.uuid4().hex[:8]
            self.ids: list[str] = []
            self.leases: list[Task] = []

        def types(self) -> tuple[str, str]:
            return (f"{self.prefix}-a", f"{self.prefix}-b")

        def both(self, call: Callable[[TaskStorage], Any]) -> tuple[Any, Any]:
            expected = outcome_of(loop, lambda: call(self.model))
            actual = outcome_of(loop, lambda: call(store))
            return expected, actual

        @initialize()
        def fresh(self) -> None:
            pass

        @rule(
            count=st.integers(1, 3),
            kind=st.sampled_from([0, 1]),
            priority=st.sampled_from([0, 10]),
            key=st.sampled_from([None, "k1", "k2"]),
            retries=st.integers(0, 2),
        )
        def enqueue(
            self, count: int, kind: int, priority: int, key: str | None, retries: int
        ) -> None:
            tasks = [
                new_task(self.types()[kind], priority=priority, dedupe_key=key, max_retries=retries)
                for _ in range(count)
            ]
            expected, actual = self.both(lambda s: s.enqueue(tasks))
            assert self.normal(expected) == self.normal(actual)
            self.ids.extend(t.id for t in tasks)

        @precondition(lambda self: bool(self.ids))
        @rule(
            worker=st.sampled_from(WORKERS),
            kinds=st.sampled_from([(0,), (1,), (0, 1)]),
            limit=st.integers(1, 3),
            short=st.booleans(),
        )
        def claim(self, worker: str, kinds: tuple[int, ...], limit: int, short: bool) -> None:
            request = claim_request(
                *[self.types()[k] for k in kinds],
                worker=worker,
                limit=limit,
                lease=SHORT if short else LONG,
            )
            expected, actual = self.both(lambda s: s.claim_batch(request))
            assert self.normal(expected) == self.normal(actual)
            if expected[0] == "ok":
                self.leases.extend(expected[1])

        @precondition(lambda self: bool(self.leases))
        @rule(data=st.data(), kind=st.sampled_from(KINDS))
        def finish(self, data: st.DataObject, kind: FinishKind) -> None:
            held = data.draw(st.sampled_from(self.leases))
            done = finish_of(
                held, kind, result="r", error=None if kind is FinishKind.COMPLETE else "e"
            )
            expected, actual = self.both(lambda s: s.finish_batch([done]))
            assert self.normal(expected) == self.normal(actual)

        @precondition(lambda self: bool(self.leases))
        @rule(data=st.data())
        def renew(self, data: st.DataObject) -> None:
            chosen = data.draw(st.lists(st.sampled_from(self.leases), min_size=1, max_size=3))
            leases = [Lease(t.id, t.worker_id or "", t.attempts) for t in chosen]
            expected, actual = self.both(lambda s: s.renew_leases(leases, LONG))
            assert expected == actual

        @precondition(lambda self: bool(self.leases))
        @rule()
        def rescue(self) -> None:
            loop.run(asyncio.sleep(0.02))  # every short lease has expired by now
            expected, actual = self.both(lambda s: s.rescue_expired())
            assert self.normal(expected, ours=True) == self.normal(actual, ours=True)

        @precondition(lambda self: bool(self.ids))
        @rule(data=st.data(), reason=st.sampled_from([CancelReason.USER, CancelReason.SHUTDOWN]))
        def cancel(self, data: st.DataObject, reason: CancelReason) -> None:
            task_id = data.draw(st.sampled_from(self.ids))
            expected, actual = self.both(lambda s: s.cancel(task_ids=[task_id], reason=reason))
            assert self.normal(expected) == self.normal(actual)

        @rule(kind=st.sampled_from([0, 1]))
        def suspend(self, kind: int) -> None:
            scope = SuspensionScope(task_type=self.types()[kind])
            expected, actual = self.both(lambda s: s.suspend(scope))
            assert expected == actual

        @rule(kind=st.sampled_from([0, 1]))
        def resume(self, kind: int) -> None:
            scope = SuspensionScope(task_type=self.types()[kind])
            expected, actual = self.both(lambda s: s.resume(scope))
            assert expected == actual

        @precondition(lambda self: bool(self.ids))
        @rule(data=st.data())
        def retry(self, data: st.DataObject) -> None:
            task_id = data.draw(st.sampled_from(self.ids))
            expected, actual = self.both(lambda s: s.retry(task_id))
            assert self.normal(expected) == self.normal(actual)

        @rule()
        def cleanup(self) -> None:
            loop.run(asyncio.sleep(0.005))
            # Counts differ (the store holds earlier examples' tasks): compare the tasks.
            self.both(lambda s: s.cleanup(timedelta(0)))

        @invariant()
        def same_tasks(self) -> None:
            for task_id in self.ids:
                expected = comparable(loop.run(self.model.get(task_id)))
                actual = comparable(loop.run(store.get(task_id)))
                assert expected == actual, f"task {task_id}: model {expected} != store {actual}"

        @invariant()
        def same_attempt_logs(self) -> None:
            for task_id in self.ids:
                expected = [
                    (a.number, a.outcome, a.worker_id)
                    for a in loop.run(self.model.attempts(task_id))
                ]
                actual = [
                    (a.number, a.outcome, a.worker_id) for a in loop.run(store.attempts(task_id))
                ]
                assert expected == actual, f"task {task_id}: attempts {expected} != {actual}"

        def normal(self, outcome: tuple[str, Any], *, ours: bool = False) -> Any:
            kind, value = outcome
            if kind == "error":
                return outcome
            if isinstance(value, list):
                items = [comparable(v) if isinstance(v, Task) or v is None else v for v in value]
                if ours:
                    known = set(self.ids)
                    items = sorted(
                        (i for i in items if not isinstance(i, tuple) or i[0] in known), key=repr
                    )
                return (kind, items)
            if isinstance(value, Task):
                return (kind, comparable(value))
            return outcome

        def teardown(self) -> None:
            for scope in loop.run(store.suspensions()):
                if scope.task_type in self.types():
                    loop.run(store.resume(scope))
            loop.run(self.model.close())

    return StorageModel


@pytest.fixture
def model_loop() -> Iterator[Loop]:
    loop = Loop()
    yield loop
    loop.close()


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("backend", list(MODEL_BACKENDS))
def test_every_backend_behaves_as_the_memory_model(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, model_loop: Loop
) -> None:
    fixture = MODEL_BACKENDS[backend]
    url = (
        f"sqlite:///{tmp_path / 'model.db'}"
        if fixture is None
        else request.getfixturevalue(fixture)
    )
    store = storage_for_url(str(url))
    model_loop.run(store.open())
    try:
        profile = settings.get_profile(PROFILE)
        share = SLOW_BACKENDS.get(backend, 1.0)
        examples = max(1, round(profile.max_examples * share))
        run_state_machine_as_test(
            machine_for(model_loop, store), settings=settings(profile, max_examples=examples)
        )
    finally:
        model_loop.run(store.close())
