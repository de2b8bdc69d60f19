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
from datetime import datetime
from typing import Any

import asyncpg

from shared.adapters import dead_letters as store
from shared.adapters.nats import NatsAuth, connect_nats
from shared.contracts.topology import Topology
from shared.ops.dlq_change import change_status

ACTOR = "demo-operator"
# Dead letters that hold their key (on_dead_letter: hold) and wait for an operator still:
# what `ferry parked list` shows as held heads; a handler's reject only once its replay
# after the fix failed too (poison), anything else (bad schema) at once.
_HOLDING = """
SELECT d.durable, d.message_id, d.reason_code
FROM dead_letters d JOIN parked_messages p USING (durable, message_id)
WHERE d.durable = ANY($1::text[]) AND p.state = 'held' AND d.status IN ('dead', 'held', 'parked')
  AND (d.reason_code <> 'HANDLER_REJECTED' OR d.replay_attempts > 0 OR d.generation > 1)
ORDER BY d.durable, p.stream_seq
"""


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
    """Replay once every held, handler-rejected dead letter of ``topology`` that was never
    replayed (the bug is fixed now; one that fails again is poison); how many."""
    due: list[tuple[str, dict[str, Any]]] = []
    for database, durables in _databases(topology).items():
        async with pools[database].acquire() as conn:
            rows = await store.find(
                conn,
                store.Query(durables=durables, statuses=["held"], reasons=["HANDLER_REJECTED"]),
            )
        due += [(database, r) for r in rows if r["replay_attempts"] == 0 and r["generation"] == 1]
    if not due:
        return 0
    nc = await connect_nats([nats_url], name="demo-operator", auth=auth, give_up_after=10)
    replayed = 0
    try:
        for database, row in due:
            async with pools[database].acquire() as conn:
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


async def discard_holding_heads(
    topologies: list[Topology], pools: dict[str, asyncpg.Pool]
) -> list[tuple[str, str]]:
    """Discard every dead letter that still holds an ``ordering: key`` durable's key after
    the fix and its replay (``ferry dlq discard``, audited): its later events go on. The
    (durable, message id) of each."""
    gone: list[tuple[str, str]] = []
    for topology in topologies:
        ordered = {n for n, d in topology.durables.items() if d.ordering == "key"}
        for database, durables in _databases(topology).items():
            names = sorted(ordered.intersection(durables))
            if not names:
                continue
            async with pools[database].acquire() as conn:
                for row in await conn.fetch(_HOLDING, names):
                    why = "bad schema" if row["reason_code"] == "SCHEMA_INVALID" else "poison"
                    done, _ = await change_status(
                        conn,
                        topology.durable(row["durable"]),
                        row["durable"],
                        row["message_id"],
                        "discarded",
                        actor=ACTOR,
                        reason=f"demo: {why}, fails after the fix; its key's events go on",
                    )
                    if done:
                        gone.append((row["durable"], str(row["message_id"])))
    return gone


async def tally(
    topologies: list[Topology], pools: dict[str, asyncpg.Pool], since: datetime
) -> dict[str, Any]:
    """Dead letters first recorded since ``since`` (this run's) per topology by (reason,
    status), their replays and the actions recorded on them."""
    out: dict[str, Any] = {}
    for topology in topologies:
        by: Counter[tuple[str, str]] = Counter()
        replays = actions = 0
        for database, durables in _databases(topology).items():
            rows = await pools[database].fetch(
                "SELECT reason_code, status, replay_attempts FROM dead_letters"
                " WHERE durable = ANY($1::text[]) AND first_dead_lettered_at >= $2",
                durables,
                since,
            )
            for r in rows:
                by[(r["reason_code"], r["status"])] += 1
                replays += r["replay_attempts"]
            actions += int(
                await pools[database].fetchval(
                    "SELECT count(*) FROM dead_letter_actions WHERE durable = ANY($1::text[])"
                    " AND at >= $2",
                    durables,
                    since,
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
