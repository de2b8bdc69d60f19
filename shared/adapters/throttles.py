"""Throttle overrides (migration 0012): an operator's rate limit for one durable, audited.

A row of ``throttle_overrides`` replaces the topology's ``throttle:`` for its durable while
it exists (``rate`` NULL: no limit at all); every set and clear is recorded in
``throttle_actions`` in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.adapters.postgres import Conn
from shared.domain.throttle import Limit


@dataclass(frozen=True, slots=True)
class Override:
    """An operator's override of a durable's throttle."""

    durable: str
    #: Messages per second; None: no limit.
    rate: float | None
    burst: int | None
    actor: str
    reason: str
    set_at: datetime | None = None

    def limit(self) -> Limit | None:
        """The limit it sets (None: unthrottled)."""
        return None if self.rate is None else Limit.of(self.rate, self.burst)


async def current(conn: Conn, durable: str) -> Override | None:
    """The override in force for ``durable``, if any."""
    row = await conn.fetchrow(
        "SELECT durable, rate, burst, actor, reason, set_at FROM throttle_overrides "
        "WHERE durable = $1",
        durable,
    )
    return None if row is None else Override(**dict(row))


#: Rows of processes not seen for this long are deleted by the next poll (seconds).
MEMBER_EXPIRY = 3600.0


async def poll(
    conn: Conn, durable: str, owner: str, *, alive: float
) -> tuple[Override | None, int]:
    """One poll of a running consumer process: mark ``owner`` alive, and read the override
    in force and how many processes of ``durable`` were seen within ``alive`` seconds
    (``owner`` included) — the limit is shared among them."""
    row = await conn.fetchrow(
        """
        WITH me AS (
          INSERT INTO throttle_members (durable, owner) VALUES ($1, $2)
          ON CONFLICT (durable, owner) DO UPDATE SET seen_at = clock_timestamp()
        ), gone AS (
          DELETE FROM throttle_members
          WHERE durable = $1 AND seen_at < clock_timestamp() - $4 * interval '1 second'
        )
        SELECT o.durable, o.rate, o.burst, o.actor, o.reason, o.set_at,
          1 + (SELECT count(*) FROM throttle_members m WHERE m.durable = $1 AND m.owner <> $2
               AND m.seen_at > clock_timestamp() - $3 * interval '1 second') AS members
        FROM (SELECT 1) AS one LEFT JOIN throttle_overrides o ON o.durable = $1
        """,
        durable, owner, alive, MEMBER_EXPIRY,
    )  # fmt: skip
    assert row is not None
    found = dict(row)
    members = int(found.pop("members"))
    return (None if found["durable"] is None else Override(**found)), members


async def leave(conn: Conn, durable: str, owner: str) -> None:
    """``owner`` stops: the others take its share at their next poll."""
    await conn.execute(
        "DELETE FROM throttle_members WHERE durable = $1 AND owner = $2", durable, owner
    )


async def overrides(conn: Conn, durables: list[str]) -> list[Override]:
    """The overrides in force for any of ``durables``."""
    rows = await conn.fetch(
        "SELECT durable, rate, burst, actor, reason, set_at FROM throttle_overrides "
        "WHERE durable = ANY($1::text[]) ORDER BY durable",
        durables,
    )
    return [Override(**dict(r)) for r in rows]


async def set_override(
    conn: Conn, durable: str, rate: float | None, burst: int | None, *, actor: str, reason: str
) -> None:
    """Set (or replace) ``durable``'s override, audited."""
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO throttle_overrides (durable, rate, burst, actor, reason) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (durable) DO UPDATE SET "
            "rate = EXCLUDED.rate, burst = EXCLUDED.burst, actor = EXCLUDED.actor, "
            "reason = EXCLUDED.reason, set_at = clock_timestamp()",
            durable, rate, burst, actor, reason,
        )  # fmt: skip
        await _audit(conn, durable, "set", rate, burst, actor, reason)


async def clear_override(conn: Conn, durable: str, *, actor: str, reason: str) -> bool:
    """Delete ``durable``'s override (audited); False when there was none (nothing done)."""
    async with conn.transaction():
        gone = await conn.fetchval(
            "DELETE FROM throttle_overrides WHERE durable = $1 RETURNING durable", durable
        )
        if gone is None:
            return False
        await _audit(conn, durable, "clear", None, None, actor, reason)
    return True


async def actions(conn: Conn, durable: str, limit: int = 20) -> list[dict[str, Any]]:
    """The latest sets and clears of ``durable``'s override, newest first."""
    rows = await conn.fetch(
        "SELECT action, rate, burst, actor, reason, at FROM throttle_actions "
        "WHERE durable = $1 ORDER BY at DESC, id DESC LIMIT $2",
        durable,
        limit,
    )
    return [dict(r) for r in rows]


async def _audit(
    conn: Conn,
    durable: str,
    action: str,
    rate: float | None,
    burst: int | None,
    actor: str,
    reason: str,
) -> None:
    await conn.execute(
        "INSERT INTO throttle_actions (durable, action, rate, burst, actor, reason) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        durable, action, rate, burst, actor, reason,
    )  # fmt: skip
