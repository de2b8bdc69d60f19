"""``ferry where MESSAGE_ID``: every hop of one event, from the outbox to its handlers.

Read-only, across every database and stream of the topology:

1. **outbox** — which context recorded it, when, whether and when it was published, after
   how many attempts, the last publish error;
2. **stream** — the stream, sequence and time JetStream stored it at (found through an
   inbox row's sequence, else by scanning the stream from the publish time);
3. per **durable** whose filter covers the subject — JetStream's delivery state (pending,
   delivered, acknowledged), the inbox row (status, attempts, last error, handler status,
   retry history, duplicates), the handler's own call ledger where the example handler
   services keep one, and the **dead letter** with its replays and operator actions;
4. the **trace id** (with a link when ``FERRY_TRACE_URL_TEMPLATE`` is set).

Exit codes: 0 found, 1 the id is nowhere in this topology.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.client import Client as NATS
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from shared.adapters import dead_letters
from shared.adapters.nats import connect_nats
from shared.adapters.postgres import Conn, connect
from shared.contracts.topology import Topology, subject_matches
from shared.domain.subjects import event_subject
from shared.runtime.settings import CommonSettings
from shared.telemetry import parse_traceparent

Command = Callable[[CommonSettings, argparse.Namespace], Coroutine[Any, Any, int]]

#: Most stream messages read while looking for an event no inbox row locates.
SCAN_LIMIT = 20_000
#: How far before the publish time the scan starts (clocks of two machines).
SCAN_SLACK = timedelta(seconds=30)

_OUTBOX = """
SELECT seq, aggregate_type, aggregate_id, event_type, event_version, occurred_at, recorded_at,
       published_at, publish_attempts, publish_error, last_attempt_at, correlation_id,
       causation_id, traceparent, set_aside_at, set_aside_reason,
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
        doc["stream"] = await _locate(nc, topology, doc["outbox"], rows["inbox"], message_id)
        doc["durables"] = await _durables(nc, topology, doc, rows)
    finally:
        await nc.close()
    doc["trace"] = _trace(settings, doc, rows)
    doc["found"] = bool(doc["outbox"] or rows["inbox"] or rows["dead"] or doc["stream"])
    return doc


async def _database_rows(
    settings: CommonSettings, topology: Topology, message_id: uuid.UUID
) -> dict[str, Any]:
    found: dict[str, Any] = {"outbox": None, "inbox": {}, "dead": {}, "calls": {}}
    owners = {ctx.database: name for name, ctx in topology.contexts.items()}
    for database in topology.databases():
        conn = await connect(settings.dsn(database))
        try:
            outbox = await conn.fetchrow(_OUTBOX, message_id)
            if outbox is not None:
                found["outbox"] = {"context": owners.get(database), **_plain(outbox)}
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
    return [_plain(r) for r in await conn.fetch(_CALLS, message_id)]


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
    inbox: dict[str, Any],
    message_id: uuid.UUID,
) -> dict[str, Any] | None:
    """Where JetStream stored the event: by an inbox row's sequence, else by a scan."""
    js = nc.jetstream()
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
            return _stored(stream, msg.seq, msg.subject, msg.time, msg.headers)
    if outbox is None or outbox["published_at"] is None or outbox["context"] is None:
        return None
    spec = topology.context(outbox["context"]).stream
    if spec is None:
        return None
    return await _scan(nc, spec.name, subject, outbox["published_at"], message_id)


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
                return _stored(stream, meta.sequence.stream, msg.subject, meta.timestamp,
                               msg.headers)  # fmt: skip
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
    nc: NATS, topology: Topology, doc: dict[str, Any], rows: dict[str, Any]
) -> list[dict[str, Any]]:
    """Per durable that delivers the event (or holds a row of it): what happened there."""
    subject = _subject(topology, doc["outbox"], rows["inbox"])
    stored = doc["stream"]
    out = []
    for name, spec in sorted(topology.durables.items()):
        covers = (
            any(subject_matches(f, subject) for f in spec.filter_subjects) if subject else False
        )
        if not (covers or name in rows["inbox"] or name in rows["dead"]):
            continue
        entry: dict[str, Any] = {"durable": name, "stream": spec.stream, "target": spec.target}
        if stored is not None and stored["stream"] == spec.stream:
            entry["delivery"] = await _delivery_state(nc, spec.stream, name, stored["sequence"])
        entry["inbox"] = rows["inbox"].get(name)
        entry["dead_letter"] = rows["dead"].get(name)
        database = topology.context(spec.target).database
        entry["handler_calls"] = [
            c for c in rows["calls"].get(database, []) if c["handler"] == spec.target
        ]
        out.append(entry)
    return out


async def _delivery_state(nc: NATS, stream: str, durable: str, seq: int) -> dict[str, Any]:
    """JetStream's view: not yet delivered, delivered and awaiting ack, or acknowledged."""
    try:
        info = await nc.jetstream().consumer_info(stream, durable)
    except NotFoundError:
        return {"state": "no such consumer"}
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
        lines += _render_durable(entry)
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


def _render_durable(entry: dict[str, Any]) -> list[str]:
    lines = [f"durable  {entry['durable']} (→ {entry['target']})"]
    if "delivery" in entry:
        lines.append(f"         jetstream: {entry['delivery']['state']}")
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
