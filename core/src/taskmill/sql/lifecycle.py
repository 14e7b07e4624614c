"""The lifecycle kernel (:mod:`taskmill.lifecycle`) as SQL: the ``SET`` assignments of
a transition and ``CASE`` expressions over a table of transitions.

A SQL backend names where each written value comes from (:class:`Sources`, SQL
expressions of its own statement) and builds its statements from these once, at import
or when a store opens; nothing here runs per operation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, TypeVar

import attrs

from taskmill.lifecycle import (
    RELEASED_ON_STOP,
    RescueCase,
    RunAt,
    Transition,
    Write,
    finish_kind,
    rescue_case,
)
from taskmill.model import CancelReason

__all__ = [
    "PROGRESS_COLUMNS",
    "Sources",
    "assignments",
    "budget_sql",
    "case_of",
    "event_sql",
    "literal",
    "outcome_sql",
    "reasons_sql",
    "rescue_case_sql",
    "set_clause",
    "stop_release_sql",
    "transition_cases",
]

K = TypeVar("K")

PROGRESS_COLUMNS: Final = ("progress_done", "progress_total", "progress_message")
_NO_PROGRESS: Final = ("0", "NULL", "NULL")


def literal(value: str) -> str:
    """``value`` as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


@attrs.frozen
class Sources:
    """Where a transition's written values come from, as SQL expressions."""

    now: str
    """The store clock."""
    later: str = "NULL"
    """``run_at`` of a RETRY (now plus the finish's ``retry_in``)."""
    result: str = "NULL"
    error: str = "NULL"
    cancel_reason: str = "NULL"
    table: str = ""
    """The updated table's alias (``t``) when its columns need qualifying."""


def assignments(transition: Transition, sources: Sources) -> dict[str, str]:
    """Column → SQL expression for every task column ``transition`` writes, lease and
    ``updated_at`` aside (every transition clears the lease and sets ``updated_at``)."""
    column = f"{sources.table}." if sources.table else ""
    out = {"status": literal(transition.status.value)}
    if transition.gives_back_attempt:
        out["attempts"] = f"{column}attempts - 1"
    if transition.run_at is RunAt.NOW:
        out["run_at"] = sources.now
    elif transition.run_at is RunAt.LATER:
        out["run_at"] = sources.later
    if transition.terminal:
        out["finished_at"] = sources.now
    for name, write, source in (
        ("result", transition.result, sources.result),
        ("error", transition.error, sources.error),
        ("cancel_reason", transition.cancel_reason, sources.cancel_reason),
    ):
        if write is Write.SET:
            out[name] = source
        elif write is Write.CLEAR:
            out[name] = "NULL"
    if transition.requeues:
        out.update(zip(PROGRESS_COLUMNS, _NO_PROGRESS, strict=True))
    return out


def set_clause(transition: Transition, sources: Sources) -> str:
    """The ``SET`` list (without the keyword) of ``transition``, lease and
    ``updated_at`` aside."""
    return ", ".join(f"{c} = {e}" for c, e in assignments(transition, sources).items())


def case_of(selector: str, branches: Mapping[str, str], otherwise: str | None = None) -> str:
    """``CASE selector WHEN key THEN value ... [ELSE otherwise] END``; keys are SQL
    literals' texts (quoted here)."""
    whens = " ".join(f"WHEN {literal(k)} THEN {v}" for k, v in branches.items())
    tail = "" if otherwise is None else f" ELSE {otherwise}"
    return f"CASE {selector} {whens}{tail} END"


def transition_cases(
    selector: str,
    table: Mapping[K, Transition],
    key: Mapping[K, str],
    sources: Mapping[K, Sources],
    keep: Mapping[str, str],
    columns: tuple[str, ...],
) -> dict[str, str]:
    """For each of ``columns``: one ``CASE selector`` over the transitions of ``table``
    (``selector`` evaluates to ``key[k]`` for the row taking transition ``k``), each
    branch the value that transition writes, or ``keep[column]`` where it writes none.
    The result is the ``SET`` list of one statement that applies any of them."""
    written = {k: assignments(t, sources[k]) for k, t in table.items()}
    out: dict[str, str] = {}
    for column in columns:
        branches = {key[k]: w.get(column, keep[column]) for k, w in written.items()}
        out[column] = case_of(selector, branches)
    return out


def reasons_sql(expression: str, *, terminal: bool) -> str:
    """SQL true when ``expression`` (a stored cancel reason) is a terminal reason (or a
    non-terminal one: a stop request)."""
    chosen = [literal(r.value) for r in CancelReason if r.terminal is terminal]
    return f"{expression} IN ({', '.join(chosen)})"


def budget_sql(attempts: str, max_retries: str) -> str:
    """SQL true when a task with these columns has retry budget left (see
    :func:`taskmill.lifecycle.has_retry_budget`)."""
    return f"{attempts} < {max_retries} + 1"


# The SQL above restates two small rules of the kernel; these fail at import if the
# kernel's rules change without it.
assert rescue_case(None, 1, 0) is RescueCase.GIVE_UP and rescue_case(None, 1, 1) is RescueCase.RETRY


def _by_release(transitions: Iterable[Transition]) -> tuple[list[Transition], list[Transition]]:
    chosen = list(transitions)
    return [t for t in chosen if t.gives_back_attempt], [
        t for t in chosen if not t.gives_back_attempt
    ]


def _only(values: Iterable[str], what: str) -> str:
    found = set(values)
    if len(found) != 1:
        raise ValueError(f"the transitions do not determine {what}: {sorted(found)}")
    return found.pop()


def event_sql(transitions: Iterable[Transition], *, status: str, released: str | None) -> str:
    """The event kind of a row that took one of ``transitions``, told apart by its new
    ``status`` (an SQL expression) and, when given, whether the attempt was given
    back (``released``, an SQL boolean).

    :raises ValueError: the transitions cannot be told apart that way.
    """
    given_back, spent = _by_release(transitions) if released else ([], list(transitions))
    by_status: dict[str, list[str]] = {}
    for t in spent:
        by_status.setdefault(t.status.value, []).append(t.event.value)
    branches = {s: literal(_only(kinds, f"the event of {s}")) for s, kinds in by_status.items()}
    by_status_sql = case_of(status, branches)
    if not given_back:
        return by_status_sql
    back = _only((t.event.value for t in given_back), "the event of a release")
    return f"CASE WHEN {released} THEN {literal(back)} ELSE {by_status_sql} END"


def outcome_sql(transitions: Iterable[Transition], *, released: str, reported: str) -> str:
    """The attempt outcome logged for a row that took one of ``transitions``: the
    outcome of the transition that gives the attempt back when ``released``, else
    ``reported`` (what the worker said).

    :raises ValueError: the transitions cannot be told apart that way.
    """
    given_back, spent = _by_release(transitions)
    if any(t.outcome is not None for t in spent):
        raise ValueError("a transition that spends the attempt logs its own outcome")
    back = _only((t.outcome.value for t in given_back if t.outcome), "a release's outcome")
    return f"CASE WHEN {released} THEN {literal(back)} ELSE {reported} END"


def stop_release_sql(kind: str, stop_reason: str) -> str:
    """The finish kind storage applies, from the requested ``kind`` and the stored
    ``stop_reason`` (SQL expressions; see :func:`taskmill.lifecycle.finish_kind`)."""
    released = ", ".join(literal(k.value) for k in sorted(RELEASED_ON_STOP, key=str))
    stopped = literal(finish_kind(next(iter(RELEASED_ON_STOP)), stop_requested=True).value)
    return (
        f"(CASE WHEN {kind} IN ({released}) AND {stop_reason} IS NOT NULL "
        f"THEN {stopped} ELSE {kind} END)"
    )


def rescue_case_sql(cancel_reason: str, attempts: str, max_retries: str) -> str:
    """The :class:`~taskmill.lifecycle.RescueCase` (its value) of an expired task, from
    its stored stop request and retry budget (see :func:`taskmill.lifecycle.rescue_case`)."""
    cases = {
        reasons_sql(cancel_reason, terminal=True): RescueCase.CANCEL,
        reasons_sql(cancel_reason, terminal=False): RescueCase.RELEASE,
        budget_sql(attempts, max_retries): RescueCase.RETRY,
    }
    whens = " ".join(f"WHEN {test} THEN {literal(case.value)}" for test, case in cases.items())
    return f"(CASE {whens} ELSE {literal(RescueCase.GIVE_UP.value)} END)"
