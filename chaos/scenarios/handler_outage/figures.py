"""The outage's figures (issue 45), computed from what the run read back (:class:`Dump`):
the lane's inbox, the handler's effects ledger, the dead letters, the consumer's circuit
breaker lines, counted against the intent ledger's commits.

A pure function of the dump (:func:`outage_figures`), so a synthetic dump tests it.

* **lost**: committed, neither processed nor dead-lettered; **applied twice**: more than
  one handler call answered 200 for an id; **dead letters**: the lane's ``dead_letters``.
* **deliveries**: JetStream's deliveries of each event (the inbox's ``attempts``). Each
  delivery past the first followed a failed call settled back to JetStream (a
  ``retry_history`` entry); a failed call that began in a **probe**'s window (from the
  breaker's ``half-open`` line to the line that ended it, :data:`PROBE_SLACK` either side)
  was the probe's. The issue's bound, "no message past its second delivery except the
  probes", is ``past_second_without_probes``: deliveries less the probes' failed calls,
  above 2.
* **resume**: seconds from the handler's return (the link back) to the lane's first apply
  after it; **backlog**: the events committed before the return and not applied by then;
  **drain**: seconds from the return to the last of them applied (and its p50/p90/p99).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: Seconds either side of a probe's window in which a failed call still counts as its own
#: (the log's time is in milliseconds, the inbox's is taken when the failure is settled).
PROBE_SLACK = 1.0
#: The consumer's circuit breaker lines (services/inbox_consumer/breaker.py) -> what they say.
BREAKER_LINES = (
    ("circuit breaker half-open", "probe"),
    ("circuit breaker open (the probe failed)", "probe_failed"),
    ("circuit breaker open (", "opened"),
    ("circuit breaker closed", "closed"),
)


@dataclass(frozen=True)
class InboxRow:
    """One event's inbox row on the lane."""

    status: str
    attempts: int
    #: When each failed call settled back to JetStream was recorded (epoch seconds).
    failures: tuple[float, ...] = ()


@dataclass
class Dump:
    """What the run read back after the drain (times are epoch seconds)."""

    #: Committed event id -> when its COMMIT returned (None: resolved after the run).
    committed: dict[str, float | None]
    inbox: dict[str, InboxRow]
    #: Event id -> when the handler applied it.
    applied: dict[str, float]
    #: Event id -> handler calls answered 200.
    ok_calls: Counter[str]
    #: Event id -> the dead letter's reason code.
    dead: dict[str, str]
    #: (time, what) of the consumer's breaker lines, in order (see :data:`BREAKER_LINES`).
    breaker: list[tuple[float, str]]
    #: When the handler's link went down and came back.
    down: float
    back: float


@dataclass
class Figures:
    """The outage's figures (see the module docstring)."""

    outage_seconds: float
    events: int
    committed_during_outage: int
    lost: int
    applied_twice: int
    dead_letters: int
    dead_letters_by_reason: dict[str, int]
    deliveries: dict[int, int]
    beyond_first: int
    failed_calls: dict[str, int]
    max_deliveries: int
    past_second: int
    past_second_without_probes: int
    probes: int
    probes_that_carried_events: int
    breaker_opened: int
    breaker_closed: int
    breaker_closed_after_return: float | None
    resume: float | None
    backlog: int
    backlog_unapplied: int
    drain: float | None
    backlog_delay: dict[str, float] = field(default_factory=dict)

    def doc(self) -> dict[str, Any]:
        """The figures as report.json gives them."""
        return {
            "outage seconds": round(self.outage_seconds, 1),
            "events committed on the lane": self.events,
            "committed during the outage": self.committed_during_outage,
            "lost": self.lost,
            "applied twice": self.applied_twice,
            "dead letters": self.dead_letters,
            "dead letters by reason": self.dead_letters_by_reason,
            "deliveries per event": {str(k): v for k, v in sorted(self.deliveries.items())},
            "deliveries beyond the first": self.beyond_first,
            "failed calls settled (by when)": self.failed_calls,
            "max deliveries of an event": self.max_deliveries,
            "events past their 2nd delivery": self.past_second,
            "events past their 2nd delivery, probes excluded": self.past_second_without_probes,
            "probes": self.probes,
            "probes whose failure settled an event": self.probes_that_carried_events,
            "breaker opened": self.breaker_opened,
            "breaker closed": self.breaker_closed,
            "breaker closed after return (s)": _round(self.breaker_closed_after_return),
            "first apply after return (s)": _round(self.resume),
            "backlog at return (events)": self.backlog,
            "backlog never applied": self.backlog_unapplied,
            "backlog drained after return (s)": _round(self.drain),
            "backlog apply delay (s)": self.backlog_delay,
        }


def outage_figures(dump: Dump) -> Figures:
    """The figures of one run (see the module docstring)."""
    windows = probe_windows(dump.breaker)
    deliveries: Counter[int] = Counter()
    failed: Counter[str] = Counter()
    past_second = past_second_without_probes = 0
    carried: set[float] = set()
    for row in dump.inbox.values():
        deliveries[row.attempts] += 1
        probe_calls = 0
        for at in row.failures:
            probe = _window_of(windows, at)
            if probe is not None:
                carried.add(probe)
                probe_calls += 1
            failed[_when(at, probe, dump)] += 1
        past_second += row.attempts > 2
        past_second_without_probes += row.attempts - probe_calls > 2
    kinds = Counter(kind for _, kind in dump.breaker)
    closes = [t for t, kind in dump.breaker if kind == "closed" and t >= dump.down]
    first_applied = [t for t in dump.applied.values() if t >= dump.back]
    backlog = [
        i
        for i, at in dump.committed.items()
        if at is not None and at < dump.back and not dump.applied.get(i, math.inf) < dump.back
    ]
    delays = sorted(dump.applied[i] - dump.back for i in backlog if i in dump.applied)
    return Figures(
        outage_seconds=dump.back - dump.down,
        events=len(dump.committed),
        committed_during_outage=sum(
            1 for at in dump.committed.values() if at is not None and dump.down <= at < dump.back
        ),
        lost=len(lost_ids(dump)),
        applied_twice=sum(1 for n in dump.ok_calls.values() if n > 1),
        dead_letters=sum(1 for i in dump.committed if i in dump.dead),
        dead_letters_by_reason=dict(
            Counter(r for i, r in dump.dead.items() if i in dump.committed)
        ),
        deliveries=dict(sorted(deliveries.items())),
        beyond_first=sum((n - 1) * count for n, count in deliveries.items() if n > 1),
        failed_calls=dict(failed),
        max_deliveries=max(deliveries, default=0),
        past_second=past_second,
        past_second_without_probes=past_second_without_probes,
        probes=kinds["probe"],
        probes_that_carried_events=len(carried),
        breaker_opened=kinds["opened"],
        breaker_closed=kinds["closed"],
        breaker_closed_after_return=(min(closes) - dump.back) if closes else None,
        resume=(min(first_applied) - dump.back) if first_applied else None,
        backlog=len(backlog),
        backlog_unapplied=sum(1 for i in backlog if i not in dump.applied),
        drain=delays[-1] if delays else None,
        backlog_delay={f"p{p}": round(_percentile(delays, p), 1) for p in (50, 90, 99)}
        if delays
        else {},
    )


def lost_ids(dump: Dump) -> list[str]:
    """Committed events neither processed nor dead-lettered."""
    return [
        i
        for i in dump.committed
        if not (
            (row := dump.inbox.get(i)) is not None
            and (row.status == "processed" or (row.status == "failed" and i in dump.dead))
        )
    ]


def probe_windows(breaker: list[tuple[float, str]]) -> list[tuple[float, float]]:
    """Each probe's window: from its half-open line to the next breaker line (its verdict),
    :data:`PROBE_SLACK` wider either side; in order."""
    windows = []
    for n, (at, kind) in enumerate(breaker):
        if kind != "probe":
            continue
        ends = [t for t, k in breaker[n + 1 :] if k != "probe"][:1]
        end = ends[0] if ends else at
        windows.append((at - PROBE_SLACK, end + PROBE_SLACK))
    return windows


def _window_of(windows: list[tuple[float, float]], at: float) -> float | None:
    """The start of the probe window ``at`` falls in, if any (probes come seconds apart,
    their windows do not overlap)."""
    n = bisect_right([start for start, _ in windows], at) - 1
    if n >= 0 and at <= windows[n][1]:
        return windows[n][0]
    return None


def _when(at: float, probe: float | None, dump: Dump) -> str:
    if probe is not None:
        return "a probe"
    if at < dump.down:
        return "before the outage"
    if at < dump.back:
        return "during the outage, not a probe"
    return "after the return"


def breaker_lines(log_lines: Iterable[str]) -> list[tuple[float, str]]:
    """(time, what) of each circuit breaker line of a consumer's JSON log, in order."""
    out = []
    for line in log_lines:
        if "circuit breaker" not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        message = str(record.get("message", ""))
        for text, kind in BREAKER_LINES:
            if text in message:
                at = datetime.fromisoformat(str(record["time"]).replace("Z", "+00:00"))
                out.append((at.timestamp(), kind))
                break
    return sorted(out)


def failure_times(retry_history: str | None) -> tuple[float, ...]:
    """The times of an inbox row's ``retry_history`` entries (epoch seconds)."""
    entries = json.loads(retry_history) if retry_history else []
    return tuple(
        datetime.fromisoformat(str(e["at"]).replace("Z", "+00:00")).timestamp() for e in entries
    )


def _percentile(ordered: list[float], p: int) -> float:
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
