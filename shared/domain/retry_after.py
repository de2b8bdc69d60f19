"""A handler's ``Retry-After`` header, read as RFC 9110 §10.2.3 defines it.

``Retry-After = HTTP-date / delay-seconds`` where ``delay-seconds = 1*DIGIT``. An
HTTP-date is the preferred IMF-fixdate (``Sun, 06 Nov 1994 08:49:37 GMT``) or one of
the two obsolete forms a recipient must still accept (RFC 850:
``Sunday, 06-Nov-94 08:49:37 GMT``; asctime: ``Sun Nov  6 08:49:37 1994``); a date is
turned into the seconds from ``now`` until it, at least 0.

:func:`parse_retry_after` returns a finite float ≥ 0 or None (absent or not one of these
forms: ``nan``, ``inf``, ``-1``, ``1.5``, ``1e400``, garbage). It never raises.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

#: Longest delay-seconds value kept exactly; RFC 9110 asks recipients to handle at least
#: 2^31 (larger values are that many seconds and more: the caller caps them anyway).
LONGEST = float(2**31)
#: A header longer than this is not a Retry-After value worth reading.
MAX_LENGTH = 64

_MONTHS = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"),
        start=1,
    )
}
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_LONG_DAY = r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
_MONTH = r"(?P<month>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_TIME = r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
_DATE_FORMS = (
    # IMF-fixdate
    re.compile(rf"{_DAY}, (?P<day>[0-9]{{2}}) {_MONTH} (?P<year>[0-9]{{4}}) {_TIME} GMT", re.ASCII),
    # RFC 850 (two-digit year)
    re.compile(
        rf"{_LONG_DAY}, (?P<day>[0-9]{{2}})-{_MONTH}-(?P<year2>[0-9]{{2}}) {_TIME} GMT", re.ASCII
    ),
    # asctime (day padded with a space)
    re.compile(rf"{_DAY} {_MONTH} (?P<day>[ 0-9][0-9]) {_TIME} (?P<year>[0-9]{{4}})", re.ASCII),
)
_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def parse_retry_after(value: str | None, *, now: datetime) -> float | None:
    """Seconds to wait that ``value`` asks for, or None when it is absent or invalid."""
    if value is None:
        return None
    text = value.strip(" \t")
    if not text or len(text) > MAX_LENGTH:
        return None
    if _DIGITS.fullmatch(text):
        # At most MAX_LENGTH digits: int() is exact and far below its 4,300-digit limit.
        return min(float(int(text)), LONGEST)
    when = http_date(text, now=now)
    if when is None:
        return None
    return max((when - now).total_seconds(), 0.0)


def http_date(text: str, *, now: datetime) -> datetime | None:
    """The instant an HTTP-date names (UTC), or None when ``text`` is not one."""
    for form in _DATE_FORMS:
        match = form.fullmatch(text)
        if match is None:
            continue
        parts = match.groupdict()
        year = int(parts["year"]) if parts.get("year") else _full_year(parts["year2"], now)
        try:
            return datetime(
                year,
                _MONTHS[parts["month"]],
                int(parts["day"]),
                int(parts["hour"]),
                int(parts["minute"]),
                int(parts["second"]),
                tzinfo=UTC,
            )
        except ValueError:  # 31 Feb, 25:00:00, year 0, ...
            return None
    return None


def _full_year(two_digits: str, now: datetime) -> int:
    """RFC 9110 §5.6.7: a two-digit year more than 50 years ahead is in the past century."""
    year = now.year // 100 * 100 + int(two_digits)
    if year > now.year + 50:
        year -= 100
    return year
