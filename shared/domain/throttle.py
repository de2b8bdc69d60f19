"""Controlled throttling (INFRA-005 §7.3): a rate written ``20/s``, and a token bucket.

A throttled durable's consumer takes one token per message it fetches; the bucket holds
at most ``burst`` tokens and refills at ``rate`` tokens per second. A rate is written
``<number>/<unit>`` with unit ``s``, ``m`` or ``h`` (``20/s``, ``300/m``, ``2.5/s``), between
:data:`MIN_RATE` and :data:`MAX_RATE` per second.

Pure (stdlib only): time is passed in, so the bucket is tested without a clock.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

#: Seconds per rate unit.
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
#: Slowest rate (per second): one message an hour.
MIN_RATE = 1 / 3600
#: Fastest rate (per second): beyond it a throttle throttles nothing a consumer can do.
MAX_RATE = 100_000.0
#: Largest burst (tokens).
MAX_BURST = 100_000
_RATE = re.compile(r"(\d{1,9}(?:\.\d{1,6})?)\s*/\s*([A-Za-z]+)")


class RateError(ValueError):
    """A rate that cannot be read, or out of range (the message says how to write it)."""


def parse_rate(value: object) -> float:
    """Messages per second of ``value`` (``"20/s"``, ``"300/m"``, ``"1/h"``). A bare number
    is refused with a hint (is 20 per second or per minute?), and so is anything else."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise RateError(f"rate {str(value)[:20]} needs a unit: write e.g. 20/s, 300/m or 1/h")
    if not isinstance(value, str):
        raise RateError(f"rate must be text like 20/s, not {type(value).__name__}")
    match = _RATE.fullmatch(value.strip())
    if match is None and re.fullmatch(r"\d{1,9}(?:\.\d{1,6})?", value.strip()):
        number = value.strip()
        raise RateError(f"rate {number!r} needs a unit: write {number}/s, {number}/m or {number}/h")
    if match is None:
        shown = value if len(value) <= 40 else value[:39] + "…"
        raise RateError(f"rate {shown!r} is not <number>/<unit>: write e.g. 20/s, 300/m or 1/h")
    number, unit = match.groups()
    seconds = RATE_UNITS.get(unit.lower())
    if seconds is None:
        raise RateError(f"rate {value.strip()!r}: unknown unit {unit!r} (s, m or h)")
    per_second = float(number) / seconds
    if per_second < MIN_RATE:
        raise RateError(f"rate {value.strip()!r} is below the slowest allowed, 1/h")
    if per_second > MAX_RATE:
        raise RateError(f"rate {value.strip()!r} is above the fastest allowed, {MAX_RATE:g}/s")
    return per_second


def format_rate(per_second: float) -> str:
    """The shortest exact-enough spelling: ``20/s``, ``5/m``, ``1/h``, ``0.5/s``."""
    for unit in ("s", "m", "h"):
        count = per_second * RATE_UNITS[unit]
        if count >= 1 and abs(count - round(count)) < 1e-9 * max(count, 1):
            return f"{round(count)}/{unit}"
    if per_second >= 1:
        return f"{per_second:.6g}/s"
    return f"{per_second * 3600:.6g}/h"


def default_burst(per_second: float) -> int:
    """One second's worth of messages, at least one."""
    return max(1, math.ceil(per_second - 1e-9))


@dataclass(frozen=True, slots=True)
class Limit:
    """A rate (messages per second) and the burst the bucket holds."""

    rate: float
    burst: int

    @classmethod
    def of(cls, rate: float, burst: int | None = None) -> Limit:
        """``rate`` with ``burst`` (default: one second's worth)."""
        if not MIN_RATE <= rate <= MAX_RATE or math.isnan(rate):
            raise RateError(f"rate {rate!r}/s is outside {format_rate(MIN_RATE)}..{MAX_RATE:g}/s")
        if burst is not None and not 1 <= burst <= MAX_BURST:
            raise RateError(f"burst {burst} must be between 1 and {MAX_BURST}")
        return cls(rate, default_burst(rate) if burst is None else burst)

    def describe(self) -> str:
        """``20/s (burst 40)``."""
        return f"{format_rate(self.rate)} (burst {self.burst})"


class TokenBucket:
    """Tokens refill at the limit's rate up to its burst; None = no limit.

    :meth:`take` may drive the count below zero (several fetch loops share one bucket and
    each takes what it actually fetched): the debt is waited out by the next taker, so
    the long-run rate holds.
    """

    def __init__(self, limit: Limit | None, now: float) -> None:
        self.limit = limit
        self.tokens = float(limit.burst) if limit else 0.0
        self._at = now

    def _refill(self, now: float) -> None:
        if self.limit is not None and now > self._at:
            self.tokens = min(
                float(self.limit.burst), self.tokens + (now - self._at) * self.limit.rate
            )
        self._at = max(self._at, now)

    def set_limit(self, limit: Limit | None, now: float) -> None:
        """Change the limit; tokens carried over are capped at the new burst (a bucket
        that had no limit starts full)."""
        self._refill(now)
        if limit is None:
            self.tokens = 0.0
        elif self.limit is None:
            self.tokens = float(limit.burst)
        else:
            self.tokens = min(self.tokens, float(limit.burst))
        self.limit = limit

    def available(self, now: float) -> float:
        """Tokens in the bucket now (infinite without a limit)."""
        if self.limit is None:
            return math.inf
        self._refill(now)
        return self.tokens

    def take(self, count: int, now: float) -> None:
        """Spend ``count`` tokens (possibly into debt)."""
        if self.limit is None or count <= 0:
            return
        self._refill(now)
        self.tokens -= count

    def wait_for(self, count: float, now: float) -> float:
        """Seconds until ``count`` tokens are there (0: now; never more than the time to
        refill from the current debt to ``min(count, burst)``)."""
        if self.limit is None:
            return 0.0
        self._refill(now)
        wanted = min(count, float(self.limit.burst))
        missing = wanted - self.tokens
        return 0.0 if missing <= 0 else missing / self.limit.rate
