"""Task documents: how a :class:`~taskmill.model.Task` is stored, and back.

Timestamps are whole microseconds since the epoch (int64), so a snapshot read back equals
the one written (BSON dates keep milliseconds only). ``params``, ``data`` and ``result``
are stored as the JSON text the core serialized: MongoDB restricts field names (``$``
prefixes and ``.`` inside are refused or unreachable by update operators on many
versions), and a task's params may use any JSON key, so they are kept faithfully as text.
``leader_key`` is set only while the task is an active dedupe leader: the unique partial
index on it makes two leaders of one key impossible, whatever the processes race.

One document holds a whole task, so the server's largest document (``maxBsonObjectSize``,
16 MiB on MongoDB) bounds the JSON values a task keeps: :func:`value_ceiling`.

An event document's ``_id`` is its place in the event log, an :class:`EventKey` written
as the cursor token readers get back (:meth:`EventKey.token`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

import attrs
from taskmill.cursors import POSITION_DIGITS, position_token, token_position
from taskmill.model import CancelReason, Progress, Task, TaskStatus
from taskmill.serialization import dumps, loads

__all__ = [
    "MARGIN",
    "EventKey",
    "from_micros",
    "leader_key",
    "micros",
    "task",
    "task_document",
    "tombstone",
    "tombstone_task",
    "value_ceiling",
]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_STATUS: Final = {s.value: s for s in TaskStatus}
_REASON: Final = {r.value: r for r in CancelReason}

MARGIN: Final = 128 * 1024
"""Bytes of a task document left for everything beside its params and its result: its
error (16,000 characters, at most 64,000 bytes as UTF-8), its progress message (4,096
characters, 16 KiB), its ids, type, app id, dedupe key, leader key and user id (about
16 KiB), and the field names, numbers and timestamps (under 1 KiB)."""


def value_ceiling(max_document: int) -> int:
    """The largest JSON value (UTF-8 bytes) a task keeps when the server's largest
    document is ``max_document`` bytes: a task document holds its params and its result
    together (and an alias its own params with its leader's result), so each gets half
    of what the document holds beside :data:`MARGIN`."""
    return (max_document - min(MARGIN, max_document // 2)) // 2


def micros(value: datetime) -> int:
    """``value`` as whole microseconds since the epoch."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> datetime:
    """A stored timestamp as a tz-aware UTC datetime."""
    return datetime.fromtimestamp(value // 1_000_000, UTC).replace(microsecond=value % 1_000_000)


def _opt_time(value: int | None) -> datetime | None:
    return None if value is None else from_micros(value)


def _opt_micros(value: datetime | None) -> int | None:
    return None if value is None else micros(value)


def leader_key(app_id: str | None, task_type: str, dedupe_key: str) -> str:
    """The value of ``leader_key`` for a leader of ``(app_id, task_type, dedupe_key)``
    (a JSON array, so no choice of the three strings can collide with another)."""
    return dumps([app_id, task_type, dedupe_key])


_STAMP_DIGITS: Final = 20
_SHARD_DIGITS: Final = 2
_KEYED: Final = "1"
"""The first character of a keyed token: after every position token (which starts
with ``0``), so a cursor kept from before keys were stamped sorts before them all."""
_TOKEN_LENGTH: Final = len(_KEYED) + _STAMP_DIGITS + _SHARD_DIGITS + POSITION_DIGITS


@attrs.frozen(order=True)
class EventKey:
    """An event's place in the event log, ordered as ``(stamp, shard, position)``.

    ``position`` is the event's place in its shard's counter (commit order within the
    shard); ``stamp`` is a time of the writing transaction, at least the stamp of the
    shard's previous events (see :mod:`taskmill_mongo.transactions`). Stamp 0 is the
    log written before events were stamped (``_id`` the integer position, all in shard
    0), which precedes every stamped event.
    """

    stamp: int = attrs.field(validator=attrs.validators.ge(0))
    shard: int = attrs.field(validator=attrs.validators.ge(0))
    position: int = attrs.field(validator=attrs.validators.ge(0))

    @property
    def stamped(self) -> bool:
        return self.stamp > 0

    def token(self) -> str:
        """The cursor token of this place: fixed width, so that tokens compare with
        ``<`` as keys do; an unstamped key is a plain
        :func:`~taskmill.cursors.position_token`."""
        if not self.stamped:
            return position_token(self.position)
        return (
            f"{_KEYED}{self.stamp:0{_STAMP_DIGITS}d}{self.shard:0{_SHARD_DIGITS}d}"
            f"{self.position:0{POSITION_DIGITS}d}"
        )

    def document_id(self) -> str | int:
        """The ``_id`` of the event at this place (an unstamped one's is its position)."""
        return self.token() if self.stamped else self.position

    @classmethod
    def from_token(cls, token: str) -> EventKey:
        """The key :meth:`token` wrote as ``token``.

        :raises InvalidCursor: for any string :meth:`token` does not write.
        """
        if len(token) == _TOKEN_LENGTH and token.startswith(_KEYED):
            digits = token[len(_KEYED) :]
            stamp = int(digits[:_STAMP_DIGITS]) if digits.isascii() and digits.isdigit() else 0
            if stamp > 0:
                shard = int(digits[_STAMP_DIGITS : _STAMP_DIGITS + _SHARD_DIGITS])
                return cls(stamp, shard, int(digits[_STAMP_DIGITS + _SHARD_DIGITS :]))
        # A position token, or (any other string) InvalidCursor with the store's message.
        return cls(0, 0, token_position(token))

    @classmethod
    def from_document_id(cls, value: str | int) -> EventKey:
        """The key of the event whose ``_id`` is ``value``."""
        return cls(0, 0, value) if isinstance(value, int) else cls.from_token(value)


def task_document(task: Task, seq: int) -> dict[str, Any]:
    """The document stored for ``task`` at insertion place ``seq``."""
    doc: dict[str, Any] = {
        "_id": task.id,
        "seq": seq,
        "task_type": task.task_type,
        "status": task.status.value,
        "created_at": micros(task.created_at),
        "run_at": micros(task.run_at),
        "updated_at": micros(task.updated_at),
        "app_id": task.app_id,
        "params": dumps(task.params),
        "data": dumps(task.data),
        "priority": task.priority,
        "attempts": task.attempts,
        "max_retries": task.max_retries,
        "result": None if task.result is None else dumps(task.result),
        "error": task.error,
        "progress": [task.progress.done, task.progress.total, task.progress.message],
        "dedupe_key": task.dedupe_key,
        "alias_of": task.alias_of,
        "parent_id": task.parent_id,
        "user_id": task.user_id,
        "cancel_reason": None if task.cancel_reason is None else task.cancel_reason.value,
        "started_at": _opt_micros(task.started_at),
        "finished_at": _opt_micros(task.finished_at),
        "worker_id": task.worker_id,
        "lease_expires_at": _opt_micros(task.lease_expires_at),
    }
    if task.dedupe_key is not None and task.alias_of is None and task.status.active:
        doc["leader_key"] = leader_key(task.app_id, task.task_type, task.dedupe_key)
    return doc


def task(doc: dict[str, Any]) -> Task:
    """The snapshot a stored document holds."""
    done, total, message = doc["progress"]
    result = doc["result"]
    reason = doc["cancel_reason"]
    return Task(
        id=doc["_id"],
        task_type=doc["task_type"],
        status=_STATUS[doc["status"]],
        created_at=from_micros(doc["created_at"]),
        run_at=from_micros(doc["run_at"]),
        updated_at=from_micros(doc["updated_at"]),
        app_id=doc["app_id"],
        params=loads(doc["params"]),
        data=loads(doc["data"]),
        priority=doc["priority"],
        attempts=doc["attempts"],
        max_retries=doc["max_retries"],
        result=None if result is None else loads(result),
        error=doc["error"],
        progress=Progress(done=done, total=total, message=message),
        dedupe_key=doc["dedupe_key"],
        alias_of=doc["alias_of"],
        parent_id=doc["parent_id"],
        user_id=doc["user_id"],
        cancel_reason=None if reason is None else _REASON[reason],
        started_at=_opt_time(doc["started_at"]),
        finished_at=_opt_time(doc["finished_at"]),
        worker_id=doc["worker_id"],
        lease_expires_at=_opt_time(doc["lease_expires_at"]),
    )


def tombstone(doc: dict[str, Any], deleted_at: int) -> dict[str, Any]:
    """The ``tombstones`` document of a task deleted by its finish at ``deleted_at``
    (integer microseconds), whose last document is ``doc``: its ``_id``, the time, and
    ``doc`` itself as JSON text (its values are strings, integers, floats, nulls and a
    list). It is read back whole and never queried by its fields, and one string is
    less for the test stand-in to store than some thirty fields (a BSON binary would
    be as small, but the stand-in fails to replace a document holding one)."""
    return {"_id": doc["_id"], "deleted_at": deleted_at, "task": dumps(doc)}


def tombstone_task(stored: dict[str, Any]) -> Task:
    """The last snapshot a ``tombstones`` document keeps."""
    doc = loads(stored["task"])
    assert isinstance(doc, dict)
    return task(doc)
