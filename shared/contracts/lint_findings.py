"""What the lint reports: a finding (:class:`Problem`), and durations as findings print them.

Every rule and coverage gate of :mod:`shared.contracts.lint` reports its findings as
:class:`Problem` instances; :func:`format_duration` writes the durations in their messages.
"""

from __future__ import annotations

from dataclasses import dataclass

_DAY, _HOUR, _MINUTE = 86400, 3600, 60


@dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One finding: where (file and field), which rule, and what is wrong."""

    source: str
    field: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.field}: {self.message} [{self.rule}]"


def format_duration(seconds: float) -> str:
    """``30d 18m 36s``-style, exact to the millisecond."""
    if seconds < 1 and seconds != 0:
        return f"{round(seconds * 1000)}ms"
    whole, frac = divmod(seconds, 1)
    parts = []
    remaining = int(whole)
    for unit, size in (("d", _DAY), ("h", _HOUR), ("m", _MINUTE)):
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    if remaining or frac or not parts:
        secs = remaining + frac
        parts.append(f"{secs:g}s")
    return " ".join(parts)
