"""How long a failed task waits before its next attempt."""

from __future__ import annotations

import math
import random
from typing import Any

import attrs

from taskmill.settable import fraction, number, seconds, settable
from taskmill.validation import DELAY_MAX


def _seconds(low: float, high: float) -> Any:
    def check(instance: RetryPolicy, attribute: attrs.Attribute[float], value: float) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high  # NaN fails
        ):
            raise ValueError(
                f"RetryPolicy.{attribute.name} must be a number from {low:g} to {high:g},"
                f" got {value!r}"
            )

    return check


@attrs.frozen
class RetryPolicy:
    """Exponential backoff with jitter: ``base · factor^(n-1)``, capped at ``maximum``,
    then spread by ±``jitter`` (a fraction) so that a burst of failures does not come
    back as a burst of retries.

    :raises ValueError: a field is out of range (``base`` and ``maximum`` 0 to 100
        years in seconds, ``factor`` 1 to 1000, ``jitter`` 0 to 1).
    """

    # The metadata makes each field the setting retry_<field> (taskmill.settable).
    base: float = attrs.field(
        default=0.5,
        validator=_seconds(0, DELAY_MAX),
        metadata=settable("backoff before the first retry", seconds(0, exclusive=False), "SECONDS"),
    )
    factor: float = attrs.field(
        default=2.0,
        validator=_seconds(1, 1000),
        metadata=settable("backoff growth per attempt, 1 or more", number(1, exclusive=False), "X"),
    )
    maximum: float = attrs.field(
        default=60.0,
        validator=_seconds(0, DELAY_MAX),
        metadata=settable("longest backoff", seconds(0, exclusive=False), "SECONDS"),
    )
    jitter: float = attrs.field(
        default=0.25,
        validator=_seconds(0, 1),
        metadata=settable("backoff spread, a fraction from 0 to 1", fraction(), "FRACTION"),
    )

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based), for any
        attempt number (a task may retry up to a billion times)."""
        try:
            grown = self.base * self.factor ** max(0, attempt - 1)
        except OverflowError:
            grown = math.inf
        raw = min(self.maximum, grown)
        spread = raw * self.jitter
        return max(0.0, min(self.maximum, raw + random.uniform(-spread, spread)))
