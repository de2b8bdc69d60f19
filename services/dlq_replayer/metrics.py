"""The dlq-replayer's instruments (see :mod:`shared.runtime.metrics` for the core)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from prometheus_client import Gauge
from prometheus_client.core import Metric

from shared.runtime.metrics import RoleMetrics, age_seconds, counter_family


class ReplayerMetrics:
    """dlq-replayer: replays, and the dead-letter store by durable and status."""

    def __init__(self, role: RoleMetrics) -> None:
        self.role = role
        self._states = Gauge(
            "ferry_dead_letters_current",
            "Open dead letters in the store by durable and status (dead, held, replaying, parked).",
            ["durable", "status"],
            registry=role.registry,
        )
        self._oldest = Gauge(
            "ferry_dead_letters_oldest_age_seconds",
            "Age of the oldest dead letter waiting (dead, held or parked), per durable.",
            ["durable"],
            registry=role.registry,
        )

    def watch(self, replayer: Any) -> None:
        """Export ``replayer.stats`` and refresh the store gauges from its pools."""
        self.role.add_collector(lambda: replayer_families(replayer.stats))
        self.role.add_refresher("dead_letters", lambda: self._refresh(replayer))

    async def _refresh(self, replayer: Any) -> None:
        statuses = OPEN
        durables = sorted(replayer.topology.durables)
        counts = {(d, s): 0 for d in durables for s in statuses}
        oldest: dict[str, datetime | None] = dict.fromkeys(durables)
        for pool in replayer.pools.values():
            async with pool.acquire() as conn:
                rows = await conn.fetch(_DEAD_LETTER_STATES, durables, list(OPEN))
            for r in rows:
                counts[(r["durable"], r["status"])] = r["count"]
                if r["oldest"] is not None:
                    known = oldest[r["durable"]]
                    oldest[r["durable"]] = r["oldest"] if known is None else min(known, r["oldest"])
        for (durable, status), value in counts.items():
            self._states.labels(durable, status).set(value)
        for durable, moment in oldest.items():
            self._oldest.labels(durable).set(age_seconds(moment))


#: The store's open dead letters, by status: settled ones (replayed, discarded) are its
#: history, a year of it in production, and are never read at a scrape (issue 48); what
#: became of them is counted as it happens (ferry_dlq_replays, the operators' actions).
OPEN = ("dead", "held", "replaying", "parked")
_DEAD_LETTER_STATES = """
SELECT durable, status, count(*) AS count,
       min(dead_lettered_at) FILTER (WHERE status IN ('dead', 'held', 'parked')) AS oldest
FROM dead_letters WHERE durable = ANY($1::text[]) AND status = ANY($2::text[])
GROUP BY durable, status
"""


def replayer_families(stats: Any) -> list[Metric]:
    """The replayer's exact counts as Prometheus families."""
    return [
        counter_family(
            "ferry_dlq_replays",
            "Automatic replays published, by durable.",
            ["durable"],
            {(k,): v for k, v in stats.replayed_by_durable.items()},
        ),
        counter_family(
            "ferry_dlq_replayer_events",
            "Replayer work by kind: replays settled as replayed, replays republished after "
            "an unconfirmed publish, entries skipped (taken by another replica), entries "
            "parked (nothing to replay), errors (retried), failures (unexpected), scans, "
            "failure-group count changes folded.",
            ["kind"],
            {
                ("settled",): stats.settled,
                ("republished",): stats.republished,
                ("skipped",): stats.skipped,
                ("parked",): stats.parked,
                ("error",): stats.errors,
                ("failed",): stats.failed,
                ("scan",): stats.scans,
                ("folded",): stats.folded,
            },
        ),
    ]
