"""Human-friendly durations and sizes used in topology files (``120s``, ``7d``, ``10GB``).

Both parsers return a value or raise :class:`~shared.domain.errors.MalformedInput` (a
``ValueError``) naming the input: never an overflow, an infinity or a NaN.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import TypeVar

from shared.domain.errors import MalformedInput

_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE = re.compile(r"\s*([0-9]+)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
#: Longest duration accepted: 100 years. Longer is a typo, and would overflow a
#: ``timedelta`` or JetStream's int64 nanoseconds.
MAX_DURATION = 100 * 365 * 86400.0
#: Largest size accepted: JetStream's limits are signed 64-bit integers.
MAX_SIZE = 2**63 - 1
#: Digits a size may have before its unit (``MAX_SIZE`` has 19).
_MAX_SIZE_DIGITS = len(str(MAX_SIZE))
_TOO_LONG = "is longer than 100 years"
_TOO_LARGE = f"exceeds the largest size, {MAX_SIZE} bytes"

_Number = TypeVar("_Number", int, float)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bounded(value: object, number: _Number, largest: _Number, too_large: str) -> _Number:
    """``number`` (read from ``value``) unless it is negative or above ``largest``."""
    if number < 0:
        raise MalformedInput(f"{_shown(value)} is negative")
    if number > largest:
        raise MalformedInput(f"{_shown(value)} {too_large}")
    return number


def parse_duration(value: object) -> float:
    """Seconds from ``1.5``, ``"500ms"``, ``"120s"``, ``"2m"``, ``"7d"``."""
    if isinstance(value, bool):
        raise MalformedInput("a duration must be a number of seconds or a string like '120s'")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise MalformedInput(f"{_shown(value)} {_TOO_LONG}") from None
    elif isinstance(value, str) and (match := _DURATION.fullmatch(value)):
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    else:
        raise MalformedInput(f"{_shown(value)} is not a duration (use e.g. 500ms, 30s, 2m, 7d)")
    if math.isnan(seconds):
        raise MalformedInput(f"{_shown(value)} is not a number")
    return _bounded(value, seconds, MAX_DURATION, _TOO_LONG)


def parse_size(value: object) -> int:
    """Bytes from ``1024``, ``"10GB"`` (decimal) or ``"1GiB"`` (binary)."""
    if isinstance(value, bool):
        raise MalformedInput("a size must be a number of bytes or a string like '10GB'")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value)):
        digits = match.group(1).lstrip("0") or "0"
        if len(digits) > _MAX_SIZE_DIGITS:
            raise MalformedInput(f"{_shown(value)} {_TOO_LARGE}")
        size = int(digits) * _SIZE_UNITS[(match.group(2) or "b").lower()]
    else:
        raise MalformedInput(f"{_shown(value)} is not a size (use e.g. 512MB, 10GB)")
    return _bounded(value, size, MAX_SIZE, _TOO_LARGE)


def parse_instant(text: str) -> datetime:
    """An ISO-8601 time with its timezone (``2026-11-26T17:00:00Z``, ``...+01:00``), in UTC;
    :class:`MalformedInput` otherwise. A time without a timezone is refused: whose clock it
    means cannot be guessed."""
    try:
        moment = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise MalformedInput(f"{text[:60]!r} is not an ISO-8601 time") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise MalformedInput(f"{text[:60]!r} has no timezone: add Z or an offset like +01:00")
    return moment.astimezone(UTC)
