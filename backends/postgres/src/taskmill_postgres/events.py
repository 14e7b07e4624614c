"""The event log as a multi-statement transaction writes it, and the cursor of its end.

Every event seq is drawn behind the schema's events lock (``pg_advisory_xact_lock``
keyed by :func:`~taskmill_postgres.options.lock_key`), held to the commit, so seqs
follow commit order and a cursor never skips an event committed later. Operations that
are one statement append their events inside that statement (see
:mod:`taskmill_postgres.statements`); the others collect them in :class:`Events` and
append them last with :meth:`EventLog.append`.
"""

from __future__ import annotations

from collections.abc import Sequence

from taskmill.storage import StoreChange

from taskmill_postgres.schema import Conn
from taskmill_postgres.statements import Statements

__all__ = ["EventLog", "Events"]


class Events:
    """The events one transaction appends (task seq, kind, status), in order."""

    __slots__ = ("kinds", "seqs", "statuses")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.kinds: list[str] = []
        self.statuses: list[str] = []

    def add(self, seq: int, kind: str, status: str) -> None:
        self.seqs.append(seq)
        self.kinds.append(kind)
        self.statuses.append(status)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class EventLog:
    """The event log of one schema: its statements, its events lock and the prefix of
    its notification channels."""

    __slots__ = ("channel", "lock", "sql")

    def __init__(self, sql: Statements, lock: int, channel: str) -> None:
        self.sql = sql
        self.lock = lock
        """The events lock's key."""
        self.channel = channel
        """Changes of kind ``k`` are notified on channel ``channel + k.value``."""

    async def append(self, conn: Conn, events: Events, also: Sequence[StoreChange] = ()) -> None:
        """Append ``events`` behind the events lock and notify EVENTS (and ``also``):
        the last statement of a multi-statement transaction."""
        if events:
            await conn.execute(
                self.sql.insert_events,
                self.lock,
                self.channel,
                [kind.value for kind in also],
                events.seqs,
                events.kinds,
                events.statuses,
            )

    async def last_seq(self, conn: Conn) -> int:
        """The seq of the last event committed: every event committed later has a
        larger one."""
        last: int | None = await conn.fetchval(self.sql.last_event)
        if last is not None:
            # Every event committed later has a larger seq (they are drawn under the
            # events lock, in commit order).
            return last
        # No event is stored: the counter, read while holding the events lock (so no
        # transaction has drawn a seq it has not committed yet).
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", self.lock)
            counter: int = await conn.fetchval(self.sql.event_counter)
        return counter
