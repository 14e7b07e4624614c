"""Global rate limits and global concurrency limits: the rules every backend applies
inside its claim.

A handler declares ``rate_limit="100/s"`` (``/s``, ``/min``, ``/h``) and/or
``global_concurrency=N``; the worker carries them in
:attr:`taskmill.storage.ClaimRequest.limits`, keyed like ``handlers``. Inside the one
claim transaction a backend

1. locks (creating when missing) the rate bucket of every rate-limited key it may
   claim for, and reads the store's clock;
2. counts the RUNNING tasks of every concurrency-limited key;
3. calls :func:`limited_caps` to cut each key's cap to what the limits allow;
4. claims as usual with those caps, and
5. writes each bucket back with :func:`spend`.

That sequence is written once, in :mod:`taskmill.limiting`, over each store's
:class:`~taskmill.limiting.BucketLedger`; this module holds the decisions it applies.

A bucket is a token bucket holding at most ``count`` tokens (one period's worth),
refilled continuously at ``count / period`` per second of the store's clock, starting
full. So in any window of ``T`` seconds at most ``count + count * T / period`` tasks of
the key start: the overshoot over the nominal rate is at most one burst of ``count``.

A key's scope: ``(None, task_type)`` (the host's handler) limits every task of that type
whatever its app; ``(app_id, task_type)`` limits only that app's tasks. Its bucket is
stored under :func:`scope_of`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Final, TypeAlias

import attrs

from taskmill.errors import TaskmillError

HandlerKey: TypeAlias = tuple[str | None, str]
"""``(app_id, task_type)``, as in :data:`taskmill.storage.HandlerKey`."""

__all__ = [
    "Bucket",
    "InvalidLimit",
    "Rate",
    "TypeLimit",
    "check_max_running",
    "key_of",
    "limited_caps",
    "locked_keys",
    "parse_rate",
    "refill",
    "scope_of",
    "spend",
    "taken_by_key",
]

_PERIODS: Final = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
}
_RATE: Final = re.compile(r"^\s*(\d+)\s*/\s*([a-z]+)\s*$")


class InvalidLimit(TaskmillError, ValueError):
    """A rate limit or global concurrency limit that cannot be understood."""


@attrs.frozen
class Rate:
    """``count`` task starts per ``period`` seconds."""

    count: int
    period: float

    @property
    def per_second(self) -> float:
        """Tokens added to the bucket per second."""
        return self.count / self.period


@attrs.frozen
class TypeLimit:
    """The limits of one handler key, as a claim carries them."""

    rate: Rate | None = None
    """At most this many starts per period across every worker of the store."""
    max_running: int | None = None
    """At most this many RUNNING tasks of the key across every worker of the store."""


@attrs.frozen
class Bucket:
    """A stored rate bucket: ``tokens`` as of ``updated_at`` (store clock, seconds)."""

    tokens: float
    updated_at: float


def parse_rate(text: str) -> Rate:
    """``"100/s"``, ``"30/min"``, ``"5/h"`` → :class:`Rate`.

    :raises InvalidLimit: the text is not ``<positive integer>/<s|min|h>``.
    """
    match = _RATE.match(text) if isinstance(text, str) else None
    period = _PERIODS.get(match.group(2)) if match else None
    if match is None or period is None or int(match.group(1)) < 1:
        raise InvalidLimit(
            f"rate_limit {text!r} is not understood; write it as a positive whole number "
            f'of starts per second, minute or hour: "100/s", "30/min" or "5/h"'
        )
    return Rate(count=int(match.group(1)), period=period)


def check_max_running(value: int | None) -> int | None:
    """Return ``value`` when it is None or a positive integer.

    :raises InvalidLimit: otherwise.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidLimit(
            f"global_concurrency must be a whole number >= 1 (or None for no global "
            f"limit), got {value!r}"
        )
    return value


def scope_of(key: HandlerKey) -> str:
    """How a key's bucket row names its app: ``'*'`` for the host's key, ``'=' + app``."""
    app_id = key[0]
    return "*" if app_id is None else "=" + app_id


def refill(bucket: Bucket | None, rate: Rate, now: float) -> float:
    """The tokens of ``bucket`` at ``now`` (a missing bucket is full)."""
    if bucket is None:
        return float(rate.count)
    elapsed = max(0.0, now - bucket.updated_at)
    return min(float(rate.count), bucket.tokens + elapsed * rate.per_second)


def limited_caps(
    handlers: Mapping[HandlerKey, int | None],
    limits: Mapping[HandlerKey, TypeLimit],
    *,
    tokens: Mapping[HandlerKey, float],
    running: Mapping[HandlerKey, int],
) -> dict[HandlerKey, int | None]:
    """``handlers`` with each limited key's cap cut to what its limits allow now:
    whole tokens of its bucket (``tokens``, already refilled) and free global slots
    (``max_running`` less ``running``). Keys stay in the mapping even at cap 0, so an
    app's tasks never fall through to the host's key."""
    caps = dict(handlers)
    for key, limit in limits.items():
        if key not in caps:
            continue
        cap = caps[key]
        if limit.rate is not None:
            allowed = max(0, math.floor(tokens.get(key, float(limit.rate.count)) + 1e-9))
            cap = allowed if cap is None else min(cap, allowed)
        if limit.max_running is not None:
            free = max(0, limit.max_running - running.get(key, 0))
            cap = free if cap is None else min(cap, free)
        caps[key] = cap
    return caps


def spend(tokens: float, taken: int) -> float:
    """The bucket's tokens after ``taken`` starts."""
    return max(0.0, tokens - taken)


def locked_keys(
    handlers: Mapping[HandlerKey, int | None], limits: Mapping[HandlerKey, TypeLimit]
) -> list[HandlerKey]:
    """The limited keys a claim may take for (cap not 0), in the order their bucket rows
    are locked (a stable one, so two claims never deadlock on them). The row of a
    concurrency-only key carries no tokens that matter: locking it serializes the
    claims that count its RUNNING tasks."""
    keys = [k for k in limits if k in handlers and handlers[k] != 0]
    return sorted(keys, key=lambda k: (scope_of(k), k[1]))


def key_of(app_id: str | None, task_type: str, handlers: Mapping[HandlerKey, object]) -> HandlerKey:
    """The handler key a claimed task was served by: its app's own, else the host's."""
    return (app_id, task_type) if (app_id, task_type) in handlers else (None, task_type)


def taken_by_key(
    claimed: Iterable[tuple[str | None, str]], handlers: Mapping[HandlerKey, object]
) -> dict[HandlerKey, int]:
    """How many of the claimed tasks (their ``(app_id, task_type)``) each handler key
    took."""
    taken: dict[HandlerKey, int] = {}
    for app_id, task_type in claimed:
        key = key_of(app_id, task_type, handlers)
        taken[key] = taken.get(key, 0) + 1
    return taken
