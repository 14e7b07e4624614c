"""What fits in one packet to the server.

The server refuses a packet (one statement, or several joined into one multi-statement
packet) of ``max_allowed_packet`` bytes or more, and closes the connection. The store
reads that size once, when it opens; a session then keeps every packet under it:
multi-row statements are cut into several (:func:`runs`), and deferred statements are
sent as several packets, in the same transaction. A task's JSON values are bounded
(:func:`value_ceiling`) so that any of them fits in a statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

__all__ = [
    "CHUNK",
    "DEFAULT_PACKET",
    "MARGIN",
    "SLACK",
    "Run",
    "chunks",
    "runs",
    "text_bytes",
    "value_ceiling",
]

CHUNK: Final = 500
"""Most rows in one multi-row statement, and most ids bound in one ``IN (...)`` list."""


def chunks(items: Sequence[Any], size: int = CHUNK) -> list[Sequence[Any]]:
    """``items`` cut into consecutive slices of at most ``size`` (:data:`CHUNK`)."""
    return [items[i : i + size] for i in range(0, len(items), size)]


DEFAULT_PACKET: Final = 16 * 1024 * 1024
"""``max_allowed_packet`` until the server said otherwise: MariaDB's default (MySQL
8's is 64 MiB)."""
SLACK: Final = 1024
"""Bytes a packet keeps free below ``max_allowed_packet``: the server refuses a
statement of ``max_allowed_packet - 1`` bytes already (the command byte counts), and
deferred statements are counted with their separators."""
MARGIN: Final = 128 * 1024
"""Bytes of a statement left for everything beside its one large value: a task's
error (16,000 characters, at most 64,000 bytes as UTF-8 and escaped), its progress
message (4,096 characters, 16 KiB), its id, type, app id, dedupe key and user id
(about 8 KiB escaped), and the SQL around them (about 2 KiB for a finish)."""


def value_ceiling(max_allowed_packet: int) -> int:
    """The largest JSON value (UTF-8 bytes) a task keeps on a server with this
    ``max_allowed_packet``: what a statement holds beside :data:`MARGIN`, halved, since
    a value is written as an SQL string literal in which each quote and backslash is
    escaped with a backslash (JSON text of nothing but quotes takes twice its size).
    On a tiny ``max_allowed_packet`` (under 256 KiB) the margin is half of it."""
    return (max_allowed_packet - min(MARGIN, max_allowed_packet // 2)) // 2


def text_bytes(text: str) -> int:
    """``text``'s length in UTF-8 (the connection's charset is utf8mb4): its ``len`` when
    it is ASCII, which nearly every statement is (a check at memory speed)."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


Run = tuple[int, int, int]
"""A run of items: (start, stop, bytes), as :func:`runs` cuts them."""


def runs(sizes: Sequence[int], room: int, most: int) -> list[Run]:
    """Cut items of ``sizes`` bytes, in order, into consecutive runs of at most ``most``
    items each whose sizes add up to at most ``room`` (an item larger than ``room`` is
    a run of its own, which the server will refuse)."""
    cut: list[Run] = []
    start = 0
    total = 0
    for index, size in enumerate(sizes):
        if index > start and (total + size > room or index - start >= most):
            cut.append((start, index, total))
            start, total = index, 0
        total += size
    if sizes:
        cut.append((start, len(sizes), total))
    return cut
