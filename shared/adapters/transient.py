"""What a role that talks to PostgreSQL and JetStream treats as transient: the one list.

The dlq-router nak's an advisory that fails with one of these (it comes back; nothing is
lost), the dlq-replayer leaves a replay unconfirmed and publishes it again on a later
scan. Anything else is a bug and is reported as such. The outbox-publisher's outages
(a publish JetStream did not answer) are :data:`PUBLISH_OUTAGES`.
"""

from __future__ import annotations

import asyncio

import nats.errors
from nats.js.errors import APIError, NoStreamResponseError, TooManyStalledMsgsError

from shared.adapters.postgres import DATABASE_ERRORS

#: JetStream is down, unreachable, reconnecting, or has no leader for the stream (a NATS
#: restart, a stream being recreated).
NATS_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.ConnectionClosedError,
    nats.errors.NoRespondersError,
    NoStreamResponseError,
    APIError,
    nats.errors.TimeoutError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.NoServersError,
)

#: Transient: the database or JetStream is down or has no leader.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, *NATS_ERRORS, OSError)

#: A publish JetStream did not answer (no PubAck in time, no responders, the connection
#: stale, closed, draining or reconnecting, no stream answering, too many PubAcks
#: outstanding): the outbox-publisher's outages. A 503 API error (no stream leader) is
#: one too (see :func:`shared.adapters.jetstream.api_error_codes`).
PUBLISH_OUTAGES: tuple[type[BaseException], ...] = (
    asyncio.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    NoStreamResponseError,
    TooManyStalledMsgsError,
)
