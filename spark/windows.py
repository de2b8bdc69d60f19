"""Windows and the range one run covers (pure).

Windows are ``[k·W, (k+1)·W)`` seconds since the Unix epoch, of the events' ``occurred_at``.
A window is *complete* once ``as_of - grace`` has passed its end: by then its events had
the grace period to be published and settled. An incremental run covers every complete
window from the watermark on and then moves the watermark; an explicit range (``--since``
/ ``--until``) recomputes what it names, open windows included, and leaves the watermark.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from shared.domain.errors import ConfigurationError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class RunRange:
    """Windows ``[start, end)`` of one run; ``incremental`` runs move the watermark."""

    start: datetime
    end: datetime
    incremental: bool

    def windows(self, seconds: int) -> list[datetime]:
        """Start of every window in the range."""
        step = timedelta(seconds=seconds)
        out, moment = [], self.start
        while moment < self.end:
            out.append(moment)
            moment += step
        return out


def floor_window(moment: datetime, seconds: int) -> datetime:
    """Start of the window containing ``moment``."""
    micros = (moment - EPOCH) // timedelta(microseconds=1)
    size = seconds * 1_000_000
    return EPOCH + timedelta(microseconds=(micros // size) * size)


def ceil_window(moment: datetime, seconds: int) -> datetime:
    """End of the window containing ``moment`` (``moment`` itself when on a boundary)."""
    start = floor_window(moment, seconds)
    return start if start == moment else start + timedelta(seconds=seconds)


def parse_instant(text: str, what: str) -> datetime:
    """An ISO 8601 instant; a naive one is refused (which zone would it be?)."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigurationError(f"{what}: {text!r} is not an ISO 8601 timestamp") from None
    if moment.tzinfo is None:
        raise ConfigurationError(f"{what}: {text!r} has no time zone (add Z or +00:00)")
    return moment.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """What decides a run's range."""

    as_of: datetime
    window_seconds: int
    grace_seconds: float
    watermark: datetime | None = None
    since: datetime | None = None
    until: datetime | None = None
    #: Where a first incremental run starts (FERRY_KPI_START), else the earliest event.
    start: datetime | None = None
    earliest_event: datetime | None = None


def decide_range(req: RangeRequest) -> RunRange | None:
    """The windows to compute, or None when there is nothing (new) to do."""
    seconds = req.window_seconds
    complete_end = floor_window(req.as_of - timedelta(seconds=req.grace_seconds), seconds)
    explicit = req.since is not None or req.until is not None
    if req.until is not None:
        end = min(ceil_window(req.until, seconds), ceil_window(req.as_of, seconds))
    else:
        end = complete_end
    if req.since is not None:
        start: datetime | None = floor_window(req.since, seconds)
    elif req.watermark is not None:
        start = req.watermark
    else:
        first = req.start or req.earliest_event
        start = None if first is None else floor_window(first, seconds)
    if start is None or start >= end:
        return None
    return RunRange(start, end, incremental=not explicit)


def next_run(now: datetime, every_seconds: int, offset_seconds: float) -> datetime:
    """The first ``k·every + offset`` strictly after ``now`` (the scheduler's next run)."""
    base = floor_window(now - timedelta(seconds=offset_seconds), every_seconds)
    moment = base + timedelta(seconds=offset_seconds)
    while moment <= now:
        moment += timedelta(seconds=every_seconds)
    return moment
