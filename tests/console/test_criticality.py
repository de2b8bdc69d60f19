"""The console's overview lists the ``criticality: high`` durables first (INFRA-005 §7)."""

from __future__ import annotations

from pathlib import Path

from services.console.data import durable_views
from shared.contracts.loading import load_topology

ROOT = Path(__file__).resolve().parents[2]


def test_high_criticality_durables_come_first_marked_the_rest_by_name() -> None:
    views = durable_views(load_topology(ROOT / "topologies/mediation.yaml"))
    assert list(views) == ["cg_h_publish", "cg_f_ingest", "cg_g_archive", "cg_replay"]
    assert [v.critical for v in views.values()] == [True, False, False, False]


def test_without_a_critical_durable_the_order_is_by_name() -> None:
    views = durable_views(load_topology(ROOT / "topologies/sea-vibespro.yaml"))
    assert list(views) == ["sea__from_vibespro", "vibespro__from_sea"]
    assert not any(v.critical for v in views.values())
