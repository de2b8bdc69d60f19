"""Outbox rows the publisher set aside: listing them and making them pending again (``ferry
outbox``, shared/cli/outbox.py).

A row is set aside when it cannot be published (reason codes PAYLOAD_INVALID,
MESSAGE_TOO_LARGE, PUBLISH_REFUSED, and on a partitioned stream ORDERING_KEY_MISSING: its
payload lacks the event's ``ordering_key`` field, so it has no partition; see
services/outbox_publisher/failures.py). The later rows of its aggregate wait behind it.
Republishing makes it pending again with 0 attempts (fix the row or the limits first, or it
is set aside again) and records who, when and why in ``outbox_actions``.
"""

from __future__ import annotations

import uuid
from typing import Any

from shared.adapters import outbox_set_aside
from shared.adapters.postgres import connect
from shared.runtime.settings import CommonSettings

_FAILING = """
SELECT seq, id, aggregate_type, aggregate_id, event_type, event_version,
       publish_attempts AS attempts, publish_error AS last_error, last_attempt_at
FROM outbox_events
WHERE published_at IS NULL AND (publish_attempts <> 0 OR set_aside_at IS NOT NULL)
  AND set_aside_at IS NULL
ORDER BY seq LIMIT $1
"""


async def _connect(settings: CommonSettings, context: str) -> Any:
    topology = settings.load_topology()
    return await connect(settings.dsn(topology.context(context).database))


async def troubled_rows(
    settings: CommonSettings, context: str, limit: int, *, failed_only: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``context``'s set-aside rows and (unless ``failed_only``) its failing ones, oldest
    first, at most ``limit`` of each."""
    conn = await _connect(settings, context)
    try:
        aside = await outbox_set_aside.set_aside_rows(conn, limit)
        failing = [] if failed_only else [dict(r) for r in await conn.fetch(_FAILING, limit)]
    finally:
        await conn.close()
    return aside, failing


async def republish(
    settings: CommonSettings,
    context: str,
    ids: list[uuid.UUID] | None,
    *,
    actor: str,
    reason: str,
) -> list[dict[str, Any]]:
    """Make set-aside rows of ``context`` pending again (all of them when ``ids`` is None),
    audited; the rows republished."""
    conn = await _connect(settings, context)
    try:
        return await outbox_set_aside.republish(conn, ids, actor=actor, reason=reason)
    finally:
        await conn.close()
