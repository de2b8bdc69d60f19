"""The demo workload: domain commands in both topologies, live progress, a reckoning.

Each command changes state and records its event in one transaction. About 1 % of the
events are poison (the handler answers 422), 1 % are rejected (422) until a "fix" a few
seconds later — dead-lettered, then replayed: automatically in sea-vibespro, by an
operator in mediation — and 3 % fail once (503, then succeed), so the dead-letter,
replay and retry paths all run. Module F's handler emits an event of its own
for every event it ingests, feeding lane F→G. At the end every event a durable should
receive is looked up in that durable's inbox: processed, dead-lettered, or **lost**.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from devstack import demo_dlq
from shared.adapters.nats import NatsAuth
from shared.adapters.postgres import Conn
from shared.adapters.producer import record_event
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology
from shared.domain.envelope import format_timestamp

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = ("topologies/sea-vibespro.yaml", "topologies/mediation.yaml")
#: Share of commands written by plain SQL with a payload that breaks its schema.
RAW_INVALID_SHARE = 0.003
#: Seconds the scripted "bug" rejects an event (1 % of them) before it is "fixed".
REJECT_FOR = 3.0
#: (context, aggregate type, event type, version, payload builder)
COMMANDS: list[tuple[str, str, str, int]] = [
    ("vibespro", "vibe", "vibe_created", 1),
    ("vibespro", "vibe", "vibe_created", 2),
    ("sea", "model", "model_published", 1),
    ("module_e", "opportunity", "opportunity_scored", 1),
    ("module_h", "config", "config_publish_requested", 1),
    ("module_g", "opportunity", "replay_requested", 1),
]


def payload_for(event_type: str, version: int, key: str, rng: random.Random) -> dict[str, Any]:
    """A payload valid for the event's schema, sometimes with a scripted fault."""
    payloads: dict[str, dict[str, Any]] = {
        "vibe_created": {"vibe_id": key, "title": f"vibe {key}"},
        "model_published": {"model_id": key, "name": f"model {key}"},
        "opportunity_scored": {"opportunity_key": key, "score": round(rng.random(), 3)},
        "config_publish_requested": {"config_id": key, "revision": rng.randint(1, 99)},
        "replay_requested": {"opportunity_key": key},
    }
    payload = payloads[event_type]
    if event_type == "vibe_created" and version == 2:
        payload["owner_id"] = f"owner-{key}"
    roll = rng.random()
    if roll < 0.01:
        payload["_ferry_test"] = {"poison": True}
    elif roll < 0.02:
        # A handler bug fixed a few seconds later: dead-lettered now, replayed fine later.
        fixed_at = datetime.now(UTC) + timedelta(seconds=REJECT_FOR)
        payload["_ferry_test"] = {"reject_until": format_timestamp(fixed_at)}
    elif roll < 0.05:
        payload["_ferry_test"] = {"fail_attempts": 1}
    return payload


async def record_raw_invalid(
    conn: Conn, aggregate: str, key: str, event_type: str, version: int
) -> None:
    """A non-Python producer's plain SQL insert whose payload breaks the event's schema.

    Nothing checks it on the way in; the consumer validates it against the manifests,
    and dead-letters it as SCHEMA_INVALID (held: the same bytes can never pass).
    """
    await conn.execute(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type,"
        " event_version, payload) VALUES ($1, $2, $3, $4, $5, $6::jsonb)",
        uuid.uuid4(),
        aggregate,
        key,
        event_type,
        version,
        json.dumps({"unexpected": key}),
    )


@dataclass
class Demo:
    """Connections to every context database, and the tally."""

    dsn_template: str
    topologies: list[Topology]
    nats_url: str = ""
    #: The operator's NATS credentials (the stack's admin), for the dead-letter act.
    nats_auth: NatsAuth | None = None
    pools: dict[str, asyncpg.Pool] = field(default_factory=dict)
    produced: int = 0

    def database(self, context: str) -> str:
        for topology in self.topologies:
            if context in topology.contexts:
                return topology.contexts[context].database
        raise KeyError(context)

    async def open(self) -> None:
        for topology in self.topologies:
            for ctx in topology.contexts.values():
                dsn = self.dsn_template.replace("{database}", ctx.database)
                self.pools[ctx.database] = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
                await self.pools[ctx.database].execute(
                    "CREATE TABLE IF NOT EXISTS demo_aggregates (kind TEXT, key TEXT,"
                    " changes INT NOT NULL DEFAULT 1, PRIMARY KEY (kind, key))"
                )

    async def close(self) -> None:
        await asyncio.gather(*(pool.close() for pool in self.pools.values()))

    async def command(self, rng: random.Random) -> None:
        """One domain command: state change and event in one transaction."""
        context, aggregate, event_type, version = rng.choice(COMMANDS)
        key = f"{aggregate[0]}{rng.randint(1, 200)}"
        async with self.pools[self.database(context)].acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO demo_aggregates (kind, key) VALUES ($1, $2) ON CONFLICT (kind, key)"
                " DO UPDATE SET changes = demo_aggregates.changes + 1",
                aggregate,
                key,
            )
            if rng.random() < RAW_INVALID_SHARE:
                await record_raw_invalid(conn, aggregate, key, event_type, version)
            else:
                await record_event(
                    conn,
                    aggregate_type=aggregate,
                    aggregate_id=key,
                    event_type=event_type,
                    event_version=version,
                    payload=payload_for(event_type, version, key, rng),
                )
        self.produced += 1

    async def counts(self) -> dict[str, int]:
        """Published, processed, dead-lettered, duplicates and backlogs over all databases."""
        totals = dict.fromkeys(("outbox", "published", "processed", "failed", "duplicates"), 0)
        for pool in self.pools.values():
            row = await pool.fetchrow(
                "SELECT (SELECT count(*) FROM outbox_events) AS outbox,"
                " (SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL) AS published,"
                " (SELECT count(*) FROM inbox_messages WHERE status = 'processed') AS processed,"
                " (SELECT count(*) FROM inbox_messages WHERE status = 'failed') AS failed,"
                " (SELECT coalesce(sum(duplicates), 0) FROM inbox_messages) AS duplicates"
            )
            assert row is not None
            for name in totals:
                totals[name] += int(row[name])
        return totals

    async def reckoning(self) -> tuple[int, int, list[float]]:
        """(expected deliveries, lost, end-to-end latencies in ms) over every durable."""
        expected = lost = 0
        latencies: list[float] = []
        for topology in self.topologies:
            for name, durable in topology.durables.items():
                source = topology.contexts[topology.context_of_stream(durable.stream)].database
                target = topology.contexts[durable.target].database
                sent = {
                    r["id"]: r["occurred_at"]
                    for r in await self.pools[source].fetch(
                        "SELECT id, occurred_at FROM outbox_events"
                    )
                }
                done = {
                    r["message_id"]: (r["status"], r["processed_at"])
                    for r in await self.pools[target].fetch(
                        "SELECT message_id, status, processed_at FROM inbox_messages"
                        " WHERE durable = $1 AND status IN ('processed', 'failed')",
                        name,
                    )
                }
                expected += len(sent)
                lost += sum(1 for mid in sent if mid not in done)
                latencies += [
                    (done[mid][1] - at).total_seconds() * 1000
                    for mid, at in sent.items()
                    if mid in done and done[mid][0] == "processed"
                ]
        return expected, lost, latencies


def _line(elapsed: float, produced: int, c: dict[str, int]) -> str:
    return (
        f"\r{elapsed:5.1f}s produced {produced:6} published {c['published']:6} "
        f"processed {c['processed']:6} dead-lettered {c['failed']:4} "
        f"duplicates {c['duplicates']:4} outbox backlog {c['outbox'] - c['published']:5}"
    )


async def drive(demo: Demo, *, rate: float, seconds: float, settle: float, seed: int) -> int:
    """Produce at ``rate`` for ``seconds``, wait for the platform to settle, print the summary."""
    rng = random.Random(seed)
    start = time.monotonic()
    next_report = start
    while (now := time.monotonic()) - start < seconds:
        target = int((now - start) * rate)
        while demo.produced < target:
            await demo.command(rng)
        if now >= next_report:
            print(_line(now - start, demo.produced, await demo.counts()), end="", flush=True)
            next_report = now + 1.0
        await asyncio.sleep(0.01)
    deadline = time.monotonic() + settle
    expected, lost, latencies = await demo.reckoning()
    while lost and time.monotonic() < deadline:
        print(
            _line(time.monotonic() - start, demo.produced, await demo.counts()), end="", flush=True
        )
        await asyncio.sleep(1.0)
        expected, lost, latencies = await demo.reckoning()
    counts = await demo.counts()
    print(_line(time.monotonic() - start, demo.produced, counts))
    code = summary(demo.produced, counts, expected, lost, latencies)
    await dead_letter_act(demo, settle)
    return code


async def dead_letter_act(demo: Demo, seconds: float) -> None:
    """Let automatic replays run, replay mediation's rejects as an operator, print a table."""
    mediation = [t for t in demo.topologies if t.name == "mediation"]
    if demo.nats_url and mediation:
        replayed = await demo_dlq.operator_replay(
            demo.nats_url, mediation[0], demo.pools, demo.nats_auth
        )
        print(f"\noperator (ferry dlq replay) replayed {replayed} held mediation dead letter(s)")
    await demo_dlq.settle(demo.topologies, demo.pools, seconds=seconds)
    demo_dlq.print_table(await demo_dlq.tally(demo.topologies, demo.pools))


def summary(produced: int, c: dict[str, int], expected: int, lost: int, lat: list[float]) -> int:
    """Print the reckoning; exit code 1 when anything was lost."""
    quantiles = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [0.0] * 99
    print("\nFerry demo summary")
    print(f"  produced by commands     {produced}")
    print(f"  events in all outboxes   {c['outbox']} (includes module F's follow-up events)")
    print(f"  published                {c['published']}")
    print(f"  deliveries expected      {expected}")
    print(f"  processed                {c['processed']}")
    print(f"  dead-lettered            {c['failed']} (poison, bad schema, not yet replayed)")
    print(f"  duplicates skipped       {c['duplicates']}")
    print(f"  lost                     {lost}")
    print(
        f"  end-to-end latency ms    p50 {quantiles[49]:.1f}  p95 {quantiles[94]:.1f}  "
        f"p99 {quantiles[98]:.1f}  (occurred_at in source → processed_at in target)"
    )
    return 0 if lost == 0 else 1


def run_demo(env: dict[str, str], argv: list[str]) -> int:
    """Called by ``devstack.stack up --demo`` once the stack is up."""
    parser = argparse.ArgumentParser(prog="demo")
    parser.add_argument("--rate", type=float, default=100.0, help="commands per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to produce")
    parser.add_argument("--settle", type=float, default=60.0, help="max wait for the tail")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--no-kpi", action="store_true", help="skip the KPI job's report (half a minute of Spark)"
    )
    args = parser.parse_args(argv)
    topologies = [load_topology(ROOT / path) for path in TOPOLOGIES]
    demo = Demo(env["FERRY_DSN_TEMPLATE"], topologies, env.get("FERRY_NATS_URL", ""))
    if "FERRY_NATS_USER" in env:
        password = Path(env["FERRY_NATS_PASSWORD_FILE"]).read_text().strip()
        demo.nats_auth = NatsAuth(user=env["FERRY_NATS_USER"], password=password)

    async def main() -> int:
        await demo.open()
        try:
            return await drive(
                demo, rate=args.rate, seconds=args.seconds, settle=args.settle, seed=args.seed
            )
        finally:
            await demo.close()

    print(
        f"demo: {args.rate:.0f} commands/s for {args.seconds:.0f}s across both topologies "
        f"(1 % poison, 1 % rejected until a fix {REJECT_FOR:.0f}s later, 3 % transient "
        "failures) — Ctrl-C stops everything"
    )
    started = datetime.now(UTC)
    code = asyncio.run(main())
    if args.no_kpi:
        return code
    from spark.demo import show_kpi_report  # the KPI job over what the demo just did

    show_kpi_report(env, since=started, topologies=TOPOLOGIES)
    return code


if __name__ == "__main__":
    sys.exit(run_demo(dict(__import__("os").environ), sys.argv[1:]))
