"""One dead letter in full (see :mod:`shared.ops.dlq`): its record, trace id, operator
actions, its payload's edits (both versions) and, for an ``ordering: key`` durable, its
key's parked queue."""

from __future__ import annotations

import json
import uuid
from typing import Any

from shared.adapters import dead_letters as store
from shared.adapters import parked_queue
from shared.adapters.postgres import connect
from shared.ops.dlq_find import public
from shared.runtime.settings import CommonSettings


async def show_dead_letter(
    settings: CommonSettings, durable: str, message_id: uuid.UUID
) -> dict[str, Any] | None:
    """One dead letter in full (``ferry dlq show``, the console): the row as JSON-friendly
    data with its trace id, operator actions, edits and ordering; None when there is none."""
    topology = settings.load_topology()
    spec = topology.durable(durable)
    conn = await connect(settings.dsn(topology.context(spec.target).database))
    try:
        query = store.Query(durables=[durable], message_ids=[message_id])
        rows = await store.find(conn, query)
        done = await store.actions(conn, durable, message_id)
        edited = await store.edits(conn, durable, message_id)
        ordering = await _ordering(conn, durable, rows[0]) if rows else None
    finally:
        await conn.close()
    if not rows:
        return None
    row = public(rows[0])
    row["trace_id"] = _trace_id(row.get("traceparent"))
    row["actions"] = done
    row["edits"] = edited
    row["ordering"] = ordering
    return row


async def _ordering(conn: Any, durable: str, row: dict[str, Any]) -> dict[str, Any] | None:
    """An ``ordering: key`` dead letter's key, policy, and its key's parked queue now."""
    record = row.get("record")
    if isinstance(record, str):
        record = json.loads(record)
    found = record.get("ordering") if isinstance(record, dict) else None
    if not isinstance(found, dict) or not isinstance(found.get("key"), str):
        return None
    doc = dict(found)
    queue = await parked_queue.keys(conn, durable, found["key"], 1)
    if queue:
        head = queue[0]
        doc["parked"] = {
            "events": head["events"],
            "head_id": str(head["head_id"]),
            "head_state": head["head_state"],
            "this_is_the_head": head["head_id"] == row["message_id"],
            "waiting_behind_head": head["events"] - 1,
        }
    else:
        doc["parked"] = None
    return doc


def _trace_id(traceparent: Any) -> str | None:
    parts = str(traceparent or "").split("-")
    return parts[1] if len(parts) == 4 else None
