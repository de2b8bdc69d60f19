"""The audit of actions on dead letters (``dead_letter_actions``): who replayed, parked,
discarded or auto-parked which one, and why."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from shared.adapters.postgres import Conn

_ACTION = """
INSERT INTO dead_letter_actions (durable, message_id, action, actor, reason, details)
VALUES ($1, $2, $3, $4, $5, $6::jsonb)
"""


async def record_action(
    conn: Conn,
    durable: str,
    message_id: UUID,
    action: str,
    actor: str,
    reason: str,
    details: dict[str, Any],
) -> None:
    """Record one action on the dead letter ``durable``/``message_id``."""
    await conn.execute(
        _ACTION, durable, message_id, action, actor, reason, json.dumps(details, default=str)
    )
