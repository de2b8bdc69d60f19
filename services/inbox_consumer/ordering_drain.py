"""The drainer of an ``ordering: key`` durable: it tries blocked keys' heads from
``parked_messages`` as they fall due and releases the events behind them in order, each
parked message handed to the usual pipeline as a :class:`ParkedMsg` (see
:mod:`services.inbox_consumer.ordering`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from services.inbox_consumer.claiming import Claimer
from services.inbox_consumer.deciding import Unexpected
from services.inbox_consumer.delivery import Delivery, parse_delivery
from services.inbox_consumer.metrics import ConsumerMetrics
from services.inbox_consumer.ordering_base import KeyOrder
from services.inbox_consumer.ordering_turns import Turn
from services.inbox_consumer.settlement import Decided
from shared.adapters import parking
from shared.adapters.postgres import DATABASE_ERRORS, Conn
from shared.domain.ack import Ack
from shared.domain.ports import InboxStore

log = logging.getLogger("ferry.inbox_consumer")

#: Longest pause of the drainer when nothing is due (a new park wakes it at once).
DRAIN_IDLE = 1.0
#: Pause after the drainer failed to reach the database.
DRAIN_RETRY = 1.0
#: Seconds between the drainer's looks for heads left waiting at 'infinity' for nothing
#: (a park racing an operator's discard in another process; see parking._PARK): one
#: index probe per parked key of the partition.
STRANDED_EVERY = 30.0


@dataclass
class _Sequence:
    stream: int


@dataclass
class _Metadata:
    stream: str
    sequence: _Sequence
    num_delivered: int


@dataclass
class ParkedMsg:
    """A parked message handed to the usual pipeline in place of a JetStream message.

    Acks, naks and terms have nothing to tell JetStream (the message was acked when it was
    parked): the drainer settles the parked row itself from the decision.
    """

    subject: str
    data: bytes
    headers: dict[str, str]
    metadata: _Metadata
    is_acked: bool = False
    calls: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, row: parking.ParkedRow, stream: str) -> ParkedMsg:
        meta = _Metadata(stream, _Sequence(row.delivered_seq), row.attempts + 1)
        return cls(row.subject, row.data, dict(row.headers), meta)

    async def ack(self) -> None:
        self.is_acked = True
        self.calls.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.is_acked = True
        self.calls.append("nak")

    async def term(self) -> None:
        self.is_acked = True
        self.calls.append("term")

    async def in_progress(self) -> None:
        return None


class _Stopping(Exception):
    """The consumer is stopping while the database is away: leave the rest unsettled."""


class Drainer:
    """The drainer of one partition of an ordered durable, beside its
    :class:`~services.inbox_consumer.ordering.Sequencer` (the same :class:`KeyOrder`)."""

    def __init__(
        self,
        order: KeyOrder,
        *,
        claimer: Claimer,
        store: InboxStore[Conn],
        metrics: ConsumerMetrics,
        owner: str,
        max_message_bytes: int,
        unexpected: Unexpected,
    ) -> None:
        self.order, self.claimer, self.store, self.metrics = order, claimer, store, metrics
        self.owner, self.max_message_bytes, self.unexpected = owner, max_message_bytes, unexpected
        self.durable, self.partition = order.durable, order.partition

    async def drain(self, stop: asyncio.Event) -> None:
        """Try blocked keys' heads as they fall due, until ``stop``."""
        looked = time.monotonic()  # KeyOrder.load looked as the partition started
        while not stop.is_set():
            self.order.wake.clear()
            try:
                if time.monotonic() - looked >= STRANDED_EVERY:
                    looked = time.monotonic()
                    await self._promote_stranded()
                pause = await self._drain_round()
            except DATABASE_ERRORS as exc:
                log.warning("parked messages unreachable: %s", exc)
                pause = DRAIN_RETRY
            except Exception as exc:
                self.unexpected("drain", exc, None)
                pause = DRAIN_RETRY
            if pause > 0:
                with contextlib.suppress(TimeoutError):
                    waking = asyncio.ensure_future(self.order.wake.wait())
                    stopping = asyncio.ensure_future(stop.wait())
                    try:
                        await asyncio.wait(
                            {waking, stopping}, timeout=pause, return_when="FIRST_COMPLETED"
                        )
                    finally:
                        waking.cancel()
                        stopping.cancel()

    async def _promote_stranded(self) -> None:
        conn: Conn
        async with self.order.pool.acquire() as conn:
            stranded = await parking.promote_stranded(conn, self.durable, self.partition)
        if stranded:
            log.warning(
                "%d keys of partition %d had a head waiting for nothing, due now: %s",
                len(stranded), self.partition, ", ".join(stranded[:10]),
            )  # fmt: skip

    async def _drain_round(self) -> float:
        """One pass over the due keys; the pause before the next."""
        order = self.order
        limit = max(order.decider.concurrency * 2, 8)
        conn: Conn
        async with order.pool.acquire() as conn:
            keys = await parking.ready_keys(conn, self.durable, self.partition, limit)
            if not keys:
                due = await parking.next_due(conn, self.durable, self.partition)
                if due is None:
                    return DRAIN_IDLE
                return min(max(due, 0.05), DRAIN_IDLE)
        await asyncio.gather(*(self._drain_key(key, order.turns.take(key)) for key in keys))
        return 0.0

    async def _drain_key(self, key: str, turn: Turn) -> None:
        try:
            async with turn:
                await self._drain_key_in_turn(key)
        except _Stopping:
            return

    async def _drain_key_in_turn(self, key: str) -> None:
        order = self.order
        conn: Conn
        async with order.pool.acquire() as conn:
            rows = await parking.key_rows(conn, self.durable, key, order.spec.batch_size)
        if not rows:
            order.blocked.discard(key)
            return
        if rows[0].state == "held" or not rows[0].due:
            return
        deliveries = [
            parse_delivery(ParkedMsg.of(row, order.spec.stream), self.max_message_bytes)
            for row in rows
        ]
        claim = await self.claimer.claim(deliveries)
        if claim is None:
            raise _Stopping
        acks: list[Decided] = []
        done: list[uuid.UUID] = []
        stopped_at = await self._drain_rows(key, rows, deliveries, claim, acks, done)
        if stopped_at is not None:
            claimed = set(claim.claimed)
            rest = [d.message_id for d in deliveries[stopped_at + 1 :] if d.message_id in claimed]
            if rest:
                await order.holder.run(
                    "give back claims",
                    lambda c: parking.unclaim(c, self.durable, self.owner, rest),
                )
        await self._release(key, acks, done)

    async def _drain_rows(
        self,
        key: str,
        rows: list[parking.ParkedRow],
        deliveries: list[Delivery],
        claim: Any,
        acks: list[Decided],
        done: list[uuid.UUID],
    ) -> int | None:
        """Hand ``key``'s parked messages over in order; the index it stopped at, if any."""
        order = self.order
        for index, (row, delivery) in enumerate(zip(rows, deliveries, strict=True)):
            mid = delivery.message_id
            if mid in claim.final:
                held = await order.holds_its_key(mid)
                if held is None:
                    raise _Stopping
                if held:  # dead-lettered here before a kill, never marked held: hold now
                    await self._retry_row(row, "held", row.attempts, 0.0, "dead letter held")
                    return index
                order.stats.duplicates += 1
                done.append(mid)
                continue
            if mid in claim.leased:
                wait = claim.leased[mid] + 1.0
                await self._retry_row(row, row.state, row.attempts, wait, "leased elsewhere")
                return index
            decision, status = await order.decide(delivery)
            if isinstance(decision, Ack):
                acks.append((delivery, (decision, status)))
                done.append(mid)
                continue
            stop = await order.failed(key, delivery, decision, status)
            if stop is None:
                done.append(mid)
                continue
            state, delay, reason = stop
            await self._retry_row(row, state, delivery.attempt, delay, reason)
            return index
        return None

    async def _retry_row(
        self, row: parking.ParkedRow, state: str, attempts: int, delay: float, reason: str
    ) -> None:
        await self.order.holder.run(
            "park the head again",
            lambda c: parking.retry_head(
                c, self.durable, row.message_id, state=state, attempts=attempts, delay=delay,
                reason=reason[:500],
            ),
        )  # fmt: skip

    async def _release(self, key: str, acks: list[Decided], done: list[uuid.UUID]) -> None:
        """Mark the processed ones and delete every settled row of ``key``, atomically."""
        if not done:
            return
        order = self.order
        processed = {d.message_id: s or 200 for d, (_, s) in acks}

        async def write(conn: Conn) -> int:
            async with conn.transaction():
                if processed:
                    await self.store.mark_processed(conn, self.durable, processed)
                return await parking.release(conn, self.durable, key, done)

        left = await order.holder.run(f"release {len(done)} parked", write)
        if left is None:
            raise _Stopping
        for delivery, _ in acks:
            order.stats.processed += 1
            self.metrics.processed(delivery.occurred_at)
        order.stats.released += len(done)
        if left == 0:
            order.blocked.discard(key)
