"""``ferry where MESSAGE_ID``: every hop of one event, from the outbox to its handlers.

Read-only, across every database and stream of the topology:

1. **outbox** — which context recorded it, when, whether and when it was published, after
   how many attempts, the last publish error;
2. **stream** — the stream, sequence and time JetStream stored it at (found through an
   inbox row's sequence, else by scanning the stream from the publish time);
3. per **durable** whose filters take the subject (:meth:`Topology.delivers`, partition
   tokens included) — JetStream's delivery state (pending, delivered, acknowledged; on the
   consumer of the event's partition for an ordered durable), the inbox row (status,
   attempts, last error, handler status, retry history, duplicates), the handler's own
   call ledger where the example handler services keep one, and the **dead letter** with
   its replays and operator actions;
4. per durable declared ``ordering: key`` — the event's **ordering key** (read from the
   outbox row, else the stored message, else its parked row), its **partition** on a
   partitioned stream, and, while it is parked (``parked_messages``), its state (queued,
   retrying, held), attempts, next attempt, how many of its key's parked messages are
   before and after it and the head it waits behind; an event not parked itself whose key
   is shows the key's head;
5. the **trace id** (with a link when ``FERRY_TRACE_URL_TEMPLATE`` is set).

Exit codes: 0 found, 1 the id is nowhere in this topology.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

from nats.aio.client import Client as NATS
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from shared.adapters import dead_letters, parking
from shared.adapters.nats import connect_nats
from shared.adapters.postgres import Conn, connect
from shared.contracts.topology import DurableSpec, Topology
from shared.domain.ordering import (
    OrderingKeyError,
    consumer_name,
    ordering_key,
    partition_of,
    split_partition,
)
from shared.domain.subjects import event_subject
from shared.runtime.settings import CommonSettings
from shared.telemetry import parse_traceparent

Command = Callable[[CommonSettings, argparse.Namespace], Coroutine[Any, Any, int]]

#: Most stream messages read while looking for an event no inbox row locates.
SCAN_LIMIT = 20_000
#: How far before the publish time the scan starts (clocks of two machines).
SCAN_SLACK = timedelta(seconds=30)
#: The informational header the publisher puts the (percent-encoded) ordering key in.
ORDERING_KEY_HEADER = "Ferry-Ordering-Key"

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
       traceparent, lease_owner, lease_until, updated_at
FROM inbox_messages WHERE message_id = $1 ORDER BY durable
"""

_DEAD = """
SELECT durable, status, reason_code, last_error, attempts, source, generation, stream,
       stream_seq, dlq_subject, first_dead_lettered_at, dead_lettered_at, replay_attempts,
       next_replay_at, last_replay_at, replayed_at, replay_history, traceparent
FROM dead_letters WHERE message_id = $1 ORDER BY durable
"""

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

_CALLS = """
SELECT handler, attempt, status, called_at FROM handler_calls
WHERE message_id = $1 ORDER BY called_at, id
"""


def add_where_command(sub: Any) -> None:
    """Register ``ferry where`` on the ``ferry`` parser's subcommands."""
    where = sub.add_parser(
        "where", help="every hop of one event: outbox, stream, deliveries, inbox, dead letter"
    )
    where.add_argument("message_id", type=_message_id, help="the event id (= Nats-Msg-Id)")
    where.add_argument("--json", action="store_true", help="machine-readable output")
    where.set_defaults(func=cmd_where)


def _message_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a message id (UUID)") from None


async def cmd_where(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Find the event everywhere; print the journey."""
    topology = settings.load_topology()
    doc = await journey(settings, topology, args.message_id)
    print(json.dumps(doc, indent=2, default=str) if args.json else render(doc))
    return 0 if doc["found"] else 1


async def journey(settings: CommonSettings, topology: Topology, message_id: uuid.UUID) -> Any:
    """Everything known about ``message_id`` in ``topology``, as a JSON-able document."""
    doc: dict[str, Any] = {"message_id": str(message_id), "topology": topology.name}
    rows = await _database_rows(settings, topology, message_id)
    doc["outbox"] = rows["outbox"]
    nc = await connect_nats(
        settings.nats_servers(), name="ferry-where", auth=settings.nats_auth(), give_up_after=10
    )
    try:
        doc["stream"] = await _locate(nc, topology, doc["outbox"], rows, message_id)
        doc["durables"] = await _durables(settings, nc, topology, doc, rows)
    finally:
        await nc.close()
    doc["trace"] = _trace(settings, doc, rows)
    doc["found"] = bool(doc["outbox"] or rows["inbox"] or rows["dead"] or doc["stream"])
    return doc


async def _database_rows(
    settings: CommonSettings, topology: Topology, message_id: uuid.UUID
) -> dict[str, Any]:
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


def _subject(topology: Topology, outbox: dict[str, Any] | None, inbox: dict[str, Any]) -> str:
    if outbox is not None and outbox["context"] is not None:
        namespace = topology.context(outbox["context"]).namespace
        return str(event_subject(namespace, outbox["event_type"], outbox["event_version"]))
    return next((row["subject"] for row in inbox.values()), "")


async def _locate(
    nc: NATS,
    topology: Topology,
    outbox: dict[str, Any] | None,
    rows: dict[str, Any],
    message_id: uuid.UUID,
) -> dict[str, Any] | None:
    """Where JetStream stored the event: by an inbox row's sequence, else by a scan.

    What the stored message says of the event (its envelope, its ordering-key header) is
    kept in ``rows["wire"]``: the ordering key of an event no outbox of the topology holds.
    """
    js = nc.jetstream()
    inbox = rows["inbox"]
    subject = _subject(topology, outbox, inbox)
    for durable, row in inbox.items():
        stream = topology.durables[durable].stream if durable in topology.durables else None
        if stream is None or row["stream_seq"] is None:
            continue
        try:
            msg = await js.get_msg(stream, row["stream_seq"])
        except NotFoundError:
            continue
        if _is(msg.headers, msg.data, message_id) and not (msg.subject or "").startswith(
            "ferry.replay."
        ):
            rows["wire"] = _wire(msg.headers, msg.data)
            return _stored(stream, msg.seq, msg.subject, msg.time, msg.headers)
    if outbox is None or outbox["published_at"] is None or outbox["context"] is None:
        return None
    spec = topology.context(outbox["context"]).stream
    if spec is None:
        return None
    # A partitioned stream's subjects end in the partition token.
    pattern = subject if spec.partitions == 1 else f"{subject}.*"
    stored = await _scan(nc, spec.name, pattern, outbox["published_at"], message_id)
    if stored is not None:
        rows["wire"] = _wire(stored.pop("headers"), None)
    return stored


def _wire(headers: dict[str, str] | None, data: bytes | None) -> dict[str, Any]:
    """The stored message's envelope (None without its body) and ordering-key header."""
    envelope = None
    if data:
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = None
        envelope = parsed if isinstance(parsed, dict) else None
    header = (headers or {}).get(ORDERING_KEY_HEADER)
    return {"envelope": envelope, "key_header": unquote(header) if header else None}


def _is(headers: dict[str, str] | None, data: bytes | None, message_id: uuid.UUID) -> bool:
    if (headers or {}).get("Nats-Msg-Id") == str(message_id):
        return True
    try:
        return bool(json.loads(data or b"{}").get("message_id") == str(message_id))
    except (ValueError, AttributeError):
        return False


def _stored(stream: str, seq: Any, subject: Any, at: Any, headers: Any) -> dict[str, Any]:
    return {
        "stream": stream,
        "sequence": seq,
        "subject": subject,
        "stored_at": at,
        "traceparent": (headers or {}).get("traceparent"),
    }


async def _scan(
    nc: NATS, stream: str, subject: str, published_at: datetime, message_id: uuid.UUID
) -> dict[str, Any] | None:
    """Read ``subject`` from shortly before the publish time until the event turns up."""
    js = nc.jetstream()
    start = (published_at - SCAN_SLACK).astimezone(UTC)
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_TIME,
        opt_start_time=start,
        headers_only=True,
    )
    sub = await js.subscribe(subject, stream=stream, ordered_consumer=True, config=config)
    try:
        for _ in range(SCAN_LIMIT):
            try:
                msg = await sub.next_msg(timeout=2.0)
            except TimeoutError:
                return None
            if (msg.headers or {}).get("Nats-Msg-Id") == str(message_id):
                meta = msg.metadata
                stored = _stored(stream, meta.sequence.stream, msg.subject, meta.timestamp,
                                 msg.headers)  # fmt: skip
                stored["headers"] = dict(msg.headers or {})
                return stored
            if meta_after(msg, published_at):
                return None
    finally:
        await sub.unsubscribe()
    return None


def meta_after(msg: Any, published_at: datetime) -> bool:
    """Past the publish time by more than the slack: the event is not in the stream."""
    stamp = msg.metadata.timestamp
    return bool(stamp is not None and stamp > published_at + SCAN_SLACK)


async def _durables(
    settings: CommonSettings,
    nc: NATS,
    topology: Topology,
    doc: dict[str, Any],
    rows: dict[str, Any],
) -> list[dict[str, Any]]:
    """Per durable that delivers the event (or holds a row of it): what happened there."""
    subject = _subject(topology, doc["outbox"], rows["inbox"])
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
        out.append(entry)
    return out


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
            heads = await parking.keys(conn, durable, key, 1)
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


async def _delivery_state(nc: NATS, stream: str, consumer: str, seq: int) -> dict[str, Any]:
    """JetStream's view: not yet delivered, delivered and awaiting ack, or acknowledged."""
    try:
        info = await nc.jetstream().consumer_info(stream, consumer)
    except NotFoundError:
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


def _trace(settings: CommonSettings, doc: dict[str, Any], rows: dict[str, Any]) -> Any:
    candidates = [
        (doc["outbox"] or {}).get("traceparent"),
        *(r.get("traceparent") for r in rows["inbox"].values()),
        *(r.get("traceparent") for r in rows["dead"].values()),
        (doc["stream"] or {}).get("traceparent"),
    ]
    for traceparent in candidates:
        ids = parse_traceparent(traceparent)
        if ids is not None:
            trace: dict[str, Any] = {"trace_id": ids[0], "traceparent": traceparent}
            if settings.trace_url_template:
                trace["url"] = settings.trace_url_template.replace("{trace_id}", ids[0])
            return trace
    return None


# --------------------------------------------------------------------------- human output


def render(doc: dict[str, Any]) -> str:
    """The journey as numbered hops, one fact per line."""
    if not doc["found"]:
        return (
            f"{doc['message_id']}: not found in any outbox, stream, inbox or dead-letter "
            f"table of topology {doc['topology']}"
        )
    lines = [f"message {doc['message_id']} (topology {doc['topology']})"]
    lines += _render_outbox(doc["outbox"])
    lines += _render_stream(doc["stream"])
    for entry in doc["durables"]:
        lines += _render_durable(doc["message_id"], entry)
    trace = doc["trace"]
    lines.append(
        "trace    " + (f"{trace['trace_id']}" + (f"  {trace['url']}" if "url" in trace else ""))
        if trace
        else "trace    none recorded (no traceparent on any hop)"
    )
    return "\n".join(lines)


def _render_outbox(outbox: dict[str, Any] | None) -> list[str]:
    if outbox is None:
        return ["outbox   not in any outbox of this topology (published by another producer?)"]
    head = (
        f"outbox   {outbox['context']}: {outbox['event_type']}.v{outbox['event_version']} "
        f"of {outbox['aggregate_type']}/{outbox['aggregate_id']}, recorded {outbox['recorded_at']}"
    )
    if outbox["published_at"] is not None:
        state = (
            f"         published {outbox['published_at']} after "
            f"{outbox['publish_attempts']} attempt(s)"
        )
    elif outbox.get("set_aside_at") is not None:
        state = (
            f"         SET ASIDE {outbox['set_aside_at']} ({outbox['set_aside_reason']}) after "
            f"{outbox['publish_attempts']} attempt(s): {outbox['publish_error']}; an operator "
            f"republishes it with ferry outbox republish --context {outbox['context']} "
            f"--id ID --reason ..."
        )
    else:
        state = f"         NOT PUBLISHED yet: {outbox['publish_attempts']} attempt(s)"
        if outbox["publish_error"]:
            state += f", last error: {outbox['publish_error']}"
        if outbox.get("behind_seq") is not None:
            state += (
                f"; waits behind outbox row #{outbox['behind_seq']} of its aggregate, "
                "failing or set aside (ferry outbox list --failed)"
            )
    return [head, state]


def _render_stream(stored: dict[str, Any] | None) -> list[str]:
    if stored is None:
        return ["stream   not found in the stream"]
    return [
        f"stream   {stored['stream']} #{stored['sequence']} on {stored['subject']}, "
        f"stored {stored['stored_at']}"
    ]


def _render_durable(message_id: str, entry: dict[str, Any]) -> list[str]:
    lines = [f"durable  {entry['durable']} (→ {entry['target']})"]
    if "delivery" in entry:
        delivery = entry["delivery"]
        via = delivery.get("consumer")
        on = f" (consumer {via})" if via and via != entry["durable"] else ""
        lines.append(f"         jetstream{on}: {delivery['state']}")
    if entry.get("ordering") is not None:
        lines += _render_ordering(entry["durable"], message_id, entry["ordering"])
    row = entry["inbox"]
    if row is None:
        lines.append("         inbox: no row yet (not received)")
    else:
        lines.append(
            f"         inbox: {row['status']}, {row['attempts']} attempt(s), received "
            f"{row['received_at']}, processed {row['processed_at'] or '-'}, handler status "
            f"{row['handler_status'] or '-'}, duplicates {row['duplicates']}"
        )
        if row["last_error"]:
            lines.append(f"         last error: {row['reason_code'] or ''} {row['last_error']}")
        for step in row["retry_history"] or []:
            lines.append(
                f"           attempt {step.get('attempt')}: {step.get('reason')} "
                f"({step.get('status') or '-'}) at {step.get('at')}"
            )
    for call in entry["handler_calls"]:
        lines.append(
            f"         handler call: attempt {call['attempt']} → {call['status']} at "
            f"{call['called_at']}"
        )
    lines += _render_dead(entry["dead_letter"])
    return lines


def _render_ordering(durable: str, message_id: str, ordering: dict[str, Any]) -> list[str]:
    """The key, the partition and the event's place in its key's parked queue."""
    if ordering["key"] is None:
        key = f"key unknown ({ordering['key_error']})"
    else:
        of = f"payload field {ordering['key_field']}" if ordering["key_field"] else "aggregate"
        key = f"key {ordering['key']} ({of})"
    where = ""
    if ordering["partition"] is not None:
        where = f", partition {ordering['partition']} of {ordering['partitions']}"
    lines = [f"         ordering: {key}{where}, on_dead_letter {ordering['on_dead_letter']}"]
    parked = ordering["parked"]
    if parked is not None:
        state = f"         parked: {parked['state']}, {parked['attempts']} attempt(s)"
        if parked["state"] != "held":  # a held head is never tried until an operator acts
            state += f", next attempt {parked['next_attempt_at']}"
        state += f", since {parked['parked_at']}"
        if parked["reason"]:
            state += f", reason {_short(parked['reason'])}"
        lines.append(state)
        if parked["is_head"]:
            lines.append(
                f"         the head of its key: {parked['after']} parked event(s) wait behind it"
            )
        else:
            head = parked["head"]
            lines.append(
                f"         waits behind {parked['before']} parked event(s) of its key "
                f"({parked['after']} behind it); the head {head['message_id']} is "
                f"{head['state']} x{head['attempts']}: {_short(head['reason']) or '-'}"
            )
        head_id = message_id if parked["is_head"] else parked["head"]["message_id"]
        if (parked if parked["is_head"] else parked["head"])["state"] == "held":
            lines.append(
                f"         the held head waits for an operator: ferry dlq replay {durable} "
                f"{head_id} --reason ..., or ferry parked discard --durable {durable} "
                f"--key {ordering['key']} --reason ..."
            )
    elif ordering["key_parked"] is not None:
        waiting = ordering["key_parked"]
        head = waiting["head"]
        lines.append(
            f"         not parked itself; its key has {waiting['events']} parked event(s) now, "
            f"head {head['message_id']} {head['state']} x{head['attempts']}: "
            f"{_short(head['reason']) or '-'}"
        )
    return lines


def _short(text: Any, width: int = 120) -> str:
    return " ".join(str(text or "").split())[:width]


def _render_dead(dead: dict[str, Any] | None) -> list[str]:
    if dead is None:
        return []
    lines = [
        f"         dead letter: {dead['status']} ({dead['reason_code']}: {dead['last_error']}), "
        f"via {dead['source']}, {dead['dlq_subject']}, generation {dead['generation']}, "
        f"replays {dead['replay_attempts']}"
    ]
    for event in dead["replay_history"] or []:
        lines.append(
            f"           {event.get('event')} at {event.get('at')}: {event.get('reason')} "
            f"{event.get('detail') or ''}".rstrip()
        )
    for action in dead["actions"]:
        lines.append(
            f"           action {action['action']} by {action['actor']} at {action['at']}: "
            f"{action['reason']}"
        )
    return lines
