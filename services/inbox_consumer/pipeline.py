"""The unordered batch path: the stages in sequence, each a collaborator of its own.

For the deliveries of one fetched batch (unique ids; the run loop has parsed them and
the keeper heart-beats them until they are settled, :mod:`.keepalive`):

1. **claim** (:mod:`.claiming`): record and lease them in the inbox, holding through
   database outages (:mod:`.holding`); the duplicates are acked and the copies another
   delivery leases nak'ed there (:mod:`.replies`), the claimed ones go on;
2. **open spans** (:mod:`.spans`): each claimed delivery's ``process`` span;
3. **decide** (:mod:`.deciding`, or :mod:`.batching` for ``handler.batch`` >= 2): the
   handler call through the handler port, then :func:`shared.domain.ack.decide`;
4. **settle** (:mod:`.settlement`): inbox writes, then ack / nak / term through the
   delivery port (:mod:`.replies`).

An ordered durable (``ordering: key``) takes the same stages in its keys' turns
(:mod:`.ordering`); its keyless deliveries come here.
"""

from __future__ import annotations

import asyncio

from services.inbox_consumer.batching import BatchCaller
from services.inbox_consumer.claiming import Claimer
from services.inbox_consumer.deciding import Decider
from services.inbox_consumer.delivery import Delivery
from services.inbox_consumer.settlement import Settler
from services.inbox_consumer.spans import process_span


class Unordered:
    """The stages of an unordered batch, handed over by the composition root."""

    def __init__(
        self,
        *,
        claimer: Claimer,
        decider: Decider,
        batcher: BatchCaller | None,
        settler: Settler,
        durable: str,
        stream: str,
    ) -> None:
        self.claimer, self.decider, self.batcher, self.settler = claimer, decider, batcher, settler
        self.durable, self.stream = durable, stream

    async def process(self, deliveries: list[Delivery]) -> None:
        """Claim, decide (all at once) and settle ``deliveries`` (unique ids)."""
        claimed = await self.claimer.claimed(deliveries)
        if not claimed:
            return
        for delivery in claimed:
            delivery.span = process_span(delivery, durable=self.durable, stream=self.stream)
        if self.batcher is not None:  # handler.batch >= 2: N events per call
            decisions = await self.batcher.decide_all(claimed)
        else:
            decisions = await asyncio.gather(*(self.decider.traced(d) for d in claimed))
        await self.settler.settle(list(zip(claimed, decisions, strict=True)))
