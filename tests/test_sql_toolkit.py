"""The SQL toolkit and the lifecycle kernel on their own (the backends' contract tests
prove them in use): the guards that keep generated SQL honest."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import attrs
import pytest
from taskmill.errors import InvalidURL
from taskmill.lifecycle import (
    FINISH_TABLE,
    FINISHES,
    RESCUES,
    RescueCase,
    cancel_targets,
    finish_kind,
    rescue_case,
)
from taskmill.migrations import run_sync
from taskmill.model import CancelReason, TaskFilter, TaskStatus
from taskmill.sql.filters import Dialect, translate
from taskmill.sql.lifecycle import event_sql, outcome_sql
from taskmill.sql.urls import check_known_options, number_option, redact
from taskmill.storage import FinishKind

QMARK = Dialect(placeholder=lambda n, t: "?", arrays=False, timestamp=lambda d: 0, false="0")
NUMBERED = Dialect(placeholder=lambda n, t: f"${n}::{t}", arrays=True, timestamp=lambda d: d)


def test_the_finish_table_covers_every_combination_once() -> None:
    keys = {(r.requested, r.stop_requested, r.budget_left) for r in FINISH_TABLE}
    assert len(keys) == len(FINISH_TABLE) == len(FinishKind) * 2 * 2
    stopped = {r.applied for r in FINISH_TABLE if r.stop_requested and r.requested in (
        FinishKind.RETRY, FinishKind.FAIL)}  # fmt: skip
    assert stopped == {FinishKind.RELEASE}
    spent = [r for r in FINISH_TABLE if r.requested is FinishKind.RETRY and not r.budget_left]
    assert {r.applied for r in spent if not r.stop_requested} == {FinishKind.FAIL}


def test_the_rescue_case_follows_the_request_then_the_budget() -> None:
    assert rescue_case(CancelReason.USER, 1, 0) is RescueCase.CANCEL
    assert rescue_case(CancelReason.SHUTDOWN, 9, 0) is RescueCase.RELEASE
    assert rescue_case(None, 1, 1) is RescueCase.RETRY
    assert rescue_case(None, 2, 1) is RescueCase.GIVE_UP
    assert finish_kind(FinishKind.COMPLETE, stop_requested=True) is FinishKind.COMPLETE


def test_event_sql_refuses_transitions_it_cannot_tell_apart() -> None:
    ambiguous = [
        FINISHES[FinishKind.RETRY],
        attrs.evolve(FINISHES[FinishKind.RETRY], event=FINISHES[FinishKind.FAIL].event),
    ]
    with pytest.raises(ValueError, match="do not determine"):
        event_sql(ambiguous, status="d.status", released=None)
    assert "'requeued'" in event_sql(RESCUES.values(), status="r.status", released=None)
    with pytest.raises(ValueError, match="logs its own outcome"):
        outcome_sql(RESCUES.values(), released="d.released", reported="d.outcome")


def test_a_filter_translates_to_each_dialect_with_its_arguments() -> None:
    after = datetime(2026, 1, 1, tzinfo=UTC)
    f = TaskFilter(app_id="a", statuses=(), task_types=("x", "y"), created_after=after)
    qmark = translate(f, QMARK)
    assert qmark.clauses == ("app_id = ?", "task_type IN (?, ?)", "0", "created_at > ?")
    assert qmark.args == ["a", "x", "y", 0]
    numbered = translate(f, NUMBERED, first=3)
    assert numbered.expression == (
        "app_id = $3::text AND task_type = ANY($4::text[]) AND status = ANY($5::text[]) "
        "AND created_at > $6::timestamptz"
    )
    assert numbered.args == ["a", ["x", "y"], [], after]
    assert translate(TaskFilter(), QMARK).where == ""
    assert translate(TaskFilter(statuses=[TaskStatus.FAILED]), NUMBERED).args == [["failed"]]


def test_run_sync_refuses_a_coroutine_that_suspends() -> None:
    async def suspends() -> int:
        await asyncio.sleep(0)
        return 1

    async def never_suspends() -> int:
        return 2

    assert run_sync(never_suspends()) == 2
    with pytest.raises(RuntimeError, match="suspended"):
        run_sync(suspends())


def test_cancel_targets_walk_descendants_breadth_first_and_end_on_a_cycle() -> None:
    tree = {"a": ["b", "c"], "b": ["d"], "c": ["a"], "d": []}

    async def children_of(level: list[str]) -> list[tuple[str, str]]:
        return [(c, p) for p in level for c in tree.get(p, [])]

    assert run_sync(cancel_targets(["a"], children_of)) == ["a", "b", "c", "d"]
    assert run_sync(cancel_targets(["d", "a"], None)) == ["d", "a"]


def test_url_options_are_checked_and_passwords_redacted() -> None:
    with pytest.raises(InvalidURL, match="valid options are: x: the x"):
        check_known_options("my", {"y": 1}, {"x": "the x"})
    assert number_option("my", "n", "2", minimum=1, integer=True) == 2
    with pytest.raises(InvalidURL, match="must be a whole number >= 1"):
        number_option("my", "n", True, minimum=1, integer=True)
    assert redact("postgresql://u:secret@h/db") == "postgresql://u:***@h/db"
    assert redact("postgresql://h/db") == "postgresql://h/db"
