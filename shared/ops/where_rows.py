"""``ferry where``'s database reads: the event's outbox row, inbox rows, dead letters and
handler calls, from every database of the topology (see :mod:`shared.ops.where`)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from shared.adapters import dead_letters
from shared.adapters.postgres import Conn, connect
from shared.contracts.topology import Topology
from shared.runtime.settings import CommonSettings

_OUTBOX = """
SELECT seq, aggregate_type, aggregate_id, event_type, event_version, occurred_at, recorded_at,
       published_at, publish_attempts, publish_error, last_attempt_at, correlation_id,
       causation_id, traceparent, set_aside_at, set_aside_reason, payload,
       (SELECT min(b.seq) FROM outbox_events b
        WHERE b.published_at IS NULL AND b.seq < o.seq
          AND b.aggregate_type = o.aggregate_type AND b.aggregate_id = o.aggregate_id
          AND (b.publish_attempts <> 0 OR b.set_aside_at IS NOT NULL)) AS behind_seq
FROM outbox_events o WHERE id = $1
"""

_INBOX = """
SELECT durable, subject, status, attempts, received_at, processed_at, last_error,
       handler_status, reason_code, duplicates, retry_history, dlq_metadata, stream_seq,
       traceparent, lease_owner, lease_until, updated_at, held_by
FROM inbox_messages WHERE message_id = $1 ORDER BY durable
"""

_DEAD = """
SELECT durable, status, reason_code, last_error, attempts, source, generation, stream,
       stream_seq, dlq_subject, first_dead_lettered_at, dead_lettered_at, replay_attempts,
       next_replay_at, last_replay_at, replayed_at, replay_history, traceparent
FROM dead_letters WHERE message_id = $1 ORDER BY durable
"""

_CALLS = """
SELECT handler, attempt, status, called_at FROM handler_calls
WHERE message_id = $1 ORDER BY called_at, id
"""


async def database_rows(
    settings: CommonSettings, topology: Topology, message_id: uuid.UUID
) -> dict[str, Any]:
    """The event's rows in every database: ``outbox`` (and its ``event`` fields), ``inbox``
    and ``dead`` by durable, ``calls`` by database; ``wire`` is left for the stream lookup."""
    found: dict[str, Any] = {
        "outbox": None, "inbox": {}, "dead": {}, "calls": {}, "event": None, "wire": None,
    }  # fmt: skip
    owners = {ctx.database: name for name, ctx in topology.contexts.items()}
    for database in topology.databases():
        conn = await connect(settings.dsn(database))
        try:
            outbox = await conn.fetchrow(_OUTBOX, message_id)
            if outbox is not None:
                plain = _plain(outbox)
                found["event"] = _event_doc(plain.pop("payload"), plain)
                found["outbox"] = {"context": owners.get(database), **plain}
            for row in await conn.fetch(_INBOX, message_id):
                found["inbox"][row["durable"]] = _plain(row)
            for row in await conn.fetch(_DEAD, message_id):
                entry = _plain(row)
                entry["actions"] = await dead_letters.actions(conn, row["durable"], message_id)
                found["dead"][row["durable"]] = entry
            found["calls"][database] = await _handler_calls(conn, message_id)
        finally:
            await conn.close()
    return found


async def _handler_calls(conn: Conn, message_id: uuid.UUID) -> list[dict[str, Any]]:
    """The example handler services' ledger, where the database has one."""
    if await conn.fetchval("SELECT to_regclass('handler_calls')") is None:
        return []
    # The handler's own table: an operator's login may read it, the console's may not.
    if not await conn.fetchval("SELECT has_table_privilege('handler_calls', 'SELECT')"):
        return []
    return [_plain(r) for r in await conn.fetch(_CALLS, message_id)]


def _event_doc(payload: Any, row: dict[str, Any]) -> dict[str, Any]:
    """The fields of an outbox row its ordering key is read from (an envelope's shape)."""
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except ValueError:
            payload = None
    return {
        "aggregate_type": row["aggregate_type"],
        "aggregate_id": row["aggregate_id"],
        "event_type": row["event_type"],
        "event_version": row["event_version"],
        "payload": payload,
    }


def _plain(row: Any) -> dict[str, Any]:
    doc = dict(row)
    for key in ("retry_history", "dlq_metadata", "replay_history"):
        if isinstance(doc.get(key), str):
            doc[key] = json.loads(doc[key])
    return doc
