"""The lifecycle kernel (:mod:`taskmill.lifecycle`) as SQL: the ``SET`` assignments of
a transition and ``CASE`` expressions over a table of transitions.

A SQL backend names where each written value comes from (:class:`Sources`, SQL
expressions of its own statement) and builds its statements from these once, at import
or when a store opens; nothing here runs per operation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypeVar

import attrs

from taskmill.lifecycle import RunAt, Transition, Write, has_retry_budget
from taskmill.model import CancelReason

__all__ = [
    "PROGRESS_COLUMNS",
    "Sources",
    "assignments",
    "budget_sql",
    "case_of",
    "literal",
    "reasons_sql",
    "set_clause",
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
    assert has_retry_budget(1, 0) is False and has_retry_budget(1, 1) is True
    return f"{attempts} < {max_retries} + 1"
