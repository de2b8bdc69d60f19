"""Per-key ordering for ``ordering: key`` durables (INFRA-005 §5.3): turns and parking.

The events of one key reach the handler one at a time, in stream order; different keys
run in parallel up to the durable's concurrency.

* **Turns** (:class:`KeyTurns`): every batch takes, for each key it holds, a turn in that
  key's queue *synchronously*, in the order batches are fetched, before it awaits anything;
  a turn starts when the previous one of its key ends. Pipelined batches and the drainer
  therefore never overtake one another within a key.
* **Sequenced parking** (:class:`Sequencer`): when an event of a key fails (a retry, a dead
  letter under ``on_dead_letter: hold``, a dead letter that could not be written), it and
  the key's later events are written to ``parked_messages`` (migration 0009) and only then
  acked on JetStream. While a key has parked rows it is *blocked*: its new events are
  parked behind them, and only they; the rest of the durable flows. The drainer tries a
  blocked key's head when its back-off is over, from the parked copy, and releases the
  events behind it in order as soon as it succeeds. A held head waits for an operator:
  ``ferry dlq replay`` (the replayed copy un-holds it, in its place) or ``ferry parked
  discard``. Under ``on_dead_letter: skip`` the dead letter records that order was broken
  after it and the key goes on.

* **Batch calls** (``handler.batch`` >= 2): an event still waits for its own decision in
  its key's turn; the decisions that keys (on the JetStream path and in the drainer) ask
  for at about the same time travel in one batch call (:class:`.batching.BatchGatherer`),
  so a call holds at most one event per key and each key parks or goes on by its own
  event's result.

The pieces are composed, not inherited (the composition root,
:mod:`services.inbox_consumer.wiring`, hands each its collaborators):
:mod:`services.inbox_consumer.ordering_turns` (the turns),
:mod:`services.inbox_consumer.ordering_base` (:class:`KeyOrder`, what both paths share:
the partition's state, ordering keys, one event's decision and the settling of a failed
one), :mod:`services.inbox_consumer.ordering_drain` (:class:`Drainer` and
:class:`ParkedMsg`); this module holds :class:`Sequencer`, the JetStream path (fetched
batches: turns, claims, parking), handed the partition's :class:`KeyOrder` and drainer.

Parked state lives in the inbox database, so it survives restarts and kills; a consumer
that starts on a partition reloads its blocked keys before it fetches anything.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from services.inbox_consumer.claiming import Claimer
from services.inbox_consumer.delivery import Delivery
from services.inbox_consumer.ordering_base import KEY_MISSING as KEY_MISSING
from services.inbox_consumer.ordering_base import KeyOrder as KeyOrder
from services.inbox_consumer.ordering_drain import DRAIN_IDLE as DRAIN_IDLE
from services.inbox_consumer.ordering_drain import DRAIN_RETRY as DRAIN_RETRY
from services.inbox_consumer.ordering_drain import Drainer as Drainer
from services.inbox_consumer.ordering_drain import ParkedMsg as ParkedMsg
from services.inbox_consumer.ordering_turns import KeyTurns as KeyTurns
from services.inbox_consumer.ordering_turns import Turn as Turn
from services.inbox_consumer.pipeline import Unordered
from services.inbox_consumer.settlement import Decided
from shared.adapters import parking
from shared.adapters.postgres import Conn
from shared.domain.ack import Ack


class Sequencer:
    """Ordering for one partition of one durable (see the module doc): the JetStream path,
    beside the partition's drainer."""

    def __init__(
        self,
        order: KeyOrder,
        *,
        drainer: Drainer,
        claimer: Claimer,
        unordered: Unordered,
        owner: str,
    ) -> None:
        self.order, self.drainer, self.claimer = order, drainer, claimer
        self.unordered, self.owner = unordered, owner
        self.durable, self.partition = order.durable, order.partition

    async def load(self) -> None:
        """Reload the partition's blocked keys (before the first fetch)."""
        await self.order.load()

    async def drain(self, stop: asyncio.Event) -> None:
        """Run the drainer until ``stop``."""
        await self.drainer.drain(stop)

    # -- the JetStream path --------------------------------------------------------

    async def process(self, deliveries: list[Delivery]) -> None:
        """A fetched batch (unique ids, stream order). Turns are taken before any await."""
        keyed: dict[str, list[Delivery]] = {}
        loose: list[Delivery] = []
        order = self.order
        for delivery in sorted(deliveries, key=lambda d: d.stream_seq):
            key = order.key_of(delivery)
            if key is None:
                loose.append(delivery)
            else:
                keyed.setdefault(key, []).append(delivery)
        turns = {key: order.turns.take(key) for key in keyed}
        try:
            if loose:  # malformed or keyless: dead letters, in no key's order
                await self.unordered.process(loose)
            wanted = [d for key, group in keyed.items() if key not in order.blocked for d in group]
            claim = await self.claimer.claim(wanted) if wanted else None
            if wanted and claim is None:
                return  # stopping: the claim nak'ed them
            acks: list[Decided] = []
            await asyncio.gather(
                *(
                    self._run_key(key, group, turns.pop(key), claim, acks)
                    for key, group in list(keyed.items())
                )
            )
            if acks:
                await order.settler.settle(acks)
        finally:
            for turn in turns.values():
                turn.abandon()

    async def _run_key(
        self,
        key: str,
        group: list[Delivery],
        turn: Turn,
        claim: Any,
        acks: list[Decided],
    ) -> None:
        order = self.order
        async with turn:
            claimed = set(claim.claimed) if claim is not None else set()
            if key in order.blocked:
                await self._park(key, group, claimed=claimed)
                return
            for index, delivery in enumerate(group):
                mid = delivery.message_id
                if claim is None or (mid not in claimed and mid not in claim.final
                                     and mid not in claim.leased):  # fmt: skip
                    await self._park(key, group[index:], claimed=claimed)  # blocked meanwhile
                    return
                if mid in claim.final:
                    if await self._final(key, group[index:], claimed):
                        return
                    continue
                if mid in claim.leased:  # another delivery handles it right now
                    wait = claim.leased[mid] + 1.0
                    await self._park(key, group[index:], claimed=claimed, delay=wait)
                    return
                decision, status = await order.decide(delivery)
                if isinstance(decision, Ack):
                    acks.append((delivery, (decision, status)))
                    continue
                stop = await order.failed(key, delivery, decision, status)
                if stop is None:
                    continue  # skipped past a dead letter
                state, delay, reason = stop
                await self._park(
                    key,
                    group[index:],
                    claimed=claimed - {mid},
                    state=state,
                    delay=delay,
                    reason=reason,
                    attempts=delivery.attempt,
                )
                return

    async def _final(self, key: str, rest: list[Delivery], claimed: set[uuid.UUID]) -> bool:
        """``rest[0]`` is final already: a duplicate, acked (False: go on); or a dead letter
        holding its key, ``rest`` parked behind it (True: stop here; also when stopping)."""
        order = self.order
        held = await order.holds_its_key(rest[0].message_id)
        if held is None:  # stopping: left to JetStream's redelivery
            for d in rest:
                await order.replies.nak(d.msg, 0.0)
            return True
        if held:
            await self._park(key, rest, claimed=claimed, state="held", reason="dead letter held")
            return True
        order.stats.duplicates += 1
        await order.replies.ack(rest[0].msg)
        return False

    async def _park(
        self,
        key: str,
        group: list[Delivery],
        *,
        claimed: set[uuid.UUID],
        state: str = "queued",
        delay: float = 0.0,
        reason: str | None = None,
        attempts: int = 0,
    ) -> None:
        """Park ``group`` (JetStream messages, the first maybe as a failed head), then ack."""
        entries = [
            parking.ParkedEntry(
                message_id=d.message_id,
                ordering_key=key,
                stream_seq=d.stream_seq,
                partition=self.partition,
                subject=d.msg.subject,
                headers=dict(d.msg.headers or {}),
                data=bytes(d.msg.data),
                state=state if index == 0 else "queued",
                attempts=attempts if index == 0 else 0,
                delay=delay if index == 0 else 0.0,
                reason=reason if index == 0 else None,
                replay=d.replay,
            )
            for index, d in enumerate(group)
        ]
        untouched = [d.message_id for d in group if d.message_id in claimed]
        owner, order = self.owner, self.order

        async def write(conn: Conn) -> bool:
            async with conn.transaction():
                await parking.park(conn, self.durable, entries)
                await parking.unclaim(conn, self.durable, owner, untouched)
            return True

        done = await order.holder.run(f"park {len(entries)} of a key", write)
        if done is None:  # stopping: left to JetStream's redelivery
            for d in group:
                if not d.msg.is_acked:
                    await order.replies.nak(d.msg, 0.0)
            return
        order.blocked.add(key)
        order.stats.parked += len(entries)
        for d in group:
            if not d.msg.is_acked:
                await order.replies.ack(d.msg)
        order.wake.set()
