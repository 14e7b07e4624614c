"""How long a failed task waits before its next attempt."""

from __future__ import annotations

import random

import attrs


@attrs.frozen
class RetryPolicy:
    """Exponential backoff with jitter: ``base · factor^(n-1)``, capped at ``maximum``,
    then spread by ±``jitter`` (a fraction) so that a burst of failures does not come
    back as a burst of retries."""

    base: float = 0.5
    factor: float = 2.0
    maximum: float = 60.0
    jitter: float = 0.25

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        raw = min(self.maximum, self.base * self.factor ** max(0, attempt - 1))
        spread = raw * self.jitter
        return max(0.0, min(self.maximum, raw + random.uniform(-spread, spread)))
