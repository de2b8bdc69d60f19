"""A durable's pause (``ferry durable pause``, :mod:`shared.ops.pause`): until when.

A pause is JetStream's consumer pause: the server delivers nothing (and redelivers
nothing, so no delivery is spent) to a paused consumer until its ``pause_until``; then it
resumes on its own. A pause without an end is one until :data:`INDEFINITE`, i.e. until an
operator resumes it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from shared.domain.durations import parse_duration, parse_instant
from shared.domain.errors import MalformedInput

#: The end of a pause "until resumed" (far enough, yet within the server's nanosecond
#: clock arithmetic, which overflows about 292 years ahead).
INDEFINITE = datetime(2200, 1, 1, tzinfo=UTC)

_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]")
_DURATION_SHAPE = re.compile(r"^\d+(\.\d+)?\s*[a-z]+$")


def parse_until(text: str, now: datetime | None = None) -> datetime:
    """The end of a pause from ``--until``: an ISO-8601 time with its timezone
    (``2026-11-29T17:00:00Z``) or a duration from now (``30m``, ``2h``); it must lie ahead
    and before :data:`INDEFINITE`. :class:`MalformedInput` names what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise MalformedInput("--until must be an ISO-8601 time with a timezone or a duration (2h)")
    text = text.strip()
    now = now or datetime.now(UTC)
    if _TIME.match(text):
        moment = parse_instant(text)
    else:
        try:
            seconds = parse_duration(text)
        except MalformedInput as exc:
            if _DURATION_SHAPE.match(text):  # a duration, but too long: say so
                raise MalformedInput(f"--until {exc}") from None
            raise MalformedInput(
                f"{text[:60]!r} is neither an ISO-8601 time with a timezone nor a duration "
                "such as 30m or 2h"
            ) from None
        if seconds <= 0:
            raise MalformedInput(f"a pause of {text[:60]!r} would end at once")
        if seconds >= (INDEFINITE - now).total_seconds():
            raise MalformedInput(
                f"{text[:60]!r} is too long: leave --until out to pause until resumed"
            )
        moment = now + timedelta(seconds=seconds)
    if moment <= now:
        raise MalformedInput(f"{text[:60]!r} is not in the future")
    if moment >= INDEFINITE:
        raise MalformedInput(f"{text[:60]!r} is too far: leave --until out to pause until resumed")
    return moment


def rfc3339(moment: datetime) -> str:
    """``moment`` as JetStream's ``pause_until`` wants it (UTC, ``Z``)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_server_time(text: str | None) -> datetime | None:
    """A ``pause_until`` from the server (RFC 3339, up to nanoseconds); None when absent or
    unreadable."""
    if not text:
        return None
    match = re.match(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$", text)
    if match is None:
        return None
    fraction = (match.group(2) or ".0")[:7]
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    try:
        return datetime.fromisoformat(match.group(1) + fraction + zone).astimezone(UTC)
    except ValueError:
        return None


def describe_until(until: datetime | None) -> str:
    """``until resumed`` for a pause without an end, else ``until <UTC time>``."""
    if until is None or until >= INDEFINITE - timedelta(days=1):
        return "until resumed"
    return f"until {until:%Y-%m-%d %H:%M:%S} UTC"
