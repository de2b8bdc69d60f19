"""``ferry purge`` beyond the outbox and inbox: every other table Ferry or its handler SDK
writes, by the policies of :mod:`shared.ops.retention_tables`, database by database.

Which rows of a table the purge considers: a per-durable table's rows of the topology's
durables (one durable at a time, at its target context's retention), a database-wide
table's rows at the longest retention of the contexts living in that database (so two
contexts sharing a database never cut each other's history short). After each table's
purge it measures it cheaply (the statistics' row estimate, its bytes, its oldest row
through an index) for the report and the metrics.

The handler SDK's tables (``handler_applied``, ``handler_calls``) belong to the handler
service's login, which creates them; a database where they do not exist yet is skipped,
and so is one where the retention login was not granted SELECT and DELETE on them (the
report says so: the grant is the table owner's to give).
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Any

from shared.adapters.postgres import NOT_PERMITTED_ERRORS
from shared.contracts.replay_jobs import replay_lane
from shared.contracts.topology import Topology
from shared.ops.retention_common import Purged, age, cutoff, database, deleted, drain
from shared.ops.retention_tables import (
    LEASE_GRACE_SECONDS,
    LEASES_COUNT,
    LEASES_DELETE,
    POLICIES,
    SIZE_SQL,
    TablePolicy,
)
from shared.runtime.settings import CommonSettings


def _in_scope(topology: Topology, only: str | None, database_name: str) -> bool:
    """Whether a database-wide table of ``database_name`` is within ``only``."""
    if only is None:
        return True
    ctx = topology.contexts.get(only)
    return ctx is not None and ctx.database == database_name


def _durables_in(topology: Topology, database_name: str, only: str | None) -> list[str]:
    """The topology's durables whose target lives in ``database_name``, within ``only``."""
    return [
        name
        for name, spec in sorted(topology.durables.items())
        if topology.contexts[spec.target].database == database_name
        and only in (None, name, spec.target)
    ]


def _databases_of(topology: Topology, policy: TablePolicy) -> list[str]:
    """The databases where ``policy``'s table holds rows of this topology."""
    ctxs = topology.contexts
    if policy.where_found == "publishing":
        return sorted({c.database for c in ctxs.values() if c.stream is not None})
    if policy.where_found == "replay_lane":
        lane = replay_lane(topology)
        return [] if lane is None else [lane.database]
    if policy.where_found == "handlers":
        return sorted({ctxs[d.target].database for d in topology.durables.values()})
    if policy.where_found == "kpi":
        return list(topology.databases())
    return sorted({ctxs[d.target].database for d in topology.durables.values()})


def _retention(topology: Topology, policy: TablePolicy, database_name: str) -> float:
    """A database-wide table's retention: the longest of the contexts it serves there (of
    the whole topology for the KPI results, whichever database holds them)."""
    if policy.per_topology:
        return max(c.audit_retention for c in topology.contexts.values())
    ctxs = [c for c in topology.contexts.values() if c.database == database_name]
    if policy.setting == "claims_retention":
        targets = {d.target for d in topology.durables.values()}
        ctxs = [c for n, c in topology.contexts.items() if n in targets and c in ctxs]
        return max(c.claims_retention for c in ctxs)
    return max(c.audit_retention for c in ctxs)


async def purge_tables(
    settings: CommonSettings, topology: Topology, *, batch: int, dry_run: bool, only: str | None
) -> list[Purged]:
    """Purge (or, with ``dry_run``, count) every policy's rows within ``only``."""
    report: list[Purged] = []
    for database_name in topology.databases():
        todo = [p for p in POLICIES if database_name in _databases_of(topology, p)]
        leases = _lease_work(topology, database_name, only)
        if not todo and not leases:
            continue
        async with database(settings, database_name) as conn:
            for policy in todo:
                report += await _one_table(conn, topology, policy, database_name, batch,
                                           dry_run, only)  # fmt: skip
            for durable, partitions in leases:
                report.append(
                    await _leases(conn, durable, partitions, database_name, batch, dry_run)
                )
    return report


async def _one_table(
    conn: Any, topology: Topology, policy: TablePolicy, database_name: str, batch: int,
    dry_run: bool, only: str | None,
) -> list[Purged]:  # fmt: skip
    out: list[Purged] = []
    scope = (topology.name,) if policy.per_topology else ()
    if policy.where_found == "handlers":
        if not _in_scope(topology, only, database_name):
            return []
        skipped = await _unusable(conn, policy.table)
        if skipped:
            before = await cutoff(conn, _retention(topology, policy, database_name))
            return [Purged(policy.table, database_name, database_name,
                           _retention(topology, policy, database_name), before, 0,
                           skipped=skipped)]  # fmt: skip
    if policy.per_durable:
        out = await _per_durable(conn, topology, policy, database_name, batch, dry_run, only)
    elif policy.per_topology and only is not None:
        return []  # the topology's results as a whole: not one context's or durable's
    elif _in_scope(topology, only, database_name):
        retention = _retention(topology, policy, database_name)
        before = await cutoff(conn, retention)
        count = await _run(conn, policy, (*scope, before), batch, dry_run)
        out.append(Purged(policy.table, database_name, database_name, retention, before, count))
    if out:
        rows, size, oldest = await measure(conn, policy, *scope)
        for entry in out:
            entry.rows_estimate, entry.bytes, entry.oldest_age_seconds = rows, size, oldest
    return out


async def _per_durable(
    conn: Any, topology: Topology, policy: TablePolicy, database_name: str, batch: int,
    dry_run: bool, only: str | None,
) -> list[Purged]:  # fmt: skip
    """A per-durable table's purge: each durable of the database at its target's retention."""
    out: list[Purged] = []
    ordered = policy.where_found == "ordered"
    for durable in _durables_in(topology, database_name, only):
        spec = topology.durables[durable]
        if ordered and spec.ordering != "key":
            continue
        retention = getattr(topology.contexts[spec.target], policy.setting)
        before = await cutoff(conn, retention)
        count = await _run(conn, policy, (durable, before), batch, dry_run)
        out.append(Purged(policy.table, durable, database_name, retention, before, count))
    return out


async def _unusable(conn: Any, table: str) -> str:
    """Why the retention login cannot purge a handler's ``table`` here ("" if it can)."""
    if await conn.fetchval("SELECT to_regclass($1) IS NULL", table):
        return "no such table (the handler service has not created it)"
    granted = await conn.fetchval(
        "SELECT has_table_privilege($1, 'SELECT') AND has_table_privilege($1, 'DELETE')", table
    )
    if not granted:
        return (
            f"not granted: its owner (the handler's login) must GRANT SELECT, DELETE ON "
            f"{table} to the retention login"
        )
    return ""


async def _run(
    conn: Any, policy: TablePolicy, args: tuple[Any, ...], batch: int, dry_run: bool
) -> int:
    if dry_run:
        return int(await conn.fetchval(policy.count_sql(), *args))
    statement = policy.delete_sql()

    async def step() -> int:
        if policy.cascade:  # the DELETE in a CTE: its count comes as a row
            return int(await conn.fetchval(statement, *args, batch))
        return deleted(await conn.execute(statement, *args, batch))

    return await drain(step)


async def measure(
    conn: Any, policy: TablePolicy, *args: Any
) -> tuple[int | None, int | None, float | None]:
    """(rows estimated, bytes, oldest row's age in seconds) of ``policy``'s table: the
    statistics and one index probe, never a count (``args``: the oldest query's)."""
    rows, size = await table_size(conn, policy.table)
    try:
        oldest: datetime | None = await conn.fetchval(policy.oldest, *args)
    except NOT_PERMITTED_ERRORS:
        oldest = None
    return rows, size, await age(conn, oldest)


async def table_size(conn: Any, table: str) -> tuple[int | None, int | None]:
    """(rows estimated, bytes) of ``table`` from the statistics; (None, None) if absent."""
    found = await conn.fetchrow(SIZE_SQL, table)
    if found is None:
        return None, None
    return int(found["rows"]), int(found["bytes"])


def _lease_work(topology: Topology, database_name: str, only: str | None) -> list[tuple[str, int]]:
    """(durable, the partitions its stream has now) of the ordered durables here."""
    return [
        (name, topology.stream_of(name).partitions)
        for name in _durables_in(topology, database_name, only)
        if topology.durables[name].ordering == "key"
    ]


async def _leases(
    conn: Any, durable: str, partitions: int, database_name: str, batch: int, dry_run: bool
) -> Purged:
    before = await cutoff(conn, LEASE_GRACE_SECONDS)
    if dry_run:
        count = int(await conn.fetchval(LEASES_COUNT, durable, partitions, before))
    else:
        count = await drain(partial(_lease_batch, conn, durable, partitions, before, batch))
    return Purged("partition_leases", durable, database_name, LEASE_GRACE_SECONDS, before, count)


async def _lease_batch(
    conn: Any, durable: str, partitions: int, before: datetime, batch: int
) -> int:
    return deleted(await conn.execute(LEASES_DELETE, durable, partitions, before, batch))
