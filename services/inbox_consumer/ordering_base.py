"""What both paths of an ``ordering: key`` durable share (:class:`KeyOrder`): the
partition's state, each delivery's ordering key, the reload of the blocked keys, one
event's decision and the settling of a failed one. The JetStream path
(:class:`~services.inbox_consumer.ordering.Sequencer`) and the drainer
(:class:`~services.inbox_consumer.ordering_drain.Drainer`) are each handed the one
:class:`KeyOrder` of their partition (see :mod:`services.inbox_consumer.ordering`)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from services.inbox_consumer.batching import BatchGatherer
from services.inbox_consumer.deciding import Decider
from services.inbox_consumer.delivery import Delivery
from services.inbox_consumer.holding import Holder
from services.inbox_consumer.ordering_turns import KeyTurns
from services.inbox_consumer.replies import Replies
from services.inbox_consumer.settlement import Settler
from services.inbox_consumer.stats import ConsumerStats
from shared.adapters import parking
from shared.adapters.postgres import Conn, Pool
from shared.contracts.topology import DurableSpec
from shared.domain.ack import DeadLetter, Decision, Nak, RetryPolicy
from shared.domain.errors import PoisonError
from shared.domain.ordering import OrderingKeyError, ordering_key

log = logging.getLogger("ferry.inbox_consumer")

#: Reason code of an event of an ordered durable whose ordering key cannot be read.
KEY_MISSING = "ORDERING_KEY_MISSING"


class KeyOrder:
    """One partition's key state, keys and decisions (both paths use them alike)."""

    def __init__(
        self,
        *,
        pool: Pool,
        holder: Holder,
        decider: Decider,
        gatherer: BatchGatherer | None,
        settler: Settler,
        replies: Replies,
        stats: ConsumerStats,
        durable: str,
        spec: DurableSpec,
        policy: RetryPolicy,
        partition: int,
        key_fields: Mapping[tuple[str, int], str | None],
    ) -> None:
        self.pool, self.holder, self.decider, self.settler = pool, holder, decider, settler
        self.replies = replies
        self.stats, self.durable, self.spec, self.policy = stats, durable, spec, policy
        self.partition, self.key_fields = partition, key_fields
        self.turns = KeyTurns()
        #: Keys with parked messages (loaded at start, kept under the keys' turns).
        self.blocked: set[str] = set()
        #: Set when a key is parked: the drainer looks at once.
        self.wake = asyncio.Event()
        self.hold = spec.on_dead_letter == "hold"
        #: ``handler.batch`` >= 2: the events of different keys that ask for a decision
        #: together share a batch call (:class:`.batching.BatchGatherer`); None: one call
        #: per event.
        self.gatherer = gatherer

    # -- keys -------------------------------------------------------------------------

    def key_of(self, delivery: Delivery) -> str | None:
        """The delivery's ordering key; None (and its poison set) when it has none."""
        env = delivery.envelope
        if env is None:
            return None
        doc = {
            "aggregate_type": env.aggregate_type,
            "aggregate_id": env.aggregate_id,
            "payload": env.payload,
        }
        try:
            return ordering_key(doc, self.key_fields.get((env.event_type, env.event_version)))
        except OrderingKeyError as exc:
            delivery.poison = PoisonError(KEY_MISSING, str(exc))
            return None

    async def load(self) -> None:
        """Reload the partition's blocked keys (before the first fetch), making due any
        head left waiting for nothing (:func:`~shared.adapters.parking.promote_stranded`)."""
        conn: Conn
        async with self.pool.acquire() as conn:
            stranded = await parking.promote_stranded(conn, self.durable, self.partition)
            self.blocked = await parking.blocked_keys(conn, self.durable, self.partition)
        if stranded:
            log.warning(
                "%d keys of partition %d had a head waiting for nothing, due now: %s",
                len(stranded), self.partition, ", ".join(stranded[:10]),
            )  # fmt: skip
        else:
            log.info("no key of partition %d had a head waiting for nothing", self.partition)
        if self.blocked:
            log.info("%d keys of partition %d are parked", len(self.blocked), self.partition)
            self.wake.set()

    # -- one event's decision (both paths) -------------------------------------------

    async def decide(self, delivery: Delivery) -> tuple[Decision, int | None]:
        """One event's decision, awaited in its key's turn: a call of its own, or a place
        in a batch call beside other keys' events (``handler.batch`` >= 2)."""
        if self.gatherer is None:
            return await self.decider.traced(delivery)
        return await self.gatherer.decide(delivery)

    async def failed(
        self, key: str, delivery: Delivery, decision: Decision, status: int | None
    ) -> tuple[str, float, str] | None:
        """Settle a failed event in the inbox (and the dead-letter stream); the head state
        its key parks with, or None when the key goes on (a dead letter skipped)."""
        settler = self.settler
        if isinstance(decision, Nak):
            await settler.record_retry(delivery, decision, status)
            return "retrying", decision.delay, decision.reason
        assert isinstance(decision, DeadLetter)
        ordering: dict[str, Any] = {"key": key, "policy": self.spec.on_dead_letter}
        if self.hold:
            ordering["held"] = True
        else:
            ordering["order_broken_after"] = True
        # Under hold the message is acked once its key is parked, not termed now: killed in
        # between, it comes back, and its dead letter holds the key then (_holds_its_key).
        written = await settler.write_dead_letter(
            delivery, decision, status, ordering=ordering, term=not self.hold
        )
        if not written:
            return "retrying", self.policy.delay(delivery.attempt), "dead letter unwritten"
        if self.hold:
            return "held", 0.0, decision.reason_code
        return None

    async def holds_its_key(self, message_id: uuid.UUID) -> bool | None:
        """Whether a message already final is a dead letter that holds its key (None:
        stopping). Under ``hold`` a dead letter is recorded, then its key parked: a consumer
        killed in between leaves it unparked and unacked, and the key must wait behind it
        when it comes back, not go on."""
        if not self.hold:
            return False
        return await self.holder.run(
            "read a dead letter", lambda c: parking.holds_its_key(c, self.durable, message_id)
        )
