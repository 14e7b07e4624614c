"""The limits of every value a task carries, and the one check of them, made in the core
before any store sees a value.

Every backend keeps exactly what these limits admit and reads it back as written, so an
input either works on every store or is refused on every store with the same
:class:`~taskmill.errors.InvalidTaskSpec` (a ``ValueError``) naming the field, the limit
and the value's size; nothing is stored then. docs/semantics.md ("Limits") holds the
table; :data:`LIMITS` is its source, and the HTTP service's OpenAPI document states the
same figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Final

import attrs

from taskmill.errors import DELAY_MAX, InvalidTaskSpec, check_retry_delay

__all__ = [
    "APP_ID_MAX",
    "DEDUPE_KEY_MAX",
    "DELAY_MAX",
    "ERROR_MAX",
    "LIMITS",
    "MAX_RETRIES_MAX",
    "PAGE_MAX",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "PROGRESS_MESSAGE_MAX",
    "RUN_AT_MAX",
    "RUN_AT_MIN",
    "SCHEDULE_NAME_MAX",
    "TASK_ID_MAX",
    "TASK_TYPE_MAX",
    "TIMEOUT_MAX",
    "USER_ID_MAX",
    "WORKER_ID_MAX",
    "FieldLimit",
    "check_delay",
    "check_int",
    "check_key",
    "check_older_than",
    "check_page",
    "check_retry_delay",
    "check_run_at",
    "check_timeout",
    "is_key",
    "is_task_id",
    "is_text",
    "storable_error",
]

TASK_TYPE_MAX: Final = 255
"""Characters in a task type (MySQL's ``VARCHAR(255)`` holds 255 of any kind)."""
APP_ID_MAX: Final = 255
"""Characters in an app id."""
USER_ID_MAX: Final = 255
"""Characters in a user id."""
WORKER_ID_MAX: Final = 255
"""Characters in a worker id."""
DEDUPE_KEY_MAX: Final = 1024
"""Characters in a dedupe key."""
SCHEDULE_NAME_MAX: Final = 255
"""Characters in a periodic schedule's name."""
TASK_ID_MAX: Final = 64
"""Characters in a task id (taskmill's own are 36: UUID strings)."""
PROGRESS_MESSAGE_MAX: Final = 4096
"""Characters in a progress message."""
ERROR_MAX: Final = 16000
"""Characters of a task's error kept; a longer one keeps its head and its tail."""
PRIORITY_MIN: Final = -(2**31)
PRIORITY_MAX: Final = 2**31 - 1
"""Priorities are 32-bit signed integers: exact in every store and in JavaScript."""
MAX_RETRIES_MAX: Final = 1_000_000_000
"""The most retries a task may ask for (in effect: retry for ever)."""
TIMEOUT_MAX: Final = 366 * 24 * 3600.0
"""The longest handler timeout, in seconds (366 days)."""
RUN_AT_MIN: Final = datetime(1970, 1, 1, tzinfo=UTC)
"""The earliest ``run_at`` (a past one is due at once)."""
RUN_AT_MAX: Final = datetime(9999, 1, 1, tzinfo=UTC)
"""The latest ``run_at`` (exclusive): every store's timestamps and Python's reach it."""


@attrs.frozen
class FieldLimit:
    """One row of the limits table: what ``field`` admits on every backend."""

    field: str
    admits: str
    min_value: int | None = None
    max_value: int | None = None
    max_length: int | None = None


_KEY = "text without NUL or lone surrogates"
LIMITS: Final[tuple[FieldLimit, ...]] = (
    FieldLimit(
        "task_type",
        f"non-empty {_KEY}, at most {TASK_TYPE_MAX} characters",
        max_length=TASK_TYPE_MAX,
    ),
    FieldLimit("app_id", f"{_KEY}, at most {APP_ID_MAX} characters", max_length=APP_ID_MAX),
    FieldLimit("user_id", f"{_KEY}, at most {USER_ID_MAX} characters", max_length=USER_ID_MAX),
    FieldLimit(
        "dedupe_key", f"{_KEY}, at most {DEDUPE_KEY_MAX} characters", max_length=DEDUPE_KEY_MAX
    ),
    FieldLimit(
        "parent_id, after",
        f"task ids: {_KEY}, at most {TASK_ID_MAX} characters",
        max_length=TASK_ID_MAX,
    ),
    FieldLimit(
        "worker_id", f"{_KEY}, at most {WORKER_ID_MAX} characters", max_length=WORKER_ID_MAX
    ),
    FieldLimit(
        "schedule name",
        f"non-empty {_KEY}, at most {SCHEDULE_NAME_MAX} characters",
        max_length=SCHEDULE_NAME_MAX,
    ),
    FieldLimit(
        "priority",
        f"an int from {PRIORITY_MIN} to {PRIORITY_MAX} (32-bit signed)",
        min_value=PRIORITY_MIN,
        max_value=PRIORITY_MAX,
    ),
    FieldLimit(
        "max_retries",
        f"an int from 0 to {MAX_RETRIES_MAX:_}".replace("_", ","),
        min_value=0,
        max_value=MAX_RETRIES_MAX,
    ),
    FieldLimit(
        "delay, Retry(delay=...)",
        "a finite number of seconds from 0 to 3,155,760,000 (100 years), or a timedelta",
        min_value=0,
        max_value=int(DELAY_MAX),
    ),
    FieldLimit(
        "run_at",
        f"a timezone-aware datetime from {RUN_AT_MIN:%Y-%m-%d} to before {RUN_AT_MAX:%Y-%m-%d}"
        " (microseconds kept); a past one is due at once",
    ),
    FieldLimit(
        "timeout (handler)",
        f"a finite number of seconds > 0, at most {TIMEOUT_MAX:.0f} (366 days)",
        max_value=int(TIMEOUT_MAX),
    ),
    FieldLimit(
        "progress message",
        f"{_KEY}, at most {PROGRESS_MESSAGE_MAX} characters",
        max_length=PROGRESS_MESSAGE_MAX,
    ),
    FieldLimit(
        "params, data, result",
        "JSON, any key or string (NUL and emoji included; lone surrogates refused);"
        " params and data a JSON object. params at most max_params_bytes of UTF-8 (1 MiB"
        " by default); params, data and a result each at most the store's"
        " max_value_bytes (unbounded on SQLite and PostgreSQL; on MongoDB and MySQL half"
        " the document or packet size less 128 KiB: 8,323,072 bytes on default servers)",
    ),
)
"""Every limit, the same on every backend (docs/semantics.md renders this table)."""


def _bad_character(value: str) -> str | None:
    """What and where the first character no store keeps is, or None."""
    nul = value.find("\x00")
    if nul >= 0:
        return (
            f"a NUL character ('\\x00') at position {nul}, which no store keeps"
            " (PostgreSQL text cannot hold it); remove it"
        )
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"{value[exc.start]!r} at position {exc.start}, a lone surrogate: not valid"
            " Unicode text (often bytes decoded with errors='surrogateescape'); decode the"
            " input properly"
        )
    return None


def is_key(value: object, max_length: int) -> bool:
    """Whether ``value`` is text a store keeps as a key of at most ``max_length``
    characters (a str without NUL or lone surrogates)."""
    return isinstance(value, str) and len(value) <= max_length and _bad_character(value) is None


def is_text(value: str) -> bool:
    """Whether ``value`` is valid Unicode text (encodable as UTF-8: no lone
    surrogates), which every store can keep."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_task_id(value: object) -> bool:
    """Whether ``value`` can be a stored task's id (no store can hold another)."""
    return is_key(value, TASK_ID_MAX)


def check_key(field: str, value: object, max_length: int, *, empty: bool = True) -> None:
    """Refuse a key (task type, app id, dedupe key, ...) no store keeps as written.

    :raises InvalidTaskSpec: ``value`` is not a str, is empty where ``empty`` is False,
        is longer than ``max_length`` characters, or holds NUL or a lone surrogate.
    """
    if not isinstance(value, str):
        raise InvalidTaskSpec(f"{field} must be a str, not {type(value).__name__}", field=field)
    if not value and not empty:
        raise InvalidTaskSpec(f"{field} must be a non-empty string", field=field)
    if len(value) > max_length:
        raise InvalidTaskSpec(
            f"{field} is {len(value)} characters long, over the limit of {max_length}"
            f" characters that every store keeps; use a shorter {field}",
            field=field,
        )
    bad = _bad_character(value)
    if bad is not None:
        raise InvalidTaskSpec(f"{field} holds {bad}", field=field)


def check_int(field: str, value: object, minimum: int, maximum: int) -> int:
    """``value`` as an int when it is one (not a bool) from ``minimum`` to ``maximum``.

    :raises InvalidTaskSpec: naming the field, the range and the value.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTaskSpec(
            f"{field} must be an int, not {type(value).__name__} {value!r}", field=field
        )
    if not minimum <= value <= maximum:
        size = f" ({value.bit_length()} bits)" if abs(value) > 2**40 else ""
        raise InvalidTaskSpec(
            f"{field} must be from {minimum} to {maximum}, got {value}{size}", field=field
        )
    return int(value)


def check_run_at(value: object, *, field: str = "run_at") -> datetime:
    """``value`` in UTC when it is a timezone-aware datetime in the stored range (every
    store hands timestamps back in UTC).

    :raises InvalidTaskSpec: it is not a datetime, is naive, or is out of range.
    """
    if not isinstance(value, datetime):
        raise InvalidTaskSpec(
            f"{field} must be a timezone-aware datetime, not {type(value).__name__}",
            field=field,
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidTaskSpec(
            f"{field} must be a timezone-aware datetime, got the naive {value.isoformat()};"
            " use datetime.now(UTC) or attach a tzinfo",
            field=field,
        )
    try:
        in_range = RUN_AT_MIN <= value < RUN_AT_MAX
    except OverflowError:  # an offset that pushes it past datetime's own range
        in_range = False
    if not in_range:
        raise InvalidTaskSpec(
            f"{field} must be from {RUN_AT_MIN.isoformat()} to before"
            f" {RUN_AT_MAX.isoformat()}, got {value.isoformat()}",
            field=field,
        )
    return value if value.utcoffset() == _ZERO and value.tzinfo is UTC else value.astimezone(UTC)


_ZERO = timedelta(0)


def check_delay(value: object, now: datetime) -> datetime:
    """The ``run_at`` a ``delay`` from ``now`` gives: ``value`` seconds (int or float)
    or a timedelta, finite, from 0 to :data:`DELAY_MAX`.

    A negative delay is refused: to run now leave ``delay`` out; for a time that may
    have passed give ``run_at``, which may lie in the past.

    :raises InvalidTaskSpec: naming the delay and what it admits.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidTaskSpec(
            f"delay must be a number of seconds or a timedelta, not {type(value).__name__}",
            field="delay",
        )
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidTaskSpec(
            f"delay must be a finite number of seconds, got {value!r}", field="delay"
        )
    if seconds < 0:
        raise InvalidTaskSpec(
            f"delay must be >= 0 seconds, got {seconds:g}; leave it out to run now, or give"
            " run_at for a time that may have passed",
            field="delay",
        )
    if seconds > DELAY_MAX:
        raise InvalidTaskSpec(
            f"delay must be at most {DELAY_MAX:.0f} seconds (100 years), got {seconds:g};"
            " for a task that may never run, do not enqueue it yet",
            field="delay",
        )
    return now + (value if isinstance(value, timedelta) else timedelta(seconds=seconds))


def check_timeout(value: object, *, field: str = "timeout") -> float | None:
    """A handler timeout: None, or a finite number of seconds in (0, TIMEOUT_MAX].

    :raises InvalidTaskSpec: naming the range and the value.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTaskSpec(
            f"{field} must be a number of seconds, not {type(value).__name__}", field=field
        )
    if not (0 < value <= TIMEOUT_MAX):  # NaN fails both comparisons
        raise InvalidTaskSpec(
            f"{field} must be > 0 and at most {TIMEOUT_MAX:.0f} seconds (366 days), got {value!r}",
            field=field,
        )
    return float(value)


def check_keys(field: str, values: Iterable[object], max_length: int) -> None:
    """:func:`check_key` for each of ``values``."""
    for value in values:
        check_key(field, value, max_length)


PAGE_MAX: Final = 2**31 - 1
"""The largest ``limit`` and ``offset`` of a query (every store's integers hold it)."""


def check_page(limit: object, offset: object) -> None:
    """Refuse a query page no store can take: ``limit`` and ``offset`` are ints from 0
    to :data:`PAGE_MAX`.

    :raises InvalidTaskSpec: naming the argument, the range and the value.
    """
    check_int("limit", limit, 0, PAGE_MAX)
    check_int("offset", offset, 0, PAGE_MAX)


def check_older_than(value: object, now: datetime) -> timedelta:
    """A retention age: a timedelta >= 0, capped at the time since :data:`RUN_AT_MIN`
    (no task finished earlier, and every store can subtract that from its clock).

    :raises InvalidTaskSpec: not a timedelta, or negative.
    """
    if not isinstance(value, timedelta):
        raise InvalidTaskSpec(
            f"older_than must be a timedelta, not {type(value).__name__}", field="older_than"
        )
    if value < _ZERO:
        raise InvalidTaskSpec(
            f"older_than must be >= 0, got {value}; a negative age would delete tasks"
            " finished in the future of the store's clock",
            field="older_than",
        )
    return min(value, now - RUN_AT_MIN)


_CUT = "\n[... {n} characters cut ...]\n"


def storable_error(text: str | None) -> str | None:
    """An error message as every store keeps it: NUL and lone surrogates written as
    escapes, and at most :data:`ERROR_MAX` characters (a longer one keeps its head,
    which names the exception, and its tail, the innermost frames)."""
    if text is None:
        return None
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > ERROR_MAX:
        cut = len(text) - ERROR_MAX + 64
        head = (ERROR_MAX - 64) // 2
        text = text[:head] + _CUT.format(n=cut) + text[head + cut :]
    return text
