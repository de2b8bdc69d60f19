"""Every table Ferry's migrations or its handler SDK create has a retention policy (issue
48), or is named in NOT_PURGED with the reason: a new table cannot be forgotten."""

from __future__ import annotations

import re

from shared.ops.retention_tables import NOT_PURGED, POLICIES
from shared.sdk import store
from tests.conftest import ROOT

CREATE = re.compile(r"CREATE (?:UNLOGGED )?TABLE (?:IF NOT EXISTS )?([a-z_]+)", re.I)


def created_tables() -> set[str]:
    found: set[str] = set()
    for path in sorted((ROOT / "migrations").glob("*.sql")):
        found |= set(CREATE.findall(path.read_text()))
    for statement in store.BOOKKEEPING_DDL:
        found |= set(CREATE.findall(statement))
    found |= set(CREATE.findall((ROOT / "shared/adapters/postgres.py").read_text()))
    return found


def test_every_table_has_a_policy_or_a_reason() -> None:
    tables = created_tables()
    assert {"outbox_events", "handler_applied", "pause_actions"} <= tables
    covered = {p.table for p in POLICIES} | set(NOT_PURGED)
    assert tables - covered == set(), "tables without a retention policy"
    assert covered - tables == set(), "policies of tables that do not exist"
    assert not {p.table for p in POLICIES} & set(NOT_PURGED) - {"partition_leases"}


def test_each_delete_is_bounded_and_rechecks_its_conditions() -> None:
    for policy in POLICIES:
        sql = policy.delete_sql()
        scoped = policy.per_durable or policy.per_topology
        assert "LIMIT $3" in sql if scoped else "LIMIT $2" in sql, policy.table
        assert sql.count(policy.where) == 2, policy.table  # found, then re-checked
        assert ("durable = $1" in policy.where) == policy.per_durable, policy.table
        assert policy.where.startswith("topology = $1") == policy.per_topology, policy.table
        assert not (policy.per_durable and policy.per_topology), policy.table
