"""``TaskFilter`` as a predicate: the conditions a filter stands for, once.

A :class:`~taskmill.model.TaskFilter` is a conjunction of :class:`Condition` values
(:func:`conditions`). The memory store and event delivery evaluate them in Python
(:func:`matches`, which is ``TaskFilter.matches``); SQL stores translate the same list
(:func:`taskmill.sql.filters.translate`), so a filter field added here reaches every
backend, and no backend decides on its own what a field means.

This module reads a filter through :class:`FilterFields` and a task by attribute name,
so it imports nothing of :mod:`taskmill.model`, which imports it for
``TaskFilter.matches``.
"""

from __future__ import annotations

import enum
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol

import attrs

__all__ = ["Condition", "FilterFields", "Op", "conditions", "matches"]


class FilterFields(Protocol):
    """The fields of a :class:`~taskmill.model.TaskFilter` that select tasks (which it
    satisfies); None, or an empty ``text``, selects every task. Hashable: the
    conditions of a filter are worked out once (:func:`conditions`)."""

    def __hash__(self) -> int: ...

    @property
    def app_id(self) -> str | None:
        """Tasks of this app (None: the host's and every app's)."""

    @property
    def task_types(self) -> tuple[str, ...] | None:
        """Tasks of one of these types."""

    @property
    def statuses(self) -> tuple[object, ...] | None:
        """Tasks in one of these statuses (``TaskStatus`` values)."""

    @property
    def parent_id(self) -> str | None:
        """Children of this task."""

    @property
    def user_id(self) -> str | None:
        """Tasks of this user."""

    @property
    def dedupe_key(self) -> str | None:
        """Tasks with this dedupe key."""

    @property
    def created_after(self) -> datetime | None:
        """Tasks created after this moment."""

    @property
    def created_before(self) -> datetime | None:
        """Tasks created before this moment."""

    @property
    def text(self) -> str | None:
        """Tasks whose id or dedupe key contains this text."""


class Op(enum.Enum):
    """How a condition compares a task's field with its value."""

    EQUALS = "="
    ONE_OF = "in"
    """The field is one of the values (none at all selects nothing)."""
    AFTER = ">"
    BEFORE = "<"
    CONTAINS = "contains"
    """One of the fields (``Condition.field`` names them, separated by ``|``) holds
    the value as a substring; a field that is None holds nothing."""


@attrs.frozen
class Condition:
    """``field`` (a :class:`~taskmill.model.Task` attribute, which SQL stores keep in
    the column of the same name) compared by ``op`` with ``value``."""

    field: str
    op: Op
    value: Any

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields a CONTAINS condition looks in (one for the other operators)."""
        return tuple(self.field.split("|"))

    def holds(self, task: object) -> bool:
        """True when ``task`` (a :class:`~taskmill.model.Task`) satisfies this
        condition."""
        op = self.op
        if op is Op.CONTAINS:
            return any(self.value in (getattr(task, f) or "") for f in self.fields)
        actual = getattr(task, self.field)
        if op is Op.EQUALS:
            return bool(actual == self.value)
        if op is Op.ONE_OF:
            return actual in self.value
        if op is Op.AFTER:
            return bool(actual > self.value)
        return bool(actual < self.value)


_EQUALITIES = ("app_id", "parent_id", "user_id", "dedupe_key")


@lru_cache(maxsize=512)
def conditions(f: FilterFields) -> tuple[Condition, ...]:
    """The conditions ``f`` stands for, every one of which a selected task satisfies
    (an empty tuple selects everything)."""
    found: list[Condition] = []
    if f.app_id is not None:
        found.append(Condition("app_id", Op.EQUALS, f.app_id))
    if f.task_types is not None:
        found.append(Condition("task_type", Op.ONE_OF, f.task_types))
    if f.statuses is not None:
        found.append(Condition("status", Op.ONE_OF, f.statuses))
    for name in _EQUALITIES[1:]:
        value = getattr(f, name)
        if value is not None:
            found.append(Condition(name, Op.EQUALS, value))
    if f.created_after is not None:
        found.append(Condition("created_at", Op.AFTER, f.created_after))
    if f.created_before is not None:
        found.append(Condition("created_at", Op.BEFORE, f.created_before))
    if f.text:
        found.append(Condition("id|dedupe_key", Op.CONTAINS, f.text))
    return tuple(found)


def matches(f: FilterFields, task: object) -> bool:
    """True when ``task`` (a :class:`~taskmill.model.Task`) is selected by ``f`` (the
    reference semantics)."""
    return all(c.holds(task) for c in conditions(f))
