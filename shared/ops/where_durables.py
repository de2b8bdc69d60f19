"""``ferry where``'s per-durable state: JetStream's delivery state on the consumer that
delivers the event and, for an ``ordering: key`` durable, the event's key, partition and
place in its key's parked queue (see :mod:`shared.ops.where`)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from shared.adapters import parked_queue
from shared.adapters.jetstream import NOT_FOUND_ERRORS
from shared.adapters.nats import NatsClient
from shared.adapters.postgres import connect
from shared.contracts.topology import DurableSpec, Topology
from shared.domain.ordering import (
    OrderingKeyError,
    consumer_name,
    ordering_key,
    partition_of,
    split_partition,
)
from shared.domain.whereabouts import DEAD_LETTER_MEANING, Place, Trail, place_of
from shared.ops.where_stream import subject_of
from shared.runtime.settings import CommonSettings

# One parked message of a durable: where it stands in its key's queue, and the key's head.
_PARKED = """
SELECT p.ordering_key, p.partition, p.stream_seq, p.state, p.attempts, p.next_attempt_at,
       p.reason, p.parked_at,
       (SELECT count(*) FROM parked_messages b WHERE b.durable = p.durable
          AND b.ordering_key = p.ordering_key AND b.stream_seq < p.stream_seq) AS before,
       (SELECT count(*) FROM parked_messages a WHERE a.durable = p.durable
          AND a.ordering_key = p.ordering_key AND a.stream_seq > p.stream_seq) AS after,
       h.message_id AS head_id, h.state AS head_state, h.attempts AS head_attempts,
       h.reason AS head_reason, h.next_attempt_at AS head_next_attempt_at
FROM parked_messages p
CROSS JOIN LATERAL (
  SELECT message_id, state, attempts, reason, next_attempt_at FROM parked_messages h
  WHERE h.durable = p.durable AND h.ordering_key = p.ordering_key
  ORDER BY h.stream_seq LIMIT 1
) h
WHERE p.durable = $1 AND p.message_id = $2
"""


async def durables(
    settings: CommonSettings,
    nc: NatsClient,
    topology: Topology,
    doc: dict[str, Any],
    rows: dict[str, Any],
) -> list[dict[str, Any]]:
    """Per durable that delivers the event (or holds a row of it): what happened there."""
    subject = subject_of(topology, doc["outbox"], rows["inbox"])
    stored = doc["stream"]
    out = []
    for name, spec in sorted(topology.durables.items()):
        covers = bool(subject) and topology.delivers(name, subject)
        if not (covers or name in rows["inbox"] or name in rows["dead"]):
            continue
        entry: dict[str, Any] = {"durable": name, "stream": spec.stream, "target": spec.target}
        entry["ordering"] = None
        if spec.ordering == "key":
            entry["ordering"] = await _ordering(
                settings, topology, name, spec, rows, uuid.UUID(doc["message_id"])
            )
        if stored is not None and stored["stream"] == spec.stream:
            consumer = _consumer_of(topology, name, stored["subject"], entry["ordering"])
            entry["delivery"] = (
                await _delivery_state(nc, spec.stream, consumer, stored["sequence"])
                if consumer is not None
                else {"state": "unknown: the event's partition cannot be told"}
            )
        entry["inbox"] = rows["inbox"].get(name)
        entry["dead_letter"] = rows["dead"].get(name)
        database = topology.context(spec.target).database
        entry["handler_calls"] = [
            c for c in rows["calls"].get(database, []) if c["handler"] == spec.target
        ]
        entry["place"] = place(doc["outbox"], stored, spec, entry)
        out.append(entry)
    return out


#: Seconds after its publication within which an event nothing accounts for yet is still
#: in flight, not lost (the KPI job's FERRY_KPI_GRACE plays the same part).
GRACE = 60.0


def place(
    outbox: dict[str, Any] | None,
    stored: dict[str, Any] | None,
    spec: DurableSpec,
    entry: dict[str, Any],
) -> dict[str, Any]:
    """Where the event is for this durable (:mod:`shared.domain.whereabouts`, the one
    definition the demo, the KPI job and the console share), with what names it."""
    inbox, dead = entry["inbox"], entry["dead_letter"]
    parked = (entry["ordering"] or {}).get("parked")
    published_at = None if outbox is None else outbox.get("published_at")
    in_stream = stored is not None and stored["stream"] == spec.stream
    age = None
    if isinstance(published_at, datetime):
        age = (datetime.now(UTC) - published_at).total_seconds()
    trail = Trail(
        # Not in this topology's outboxes: published by another producer, if it is anywhere.
        published=outbox is None or published_at is not None,
        inbox_status=None if inbox is None else inbox["status"],
        retried=inbox is not None and (bool(inbox["retry_history"]) or inbox["attempts"] > 1),
        dead_letter_status=None if dead is None else dead["status"],
        parked_state=None if parked is None else parked["state"],
        in_stream=in_stream,
        past_grace=age is None or age > GRACE,
    )
    where = place_of(trail)
    doc: dict[str, Any] = {"place": where.value}
    if where is Place.DEAD_LETTERED and dead is not None:
        doc["dead_letter_status"] = dead["status"]
        doc["meaning"] = DEAD_LETTER_MEANING.get(dead["status"], dead["status"])
    elif where is Place.PARKED and parked is not None:
        head = parked if parked["is_head"] else parked["head"]
        doc["head"] = None if parked["is_head"] else head["message_id"]
        doc["behind_held_head"] = not parked["is_head"] and head["state"] == "held"
        doc["parked_state"] = parked["state"]
    elif where is Place.PROCESSED and inbox is not None and inbox.get("held_by"):
        doc["waited_behind_held_head"] = str(inbox["held_by"])
    return doc


def _consumer_of(
    topology: Topology, durable: str, subject: Any, ordering: dict[str, Any] | None
) -> str | None:
    """The JetStream consumer that delivers the stored event to ``durable``: the durable
    itself, or the consumer of the partition the event was stored on (else its key's)."""
    count = topology.consumer_partitions(durable)
    if count == 1:
        return durable
    partition = split_partition(str(subject or ""))[1]
    if partition is None and ordering is not None:
        partition = ordering["partition"]
    if partition is None or partition >= count:
        return None
    return consumer_name(durable, partition, count)


async def _ordering(
    settings: CommonSettings,
    topology: Topology,
    durable: str,
    spec: DurableSpec,
    rows: dict[str, Any],
    message_id: uuid.UUID,
) -> dict[str, Any]:
    """An ``ordering: key`` durable's view of the event: its key, partition and, when it
    is parked, its place in its key's queue (else its key's parked head, if any)."""
    context = topology.context_of_stream(spec.stream)
    partitions = topology.stream_of(durable).partitions
    conn = await connect(settings.dsn(topology.context(spec.target).database))
    try:
        has_table = await conn.fetchval("SELECT to_regclass('parked_messages')") is not None
        parked_row = await conn.fetchrow(_PARKED, durable, message_id) if has_table else None
        parked = _parked(parked_row) if parked_row is not None else None
        key, field, source, error = _key(topology, context, rows, parked)
        key_parked = None
        if parked is None and key is not None and has_table:
            heads = await parked_queue.keys(conn, durable, key, 1)
            key_parked = _key_parked(heads[0]) if heads else None
    finally:
        await conn.close()
    ordering: dict[str, Any] = {
        "key": key,
        "key_field": field,
        "key_from": source,
        "key_error": error,
        "partitions": partitions,
        "partition": None,
        "consumer": None,
        "on_dead_letter": spec.on_dead_letter,
        "parked": parked,
        "key_parked": key_parked,
    }
    if key is not None and partitions > 1:
        ordering["partition"] = partition_of(key, partitions)
    elif parked is not None and partitions > 1:
        ordering["partition"] = parked["partition"]
    if ordering["partition"] is not None:
        ordering["consumer"] = consumer_name(durable, ordering["partition"], partitions)
    elif partitions == 1:
        ordering["consumer"] = durable
    return ordering


def _key(
    topology: Topology, context: str, rows: dict[str, Any], parked: dict[str, Any] | None
) -> tuple[str | None, str | None, str | None, str | None]:
    """``(key, payload field it is read from, where from, why it cannot be read)``.

    The outbox row first (what the publisher partitioned by), then the stored envelope,
    then the parked row (the consumer's own reading), then the message's header."""
    wire = rows["wire"] or {}
    error: str | None = None
    field: str | None = None
    for source, event in (("outbox", rows["event"]), ("stream", wire.get("envelope"))):
        if event is None:
            continue
        kind, version = event.get("event_type"), event.get("event_version")
        if isinstance(kind, str) and isinstance(version, int):
            field = topology.ordering_field(context, kind, version)
        try:
            return ordering_key(event, field), field, source, None
        except OrderingKeyError as exc:
            error = str(exc)
    if parked is not None:
        return parked["ordering_key"], field, "parked", None
    header = wire.get("key_header")
    if header:
        return header, field, "header", None
    return None, field, None, error or "neither the outbox row nor the stored message is known"


def _parked(row: Any) -> dict[str, Any]:
    doc = dict(row)
    head = {
        "message_id": str(doc.pop("head_id")),
        "state": doc.pop("head_state"),
        "attempts": doc.pop("head_attempts"),
        "reason": doc.pop("head_reason"),
        "next_attempt_at": doc.pop("head_next_attempt_at"),
    }
    doc["before"], doc["after"] = int(doc["before"]), int(doc["after"])
    doc["is_head"] = doc["before"] == 0
    doc["head"] = None if doc["is_head"] else head
    return doc


def _key_parked(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "events": int(row["events"]),
        "oldest_at": row["oldest_at"],
        "head": {
            "message_id": str(row["head_id"]),
            "state": row["head_state"],
            "attempts": row["head_attempts"],
            "reason": row["head_reason"],
            "next_attempt_at": row["head_next_attempt_at"],
        },
    }


async def _delivery_state(nc: NatsClient, stream: str, consumer: str, seq: int) -> dict[str, Any]:
    """JetStream's view: not yet delivered, delivered and awaiting ack, or acknowledged."""
    try:
        info = await nc.jetstream().consumer_info(stream, consumer)
    except NOT_FOUND_ERRORS:
        return {"state": "no such consumer", "consumer": consumer}
    delivered = info.delivered.stream_seq if info.delivered else 0
    floor = info.ack_floor.stream_seq if info.ack_floor else 0
    if seq <= floor:
        state = "acknowledged"
    elif seq <= delivered:
        state = "delivered, not yet acknowledged (or acknowledged above the ack floor)"
    else:
        state = "pending (not delivered yet)"
    return {
        "state": state,
        "consumer": consumer,
        "consumer_delivered_seq": delivered,
        "consumer_ack_floor": floor,
        "num_pending": info.num_pending,
        "num_ack_pending": info.num_ack_pending,
    }
