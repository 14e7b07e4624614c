"""taskmill.model.attempt_runs: which run of a task each logged attempt belongs to."""

from __future__ import annotations

from datetime import UTC, datetime

from taskmill.model import Attempt, AttemptOutcome, attempt_runs

AT = datetime(2026, 12, 4, tzinfo=UTC)


def log(*entries: tuple[int, AttemptOutcome]) -> list[Attempt]:
    return [
        Attempt(task_id="t", number=n, worker_id="w", started_at=AT, finished_at=AT, outcome=o)
        for n, o in entries
    ]


F, INT, L, C = (
    AttemptOutcome.FAILED,
    AttemptOutcome.INTERRUPTED,
    AttemptOutcome.LOST,
    AttemptOutcome.COMPLETED,
)


def test_one_run_counts_up_and_an_interruption_repeats_its_number():
    assert attempt_runs(log((1, F), (2, INT), (2, L), (3, C))) == [1, 1, 1, 1]


def test_a_manual_retry_starts_a_run_where_the_number_goes_down_or_repeats():
    assert attempt_runs(log((1, F), (2, F), (1, F), (2, C))) == [1, 1, 2, 2]
    assert attempt_runs(log((1, F), (1, F), (1, C))) == [1, 2, 3]  # max_retries=0, retried twice
    assert attempt_runs(log((1, INT), (1, F), (1, C))) == [1, 1, 2]


def test_no_attempts_no_runs():
    assert attempt_runs([]) == []
