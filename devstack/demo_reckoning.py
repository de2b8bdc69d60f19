"""The demo's reckoning: every event a durable should receive, placed by the one definition
of where an event is (:mod:`shared.domain.whereabouts`, shared with the KPI job, ``ferry
where`` and the console), and the summary printed from it.

"Lost" is an event no inbox row, dead letter or parked row accounts for once the grace
period is over; events parked behind a held head, retrying or in flight are named as such.
"""

from __future__ import annotations

import statistics
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from shared.contracts.topology import Topology
from shared.domain.whereabouts import DEAD_LETTER_MEANING, PLACES, Place, Trail, place_of

#: Seconds after publication within which an event nothing accounts for is still in flight.
GRACE = 10.0
#: Dead-letter statuses a replay can still end in processing.
MENDABLE = frozenset({"dead", "replaying", "held"})

_OUTBOX = "SELECT id, occurred_at, published_at FROM outbox_events WHERE occurred_at >= $1"
_INBOX = """
SELECT message_id, status, processed_at, held_by,
       attempts > 1 OR jsonb_array_length(retry_history) > 0 AS retried
FROM inbox_messages WHERE durable = $1
"""
_DEAD = "SELECT message_id, status, reason_code FROM dead_letters WHERE durable = $1"
# Each parked event with the held head of its key it waits behind now (NULL: none).
_PARKED = """
SELECT p.message_id, p.state, h.message_id AS held_head
FROM parked_messages p
LEFT JOIN LATERAL (
  SELECT message_id FROM parked_messages h
  WHERE h.durable = p.durable AND h.ordering_key = p.ordering_key AND h.state = 'held'
    AND h.stream_seq < p.stream_seq
  ORDER BY h.stream_seq LIMIT 1
) h ON true
WHERE p.durable = $1
"""


@dataclass
class Reckoning:
    """Where every expected delivery is, and the end-to-end latencies of the processed."""

    expected: int = 0
    places: Counter[Place] = field(default_factory=Counter)
    #: Dead-lettered deliveries by (reason, dead-letter status, injected on purpose).
    dead: Counter[tuple[str, str, bool]] = field(default_factory=Counter)
    behind_held: int = 0
    #: Dead letters of events the demo did not make fail for good (rejected until the fix)
    #: that a replay will still mend: waiting for an automatic replay, replaying, or held.
    mendable: int = 0
    #: Milliseconds from occurred_at to processed_at: the pipeline's own, and the events
    #: that waited for an operator (replayed, or parked behind a held head).
    own_ms: list[float] = field(default_factory=list)
    waited_ms: list[float] = field(default_factory=list)
    lost_ids: list[tuple[str, uuid.UUID]] = field(default_factory=list)

    def count(self, place: Place) -> int:
        return self.places[place]

    @property
    def parked(self) -> int:
        return self.places[Place.PARKED]

    @property
    def unsettled(self) -> int:
        """Deliveries the platform is still working on by itself (no operator needed)."""
        return sum(self.places[p] for p in (Place.IN_FLIGHT, Place.RETRYING, Place.NOT_PUBLISHED))


async def reckon(
    pools: dict[str, asyncpg.Pool],
    topologies: list[Topology],
    injected: set[uuid.UUID],
    *,
    since: datetime,
    grace: float = GRACE,
) -> Reckoning:
    """Place every (outbox event since ``since``, durable that should receive it) of
    ``topologies``. ``injected``: the events the demo made fail on purpose (poison, bad
    schema)."""
    out = Reckoning()
    now = datetime.now(UTC)
    for topology in topologies:
        for name, durable in topology.durables.items():
            source = topology.contexts[topology.context_of_stream(durable.stream)].database
            target = pools[topology.contexts[durable.target].database]
            sent = await pools[source].fetch(_OUTBOX, since)
            inbox = {r["message_id"]: r for r in await target.fetch(_INBOX, name)}
            dead = {r["message_id"]: r for r in await target.fetch(_DEAD, name)}
            parked = {r["message_id"]: r for r in await target.fetch(_PARKED, name)}
            for event in sent:
                _place_one(out, name, event, inbox, dead, parked, injected, now, grace)
    return out


def _place_one(
    out: Reckoning,
    durable: str,
    event: Any,
    inbox: dict[uuid.UUID, Any],
    dead: dict[uuid.UUID, Any],
    parked: dict[uuid.UUID, Any],
    injected: set[uuid.UUID],
    now: datetime,
    grace: float,
) -> None:
    mid = event["id"]
    row, dl, park = inbox.get(mid), dead.get(mid), parked.get(mid)
    published = event["published_at"]
    place = place_of(
        Trail(
            published=published is not None,
            inbox_status=None if row is None else row["status"],
            retried=row is not None and bool(row["retried"]),
            dead_letter_status=None if dl is None else dl["status"],
            parked_state=None if park is None else park["state"],
            past_grace=published is not None and (now - published).total_seconds() > grace,
        )
    )
    out.expected += 1
    out.places[place] += 1
    if place is Place.DEAD_LETTERED:
        reason = "UNKNOWN" if dl is None else dl["reason_code"]
        status = "failed" if dl is None else dl["status"]
        out.dead[(reason, status, mid in injected)] += 1
        if mid not in injected and status in MENDABLE:
            out.mendable += 1
    elif place is Place.PARKED and park is not None and park["held_head"] is not None:
        out.behind_held += 1
    elif place is Place.LOST:
        out.lost_ids.append((durable, mid))
    elif place is Place.PROCESSED and row is not None:
        ms = (row["processed_at"] - event["occurred_at"]).total_seconds() * 1000
        waited = dl is not None or row["held_by"] is not None
        (out.waited_ms if waited else out.own_ms).append(ms)


def _quantiles(values: list[float]) -> str:
    if not values:
        return "none"
    q = (
        statistics.quantiles(values, n=100, method="inclusive")
        if len(values) >= 2
        else [values[0]] * 99
    )
    return f"p50 {q[49]:.1f}  p95 {q[94]:.1f}  p99 {q[98]:.1f}  max {max(values):.1f}"


def summary(produced: int, counts: dict[str, int], r: Reckoning) -> int:
    """Print the reckoning, a line per place; exit code 1 when anything is lost or parked."""
    print("\nFerry demo summary")
    print(f"  produced by commands     {produced}")
    print(f"  events in all outboxes   {counts['outbox']} (includes module F's follow-up events)")
    print(f"  published                {counts['published']}")
    print(f"  deliveries expected      {r.expected} (an event times each durable that takes it)")
    print(f"  duplicates skipped       {counts['duplicates']}")
    for place in PLACES:
        print(f"  {place.value:<24} {r.count(place)}{_note(place, r)}")
        if place is Place.DEAD_LETTERED:
            for (reason, status, injected), n in sorted(r.dead.items()):
                why = "injected by the demo" if injected else "NOT injected: look at it"
                meaning = DEAD_LETTER_MEANING.get(status, status)
                print(f"      {n:5}  {reason:<22} {meaning} ({why})")
    print(
        f"  end-to-end latency ms    {_quantiles(r.own_ms)}  ({len(r.own_ms)} events: "
        "occurred_at in source → processed_at in target)"
    )
    print(
        f"  waited for an operator   {_quantiles(r.waited_ms)}  ({len(r.waited_ms)} events: "
        "replayed, or parked behind a held head)"
    )
    for durable, mid in r.lost_ids[:20]:
        print(f"  lost: {durable} {mid} (ferry where {mid})")
    return 1 if r.count(Place.LOST) or r.count(Place.PARKED) else 0


def _note(place: Place, r: Reckoning) -> str:
    if place is Place.PARKED and r.count(place):
        return f" ({r.behind_held} behind a held head: an operator replays or discards it)"
    if place is Place.PROCESSED and r.waited_ms:
        return f" ({len(r.waited_ms)} of them after a replay or a held head)"
    return ""
