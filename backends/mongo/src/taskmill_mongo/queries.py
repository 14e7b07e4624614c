"""Query documents: task filters as queries, and the explicit query forms that the
test stand-in searches an index for."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from taskmill.filters import Op, conditions
from taskmill.model import CancelReason, SuspensionScope, TaskFilter, TaskStatus
from taskmill.serialization import dumps

from taskmill_mongo.documents import micros
from taskmill_mongo.schema import Doc

__all__ = ["ACTIVE", "PENDING", "RUNNING", "eq", "filter_query", "one_of", "scope_id"]

PENDING: Final = TaskStatus.PENDING.value
RUNNING: Final = TaskStatus.RUNNING.value
ACTIVE: Final = [PENDING, RUNNING]


def eq(value: Any) -> Doc:
    """``{field: value}`` as ``{field: {"$eq": value}}``: the same query on MongoDB
    (the short form is defined as ``$eq``), but nx-27017 (the test stand-in) can search
    an index only for the explicit form; for the short one it scans the collection."""
    return {"$eq": value}


def one_of(values: Sequence[Any]) -> Doc:
    """``$in``, or ``$eq`` for one value (which the stand-in searches an index for)."""
    return eq(values[0]) if len(values) == 1 else {"$in": list(values)}


def scope_id(scope: SuspensionScope) -> str:
    """The ``_id`` of a suspension's document."""
    return dumps([scope.app_id, scope.task_type])


def filter_query(f: TaskFilter) -> Doc:
    """``f`` as a query on task documents (the conditions of :mod:`taskmill.filters`)."""
    query: Doc = {}
    clauses: list[Doc] = []
    for c in conditions(f):
        field = "_id" if c.field == "id" else c.field
        value = c.value
        if c.op is Op.CONTAINS:
            pattern = re.escape(str(value))
            names = ["_id" if n == "id" else n for n in c.fields]
            clauses.append({"$or": [{n: {"$regex": pattern}} for n in names]})
        elif c.op is Op.EQUALS:
            clauses.append({field: _stored(value)})
        elif c.op is Op.ONE_OF:
            clauses.append({field: {"$in": [_stored(v) for v in value]}})
        elif c.op is Op.AFTER:
            clauses.append({field: {"$gt": _stored(value)}})
        else:
            clauses.append({field: {"$lt": _stored(value)}})
    if clauses:
        query["$and"] = clauses
    return query


def _stored(value: Any) -> Any:
    if isinstance(value, datetime):
        return micros(value)
    if isinstance(value, TaskStatus | CancelReason):
        return value.value
    return value
