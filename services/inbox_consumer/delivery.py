"""A fetched message as the consumer sees it: :class:`Delivery` and :func:`parse_delivery`.

Parsing never raises: a malformed message is not an error here, it becomes a delivery
carrying its ``poison`` (the dead-letter path records it with its reason), so it is never
lost and the rest of its batch goes on.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

from shared import telemetry
from shared.adapters.inbox import InboxEntry
from shared.domain.envelope import Envelope, Identified, identify
from shared.domain.errors import PoisonError
from shared.domain.ordering import split_partition
from shared.domain.ports import FetchedMessage
from shared.domain.subjects import REPLAY_PREFIX, REWIND_HEADER

log = logging.getLogger("ferry.inbox_consumer")

#: Largest message body the consumer parses (the default stream max_msg_size).
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
#: The reason code of a message whose handling raised something unexpected.
CONSUMER_ERROR = "CONSUMER_ERROR"
#: The decision code of a delivery that failed on its last attempt.
EXHAUSTED = "MAX_DELIVERIES_EXCEEDED"


@dataclass
class Delivery:
    """One fetched message and what we could learn from it."""

    msg: FetchedMessage
    message_id: uuid.UUID
    attempt: int
    stream_seq: int
    envelope: Envelope | None
    poison: PoisonError | None
    #: The ``process`` span while the delivery is handled (None when tracing is off).
    span: telemetry.Span | None = None

    @property
    def replay(self) -> bool:
        """Whether this is a dlq-replayer's (or operator's) replay of a dead letter."""
        return self.msg.subject.startswith(REPLAY_PREFIX + ".")

    @property
    def rewind(self) -> str | None:
        """The rewind id when this replay-path copy comes from ``ferry durable rewind`` (a
        re-delivery of the stream, not a dead letter's replay); on its span and log lines."""
        if not self.replay:
            return None
        return (self.msg.headers or {}).get(REWIND_HEADER) or None

    @cached_property
    def traceparent(self) -> str | None:
        """The W3C traceparent header, when well-formed: anything else (a NUL, 10 kB) is
        dropped here, before the inbox, the handler call or a dead letter refuses it.
        Read once (the inbox row, the call's headers and the log fields all ask)."""
        value = (self.msg.headers or {}).get("traceparent")
        return value.strip() if value and telemetry.parse_traceparent(value) else None

    @property
    def subject(self) -> str:
        """The event's own subject (a replay travels on the durable's replay subject)."""
        if self.replay and self.envelope is not None:
            return self.envelope.subject
        if self.replay:
            return self.msg.subject
        return split_partition(self.msg.subject)[0]

    @property
    def occurred_at(self) -> datetime | None:
        """The event's ``occurred_at`` (None for a message that could not be parsed)."""
        return self.envelope.occurred_at if self.envelope is not None else None

    def entry(self) -> InboxEntry:
        """The inbox row to record."""
        env = self.envelope
        return InboxEntry(
            message_id=self.message_id,
            subject=self.subject,
            event_type=env.event_type if env else None,
            event_version=env.event_version if env else None,
            occurred_at=env.occurred_at if env else None,
            stream_seq=self.stream_seq,
            traceparent=self.traceparent,
        )


def parse_delivery(msg: FetchedMessage, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Delivery:
    """Parse without raising: a defect is kept as ``poison`` for the dead-letter path.

    A body over ``max_bytes`` is not even parsed: it is poison ``MESSAGE_TOO_LARGE``. A
    body that makes parsing raise is poison ``CONSUMER_ERROR``, keyed like an unparseable
    one (its ``Nats-Msg-Id``, or its stream position), so the rest of its batch goes on.
    """
    meta = msg.metadata

    # A partitioned stream's subject carries the partition as its last token; the
    # envelope's own subject does not (shared.domain.ordering).
    subject = msg.subject
    if not subject.startswith(REPLAY_PREFIX + "."):
        subject = split_partition(subject)[0]

    def identified(data: bytes) -> Identified:
        return identify(
            data,
            subject=subject,
            msg_id_header=(msg.headers or {}).get("Nats-Msg-Id"),
            stream=meta.stream,
            seq=meta.sequence.stream,
        )

    size, problem = len(msg.data), None
    if size > max_bytes:
        problem = PoisonError("MESSAGE_TOO_LARGE", f"{size} bytes exceeds {max_bytes}")
    else:
        try:
            found = identified(msg.data)
        except Exception as exc:
            log.error("could not parse a message: %r", exc, exc_info=exc)
            detail = f"parsing raised {type(exc).__name__}: {exc}"[:500]
            problem = PoisonError(CONSUMER_ERROR, detail)
    if problem is not None:
        found = Identified(identified(b"").message_id, None, problem)
    seq = meta.sequence.stream
    return Delivery(msg, found.message_id, meta.num_delivered, seq, found.envelope, found.poison)


def attempt_of(msg: FetchedMessage) -> int:
    """The delivery count of a message (1 when its metadata cannot be read)."""
    try:
        return int(msg.metadata.num_delivered)
    except Exception:
        return 1
