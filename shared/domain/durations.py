"""Human-friendly durations and sizes used in topology files (``120s``, ``7d``, ``10GB``)."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE = re.compile(r"^\s*([0-9]+)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*$", re.IGNORECASE)
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


def parse_duration(value: object) -> float:
    """Seconds from ``1.5``, ``"500ms"``, ``"120s"``, ``"2m"``, ``"7d"``."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '120s'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration (use e.g. 500ms, 30s, 2m, 7d)")
    if seconds < 0:
        raise ValueError(f"{value!r} is negative")
    return seconds


def parse_size(value: object) -> int:
    """Bytes from ``1024``, ``"10GB"`` (decimal) or ``"1GiB"`` (binary)."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '10GB'")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and (match := _SIZE.match(value)):
        return int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()]
    raise ValueError(f"{value!r} is not a size (use e.g. 512MB, 10GB)")
