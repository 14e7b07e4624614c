"""Reading rows back inside a write's transaction, as MySQL has no ``RETURNING``: the
store clock, task rows by seq, and the snapshots a JSON-selecting query returns.

The store clock is the server's (``NOW(6)``), read once per operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from taskmill_mysql import statements as sql
from taskmill_mysql.connection import Session
from taskmill_mysql.packets import chunks
from taskmill_mysql.rows import SEQ, Row, from_json

__all__ = ["by_seq", "now", "snapshot_rows"]


async def now(s: Session) -> datetime:
    """The store clock (naive UTC, as stored)."""
    row = await s.fetchone(sql.NOW)
    assert row is not None
    value: datetime = row[0]
    return value


async def by_seq(s: Session, seqs: Sequence[int]) -> list[Row]:
    """The task rows (:data:`~taskmill_mysql.rows.TASK_COLUMNS`) of ``seqs``."""
    rows: list[Row] = []
    for chunk in chunks(seqs):
        rows += await s.fetchall(sql.select_by_seq(len(chunk)), chunk)
    return rows


async def snapshot_rows(s: Session, text: str, args: Sequence[Any]) -> list[Row]:
    """The rows of a query selecting :data:`~taskmill_mysql.rows.TASK_JSON` and maybe
    more columns, each as :data:`~taskmill_mysql.rows.TASK_COLUMNS` followed by those
    more columns, in the query's order (a row the server gave no JSON for is read again
    by its seq)."""
    rows: list[Row] = []
    missing: dict[int, int] = {}
    for found in await s.fetchall(text, args):
        row = from_json(found)
        if row is None:
            missing[found[1]] = len(rows)
            row = found
        rows.append(row)
    if missing:
        for full in await by_seq(s, list(missing)):
            at = missing[full[SEQ]]
            rows[at] = (*full, *rows[at][2:])
    return rows
