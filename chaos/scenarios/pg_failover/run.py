"""The PostgreSQL failover drill (issue 28): the primary SIGKILLed mid-workload, the standby
promoted, nothing acknowledged lost, every role carrying on by itself.

``python -m chaos.run --scenario pg-failover [--schedule soak]``.

The world (:class:`~chaos.scenarios.pg_failover.world.PgFailoverWorld`) is the ordinary
run's (:mod:`chaos.engine.world`) with its one PostgreSQL replaced by a pair
(:class:`devstack.postgres_pair.PostgresPair`): a primary and a streaming standby
replicating **synchronously** (``synchronous_standby_names = '*'``, ``synchronous_commit =
on``: a COMMIT returns only once the standby has flushed it). Every context database of the
run lives on the pair: physical replication copies a whole server, so a failover moves every
database at once, as it does for a CloudNativePG cluster holding them (the drill fails over
the target databases the handlers and consumers write to and the source databases the
producers and publishers use, in one go). Every role connects **straight** to both servers
with a multi-host DSN that asks for the writable one
(``postgresql://…@127.0.0.1:P1,127.0.0.1:P2/db?target_session_attrs=read-write``), not
through a proxy: a proxy in front of a dead server accepts the connection and then drops it,
which a client cannot tell from a server that failed mid-handshake. Their NATS and handler
links are proxied as in every run (no toxic is put on them).

The fault, during the workload of the ordinary run (:mod:`chaos.engine.workload`):

``pg_failover``  SIGKILL the primary (postmaster and every backend at once), wait
                 ``promote_after`` seconds (the time an operator such as CloudNativePG needs
                 to decide the primary is gone), promote the standby with ``pg_promote()``;
                 in the long version the lost server then comes back on its port as the new
                 primary's synchronous standby (a fresh base backup), so the next failover
                 goes the other way. In the CI version the promoted server runs alone to
                 the end: commits no longer wait for anyone (production re-creates a
                 standby at once; CloudNativePG does).

What it shows, besides the ordinary invariants (:mod:`chaos.engine.accounting`: 0 lost, dead
letters exactly the expected set, each id once per stream, 0 effects applied twice):

* **acknowledged but missing: 0** — every commit whose COMMIT returned to the producer
  (the ledger's ``committed``, taken before the uncertain ones are resolved) is in the
  outbox of the new primary afterwards;
* **no role restarted** — the publishers, consumers, handlers and the router reconnect to
  the promoted server on their own (the engine's monitor restarts and counts a role that died);
* per failover, **recovery time**: the longest any event waited on the failover
  (:mod:`chaos.engine.recovery`), from the later of its commit and the kill to its
  processing — events held by a role still on the dead server count, not only the first
  one through — also per kind (p50, max: :mod:`chaos.engine.recovery_table`); and
  **writes back**: from the kill to the first commit the producers saw acknowledged again.

The code is split by what it does: :mod:`chaos.scenarios.pg_failover.plan` holds the sizes
and the failover times; :mod:`chaos.scenarios.pg_failover.world` the pair world;
:mod:`chaos.scenarios.pg_failover.result` the results and their table; this module the run
itself (:class:`PgFailoverRun`, handed an :class:`~chaos.engine.engine.Engine` on the pair
world).
"""

from __future__ import annotations

import asyncio
import time

from chaos.engine import db
from chaos.engine.config import RunConfig, sized
from chaos.engine.engine import Engine, sleep_until
from chaos.engine.faults import FaultRecord
from chaos.engine.recovery_table import recovery_table
from chaos.scenarios.pg_failover.plan import SCENARIO, SIZES, failover_times
from chaos.scenarios.pg_failover.result import FailoverResult, FailoverRow
from chaos.scenarios.pg_failover.world import PgFailoverWorld

#: Ledger statuses of a commit whose outcome the producer did not learn.
UNSURE = ("uncertain", "pending")
#: Seconds before a fresh acknowledged commit counts as "just before the kill" (the commits
#: most at risk: the standby may have had them for milliseconds only).
AT_RISK_SECONDS = 5.0


class PgFailoverRun:
    """The drill (see the module docstring)."""

    def __init__(self, config: RunConfig, size_name: str = "ci") -> None:
        self.config, self.size_name = config, size_name
        self.size = sized(SIZES[size_name], config)
        self.world = PgFailoverWorld(config.run_dir, config.seed)
        self.engine = Engine(config, self.world)
        self.ledger = self.engine.ledger
        self.records: list[FaultRecord] = []
        self.promoted: list[tuple[str, str, float]] = []
        self.acked: set[str] = set()

    async def run(self) -> FailoverResult:
        """Start, play, settle, drain, count; always tear the world down."""
        started = time.monotonic()
        engine = self.engine
        async with engine.session(
            f"scenario {SCENARIO} ({self.size_name}), seed {self.config.seed}"
        ):
            await engine.connect([self.world.nats_server().url], "chaos-pg-failover")
            await engine.roles_ready()
            workload = engine.workload(self.size.events, self.size.seconds)
            await engine.play(workload, self.size.seconds, self._failovers)
            # What the producers saw acknowledged, before the uncertain ones are resolved.
            self.acked = {i.id for i in self.ledger.by_status("committed")}
            unsure = {i.id for i in self.ledger.intents.values() if i.status in UNSURE}
            await self._settle()
            drain = await engine.drain(self.size.drain_timeout)
            acked_missing = await self._acked_missing()
            accounts = await engine.count()
            recoveries, baseline = await engine.recoveries(self.records, tolerate_unreachable=True)
        return FailoverResult(
            size=self.size_name,
            seed=self.config.seed,
            accounts=accounts,
            failovers=self._rows(recoveries),
            acked=len(self.acked),
            acked_missing=acked_missing,
            producer_errors=dict(self.ledger.errors),
            unsure=len(unsure),
            unsure_committed=sum(1 for i in unsure if self.ledger.intents[i].status == "committed"),
            baseline_latency=baseline,
            recovery=recovery_table(self.records, recoveries),
            **engine.outcome(started, drain),
        )

    def _rows(self, recoveries: list[float | None]) -> list[FailoverRow]:
        origin = self.engine.timeline.origin
        rows = []
        for record, (killed, promoted, took), rec in zip(
            self.records, self.promoted, recoveries, strict=True
        ):
            rows.append(
                FailoverRow(
                    at=round(record.started - origin, 1),
                    killed=killed,
                    promoted=promoted,
                    promote_seconds=round(took, 2),
                    writes_back=self._writes_back(record.started),
                    recovery=None if rec is None else round(rec, 2),
                    acked_at_risk=sum(
                        1
                        for i in self.ledger.intents.values()
                        if i.id in self.acked
                        and i.committed_at is not None
                        and record.started - AT_RISK_SECONDS <= i.committed_at < record.started
                    ),
                    detail=record.detail,
                    ok=record.ok,
                )
            )
        return rows

    # -- the play -------------------------------------------------------------------------

    async def _failovers(self, begin: float) -> None:
        for at in failover_times(self.size):
            await sleep_until(begin + at)
            await self._failover(at)

    async def _failover(self, planned_at: float) -> None:
        pair = self.world.pg_pair()
        killed = f"pg{pair.primary_index + 1}"
        promoted = f"pg{2 - pair.primary_index}"
        record = FaultRecord(
            "pg_failover", killed, planned_at, time.time(), affects=frozenset({"*"})
        )
        took = [0.0]

        async def act() -> None:
            state = await asyncio.to_thread(pair.sync_state)
            if state != "sync":
                raise RuntimeError(f"no synchronous standby before the kill: {state!r}")
            await asyncio.to_thread(pair.kill_primary)
            record.started = time.time()
            await asyncio.sleep(self.size.promote_after)
            took[0] = await asyncio.to_thread(pair.promote)
            record.detail = (
                f"{killed} (primary) SIGKILLed; {promoted} promoted"
                f" {time.time() - record.started:.1f}s later (pg_promote {took[0]:.2f}s)"
            )
            if self.size.rejoin:
                rejoin = await asyncio.to_thread(pair.rejoin)
                record.detail += (
                    f"; {killed} back as the synchronous standby ({rejoin:.1f}s base backup)"
                )

        await self.engine.record_fault(record, act(), self.records)
        self.promoted.append((killed, promoted, took[0]))

    # -- after the play ---------------------------------------------------------------------

    async def _settle(self) -> None:
        """No toxic left, NATS and every role running. The killed primary stays down (it
        would come back as a second primary: production rejoins it as a standby)."""
        await asyncio.to_thread(self.world.client.reset)
        nats_ = self.world.nats_server()
        if not nats_.running:
            self.engine.timeline.note("nats-server was down after the faults")
            await asyncio.to_thread(nats_.start)
        self.engine.start_roles()

    def _writes_back(self, since: float) -> float | None:
        """Seconds from ``since`` to the first commit acknowledged after it."""
        times = [
            i.committed_at
            for i in self.ledger.intents.values()
            if i.id in self.acked and i.committed_at is not None and i.committed_at >= since
        ]
        return round(min(times) - since, 2) if times else None

    async def _acked_missing(self) -> list[str]:
        """Commits the producers saw acknowledged that the new primary's outbox lacks."""
        missing: list[str] = []
        by_context: dict[str, list[str]] = {}
        for intent in self.ledger.intents.values():
            if intent.id in self.acked:
                by_context.setdefault(intent.context, []).append(intent.id)
        for context, ids in sorted(by_context.items()):
            rows = await db.fetch(
                self.world.direct_dsn(context),
                "SELECT id::text AS id FROM outbox_events WHERE id = ANY($1::uuid[])",
                ids,
            )
            found = {r["id"] for r in rows}
            missing += [f"{context} {i}" for i in ids if i not in found]
        return missing
