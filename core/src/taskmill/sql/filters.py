""":class:`~taskmill.model.TaskFilter` in SQL: the conditions of
:func:`taskmill.filters.conditions`, translated per dialect.

A backend describes its dialect once (:class:`Dialect`) and calls :func:`translate`;
the meaning of each filter field stays in :mod:`taskmill.filters`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

import attrs

from taskmill.filters import Condition, Op, conditions
from taskmill.model import TaskFilter

__all__ = ["COLUMN_TYPES", "Dialect", "SQLFilter", "page_sql", "suspended_sql", "translate"]

COLUMN_TYPES: Final = {"created_at": "timestamptz"}
"""The SQL type of each filtered column that is not ``text``."""


@attrs.frozen
class Dialect:
    """How one SQL dialect binds a filter's values."""

    placeholder: Callable[[int, str], str]
    """The placeholder of argument number ``n`` (from 1) of SQL type ``t``."""
    arrays: bool
    """True: a set of values is one array argument (``= ANY(...)``); False: one
    argument per value (``IN (...)``)."""
    timestamp: Callable[[datetime], Any]
    """A datetime as the dialect stores it."""
    false: str = "false"
    """An expression that is never true (a set of no values)."""
    true: str = "true"
    contains: str = "strpos({column}, {value}) > 0"
    """True when text ``column`` holds ``value`` as a substring, case-sensitively
    (false or NULL when the column is NULL)."""


@attrs.frozen
class SQLFilter:
    """A translated filter: its conditions (SQL boolean expressions) and arguments."""

    clauses: tuple[str, ...]
    args: list[Any]
    dialect: Dialect

    @property
    def expression(self) -> str:
        """One boolean expression (the dialect's true when it selects everything)."""
        return " AND ".join(self.clauses) if self.clauses else self.dialect.true

    @property
    def where(self) -> str:
        """`` WHERE ...``, or nothing when it selects everything."""
        return " WHERE " + " AND ".join(self.clauses) if self.clauses else ""


_OPERATOR: Final = {Op.EQUALS: "=", Op.AFTER: ">", Op.BEFORE: "<"}


def translate(f: TaskFilter, dialect: Dialect, *, first: int = 1) -> SQLFilter:
    """What ``f`` selects, with its arguments numbered from ``first``."""
    clauses: list[str] = []
    args: list[Any] = []

    def bind(value: Any, sql_type: str) -> str:
        args.append(value)
        return dialect.placeholder(first + len(args) - 1, sql_type)

    for condition in conditions(f):
        clauses.append(_clause(condition, dialect, bind))
    return SQLFilter(tuple(clauses), args, dialect)


def _clause(condition: Condition, dialect: Dialect, bind: Callable[[Any, str], str]) -> str:
    column = condition.field
    sql_type = COLUMN_TYPES.get(column, "text")
    value = condition.value
    if condition.op is Op.CONTAINS:
        found = [
            dialect.contains.format(column=c, value=bind(value, "text")) for c in condition.fields
        ]
        return f"({' OR '.join(found)})"
    if condition.op is Op.ONE_OF:
        values = [getattr(v, "value", v) for v in value]
        if dialect.arrays:
            return f"{column} = ANY({bind(values, sql_type + '[]')})"
        if not values:
            return dialect.false
        return f"{column} IN ({', '.join(bind(v, sql_type) for v in values)})"
    if isinstance(value, datetime):
        value = dialect.timestamp(value)
    return f"{column} {_OPERATOR[condition.op]} {bind(value, sql_type)}"


def page_sql(
    selected: SQLFilter,
    *,
    table: str,
    columns: str,
    limit: int,
    offset: int,
    newest_first: bool,
    after: str | None,
) -> tuple[str, list[Any]]:
    """The ``SELECT`` of one page of :meth:`taskmill.storage.TaskStorage.query`: the
    tasks ``selected`` (a translated filter) in creation order (``seq``, newest first
    when asked), after the task ``after`` when given, ``offset`` then ``limit`` of them;
    its text and arguments."""
    place = selected.dialect.placeholder
    clauses = list(selected.clauses)
    args = list(selected.args)
    if after is not None:
        args.append(after)
        clauses.append(
            f"seq {'<' if newest_first else '>'} "
            f"(SELECT seq FROM {table} WHERE id = {place(len(args), 'text')})"
        )
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    args += [limit, offset]
    text = (
        f"SELECT {columns} FROM {table}{where} ORDER BY seq {'DESC' if newest_first else 'ASC'} "
        f"LIMIT {place(len(args) - 1, 'bigint')} OFFSET {place(len(args), 'bigint')}"
    )
    return text, args


def suspended_sql(
    suspensions: str, task_type: str, app_id: str, *, same: str = "=", scope: str = "s"
) -> str:
    """:meth:`taskmill.model.SuspensionScope.covers` in SQL: whether a row of the table
    ``suspensions`` covers a task of type ``task_type`` and app ``app_id`` (SQL
    expressions). ``same`` is the dialect's comparison of the app ids (null-safe where
    the task's may be NULL: ``IS`` in SQLite, ``<=>`` in MySQL); a suspension's NULL
    field covers every value."""
    return (
        f"EXISTS (SELECT 1 FROM {suspensions} AS {scope} WHERE ({scope}.task_type IS NULL"
        f" OR {scope}.task_type = {task_type}) AND ({scope}.app_id IS NULL"
        f" OR {scope}.app_id {same} {app_id}))"
    )
