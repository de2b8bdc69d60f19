"""Each live consumer process's circuit breaker state (migration 0018), on its row of
``throttle_members`` (the durable's live processes, kept alive by its throttle poll), so
the console shows which replicas of a durable stopped calling their handler."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from shared.adapters.postgres import Conn


async def report_circuit(
    conn: Conn, durable: str, owner: str, state: str, since: datetime | None
) -> None:
    """``owner``'s circuit breaker is in ``state`` since ``since`` (on its
    ``throttle_members`` row, which its throttle poll keeps alive)."""
    await conn.execute(
        "UPDATE throttle_members SET circuit = $3, circuit_since = $4 "
        "WHERE durable = $1 AND owner = $2",
        durable, owner, state, since,
    )  # fmt: skip


async def circuits(
    conn: Conn, durables: list[str], *, alive: float
) -> dict[str, list[dict[str, Any]]]:
    """The circuit breaker state of every live process (seen within ``alive`` seconds) of
    each of ``durables``."""
    rows = await conn.fetch(
        "SELECT durable, owner, circuit, circuit_since FROM throttle_members "
        "WHERE durable = ANY($1::text[]) "
        "AND seen_at > clock_timestamp() - $2 * interval '1 second' "
        "ORDER BY durable, owner",
        durables,
        alive,
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["durable"], []).append(dict(r))
    return out
