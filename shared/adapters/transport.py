"""JetStream as an :class:`~shared.domain.ports.EventTransport` (and its deliveries).

Thin: ``publish`` is ``js.publish`` with the message id as ``Nats-Msg-Id`` (the stream's
duplicate window drops a second copy); ``fetch`` pulls from a durable the topology
provisioned (bound, never created here, so its configuration stays the topology's).
The roles keep their own tuned paths (pipelined publishes, the consumer's puller); this
is the reference a contract suite holds every backend to.
"""

from __future__ import annotations

from collections.abc import Mapping

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext

from shared.domain.ports import Delivery, EventTransport, PublishReceipt

#: The header JetStream deduplicates on.
MSG_ID_HEADER = "Nats-Msg-Id"


class NatsDelivery(Delivery):
    """One JetStream message pulled for a durable."""

    def __init__(self, msg: Msg) -> None:
        self.msg = msg
        meta = msg.metadata
        self._attempt, self._seq = meta.num_delivered, meta.sequence.stream

    @property
    def subject(self) -> str:
        return self.msg.subject

    @property
    def data(self) -> bytes:
        return self.msg.data

    @property
    def message_id(self) -> str | None:
        return (self.msg.headers or {}).get(MSG_ID_HEADER)

    @property
    def attempt(self) -> int:
        return self._attempt

    @property
    def stream_seq(self) -> int:
        return self._seq

    async def ack(self) -> None:
        await self.msg.ack_sync()

    async def nak(self, delay: float) -> None:
        await self.msg.nak(delay=delay)

    async def term(self) -> None:
        await self.msg.term()


class NatsTransport(EventTransport):
    """Publishes into, and pulls from, the JetStream stream ``stream``."""

    def __init__(self, js: JetStreamContext, *, stream: str) -> None:
        self.js, self.stream = js, stream
        self._subs: dict[str, JetStreamContext.PullSubscription] = {}

    async def publish(
        self,
        subject: str,
        data: bytes,
        *,
        message_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> PublishReceipt:
        sent = {**(headers or {}), MSG_ID_HEADER: message_id}
        ack = await self.js.publish(subject, data, headers=sent, stream=self.stream)
        return PublishReceipt(stream=ack.stream, seq=ack.seq, duplicate=bool(ack.duplicate))

    async def fetch(self, durable: str, batch: int, timeout: float) -> list[Delivery]:
        sub = self._subs.get(durable)
        if sub is None:
            bound = await self.js.pull_subscribe_bind(durable=durable, stream=self.stream)
            # A concurrent fetch may have bound the durable while we awaited: keep one.
            sub = self._subs.setdefault(durable, bound)
            if sub is not bound:
                await bound.unsubscribe()
        try:
            msgs = await sub.fetch(batch, timeout=timeout)
        except (NatsTimeout, TimeoutError):  # nats-py raises either when nothing is pending
            return []
        return [NatsDelivery(m) for m in msgs]

    async def close(self) -> None:
        """Unsubscribe every durable's pull subscription (the consumers stay)."""
        # Taken out first: a fetch binding a new durable may add one while we await.
        subs, self._subs = list(self._subs.values()), {}
        for sub in subs:
            await sub.unsubscribe()
