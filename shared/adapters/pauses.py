"""The audit of operator pauses (migration 0018): ``pause_actions``.

The pause in force is JetStream's (each consumer's ``pause_until``,
:mod:`shared.ops.pause`); a row here records who paused or resumed a durable, when, until
when and why. The newest ``pause`` row of a durable says who set the pause in force.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from shared.adapters.postgres import Conn


async def record(
    conn: Conn,
    durable: str,
    action: str,
    until: datetime | None,
    *,
    actor: str,
    reason: str,
) -> None:
    """Record one ``pause`` (with ``until``) or ``resume`` of ``durable``."""
    await conn.execute(
        "INSERT INTO pause_actions (durable, action, until, actor, reason) "
        "VALUES ($1, $2, $3, $4, $5)",
        durable, action, until, actor, reason,
    )  # fmt: skip


async def actions(conn: Conn, durable: str, limit: int = 20) -> list[dict[str, Any]]:
    """The latest pauses and resumes of ``durable``, newest first."""
    rows = await conn.fetch(
        "SELECT action, until, actor, reason, at FROM pause_actions "
        "WHERE durable = $1 ORDER BY at DESC, id DESC LIMIT $2",
        durable,
        limit,
    )
    return [dict(r) for r in rows]


async def latest(conn: Conn, durables: list[str]) -> dict[str, dict[str, Any]]:
    """Each of ``durables``' newest action (durables never paused are absent)."""
    rows = await conn.fetch(
        "SELECT DISTINCT ON (durable) durable, action, until, actor, reason, at "
        "FROM pause_actions WHERE durable = ANY($1::text[]) ORDER BY durable, at DESC, id DESC",
        durables,
    )
    return {r["durable"]: dict(r) for r in rows}
