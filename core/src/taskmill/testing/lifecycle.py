"""Contract tests generated from the lifecycle kernel's tables (:mod:`taskmill.lifecycle`).

One test per row of :data:`~taskmill.lifecycle.FINISH_TABLE` (finish kind by stop
request by retry budget), per reachable :class:`~taskmill.lifecycle.RescueCase` and per
active status a terminal cancel applies to. Each sets up the row's situation through
the public storage operations, applies it, and checks the stored task, its event, its
execution-log row and its dedupe alias against the table: a backend that derives any
rule differently fails the row it gets wrong.

Mixed into :class:`taskmill.testing.StorageContract`; a backend never uses it alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from taskmill.lifecycle import (
    CANCELLATION,
    FINISH_TABLE,
    RESCUE_ERROR,
    RESCUES,
    TERMINAL_EVENTS,
    FinishRow,
    RescueCase,
    RunAt,
    Transition,
    Write,
    attempt_kind,
    cancel_error,
)
from taskmill.model import CancelReason, Task, TaskEvent, TaskStatus
from taskmill.storage import FinishKind, TaskStorage
from taskmill.testing.helpers import claim, finish, new_task, wait_until

__all__ = ["LifecycleContract"]

_RESULT = {"answer": 42}
_ERROR = "the handler's error"


def _finish_row_id(row: FinishRow) -> str:
    stop = "stop-requested" if row.stop_requested else "no-request"
    budget = "budget-left" if row.budget_left else "no-budget"
    return f"{row.requested.value}-{stop}-{budget}"


# A running task never holds a terminal request through the storage API (a terminal
# cancel ends it at once), so RescueCase.CANCEL is a defensive rule no test can reach.
_REACHABLE_RESCUES = (RescueCase.RELEASE, RescueCase.RETRY, RescueCase.GIVE_UP)


async def _events_of(storage: TaskStorage, after: str, task_id: str) -> list[TaskEvent]:
    events, _ = await storage.read_events(after)
    return [e for e in events if e.task.id == task_id]


async def _stored(storage: TaskStorage, task_id: str) -> Task:
    task = await storage.get(task_id)
    assert task is not None
    return task


def _check_written(
    after: Task,
    before: Task,
    transition: Transition,
    *,
    result: Any,
    error: str | None,
    cancel_reason: CancelReason | None,
) -> None:
    """The fields ``transition`` writes, as the table says."""
    assert after.status is transition.status
    assert after.attempts == before.attempts - (1 if transition.gives_back_attempt else 0)
    assert after.worker_id is None and after.lease_expires_at is None
    for name, write, value in (
        ("result", transition.result, result),
        ("error", transition.error, error),
        ("cancel_reason", transition.cancel_reason, cancel_reason),
    ):
        expected = {Write.SET: value, Write.CLEAR: None, Write.KEEP: getattr(before, name)}
        assert getattr(after, name) == expected[write], name
    if transition.terminal:
        assert after.finished_at is not None
    else:
        assert after.finished_at is None
        assert after.progress.done == 0 and after.progress.total is None
    if transition.run_at is RunAt.KEEP:
        assert after.run_at == before.run_at
    else:
        assert after.run_at >= before.started_at  # type: ignore[operator]


async def _check_alias(storage: TaskStorage, alias_id: str, leader: Task, after: str) -> None:
    """A PENDING alias settles with its leader when (and only when) the leader ends."""
    alias = await _stored(storage, alias_id)
    if not leader.status.terminal:
        assert alias.status is TaskStatus.PENDING
        return
    assert (alias.status, alias.result, alias.error, alias.cancel_reason) == (
        leader.status,
        leader.result,
        leader.error,
        leader.cancel_reason,
    )
    assert alias.finished_at is not None
    kinds = [e.kind for e in await _events_of(storage, after, alias_id)]
    assert kinds == [TERMINAL_EVENTS[leader.status]]


class LifecycleContract:
    """The transition table, the rescue rules and alias settlement, row by row."""

    @pytest.mark.parametrize("row", FINISH_TABLE, ids=_finish_row_id)
    async def test_a_finish_ends_as_the_transition_table_says(
        self, storage: TaskStorage, row: FinishRow
    ) -> None:
        max_retries = 1 if row.budget_left else 0  # the first attempt leaves one, or none
        (leader,) = await storage.enqueue([new_task(max_retries=max_retries, dedupe_key="k")])
        (alias,) = await storage.enqueue([new_task(max_retries=max_retries, dedupe_key="k")])
        assert alias.alias_of == leader.id
        (running,) = await storage.claim_batch(claim())
        if row.stop_requested:
            await storage.cancel(task_ids=[running.id], reason=CancelReason.SHUTDOWN)
        before = await _stored(storage, running.id)
        _, cursor = await storage.read_events(None)
        # What a worker reports for the requested end, after its retry budget.
        kind = attempt_kind(row.requested, attempts=before.attempts, max_retries=max_retries)
        reason = CancelReason.USER if kind is FinishKind.CANCEL else None
        ended = finish(
            running, kind, result=_RESULT, error=_ERROR, retry_in=0.0, cancel_reason=reason
        )

        (after,) = await storage.finish_batch([ended])

        transition = row.transition
        assert after is not None
        _check_written(
            after, before, transition, result=_RESULT, error=_ERROR, cancel_reason=reason
        )
        assert await _stored(storage, after.id) == after
        (event,) = await _events_of(storage, cursor, after.id)
        assert (event.kind, event.status) == (transition.event, transition.status)
        (logged,) = await storage.attempts(after.id)
        assert logged.outcome is (transition.outcome or ended.outcome)
        assert logged.error == (None if logged.outcome.value == "completed" else _ERROR)
        await _check_alias(storage, alias.id, after, cursor)

    @pytest.mark.parametrize("case", _REACHABLE_RESCUES, ids=lambda c: c.value)
    async def test_a_rescue_ends_as_the_rescue_table_says(
        self, storage: TaskStorage, case: RescueCase
    ) -> None:
        max_retries = 0 if case is RescueCase.GIVE_UP else 1
        (leader,) = await storage.enqueue([new_task(max_retries=max_retries, dedupe_key="k")])
        (alias,) = await storage.enqueue([new_task(max_retries=max_retries, dedupe_key="k")])
        (running,) = await storage.claim_batch(claim(lease=0.05))
        if case is RescueCase.RELEASE:
            await storage.cancel(task_ids=[running.id], reason=CancelReason.SUSPENDED)
        before = await _stored(storage, running.id)
        _, cursor = await storage.read_events(None)

        (after,) = await wait_until(storage.rescue_expired)

        transition = RESCUES[case]
        _check_written(
            after, before, transition, result=None, error=RESCUE_ERROR, cancel_reason=None
        )
        (event,) = await _events_of(storage, cursor, after.id)
        assert (event.kind, event.status) == (transition.event, transition.status)
        (logged,) = await storage.attempts(after.id)
        assert (logged.outcome, logged.error) == (transition.outcome, RESCUE_ERROR)
        await _check_alias(storage, alias.id, after, cursor)
        assert leader.id == after.id

    @pytest.mark.parametrize("running", [False, True], ids=["pending", "running"])
    @pytest.mark.parametrize("reason", [CancelReason.USER, CancelReason.PREEMPTED])
    async def test_a_terminal_cancel_ends_as_the_cancellation_rule_says(
        self, storage: TaskStorage, running: bool, reason: CancelReason
    ) -> None:
        (leader,) = await storage.enqueue([new_task(dedupe_key="k")])
        (alias,) = await storage.enqueue([new_task(dedupe_key="k")])
        if running:
            await storage.claim_batch(claim())
        before = await _stored(storage, leader.id)
        _, cursor = await storage.read_events(None)

        changed = await storage.cancel(task_ids=[leader.id], reason=reason, cascade=False)

        assert [t.id for t in changed] == [leader.id, alias.id]
        after = changed[0]
        _check_written(after, before, CANCELLATION, result=None, error=None, cancel_reason=reason)
        (event, *_) = await _events_of(storage, cursor, after.id)
        assert (event.kind, event.status) == (CANCELLATION.event, CANCELLATION.status)
        logged = await storage.attempts(after.id)
        if running:
            assert [(a.outcome, a.error) for a in logged] == [
                (CANCELLATION.outcome, cancel_error(reason))
            ]
        else:
            assert logged == []
        await _check_alias(storage, alias.id, after, cursor)
