"""Finding dead letters (operator CLI, ``ferry where``) and the actions taken on them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from shared.adapters.postgres import Conn


@dataclass
class Query:
    """Filters for listing dead letters (operator CLI)."""

    durables: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    subject: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    message_ids: list[UUID] = field(default_factory=list)
    limit: int | None = None


def subject_regex(pattern: str) -> str:
    """A PostgreSQL regex for a NATS subject pattern (``*`` one token, ``>`` the rest)."""
    parts = []
    for token in pattern.split("."):
        parts.append("[^.]+" if token == "*" else ".+" if token == ">" else re.escape(token))
    return "^" + r"\.".join(parts) + "$"


def _where(query: Query) -> tuple[str, list[Any]]:
    filters: list[tuple[str, Any]] = [
        ("durable = ANY({}::text[])", query.durables),
        ("reason_code = ANY({}::text[])", query.reasons),
        ("status = ANY({}::text[])", query.statuses),
        ("original_subject ~ {}", query.subject and subject_regex(query.subject)),
        ("dead_lettered_at >= {}", query.since),
        ("dead_lettered_at < {}", query.until),
        ("message_id = ANY({}::uuid[])", query.message_ids),
    ]
    clauses: list[str] = []
    args: list[Any] = []
    for sql, value in filters:
        if value:
            args.append(value)
            clauses.append(sql.format(f"${len(args)}"))
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


async def find(conn: Conn, query: Query) -> list[dict[str, Any]]:
    """Dead letters matching ``query``, oldest first, with their record decoded."""
    where, args = _where(query)
    sql = f"SELECT * FROM dead_letters{where} ORDER BY dead_lettered_at, durable, message_id"
    if query.limit:
        sql += f" LIMIT {int(query.limit)}"
    rows = await conn.fetch(sql, *args)
    out = []
    for r in rows:
        doc = dict(r)
        doc["record"] = json.loads(doc["record"])
        doc["replay_history"] = json.loads(doc["replay_history"])
        out.append(doc)
    return out


async def actions(conn: Conn, durable: str, message_id: UUID) -> list[dict[str, Any]]:
    """The recorded actions on one dead letter, oldest first."""
    rows = await conn.fetch(
        "SELECT action, actor, reason, at, details FROM dead_letter_actions "
        "WHERE durable = $1 AND message_id = $2 ORDER BY at, id",
        durable,
        message_id,
    )
    return [{**dict(r), "details": json.loads(r["details"])} for r in rows]
