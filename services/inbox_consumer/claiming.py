"""The claim stage: record a batch in the inbox and lease it, holding through outages.

One statement records the whole batch (REQ-051): a message whose outcome is already
final is a duplicate, one leased by another delivery is left alone, the rest are claimed
(the handler never runs twice at once for one id). While the inbox is unreachable the
batch is held (:mod:`.holding`; the keeper heart-beats it, so JetStream neither
redelivers nor counts a delivery) and no more is fetched — back-pressure — until the
database answers. Only a stop gives up: the batch is nak'ed for another replica (or the
next start). A claim the database refuses (not an outage) is retried one message at a
time.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from services.inbox_consumer.deciding import Unexpected
from services.inbox_consumer.delivery import Delivery
from services.inbox_consumer.holding import Holder, merge_claims
from services.inbox_consumer.replies import Replies
from services.inbox_consumer.stats import ConsumerStats
from shared.adapters.postgres import SERVER_ERRORS, Conn
from shared.domain.ack import RetryPolicy
from shared.domain.ports import InboxClaim, InboxStore

log = logging.getLogger("ferry.inbox_consumer")

#: Delay before a copy that lost the race for an id is offered again.
CONTENDED_DELAY = 1.0


class Claimer:
    """Claims deliveries of one durable in its inbox for one owner (see the module doc)."""

    def __init__(
        self,
        *,
        store: InboxStore[Conn],
        holder: Holder,
        replies: Replies,
        stats: ConsumerStats,
        durable: str,
        owner: str,
        lease_seconds: float,
        policy: RetryPolicy,
        unexpected: Unexpected,
    ) -> None:
        self.store, self.holder, self.replies, self.stats = store, holder, replies, stats
        self.durable, self.owner, self.lease_seconds = durable, owner, lease_seconds
        self.policy, self.unexpected = policy, unexpected

    async def claimed(self, deliveries: list[Delivery]) -> list[Delivery] | None:
        """The claim stage of an unordered batch: claim ``deliveries`` (unique ids), ack
        the duplicates (final already) and nak the copies another delivery leases; the
        claimed ones, in claim order (None when stopping: each was nak'ed)."""
        claim = await self.claim(deliveries)
        if claim is None:
            return None
        unique = {d.message_id: d for d in deliveries}
        for mid in claim.final:
            self.stats.duplicates += 1
            await self.replies.ack(unique[mid].msg)
        for mid, lease_left in claim.leased.items():
            self.stats.contended += 1
            await self.replies.nak(unique[mid].msg, lease_left + CONTENDED_DELAY)
        return [unique[mid] for mid in claim.claimed]

    async def claim(self, deliveries: list[Delivery]) -> InboxClaim | None:
        """Claim ``deliveries`` (unique ids); None (each nak'ed) when stopping with the
        inbox still away."""
        try:
            claim = await self.holder.run("claim the batch", self._work(deliveries))
        except SERVER_ERRORS as exc:
            claim = await self._claim_singly(deliveries, exc)
        if claim is None:
            for delivery in deliveries:
                await self.replies.nak(delivery.msg, CONTENDED_DELAY)
        return claim

    async def _claim_singly(
        self, deliveries: list[Delivery], exc: BaseException
    ) -> InboxClaim | None:
        """One row may be unstorable (a NUL in its subject): claim each message alone. One
        refused alone is nak'ed with its back-off — it can be neither recorded nor
        dead-lettered here; its exhaustion reaches the dlq-router — and the rest go on."""
        log.warning("claim of %d refused (%r): claiming one by one", len(deliveries), exc)
        claims = []
        for delivery in deliveries:
            try:
                one = await self.holder.run("claim one", self._work([delivery]))
            except SERVER_ERRORS as refused:
                self.unexpected("claim", refused, delivery)
                await self.replies.nak(delivery.msg, self.policy.delay(delivery.attempt))
                continue
            if one is None:
                return None
            claims.append(one)
        return merge_claims(claims)

    def _work(self, deliveries: list[Delivery]) -> Callable[[Conn], Awaitable[InboxClaim]]:
        return lambda conn: self._claim(conn, deliveries)

    async def _claim(self, conn: Conn, deliveries: list[Delivery]) -> InboxClaim:
        return await self.store.claim_batch(
            conn,
            durable=self.durable,
            owner=self.owner,
            lease_seconds=self.lease_seconds,
            entries=[d.entry() for d in deliveries],
        )
