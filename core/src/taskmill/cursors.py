"""Event-cursor tokens for stores whose event-log positions are integers.

The storage contract (:meth:`taskmill.storage.TaskStorage.read_events`) hands out
cursors as opaque tokens: non-empty strings without ``"."`` that compare with ``<`` in
commit order. A store that numbers its events (memory, SQLite, PostgreSQL: a counter
drawn in commit order) writes each number as a fixed-width, zero-padded decimal, so the
string order of two tokens is the numeric order of their positions. This module is that
one encoding; every such store uses it rather than inventing its own.
"""

from __future__ import annotations

from typing import Final

from taskmill.errors import InvalidCursor

POSITION_DIGITS: Final = 20
"""Digits of a position token: room for every unsigned 64-bit position."""

_LARGEST: Final = 10**POSITION_DIGITS - 1


def position_token(position: int) -> str:
    """The cursor token of event-log position ``position`` (0 = before every event).

    :raises ValueError: for a negative position or one wider than
        :data:`POSITION_DIGITS` digits (a bug in the store, not a caller's mistake).
    """
    if not 0 <= position <= _LARGEST:
        raise ValueError(f"an event-log position must be 0..{_LARGEST}, not {position}")
    return f"{position:0{POSITION_DIGITS}d}"


def token_position(token: str) -> int:
    """The event-log position that :func:`position_token` wrote as ``token``.

    :raises InvalidCursor: for any string :func:`position_token` does not write.
    """
    if len(token) != POSITION_DIGITS or not (token.isascii() and token.isdigit()):
        raise InvalidCursor(
            f"{token!r} is not an event cursor of this store; cursors come from"
            " TaskEvent.cursor or the second value read_events returns"
        )
    return int(token)
