"""Whether a short wait for more work pays: a smoothed gap between arrivals.

The publisher and the consumer each may linger a few milliseconds before taking a batch,
so that work arriving right behind the first item joins it (one claim and one mark for
several messages instead of one each). That pays only when something is likely to arrive
within the linger; at a low rate it is pure latency. :class:`ArrivalGap` keeps an
exponentially weighted mean of the gaps between arrivals (commits notified, messages
delivered) so the role can ask exactly that.
"""

from __future__ import annotations

import math
import time

#: Weight of the newest gap in the mean (about the last ten arrivals count).
DEFAULT_WEIGHT = 0.2


class ArrivalGap:
    """Smoothed seconds between arrivals; infinite until two have been seen."""

    def __init__(self, weight: float = DEFAULT_WEIGHT) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], not {weight}")
        self.weight = weight
        self.seconds = math.inf
        self._last: float | None = None

    def arrived(self, now: float | None = None) -> None:
        """Count one arrival (at ``now``, monotonic seconds; default: the clock)."""
        now = time.monotonic() if now is None else now
        if self._last is not None:
            gap = max(now - self._last, 0.0)
            if math.isinf(self.seconds):
                self.seconds = gap
            else:
                self.seconds += self.weight * (gap - self.seconds)
        self._last = now

    def expects_within(self, seconds: float) -> bool:
        """Whether, at the recent pace, another arrival is due within ``seconds``."""
        return self.seconds <= seconds
