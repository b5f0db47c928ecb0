"""A token bucket: at most ``rate`` events a second on average, ``burst`` at once. Pure; the
clock is injected. Not thread-safe: a caller shared by threads holds a lock around it."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    def __init__(
        self, rate: float, burst: int, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.monotonic = monotonic
        self.last = monotonic()

    def wait_time(self) -> float:
        """0 when a token was taken, else how long until one is available."""
        now = self.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate
