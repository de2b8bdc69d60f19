"""The demo workload: domain commands in both topologies, live progress, a reckoning.

Each command changes state and records its event in one transaction. About 1 % of the
events are poison (the handler answers 422), 1 % are rejected (422) until a "fix" a few
seconds later — dead-lettered, then replayed: automatically in sea-vibespro, by an
operator in mediation — and 3 % fail once (503, then succeed), so the dead-letter,
replay and retry paths all run. Module F's handler emits an event of its own
for every event it ingests, feeding lane F→G. Then the operator's act: mediation's held
rejects replayed, the poison heads that still hold an ordered lane's key discarded, and
every parked key released. At the end every event a durable should receive is placed
by the one definition of where an event is (:mod:`devstack.demo_reckoning`): processed,
dead-lettered (and why), parked, retrying, in flight, not published, or **lost**.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

import asyncpg

from devstack import demo_dlq
from devstack.demo_reckoning import Reckoning, reckon, summary
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
    payload: dict[str, Any] = payloads[event_type]
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
) -> uuid.UUID:
    """A non-Python producer's plain SQL insert whose payload breaks the event's schema.

    Nothing checks it on the way in; the consumer validates it against the manifests,
    and dead-letters it as SCHEMA_INVALID (held: the same bytes can never pass).
    """
    event_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type,"
        " event_version, payload) VALUES ($1, $2, $3, $4, $5, $6::jsonb)",
        event_id,
        aggregate,
        key,
        event_type,
        version,
        json.dumps({"unexpected": key}),
    )
    return event_id


_COUNTS = """
SELECT (SELECT count(*) FROM outbox_events WHERE occurred_at >= $1) AS outbox,
       (SELECT count(*) FROM outbox_events WHERE occurred_at >= $1
          AND published_at IS NOT NULL) AS published,
       (SELECT count(*) FROM inbox_messages WHERE received_at >= $1
          AND status = 'processed') AS processed,
       (SELECT count(*) FROM inbox_messages WHERE received_at >= $1
          AND status = 'failed') AS failed,
       (SELECT coalesce(sum(duplicates), 0) FROM inbox_messages
          WHERE received_at >= $1) AS duplicates
"""


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
    #: Events made to fail for good on purpose (poison, bad schema): expected dead letters.
    injected: set[uuid.UUID] = field(default_factory=set)
    #: When this run began: the reckoning counts the events that occurred since.
    since: datetime = field(default_factory=lambda: datetime.now(UTC))

    @cached_property
    def commands(self) -> list[tuple[str, str, str, int]]:
        """The demo's commands whose context is in the loaded topologies."""
        return [c for c in COMMANDS if any(c[0] in t.contexts for t in self.topologies)]

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
        context, aggregate, event_type, version = rng.choice(self.commands)
        key = f"{aggregate[0]}{rng.randint(1, 200)}"
        async with self.pools[self.database(context)].acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO demo_aggregates (kind, key) VALUES ($1, $2) ON CONFLICT (kind, key)"
                " DO UPDATE SET changes = demo_aggregates.changes + 1",
                aggregate,
                key,
            )
            if rng.random() < RAW_INVALID_SHARE:
                self.injected.add(
                    await record_raw_invalid(conn, aggregate, key, event_type, version)
                )
            else:
                payload = payload_for(event_type, version, key, rng)
                event_id = await record_event(
                    conn,
                    aggregate_type=aggregate,
                    aggregate_id=key,
                    event_type=event_type,
                    event_version=version,
                    payload=payload,
                )
                if payload.get("_ferry_test", {}).get("poison"):
                    self.injected.add(event_id)
        self.produced += 1

    async def counts(self) -> dict[str, int]:
        """Published, processed, dead-lettered, duplicates and backlogs over all databases,
        of this run's events (the stack's data outlives a run: ``.var/``)."""
        totals = dict.fromkeys(("outbox", "published", "processed", "failed", "duplicates"), 0)
        for pool in self.pools.values():
            row = await pool.fetchrow(_COUNTS, self.since)
            assert row is not None
            for name in totals:
                totals[name] += int(row[name])
        return totals

    async def reckoning(self) -> Reckoning:
        """Where every event of this run a durable should receive is (see
        :mod:`.demo_reckoning`)."""
        return await reckon(self.pools, self.topologies, self.injected, since=self.since)


def _line(elapsed: float, produced: int, c: dict[str, int]) -> str:
    return (
        f"\r{elapsed:5.1f}s produced {produced:6} published {c['published']:6} "
        f"processed {c['processed']:6} dead-lettered {c['failed']:4} "
        f"duplicates {c['duplicates']:4} outbox backlog {c['outbox'] - c['published']:5}"
    )


async def drive(demo: Demo, *, rate: float, seconds: float, settle: float, seed: int) -> int:
    """Produce at ``rate`` for ``seconds``, let the platform settle, play the operator,
    wait for every parked key to be released, print the summary."""
    rng = random.Random(seed)
    demo.since = datetime.now(UTC)
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
    produced_until = time.monotonic()
    # What the platform does by itself: deliveries, retries, automatic replays.
    await wait_until(demo, start, settle, lambda r: r.unsettled == 0)
    print(_line(time.monotonic() - start, demo.produced, await demo.counts()))
    # The operator, after the fix (the last rejected event's REJECT_FOR is over): replays
    # what waits for them, discards the poison heads that hold an ordered key, and watches
    # until every key went on and every event the fix mended was processed (automatic
    # replays included). A replay before the fix would fail and pass for poison.
    fixed_at = produced_until + REJECT_FOR + 0.5
    await asyncio.sleep(max(0.0, fixed_at - time.monotonic()))
    await operator_round(demo)
    await demo_dlq.settle(demo.topologies, demo.pools, seconds=settle)
    done = await wait_until(demo, start, settle, _finished, operator=True)
    code = summary(demo.produced, await demo.counts(), done)
    demo_dlq.print_table(await demo_dlq.tally(demo.topologies, demo.pools, demo.since))
    return code


def _finished(r: Reckoning) -> bool:
    return r.unsettled == 0 and not r.parked and not r.mendable


async def wait_until(
    demo: Demo,
    start: float,
    seconds: float,
    settled: Callable[[Reckoning], bool],
    *,
    operator: bool = False,
) -> Reckoning:
    """Reckon every second until ``settled`` (or ``seconds`` pass); the last reckoning.
    ``operator``: play an :func:`operator_round` each time round."""
    deadline = time.monotonic() + seconds
    reckoning = await demo.reckoning()
    while not settled(reckoning) and time.monotonic() < deadline:
        if operator:
            await operator_round(demo)
        print(
            _line(time.monotonic() - start, demo.produced, await demo.counts())
            + f" parked {reckoning.parked:4} in flight {reckoning.unsettled:4}",
            end="",
            flush=True,
        )
        await asyncio.sleep(1.0)
        reckoning = await demo.reckoning()
    return reckoning


async def operator_round(demo: Demo) -> None:
    """What an operator does after the handler bug's fix, as often as needed: replay once
    each held reject of an operator-replay topology (mediation) that was not replayed yet;
    discard each dead letter that still holds an ordered lane's key once its replay failed
    too (poison) or it can never pass (bad schema), so the events behind it go on."""
    if demo.nats_url:
        for topology in demo.topologies:
            if not any(d.replay == "operator" for d in topology.durables.values()):
                continue
            replayed = await demo_dlq.operator_replay(
                demo.nats_url, topology, demo.pools, demo.nats_auth
            )
            if replayed:
                print(
                    f"\noperator (ferry dlq replay) replayed {replayed} held {topology.name} "
                    "dead letter(s): the handler bug is fixed"
                )
    for durable, message_id in await demo_dlq.discard_holding_heads(demo.topologies, demo.pools):
        print(
            f"\noperator (ferry dlq discard) discarded {durable} {message_id}: it still held "
            "its key after the fix and its replay; the events behind it go on"
        )


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
    ca = env.get("FERRY_NATS_TLS_CA")
    if "FERRY_NATS_USER" in env:
        password = Path(env["FERRY_NATS_PASSWORD_FILE"]).read_text().strip()
        demo.nats_auth = NatsAuth(
            user=env["FERRY_NATS_USER"], password=password, tls_ca=Path(ca) if ca else None
        )
    elif ca:
        demo.nats_auth = NatsAuth(tls_ca=Path(ca))

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
