"""How long the pipeline took to recover from each fault, read from the inboxes.

A fault's recovery is the time from its start to the first event *committed after it*
being processed, taken in the slowest durable: until then, something committed after the
fault has not come through. The baseline beside it is the median commit-to-processed
latency of ``normal`` events before the first fault. Used by the scenarios whose worlds
have no steady probe of their own (the JetStream cluster, the PostgreSQL failover).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import asyncpg

from chaos.engine.workload import Intent
from shared.contracts.topology import Topology


async def processed_times(
    topo: Topology, dsn_of: Callable[[str], str]
) -> dict[str, dict[str, float]]:
    """Per durable: event id → when its inbox row was marked processed (epoch seconds)."""
    processed: dict[str, dict[str, float]] = {}
    for durable, spec in sorted(topo.durables.items()):
        conn = await asyncpg.connect(dsn_of(spec.target), timeout=10)
        try:
            rows = await conn.fetch(
                "SELECT message_id::text AS id, extract(epoch FROM processed_at) AS at"
                " FROM inbox_messages WHERE durable = $1 AND status = 'processed'",
                durable,
            )
        finally:
            await conn.close()
        processed[durable] = {r["id"]: float(r["at"]) for r in rows}
    return processed


def recovery_times(
    processed: dict[str, dict[str, float]],
    intents: Iterable[Intent],
    starts: Sequence[float],
) -> tuple[list[float | None], float | None]:
    """Per fault start: seconds to the first event committed after it being processed, in
    the slowest durable (None: none was); and the median commit-to-processed latency of
    ``normal`` events committed before the first fault (None: none)."""
    committed = [(i, i.committed_at) for i in intents if i.committed_at is not None]
    out: list[float | None] = []
    for started in starts:
        worst: float | None = None
        for durable, done in processed.items():
            times = [
                done[i.id]
                for i, at in committed
                if i.durable == durable and i.id in done and at >= started
            ]
            if not times:
                worst = None
                break
            took = min(times) - started
            worst = took if worst is None else max(worst, took)
        out.append(worst)
    first = min(starts, default=float("inf"))
    before = sorted(
        processed[i.durable][i.id] - at
        for i, at in committed
        if i.klass == "normal" and at < first and i.id in processed.get(i.durable, {})
    )
    return out, (before[len(before) // 2] if before else None)
