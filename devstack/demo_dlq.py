"""The demo's dead-letter act: automatic replays (sea-vibespro), an operator's (mediation).

By the time the demo's workload has settled, sea-vibespro's dlq-replayer has been
replaying that topology's dead letters on its own (REQ-059); mediation's sit ``held``
because replay there is an operator action (INFRA-005 §4.3). This plays the operator:
it replays mediation's rejected dead letters once (through the same code as ``ferry dlq
replay``), waits for the outcomes, and prints a table of dead letters by topology,
reason and status, with the replays and actions recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import asyncpg

from shared.adapters import dead_letters as store
from shared.adapters.nats import NatsAuth, connect_nats
from shared.contracts.topology import Topology

ACTOR = "demo-operator"


def _databases(topology: Topology) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for name, durable in topology.durables.items():
        grouped.setdefault(topology.contexts[durable.target].database, []).append(name)
    return grouped


async def operator_replay(
    nats_url: str,
    topology: Topology,
    pools: dict[str, asyncpg.Pool],
    auth: NatsAuth | None = None,
) -> int:
    """Replay every held, handler-rejected dead letter of ``topology`` once; how many."""
    nc = await connect_nats([nats_url], name="demo-operator", auth=auth, give_up_after=10)
    replayed = 0
    try:
        for database, durables in _databases(topology).items():
            async with pools[database].acquire() as conn:
                rows = await store.find(
                    conn,
                    store.Query(durables=durables, statuses=["held"], reasons=["HANDLER_REJECTED"]),
                )
                for row in rows:
                    try:
                        await store.replay(
                            conn,
                            nc.jetstream(),
                            durable=row["durable"],
                            message_id=row["message_id"],
                            actor=ACTOR,
                            reason="demo: the handler bug was fixed",
                            automatic=False,
                            topology=topology,
                        )
                    except store.NotReplayable:
                        continue
                    replayed += 1
    finally:
        await nc.close()
    return replayed


async def tally(topologies: list[Topology], pools: dict[str, asyncpg.Pool]) -> dict[str, Any]:
    """Dead letters per topology by (reason, status), replays and actions recorded."""
    out: dict[str, Any] = {}
    for topology in topologies:
        by: Counter[tuple[str, str]] = Counter()
        replays = actions = 0
        for database, durables in _databases(topology).items():
            rows = await pools[database].fetch(
                "SELECT reason_code, status, replay_attempts FROM dead_letters"
                " WHERE durable = ANY($1::text[])",
                durables,
            )
            for r in rows:
                by[(r["reason_code"], r["status"])] += 1
                replays += r["replay_attempts"]
            actions += int(
                await pools[database].fetchval(
                    "SELECT count(*) FROM dead_letter_actions WHERE durable = ANY($1::text[])",
                    durables,
                )
            )
        out[topology.name] = {"by": by, "replays": replays, "actions": actions}
    return out


async def settle(
    topologies: list[Topology], pools: dict[str, asyncpg.Pool], *, seconds: float
) -> None:
    """Wait (bounded) until no replay is in flight and every auto entry had one replay."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        busy = 0
        for topology in topologies:
            for database, durables in _databases(topology).items():
                busy += int(
                    await pools[database].fetchval(
                        "SELECT count(*) FROM dead_letters WHERE durable = ANY($1::text[])"
                        " AND (status = 'replaying' OR (status = 'dead' AND replay_attempts = 0))",
                        durables,
                    )
                )
        if not busy:
            return
        print(f"\r  waiting for {busy} dead letter(s) to be replayed ...", end="", flush=True)
        await asyncio.sleep(1.0)


def print_table(result: dict[str, Any]) -> None:
    """The dead-letter table of the summary."""
    print("\nDead letters (reason code by status), per topology")
    for name, doc in result.items():
        print(f"  {name}: {doc['replays']} replays, {doc['actions']} recorded actions")
        if not doc["by"]:
            print("    (none)")
        for (reason, status), n in sorted(doc["by"].items()):
            print(f"    {reason:<26} {status:<10} {n:5}")
