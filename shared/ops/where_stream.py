"""``ferry where``'s stream lookups: the subject the event was published on and where
JetStream stored it, by an inbox row's sequence or a scan (see :mod:`shared.ops.where`)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

from shared.adapters.jetstream import NOT_FOUND_ERRORS, from_time
from shared.adapters.nats import NatsClient
from shared.contracts.topology import Topology
from shared.domain.subjects import event_subject

#: Most stream messages read while looking for an event no inbox row locates.
SCAN_LIMIT = 20_000
#: How far before the publish time the scan starts (clocks of two machines).
SCAN_SLACK = timedelta(seconds=30)
#: The informational header the publisher puts the (percent-encoded) ordering key in.
ORDERING_KEY_HEADER = "Ferry-Ordering-Key"


def subject_of(topology: Topology, outbox: dict[str, Any] | None, inbox: dict[str, Any]) -> str:
    """The subject the event was published on: from its outbox row, else an inbox row's."""
    if outbox is not None and outbox["context"] is not None:
        namespace = topology.context(outbox["context"]).namespace
        return str(event_subject(namespace, outbox["event_type"], outbox["event_version"]))
    return next((row["subject"] for row in inbox.values()), "")


async def locate(
    nc: NatsClient,
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
    subject = subject_of(topology, outbox, inbox)
    for durable, row in inbox.items():
        stream = topology.durables[durable].stream if durable in topology.durables else None
        if stream is None or row["stream_seq"] is None:
            continue
        try:
            msg = await js.get_msg(stream, row["stream_seq"])
        except NOT_FOUND_ERRORS:
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
    nc: NatsClient, stream: str, subject: str, published_at: datetime, message_id: uuid.UUID
) -> dict[str, Any] | None:
    """Read ``subject`` from shortly before the publish time until the event turns up."""
    js = nc.jetstream()
    start = (published_at - SCAN_SLACK).astimezone(UTC)
    config = from_time(start, headers_only=True)
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
