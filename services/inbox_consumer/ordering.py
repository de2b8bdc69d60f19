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

Parked state lives in the inbox database, so it survives restarts and kills; a consumer
that starts on a partition reloads its blocked keys before it fetches anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from services.inbox_consumer.batching import BatchCaller, BatchGatherer
from services.inbox_consumer.delivery import Delivery, parse_delivery
from services.inbox_consumer.settlement import Decided
from shared.adapters import parking
from shared.adapters.postgres import DATABASE_ERRORS, Conn
from shared.domain.ack import Ack, DeadLetter, Decision, Nak
from shared.domain.errors import PoisonError
from shared.domain.ordering import OrderingKeyError, ordering_key

if TYPE_CHECKING:
    from services.inbox_consumer.consumer import InboxConsumer

log = logging.getLogger("ferry.inbox_consumer")

#: Reason code of an event of an ordered durable whose ordering key cannot be read.
KEY_MISSING = "ORDERING_KEY_MISSING"
#: Longest pause of the drainer when nothing is due (a new park wakes it at once).
DRAIN_IDLE = 1.0
#: Pause after the drainer failed to reach the database.
DRAIN_RETRY = 1.0


class KeyTurns:
    """Per-key FIFO turns: a turn starts when the key's previous turn has ended."""

    def __init__(self) -> None:
        self._tails: dict[str, asyncio.Future[None]] = {}

    def __len__(self) -> int:
        return len(self._tails)

    def take(self, key: str) -> Turn:
        """Queue for ``key`` now (no await: call in the order the work arrived)."""
        previous = self._tails.get(key)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tails[key] = mine
        return Turn(self, key, previous, mine)

    def _ended(self, key: str, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        if self._tails.get(key) is mine:
            del self._tails[key]


class Turn:
    """One place in a key's queue; ``async with`` waits for it and ends it."""

    def __init__(
        self,
        turns: KeyTurns,
        key: str,
        previous: asyncio.Future[None] | None,
        mine: asyncio.Future[None],
    ) -> None:
        self.turns, self.key, self.previous, self.mine = turns, key, previous, mine

    async def __aenter__(self) -> Turn:
        if self.previous is not None and not self.previous.done():
            try:
                await asyncio.shield(self.previous)
            except asyncio.CancelledError:
                self.abandon()
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.turns._ended(self.key, self.mine)

    def abandon(self) -> None:
        """Give up the turn without taking it: it ends when the previous one ends, so the
        next in line still never overtakes the previous."""
        if self.previous is None or self.previous.done():
            self.turns._ended(self.key, self.mine)
        else:
            self.previous.add_done_callback(lambda _: self.turns._ended(self.key, self.mine))


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


class Sequencer:
    """Ordering for one partition of one durable (see the module doc)."""

    def __init__(
        self,
        consumer: InboxConsumer,
        *,
        partition: int,
        key_fields: Mapping[tuple[str, int], str | None],
    ) -> None:
        self.consumer, self.partition, self.key_fields = consumer, partition, key_fields
        self.durable = consumer.durable
        self.turns = KeyTurns()
        #: Keys with parked messages (loaded at start, kept under the keys' turns).
        self.blocked: set[str] = set()
        self.wake = asyncio.Event()
        self.hold = consumer.spec.on_dead_letter == "hold"
        #: ``handler.batch`` >= 2: the events of different keys that ask for a decision
        #: together share a batch call (:class:`.batching.BatchGatherer`); None: one call
        #: per event.
        self.gatherer: BatchGatherer | None = None
        if consumer.spec.handler.batch > 1:
            caller = BatchCaller(
                consumer.decider, size=consumer.spec.handler.batch, unexpected=consumer.unexpected
            )
            self.gatherer = BatchGatherer(caller)

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
        """Reload the partition's blocked keys (before the first fetch)."""
        conn: Conn
        async with self.consumer.pool.acquire() as conn:
            self.blocked = await parking.blocked_keys(conn, self.durable, self.partition)
        if self.blocked:
            log.info("%d keys of partition %d are parked", len(self.blocked), self.partition)
            self.wake.set()

    # -- the JetStream path --------------------------------------------------------

    async def process(self, deliveries: list[Delivery]) -> None:
        """A fetched batch (unique ids, stream order). Turns are taken before any await."""
        keyed: dict[str, list[Delivery]] = {}
        loose: list[Delivery] = []
        for delivery in sorted(deliveries, key=lambda d: d.stream_seq):
            key = self.key_of(delivery)
            if key is None:
                loose.append(delivery)
            else:
                keyed.setdefault(key, []).append(delivery)
        turns = {key: self.turns.take(key) for key in keyed}
        try:
            if loose:  # malformed or keyless: dead letters, in no key's order
                await self.consumer.process_unordered(loose)
            wanted = [d for key, group in keyed.items() if key not in self.blocked for d in group]
            claim = await self.consumer.claim_holding(wanted) if wanted else None
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
                await self.consumer.settler.settle(acks)
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
        async with turn:
            claimed = set(claim.claimed) if claim is not None else set()
            if key in self.blocked:
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
                decision, status = await self._decide(delivery)
                if isinstance(decision, Ack):
                    acks.append((delivery, (decision, status)))
                    continue
                stop = await self._failed(key, delivery, decision, status)
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

    async def _decide(self, delivery: Delivery) -> tuple[Decision, int | None]:
        """One event's decision, awaited in its key's turn: a call of its own, or a place
        in a batch call beside other keys' events (``handler.batch`` >= 2)."""
        if self.gatherer is None:
            return await self.consumer.traced_decide(delivery)
        return await self.gatherer.decide(delivery)

    async def _failed(
        self, key: str, delivery: Delivery, decision: Decision, status: int | None
    ) -> tuple[str, float, str] | None:
        """Settle a failed event in the inbox (and the dead-letter stream); the head state
        its key parks with, or None when the key goes on (a dead letter skipped)."""
        settler = self.consumer.settler
        if isinstance(decision, Nak):
            await settler.record_retry(delivery, decision, status)
            return "retrying", decision.delay, decision.reason
        assert isinstance(decision, DeadLetter)
        ordering: dict[str, Any] = {"key": key, "policy": self.consumer.spec.on_dead_letter}
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
            return "retrying", self.consumer.policy.delay(delivery.attempt), "dead letter unwritten"
        if self.hold:
            return "held", 0.0, decision.reason_code
        return None

    async def _final(self, key: str, rest: list[Delivery], claimed: set[uuid.UUID]) -> bool:
        """``rest[0]`` is final already: a duplicate, acked (False: go on); or a dead letter
        holding its key, ``rest`` parked behind it (True: stop here; also when stopping)."""
        held = await self._holds_its_key(rest[0].message_id)
        if held is None:  # stopping: left to JetStream's redelivery
            for d in rest:
                await self.consumer.settler.nak(d.msg, 0.0)
            return True
        if held:
            await self._park(key, rest, claimed=claimed, state="held", reason="dead letter held")
            return True
        self.consumer.stats.duplicates += 1
        await self.consumer.settler.ack(rest[0].msg)
        return False

    async def _holds_its_key(self, message_id: uuid.UUID) -> bool | None:
        """Whether a message already final is a dead letter that holds its key (None:
        stopping). Under ``hold`` a dead letter is recorded, then its key parked: a consumer
        killed in between leaves it unparked and unacked, and the key must wait behind it
        when it comes back, not go on."""
        if not self.hold:
            return False
        return await self.consumer.holder.run(
            "read a dead letter", lambda c: parking.holds_its_key(c, self.durable, message_id)
        )

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
        owner = self.consumer.owner

        async def write(conn: Conn) -> bool:
            async with conn.transaction():
                await parking.park(conn, self.durable, entries)
                await parking.unclaim(conn, self.durable, owner, untouched)
            return True

        done = await self.consumer.holder.run(f"park {len(entries)} of a key", write)
        if done is None:  # stopping: left to JetStream's redelivery
            for d in group:
                if not d.msg.is_acked:
                    await self.consumer.settler.nak(d.msg, 0.0)
            return
        self.blocked.add(key)
        self.consumer.stats.parked += len(entries)
        for d in group:
            if not d.msg.is_acked:
                await self.consumer.settler.ack(d.msg)
        self.wake.set()

    # -- the drainer ----------------------------------------------------------------

    async def drain(self, stop: asyncio.Event) -> None:
        """Try blocked keys' heads as they fall due, until ``stop``."""
        while not stop.is_set():
            self.wake.clear()
            try:
                pause = await self._drain_round()
            except DATABASE_ERRORS as exc:
                log.warning("parked messages unreachable: %s", exc)
                pause = DRAIN_RETRY
            except Exception as exc:
                self.consumer.unexpected("drain", exc)
                pause = DRAIN_RETRY
            if pause > 0:
                with contextlib.suppress(TimeoutError):
                    waking = asyncio.ensure_future(self.wake.wait())
                    stopping = asyncio.ensure_future(stop.wait())
                    try:
                        await asyncio.wait(
                            {waking, stopping}, timeout=pause, return_when="FIRST_COMPLETED"
                        )
                    finally:
                        waking.cancel()
                        stopping.cancel()

    async def _drain_round(self) -> float:
        """One pass over the due keys; the pause before the next."""
        limit = max(self.consumer.decider.concurrency * 2, 8)
        conn: Conn
        async with self.consumer.pool.acquire() as conn:
            keys = await parking.ready_keys(conn, self.durable, self.partition, limit)
            if not keys:
                due = await parking.next_due(conn, self.durable, self.partition)
                if due is None:
                    return DRAIN_IDLE
                return min(max(due, 0.05), DRAIN_IDLE)
        await asyncio.gather(*(self._drain_key(key, self.turns.take(key)) for key in keys))
        return 0.0

    async def _drain_key(self, key: str, turn: Turn) -> None:
        try:
            async with turn:
                await self._drain_key_in_turn(key)
        except _Stopping:
            return

    async def _drain_key_in_turn(self, key: str) -> None:
        consumer = self.consumer
        conn: Conn
        async with consumer.pool.acquire() as conn:
            rows = await parking.key_rows(conn, self.durable, key, consumer.spec.batch_size)
        if not rows:
            self.blocked.discard(key)
            return
        if rows[0].state == "held" or not rows[0].due:
            return
        deliveries = [
            parse_delivery(ParkedMsg.of(row, consumer.spec.stream), consumer.max_message_bytes)  # type: ignore[arg-type]
            for row in rows
        ]
        claim = await consumer.claim_holding(deliveries)
        if claim is None:
            raise _Stopping
        acks: list[Decided] = []
        done: list[uuid.UUID] = []
        stopped_at = await self._drain_rows(key, rows, deliveries, claim, acks, done)
        if stopped_at is not None:
            claimed = set(claim.claimed)
            rest = [d.message_id for d in deliveries[stopped_at + 1 :] if d.message_id in claimed]
            if rest:
                await consumer.holder.run(
                    "give back claims",
                    lambda c: parking.unclaim(c, self.durable, consumer.owner, rest),
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
        consumer = self.consumer
        for index, (row, delivery) in enumerate(zip(rows, deliveries, strict=True)):
            mid = delivery.message_id
            if mid in claim.final:
                held = await self._holds_its_key(mid)
                if held is None:
                    raise _Stopping
                if held:  # dead-lettered here before a kill, never marked held: hold now
                    await self._retry_row(row, "held", row.attempts, 0.0, "dead letter held")
                    return index
                consumer.stats.duplicates += 1
                done.append(mid)
                continue
            if mid in claim.leased:
                wait = claim.leased[mid] + 1.0
                await self._retry_row(row, row.state, row.attempts, wait, "leased elsewhere")
                return index
            decision, status = await self._decide(delivery)
            if isinstance(decision, Ack):
                acks.append((delivery, (decision, status)))
                done.append(mid)
                continue
            stop = await self._failed(key, delivery, decision, status)
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
        await self.consumer.holder.run(
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
        consumer = self.consumer
        processed = {d.message_id: s or 200 for d, (_, s) in acks}

        async def write(conn: Conn) -> int:
            async with conn.transaction():
                if processed:
                    await consumer.store.mark_processed(conn, self.durable, processed)
                return await parking.release(conn, self.durable, key, done)

        left = await consumer.holder.run(f"release {len(done)} parked", write)
        if left is None:
            raise _Stopping
        for delivery, _ in acks:
            consumer.stats.processed += 1
            consumer.metrics.processed(delivery.occurred_at)
        consumer.stats.released += len(done)
        if left == 0:
            self.blocked.discard(key)
