"""AsyncAPI 3.0 document of a topology: what travels on which NATS subject, and who reads it.

Built from a loaded topology (its events come from the registry), so it says what the
deployment does, not only what the manifests declare:

* **channels**: one per published event version, its ``address`` the JetStream subject
  ``{namespace}.{type}.v{n}``; on a partitioned stream the publisher appends the partition
  of the event's ordering key, so the address ends in ``.{partition}``, a parameter whose
  values are the stream's partitions;
* **messages**: the envelope every message body is (SDS-047 §12: ids, subject, type and
  version, times, aggregate, correlation, digest) with the event's payload schema (JSON
  Schema draft 2020-12, as the manifest declares it) in ``payload``, and the NATS headers
  the publisher sets;
* **operations**: ``send`` by the producing context (its outbox-publisher), and ``receive``
  for every durable that delivers the event to a handling context, with the handler it
  calls, its ordering and its replay policy under ``x-ferry``;
* **servers**: the NATS servers (``FERRY_NATS_URL``), protocol ``nats``.

The document is deterministic for a given topology, registry and server list.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any
from urllib.parse import urlsplit

from shared.contracts.topology import EventSpec, Topology
from shared.domain.envelope import REQUIRED_FIELDS
from shared.domain.subjects import replay_subject

#: The AsyncAPI version of the documents written here.
ASYNCAPI_VERSION = "3.0.0"
#: How a message's payload schema is tagged: the manifests' dialect.
SCHEMA_FORMAT = "application/schema+json;version=draft-2020-12"
DIALECT = "https://json-schema.org/draft/2020-12/schema"

Doc = dict[str, Any]

#: The envelope's fields other than ``payload`` (shared/domain/envelope.py).
_ENVELOPE_FIELDS: dict[str, Doc] = {
    "message_id": {
        "type": "string",
        "format": "uuid",
        "description": "The event's id (also the Nats-Msg-Id header): duplicates share it.",
    },
    "subject": {"type": "string", "description": "The subject the event was published on."},
    "context": {"type": "string", "description": "The producing context."},
    "event_type": {"type": "string"},
    "event_version": {"type": "integer", "minimum": 1},
    "occurred_at": {
        "type": "string",
        "format": "date-time",
        "description": "When the event happened (RFC 3339, UTC).",
    },
    "correlation_id": {"type": ["string", "null"]},
    "causation_id": {"type": ["string", "null"]},
    "aggregate_type": {"type": "string"},
    "aggregate_id": {"type": "string"},
    "payload_digest": {
        "type": "string",
        "pattern": "^sha256:[0-9a-f]{64}$",
        "description": "sha256 of the payload's canonical JSON (sorted keys, no spaces).",
    },
}


def asyncapi_document(topology: Topology, *, servers: list[str] | None = None) -> Doc:
    """The AsyncAPI 3.0 document of ``topology`` (with its events attached)."""
    channels: Doc = {}
    operations: Doc = {}
    messages: Doc = {}
    schemas: Doc = {}
    for event in sorted(topology.events, key=lambda e: (e.context, e.type, e.version)):
        channel_id = _channel_id(topology, event)
        message_id = f"{event.context}.{event.name}"
        schemas[f"{message_id}.payload"] = _payload_schema(event)
        messages[message_id] = _message(topology, event, message_id)
        channels[channel_id] = _channel(topology, event, message_id)
        reference = [{"$ref": f"#/channels/{channel_id}/messages/{message_id}"}]
        operations[f"{event.context}.send.{event.name}"] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{channel_id}"},
            "messages": reference,
            "title": f"{event.context} publishes {event.name}",
            "description": (
                f"Recorded in context {event.context}'s outbox in the transaction of its "
                "change and published by its outbox-publisher (at least once; duplicates "
                "share the message_id)."
            ),
        }
        for durable in event.handled_by:
            operations[f"{durable}.receive.{event.name}"] = _receive(
                topology, durable, event, channel_id, reference
            )
    doc: Doc = {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": f"Ferry topology {topology.name}",
            "version": _version(topology),
            "description": (
                f"The events of topology {topology.name} as they travel on NATS JetStream: "
                "each message body is Ferry's envelope with the event's payload. Generated "
                "by `ferry asyncapi` from the topology file and the registry; do not edit."
            ),
        },
        "defaultContentType": "application/json",
    }
    if servers:
        doc["servers"] = _servers(servers)
    doc["channels"] = channels
    doc["operations"] = operations
    doc["components"] = {"messages": messages, "schemas": schemas}
    return doc


def _version(topology: Topology) -> str:
    """A version that changes when any event's subject or schema does."""
    pairs = sorted(
        (f"{topology.contexts[e.context].namespace}.{e.name}", e.fingerprint)
        for e in topology.events
    )
    digest = hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:12]
    return f"{len(pairs)} event versions, {digest}"


def _servers(urls: list[str]) -> Doc:
    out: Doc = {}
    for index, url in enumerate(urls):
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        host = parts.hostname or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        port = parts.port or 4222
        out[f"nats-{index}" if len(urls) > 1 else "nats"] = {
            "host": f"{host}:{port}",
            "protocol": "nats",
            "description": "A NATS server with JetStream (FERRY_NATS_URL).",
        }
    return out


def _subject(topology: Topology, event: EventSpec) -> str:
    return f"{topology.contexts[event.context].namespace}.{event.name}"


def _partitions(topology: Topology, event: EventSpec) -> int:
    stream = topology.contexts[event.context].stream
    return stream.partitions if stream is not None else 1


def _channel_id(topology: Topology, event: EventSpec) -> str:
    return _subject(topology, event)


def _channel(topology: Topology, event: EventSpec, message_id: str) -> Doc:
    subject = _subject(topology, event)
    stream = topology.contexts[event.context].stream
    partitions = _partitions(topology, event)
    channel: Doc = {
        "address": subject + (".{partition}" if partitions > 1 else ""),
        "title": event.name,
        "description": (
            f"{event.type} v{event.version} of context {event.context}"
            + (f", on stream {stream.name}" if stream is not None else "")
            + "."
        ),
        "messages": {message_id: {"$ref": f"#/components/messages/{message_id}"}},
    }
    if partitions > 1:
        key = f"payload field {event.ordering_key}" if event.ordering_key else "its aggregate"
        channel["parameters"] = {
            "partition": {
                "description": (
                    f"The partition of the event's ordering key ({key}) among the stream's "
                    f"{partitions}: an ordered durable reads each partition with one replica."
                ),
                "enum": [str(k) for k in range(partitions)],
            }
        }
    return channel


def _payload_schema(event: EventSpec) -> Doc:
    schema = copy.deepcopy(event.payload_schema or {"type": "object"})
    schema.pop("$schema", None)  # embedded in the envelope: the dialect is the document's
    return schema


def _message(topology: Topology, event: EventSpec, message_id: str) -> Doc:
    envelope: Doc = {
        "$schema": DIALECT,
        "type": "object",
        "required": list(REQUIRED_FIELDS),
        "properties": {
            **copy.deepcopy(_ENVELOPE_FIELDS),
            "payload": _payload_schema(event),
        },
    }
    envelope["properties"]["event_type"]["const"] = event.type
    envelope["properties"]["event_version"]["const"] = event.version
    envelope["properties"]["context"]["const"] = event.context
    headers: Doc = {
        "Nats-Msg-Id": {
            "type": "string",
            "description": "The message_id: JetStream drops a re-publish within the window.",
        },
        "traceparent": {"type": "string", "description": "W3C trace context, when traced."},
    }
    if _partitions(topology, event) > 1:
        headers["Ferry-Ordering-Key"] = {
            "type": "string",
            "description": "The event's ordering key, whose partition ends the subject.",
        }
    message: Doc = {
        "name": event.name,
        "title": f"{event.type} v{event.version}",
        "contentType": "application/json",
        "headers": {"type": "object", "properties": headers, "required": ["Nats-Msg-Id"]},
        "payload": {"schemaFormat": SCHEMA_FORMAT, "schema": envelope},
        "correlationId": {"location": "$message.payload#/correlation_id"},
        "x-ferry": {
            "fingerprint": event.fingerprint,
            "manifest": event.manifest,
        },
    }
    if event.ordering_key:
        message["x-ferry"]["ordering_key"] = event.ordering_key
    if event.description:
        message["summary"] = event.description
    return message


def _receive(
    topology: Topology,
    durable: str,
    event: EventSpec,
    channel_id: str,
    reference: list[Doc],
) -> Doc:
    spec = topology.durables[durable]
    ordered = spec.ordering == "key" and _partitions(topology, event) > 1
    extra: Doc = {
        "durable": durable,
        "stream": spec.stream,
        "target": spec.target,
        "handler": event.handlers.get(spec.target, ""),
        "handler_url": spec.handler.url,
        "ordering": spec.ordering,
        "replay": spec.replay,
        "replay_subject": replay_subject(spec.stream, durable),
        "dead_letter_subject": spec.dead_letter_subject,
    }
    if ordered:
        extra["consumers"] = [plan.name for plan in topology.consumers(durable)]
    return {
        "action": "receive",
        "channel": {"$ref": f"#/channels/{channel_id}"},
        "messages": reference,
        "title": f"{durable} delivers {event.name} to {spec.target}",
        "description": (
            f"JetStream durable {durable} on stream {spec.stream}: its inbox-consumer stores "
            f"each message in context {spec.target}'s inbox and POSTs the envelope to "
            f"{spec.handler.url} (at least once, processed once per message_id)"
            + ("; one replica per partition, in order per ordering key" if ordered else "")
            + "."
        ),
        "x-ferry": extra,
    }
