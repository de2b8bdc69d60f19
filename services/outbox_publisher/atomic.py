"""A claimed batch as JetStream atomic batches (ADR-50, nats-server 2.12+, ``allow_atomic``).

With ``sync_interval: always`` every JetStream write is an fsync, and pipelined publishes
pay one per message. The server holds an atomic batch's messages until the one that
commits it and then stores them together: on this project's VM about four times the
rate of pipelined publishes for a backlog (``bench/RESULTS.md``). A batch has a cost of
its own, so only claims of :data:`MIN_ROWS` rows or more go this way. A batch is all or
nothing and keeps its order, so rows of one aggregate keep theirs without waves.

Each message keeps its ``Nats-Msg-Id`` (the event id). The server refuses a whole batch
that holds an id it has already stored inside the duplicate window, which is what a
re-publish after a crash between PubAck and commit looks like; the caller then publishes
the rows one by one, and the duplicate window drops the copies as it always did. Any
other refusal, and an answer that is not a batch PubAck (a server older than 2.12 stores
the messages one by one and acks the last as usual), gets the same fall-back. No answer
at all is an outage, as for a single publish: the rows stay pending and are retried.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from shared.adapters.jetstream import unavailable

BATCH_ID = "Nats-Batch-Id"
BATCH_SEQUENCE = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
EXPECTED_STREAM = "Nats-Expected-Stream"

#: Claims smaller than this are published one by one: an atomic batch costs nats-server
#: about 2 ms of CPU of its own (staging and committing it), more than the fsyncs it
#: saves below about 30 messages. Measured with nats-server 2.15 on the project's VM, at
#: 600 msg/s in batches of k, nats-server µs per message one by one / atomic: k=1 350 /
#: 1,762; k=3 248 / 821; k=10 165 / 310; k=30 154 / 125; k=100 100 / 52.
MIN_ROWS = 32

#: The server's limit of messages per atomic batch.
MAX_MESSAGES = 1000
#: Bytes of messages per batch we send at most: the server holds a batch in memory until
#: its commit, and a batch of large events is split rather than held whole.
MAX_BYTES = 8 * 1024 * 1024
#: JetStream's error code for "atomic publish is disabled" (the stream lacks allow_atomic).
ATOMIC_DISABLED = 10174


class Client(Protocol):
    """The NATS client calls a batch needs (``nats.aio.client.Client`` has them)."""

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        reply: str = "",
        headers: dict[str, str] | None = None,
    ) -> None: ...

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float = 0.5,
        old_style: bool = False,
        headers: dict[str, str] | None = None,
    ) -> object: ...


#: One message: subject, body, headers (``Nats-Msg-Id`` among them).
Message = tuple[str, bytes, dict[str, str]]


@dataclass(frozen=True)
class Refused:
    """Why a batch was not stored as one (nothing of it is, or the duplicate window holds
    what was): its rows go one by one."""

    reason: str
    #: The stream does not take atomic batches at all (no ``allow_atomic``, or an older
    #: server): there is no point trying again soon.
    unsupported: bool = False


def chunks(
    messages: Sequence[Message], *, max_messages: int = MAX_MESSAGES, max_bytes: int = MAX_BYTES
) -> Iterator[range]:
    """Index ranges of ``messages``, in order, each within both limits (a message over
    ``max_bytes`` by itself gets a range of its own)."""
    start, size = 0, 0
    for index, (subject, body, headers) in enumerate(messages):
        weight = len(subject) + len(body) + sum(len(k) + len(v) + 4 for k, v in headers.items())
        if index > start and (index - start >= max_messages or size + weight > max_bytes):
            yield range(start, index)
            start, size = index, 0
        size += weight
    if start < len(messages):
        yield range(start, len(messages))


async def publish(
    nc: Client, messages: Sequence[Message], *, stream: str, timeout: float
) -> Refused | None:
    """Publish ``messages`` (at most :data:`MAX_MESSAGES`) as one atomic batch into
    ``stream``; None once its PubAck says all of them are stored.

    Raises what a single publish raises when the server cannot be reached or does not
    answer within ``timeout`` (:func:`.failures.of_publish` reads it as an outage); the
    server drops a batch whose commit never arrives.
    """
    if not messages:
        return None
    batch_id = uuid.uuid4().hex
    last = len(messages) - 1
    for index, (subject, body, headers) in enumerate(messages):
        wire = {
            **headers,
            EXPECTED_STREAM: stream,
            BATCH_ID: batch_id,
            BATCH_SEQUENCE: str(index + 1),
        }
        if index < last:
            await nc.publish(subject, body, headers=wire)
            continue
        wire[BATCH_COMMIT] = "1"
        reply = await nc.request(subject, body, timeout=timeout, headers=wire)
        return read_ack(getattr(reply, "data", b""), batch_id=batch_id, count=len(messages))
    raise AssertionError("unreachable")  # pragma: no cover


def read_ack(data: bytes, *, batch_id: str, count: int) -> Refused | None:
    """None when ``data`` is the PubAck of batch ``batch_id`` with ``count`` messages."""
    try:
        ack = json.loads(data)
    except ValueError:
        return Refused(f"the commit's answer is not JSON: {data[:200]!r}")
    if not isinstance(ack, dict):
        return Refused(f"the commit's answer is not a PubAck: {data[:200]!r}")
    error = ack.get("error")
    if isinstance(error, dict):
        code = error.get("err_code")
        text = f"{error.get('description', 'refused')} (err_code {code})"
        if error.get("code") == 503:
            # No stream leader, JetStream unavailable: an outage, as for a single publish.
            raise unavailable(code, str(error.get("description")))
        return Refused(text, unsupported=code == ATOMIC_DISABLED)
    if ack.get("batch") != batch_id or ack.get("count") != count:
        return Refused(
            "the server stored the commit as a single message (nats-server before 2.12 has "
            "no atomic batches)",
            unsupported=True,
        )
    return None


__all__ = [
    "ATOMIC_DISABLED",
    "MAX_BYTES",
    "MAX_MESSAGES",
    "MIN_ROWS",
    "Client",
    "Message",
    "Refused",
    "chunks",
    "publish",
    "read_ack",
]
