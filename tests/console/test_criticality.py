"""The console's overview lists the ``criticality: high`` durables first (INFRA-005 §7) and
shows each durable's throttle in force (INFRA-005 §7.3)."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from services.console.overview import durable_views, read_overview
from shared.access.identities import Identity
from shared.adapters import throttles
from shared.contracts.loading import load_topology
from tests.conftest import Env

ROOT = Path(__file__).resolve().parents[2]


def test_high_criticality_durables_come_first_marked_the_rest_by_name() -> None:
    views = durable_views(load_topology(ROOT / "topologies/mediation.yaml"))
    assert list(views) == ["cg_h_publish", "cg_f_ingest", "cg_g_archive", "cg_replay"]
    assert [v.critical for v in views.values()] == [True, False, False, False]


def test_without_a_critical_durable_the_order_is_by_name() -> None:
    views = durable_views(load_topology(ROOT / "topologies/sea-vibespro.yaml"))
    assert list(views) == ["sea__from_vibespro", "vibespro__from_sea"]
    assert not any(v.critical for v in views.values())


async def test_the_overview_shows_the_throttle_in_force(env: Env) -> None:
    """The topology's throttle, or an operator's override in its place (read through the
    console's own database login)."""
    env.doc["durables"]["sea__from_vibespro"]["throttle"] = {"rate": "5/s"}
    topology = env.write()
    await env.grant_roles()
    login = Identity("console", topology.name)
    pools = {
        db: await asyncpg.create_pool(env.role_dsn(login, db), min_size=1, max_size=2)
        for db in topology.databases()
    }
    try:
        conn = await asyncpg.connect(env.dsn("vibespro"))
        try:
            await throttles.set_override(
                conn, "vibespro__from_sea", 2.0, None, actor="ops", reason="test"
            )
        finally:
            await conn.close()
        overview = await read_overview(topology, pools, None)
    finally:
        for pool in pools.values():
            await pool.close()
    shown = {d.name: d.throttle for d in overview.durables}
    assert shown == {"sea__from_vibespro": "5/s (burst 5)",
                     "vibespro__from_sea": "2/s (burst 2), override"}  # fmt: skip
