"""Finding dead letters (see :mod:`shared.ops.dlq`): the search across every database of
the topology, and a row as JSON-friendly data."""

from __future__ import annotations

import uuid
from typing import Any

from shared.adapters import dead_letters as store
from shared.adapters.postgres import connect
from shared.contracts.topology import Topology
from shared.runtime.settings import CommonSettings


def _by_database(topology: Topology, durables: list[str]) -> dict[str, list[str]]:
    """Durables (all, or those asked for) grouped by the database holding their inbox."""
    grouped: dict[str, list[str]] = {}
    for name in durables or sorted(topology.durables):
        database = topology.context(topology.durable(name).target).database
        grouped.setdefault(database, []).append(name)
    return grouped


async def find_dead_letters(settings: CommonSettings, query: store.Query) -> list[dict[str, Any]]:
    """Dead letters matching ``query`` in every database of the topology, oldest first
    (``ferry dlq list``, the console)."""
    topology = settings.load_topology()
    found: list[dict[str, Any]] = []
    for database, durables in _by_database(topology, query.durables).items():
        conn = await connect(settings.dsn(database))
        try:
            scoped = store.Query(**{**vars(query), "durables": durables})
            found.extend(await store.find(conn, scoped))
        finally:
            await conn.close()
    found.sort(key=lambda r: (r["dead_lettered_at"], r["durable"], str(r["message_id"])))
    return found[: query.limit] if query.limit else found


def public(row: dict[str, Any]) -> dict[str, Any]:
    """A row as JSON-friendly data (what --json and export print)."""
    return {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in row.items()}
