"""The ordered drainer's idle round settles on generic plans at volume (issue 48).

A partition's drainer asks two questions a second while nothing is due: which keys may be
tried now (:func:`shared.adapters.parking.ready_keys`) and how long until one may be
(:func:`~shared.adapters.parking.next_due`). Executed six times, a prepared statement
whose generic plan costs no more than its custom ones is no longer planned each time.
The volume bench found the ready-keys statement planned at every round on a year's parked
events (the issue's 100,000 behind 1,000 held heads): its ``LIMIT $3``, unknown to the
generic plan, made that plan look dearer. This test counts the plans PostgreSQL made
(``pg_prepared_statements``), not times, at the issue's full parked size; with the limit
passed as a parameter it fails.
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from bench.volume_seed import Lane, Sizes, parked_sql
from devstack.postgres import PostgresServer
from shared.adapters import parking
from shared.adapters.postgres import migrate_database

pytestmark = pytest.mark.integration

DURABLE = "vibespro__from_sea"
#: The issue's parked events: 100,000 behind 1,000 held heads.
SIZES = Sizes(parked=100_000, held_heads=1_000)
#: The drainer's key limit with the consumer's default concurrency (ordering_drain).
LIMIT = 32
#: Rounds: PostgreSQL plans the first five executions custom, whatever the statement.
ROUNDS = 12

_LANE = Lane(
    durable=DURABLE,
    stream="sea",
    namespace="sea",
    dlq_subject="sea.dlq.vibespro__from_sea",
    event_types=(("model_published", 1),),
    source_dsn="",
    target_dsn="",
    handler="vibespro",
)

_PLANS = """
SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements
WHERE statement LIKE '%FROM parked_messages p%' AND statement NOT LIKE '%pg_prepared%'
"""


async def test_the_drainers_idle_round_is_not_planned_at_every_round(
    pg_server: PostgresServer,
) -> None:
    dsn = pg_server.dsn(f"drainer_plans_{uuid.uuid4().hex[:8]}")
    await migrate_database(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(parked_sql(_LANE, SIZES))
        await conn.execute("VACUUM ANALYZE parked_messages")
        for _ in range(ROUNDS):
            # Every key's head is held: nothing is ready, nothing falls due (the idle round).
            assert await parking.ready_keys(conn, DURABLE, 0, LIMIT) == []
            assert await parking.next_due(conn, DURABLE, 0) is None
        plans = await conn.fetch(_PLANS)
    finally:
        await conn.close()
    assert len(plans) == 2, [r["statement"] for r in plans]
    for row in plans:
        assert row["generic_plans"] + row["custom_plans"] == ROUNDS, dict(row)
        assert row["generic_plans"] >= ROUNDS - 6, (
            "planned again at every round on a year's parked events: "
            f"{row['custom_plans']} custom plans of {ROUNDS}\n{row['statement']}"
        )
