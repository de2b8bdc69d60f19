"""How long each fault held the pipeline back, read from the inboxes.

A fault's **recovery** is the longest any ``normal`` event of a lane it touches waited on
it: per event, from the later of its commit and the fault's *restore moment* to its inbox
row being marked processed, the worst over the events processed after the fault began
and committed before the next fault on one of its lanes. Taking the worst event, not the
first one through, is what makes a stall count: when an ordered partition's owner is
SIGKILLed the other partitions flow on, yet the messages the dead owner held and every
key behind them wait for the takeover, and their wait is the recovery. The times come
from the inbox rows (``processed_at``) and the intent ledger (``committed_at``), not from
what the roles say. When the next fault comes before this one is got over, an event both
hold back counts for both: the figure is then an upper bound of what this fault cost.

The *restore moment* is when the run took the fault's cause away
(:attr:`~chaos.engine.faults.FaultRecord.restored`: the network back, a server started
again), so an outage the run imposes is not charged to the pipeline; a fault the platform
must get over by itself (a process or node killed, a failover) counts from its start.

:func:`baseline_latency` is the yardstick beside it: the median commit-to-processed latency
of ``normal`` events before the first fault.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import asyncpg

from chaos.engine.faults import FaultRecord
from chaos.engine.workload import Intent
from shared.contracts.topology import Topology

#: Processed times: durable -> event id -> epoch seconds its inbox row was processed.
Processed = dict[str, dict[str, float]]


async def processed_times(topo: Topology, dsn_of: Callable[[str], str]) -> Processed:
    """Per durable: event id → when its inbox row was marked processed (epoch seconds).

    Events released from behind a held head (``held_by`` set: an ordered key waited for
    an operator to replay or discard its dead letter) are left out: they waited for the
    operator, not for a fault."""
    processed: Processed = {}
    for durable, spec in sorted(topo.durables.items()):
        conn = await asyncpg.connect(dsn_of(spec.target), timeout=10)
        try:
            rows = await conn.fetch(
                "SELECT message_id::text AS id, extract(epoch FROM processed_at) AS at"
                " FROM inbox_messages WHERE durable = $1 AND status = 'processed'"
                " AND held_by IS NULL",
                durable,
            )
        finally:
            await conn.close()
        processed[durable] = {r["id"]: float(r["at"]) for r in rows}
    return processed


def restore_moment(record: FaultRecord) -> float:
    """From when the pipeline is expected to catch up: the moment the run took the fault's
    cause away, or the fault's start when the platform has to recover by itself."""
    return record.restored or record.started


def lanes(record: FaultRecord, durables: Iterable[str]) -> set[str]:
    """The durables a fault can hold back. ``affects`` names those whose handler calls it
    can make redundant; a fault on NATS names none of them yet holds back every lane it
    carries, so an empty set, like ``*``, means every durable."""
    every = set(durables)
    if not record.affects or "*" in record.affects:
        return every
    return every & record.affects


def delays(
    record: FaultRecord, until: float, processed: Processed, intents: Iterable[Intent]
) -> list[float]:
    """Each affected ``normal`` event's wait on ``record`` (see the module docstring):
    events committed before ``until`` (the next fault's start) and processed after the fault
    began; seconds from the later of its commit and the restore moment, floored at 0."""
    restore = restore_moment(record)
    affected = lanes(record, processed)
    out = []
    for intent in intents:
        if intent.klass != "normal" or intent.durable not in affected:
            continue
        done = processed[intent.durable].get(intent.id)
        at = intent.committed_at
        if done is None or at is None or at >= until or done <= record.started:
            continue
        out.append(max(done - max(at, restore), 0.0))
    return out


def window_end(record: FaultRecord, records: Sequence[FaultRecord], durables: set[str]) -> float:
    """Where ``record``'s window ends: the start of the next injected fault that touches one
    of its lanes (a fault on other lanes cannot hold these back); with the run otherwise."""
    mine = lanes(record, durables)
    later = [
        r.started
        for r in records
        if r.ok and r.started > record.started and lanes(r, durables) & mine
    ]
    return min(later, default=float("inf"))


def recovery_times(
    records: Sequence[FaultRecord], processed: Processed, intents: Iterable[Intent]
) -> list[float | None]:
    """Per record (in its order): its recovery in seconds, None when it failed or no
    affected event came through after it."""
    committed = [i for i in intents if i.committed_at is not None]
    durables = set(processed)
    out: list[float | None] = []
    for record in records:
        if not record.ok:
            out.append(None)
            continue
        waits = delays(record, window_end(record, records, durables), processed, committed)
        out.append(max(waits) if waits else None)
    return out


def baseline_latency(
    processed: Processed, intents: Iterable[Intent], records: Sequence[FaultRecord]
) -> float | None:
    """The median commit-to-processed latency of ``normal`` events committed before the
    first fault (None: none was)."""
    first = min((r.started for r in records), default=float("inf"))
    latencies = sorted(
        processed[i.durable][i.id] - i.committed_at
        for i in intents
        if i.klass == "normal"
        and i.committed_at is not None
        and i.committed_at < first
        and i.id in processed.get(i.durable, {})
    )
    return latencies[len(latencies) // 2] if latencies else None
