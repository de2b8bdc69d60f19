"""One outbox row as its JetStream message: subject, envelope body and headers.

Pure (no I/O): the publisher builds every row it sends with :func:`build_message`, the
atomic-batch path and the one-by-one waves alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import quote

from shared.contracts.topology import Topology
from shared.domain.envelope import Envelope, payload_digest
from shared.domain.ordering import (
    OrderingKeyError,
    ordering_key,
    partition_of,
    partitioned_subject,
)
from shared.domain.ports import OutboxRecord
from shared.domain.subjects import event_subject

#: Informational header: the event's ordering key (percent-encoded, at most this long).
ORDERING_KEY_HEADER = "Ferry-Ordering-Key"
ORDERING_KEY_HEADER_MAX = 256
#: The ordering-key field of each (event type, version) a context publishes (None: the
#: aggregate); events missing from it are keyed by their aggregate.
OrderingFields = Mapping[tuple[str, int], str | None]


def ordering_fields_of(topology: Topology, context: str) -> dict[tuple[str, int], str | None]:
    """The ordering-key field of each event ``context`` publishes (None: the aggregate)."""
    return {(e.type, e.version): e.ordering_key for e in topology.events if e.context == context}


def build_message(
    row: OutboxRecord,
    *,
    namespace: str,
    context: str,
    partitions: int = 1,
    ordering_fields: OrderingFields | None = None,
) -> tuple[str, bytes, dict[str, str]]:
    """Subject, body and headers of one row's JetStream message.

    On a partitioned stream (``partitions`` > 1) the subject ends in the partition of the
    event's ordering key (:func:`shared.domain.ordering.partition_of`); the envelope's own
    ``subject`` stays without it. A row whose key field is missing raises
    :class:`OrderingKeyError` (the publisher sets it aside: ``ORDERING_KEY_MISSING``).
    """
    subject = str(event_subject(namespace, row.event_type, row.event_version))
    payload = json.loads(row.payload)
    field = (ordering_fields or {}).get((row.event_type, row.event_version))
    key_doc = {
        "aggregate_type": row.aggregate_type,
        "aggregate_id": row.aggregate_id,
        "payload": payload,
    }
    try:
        key: str | None = ordering_key(key_doc, field)
    except OrderingKeyError:
        if partitions > 1:
            raise
        key = None  # one partition: the key only labels the message
    envelope = Envelope(
        message_id=str(row.id),
        subject=subject,
        context=context,
        event_type=row.event_type,
        event_version=row.event_version,
        occurred_at=row.occurred_at,
        aggregate_type=row.aggregate_type,
        aggregate_id=row.aggregate_id,
        payload=payload,
        correlation_id=str(row.correlation_id) if row.correlation_id else None,
        causation_id=str(row.causation_id) if row.causation_id else None,
        payload_digest=payload_digest(payload),
    )
    headers = {"Nats-Msg-Id": str(row.id)}
    if row.traceparent:
        headers["traceparent"] = row.traceparent
    if row.tracestate:
        headers["tracestate"] = row.tracestate
    wire_subject = subject
    if key is not None:
        headers[ORDERING_KEY_HEADER] = quote(key, safe="/:@-._~")[:ORDERING_KEY_HEADER_MAX]
        if partitions > 1:
            wire_subject = partitioned_subject(subject, partition_of(key, partitions))
    return wire_subject, envelope.to_wire(), headers


__all__ = [
    "ORDERING_KEY_HEADER",
    "ORDERING_KEY_HEADER_MAX",
    "OrderingFields",
    "build_message",
    "ordering_fields_of",
]
