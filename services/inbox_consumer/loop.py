"""The consumer's run loop: fetch within the throttle, then hand each batch to its path.

Per fetched batch: parse each message (a malformed one is not an error here: it becomes
a dead letter with its reason, and is never lost), keep it alive until it is settled
(:mod:`.keepalive`), nak a second copy of one id in the same batch, and hand the unique
deliveries to the unordered stages (:mod:`.pipeline`: claim, decide, settle) or, for an
``ordering: key`` durable, to the partition's sequencer (:mod:`.ordering`).

Up to ``pipeline`` batches are processed at once, so the handler is busy while the next
batch is claimed in the inbox and the previous one is settled. Every collaborator is
handed over by the composition root (:mod:`.wiring`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass

from services.inbox_consumer.claiming import CONTENDED_DELAY
from services.inbox_consumer.deciding import Decider
from services.inbox_consumer.delivery import Delivery, attempt_of, parse_delivery
from services.inbox_consumer.holding import Holder
from services.inbox_consumer.keepalive import KeepAlive
from services.inbox_consumer.metrics import ConsumerMetrics
from services.inbox_consumer.ordering import Sequencer
from services.inbox_consumer.pipeline import Unordered
from services.inbox_consumer.puller import (
    ORDERED_REQUEST_EXPIRES,
    REQUEST_EXPIRES,
    ConsumerGone,
    DeliveryGap,
    Puller,
)
from services.inbox_consumer.replies import Replies
from services.inbox_consumer.settlement import Settler
from services.inbox_consumer.stats import ConsumerStats
from services.inbox_consumer.throttle import Throttle
from shared import telemetry
from shared.adapters.jetstream import NATS_FAILURES, JetStream
from shared.adapters.jetstream_answers import Answers
from shared.adapters.postgres import DATABASE_ERRORS
from shared.contracts.topology import DurableSpec
from shared.domain.ack import RetryPolicy
from shared.domain.ports import FetchedMessage
from shared.waits import sleep_unless

log = logging.getLogger("ferry.inbox_consumer")

#: First and longest pause (s) between inbox claims while the database is unreachable.
INBOX_RETRY_INITIAL = 0.2
INBOX_RETRY_MAX = 5.0
#: Pause before pulling again from a durable that was deleted under us.
GONE_PAUSE = 5.0
#: Answers to "is the durable back?" that mean: not yet (or cannot tell yet) — not found,
#: no connection, no responders, a timeout, no stream leader (APIError 503).
STILL_GONE: tuple[type[BaseException], ...] = NATS_FAILURES
#: Batches processed at once by default (see ConsumerLoop.pipeline).
DEFAULT_PIPELINE = 4


@dataclass(frozen=True)
class Parts:
    """A consumer's collaborators and settings, as the composition root built them."""

    js: JetStream
    durable: str
    spec: DurableSpec
    #: The JetStream consumer pulled from: the durable, or one partition's consumer.
    js_consumer: str
    partition: int
    policy: RetryPolicy
    stats: ConsumerStats
    metrics: ConsumerMetrics
    throttle: Throttle
    keeper: KeepAlive
    replies: Replies
    #: How fetched messages are answered (naks and terms confirmed, acks remembered).
    answers: Answers
    holder: Holder
    decider: Decider
    settler: Settler
    unordered: Unordered
    sequencer: Sequencer | None
    max_message_bytes: int
    #: Batches in process at once; their messages all count against max_ack_pending.
    pipeline: int
    #: Seconds a batch waits, after its first message, for the ones right behind it —
    #: only while another batch is in process (see :meth:`ConsumerLoop.run`).
    linger: float


class ConsumerLoop:
    """Consumes one durable (or one partition of it) through its stages."""

    def __init__(self, parts: Parts) -> None:
        self.js, self.durable, self.spec = parts.js, parts.durable, parts.spec
        self.js_consumer, self.partition, self.policy = (
            parts.js_consumer, parts.partition, parts.policy
        )  # fmt: skip
        self.stats, self.metrics, self.throttle = parts.stats, parts.metrics, parts.throttle
        self.keeper, self.replies, self.holder = parts.keeper, parts.replies, parts.holder
        self.answers = parts.answers
        #: The running loop's puller (None before :meth:`run` and after it).
        self._puller: Puller | None = None
        #: Whether the last run ended with nothing of it in flight: its subscription
        #: drained and the naks of what was never handed out flushed to the server. A
        #: partition is released as clean only then (:mod:`.partition_slot`).
        self.settled = True
        #: Why the last run was not settled (when it was not).
        self.unsettled = ""
        self.decider, self.settler = parts.decider, parts.settler
        self.unordered, self.sequencer = parts.unordered, parts.sequencer
        # Plain attributes: read per batch, so a test may change them while it runs.
        self.max_message_bytes, self.pipeline, self.linger = (
            parts.max_message_bytes, parts.pipeline, parts.linger
        )  # fmt: skip

    async def run(self, stop: asyncio.Event, *, fetch_timeout: float) -> None:
        """Pull and process batches until ``stop``; batches in hand are finished first."""
        self.holder.stop = self.decider.stop = stop
        self.keeper.fenced = False
        # fails clearly if absent
        await self.js.consumer_info(self.spec.stream, self.js_consumer)
        draining: asyncio.Task[None] | None = None
        # The drainer's stop: the loop's, or the loop ending by itself (a delivery gap).
        ended = asyncio.Event()
        if self.sequencer is not None:
            await self._load_parked(self.sequencer, stop)
            draining = asyncio.create_task(_until(stop, ended, self.sequencer.drain(ended)))
        puller = Puller(
            self.js,
            stream=self.spec.stream,
            durable=self.js_consumer,
            window=self.spec.batch_size,
            expires=REQUEST_EXPIRES if self.sequencer is None else ORDERED_REQUEST_EXPIRES,
            answers=self.answers,
            watch_gaps=self.sequencer is not None,
        )
        await puller.start()
        self._puller = puller
        self.stats.bound = True
        telemetry.set_log_fields(durable=self.durable)
        busy: set[asyncio.Task[None]] = set()
        beating = asyncio.create_task(self.keeper.run(extra=puller.keep_alive))
        try:
            while not stop.is_set():
                if len(busy) >= self.pipeline:
                    await asyncio.wait(busy, return_when=asyncio.FIRST_COMPLETED)
                    continue
                fetch_started = telemetry.now_ns()
                try:
                    # Linger only while another batch is in hand (the handler is busy
                    # anyway) and messages come quickly enough that one is due within
                    # the linger: then a bigger batch saves claims and marks. Otherwise
                    # the first message is handed over at once.
                    quick = puller.arrivals.expects_within(self.linger)
                    linger = self.linger if busy and quick else 0.0
                    msgs = await self._next_batch(puller, stop, fetch_timeout, linger)
                except ConsumerGone as exc:
                    await self._wait_for_durable(puller, stop, exc)
                    continue
                except DeliveryGap:
                    # What arrived after the lost deliveries waits out ack_wait behind
                    # them; the partition restarts once all is redeliverable (not settled).
                    self.stats.delivery_gaps += 1
                    break
                if not msgs:
                    continue
                self.stats.fetched += len(msgs)
                self.metrics.batch_fetched(len(msgs))
                telemetry.receive_span(
                    msgs, stream=self.spec.stream, durable=self.durable, started_ns=fetch_started
                )
                task = asyncio.create_task(self.process_batch(msgs))
                busy.add(task)
                task.add_done_callback(lambda t: self._batch_done(t, busy))
        finally:
            if busy:
                await asyncio.wait(busy)
            # Arrived, never handed out: let others have them (confirmed together).
            self._puller = None
            self.settled = False
            left = await puller.stop()
            await asyncio.gather(*(self.replies.nak(msg, 0.0) for msg in left))
            if puller.gap is not None:
                self.settled, self.unsettled = False, puller.gap
            else:
                self.settled = puller.drained and await puller.flushed()
                self.unsettled = "its pull subscription was not drained or its naks not flushed"
            beating.cancel()
            ended.set()
            if draining is not None:
                await draining

    async def _wait_for_durable(
        self, puller: Puller, stop: asyncio.Event, exc: ConsumerGone
    ) -> None:
        """The durable was deleted under us: /readyz fails until it is back."""
        self.stats.bound = False
        log.error("%s; looking again in %.0fs", exc, GONE_PAUSE)
        await sleep_unless(stop, GONE_PAUSE)
        try:
            await self.js.consumer_info(self.spec.stream, self.js_consumer)
        except STILL_GONE:
            return  # still gone (or unreachable): next turn raises again
        puller.gone = None
        self.stats.bound = True

    async def _next_batch(
        self, puller: Puller, stop: asyncio.Event, fetch_timeout: float, linger: float
    ) -> list[FetchedMessage]:
        """The next batch, within the throttle (:mod:`.throttle`): no more messages than
        the bucket holds tokens, and a pull window shrunk to the limit ([]: stopped)."""
        allowed = await self.throttle.admit(self.spec.batch_size, stop)
        if not allowed:
            return []
        puller.window = self.throttle.window(self.spec.batch_size)
        msgs: list[FetchedMessage] = [
            *await puller.next_batch(allowed, fetch_timeout, linger=linger)
        ]
        self.throttle.spent(len(msgs))
        return msgs

    async def _load_parked(self, sequencer: Sequencer, stop: asyncio.Event) -> None:
        """Reload the blocked keys before the first fetch, through database outages."""
        pause = INBOX_RETRY_INITIAL
        while not stop.is_set():
            try:
                await sequencer.load()
                return
            except DATABASE_ERRORS as exc:
                log.warning("cannot read parked keys yet (%s); again in %.1fs", exc, pause)
                await sleep_unless(stop, pause)
                pause = min(pause * 2, INBOX_RETRY_MAX)

    async def reconnected(self) -> None:
        """NATS is back after a disconnect: pull afresh at once, and send the recent acks
        again (the server that had them may have restarted before storing them)."""
        if self._puller is not None:
            await self._puller.reconnected()
        await self.answers.resend_acks(f"{self.js_consumer}: a reconnect")

    def fence(self) -> None:
        """The partition was lost (another replica may own it now): stop heart-beating what
        is in hand, so JetStream redelivers it to the new owner once ack_wait has run out;
        the run loop ends at its next turn (its stop event is set)."""
        log.warning("partition %d of %s lost: messages in hand are no longer kept alive",
                    self.partition, self.durable)  # fmt: skip
        self.keeper.fenced = True

    def _batch_done(self, task: asyncio.Task[None], busy: set[asyncio.Task[None]]) -> None:
        """Forget a finished batch (:meth:`process_batch` settles its own failures)."""
        busy.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            self.settler.unexpected("batch", exc)

    async def process_batch(self, msgs: list[FetchedMessage]) -> None:
        """Parse, then process one fetched batch; its messages are kept alive until
        settled. Whatever escapes for the batch nak's what is left of it."""
        self.keeper.hold(msgs)
        try:
            await self._process_batch(msgs)
        except Exception as exc:
            self.settler.unexpected("batch", exc)
            for msg in msgs:
                if not msg.is_acked:
                    await self.replies.nak(msg, self.policy.delay(attempt_of(msg)))
        finally:
            self.keeper.release(msgs)

    async def _process_batch(self, msgs: list[FetchedMessage]) -> None:
        # No await before the sequencer has taken its keys' turns (fetch order).
        unique: dict[uuid.UUID, Delivery] = {}
        twice: list[Delivery] = []
        for msg in msgs:
            delivery = parse_delivery(msg, self.max_message_bytes)
            if delivery.message_id in unique:  # the same id twice in one batch
                twice.append(delivery)
                continue
            unique[delivery.message_id] = delivery
        if self.sequencer is not None:
            processing = self.sequencer.process(list(unique.values()))
        else:
            processing = self.unordered.process(list(unique.values()))
        for delivery in twice:
            await self.replies.nak(delivery.msg, CONTENDED_DELAY)
        await processing


async def _until(stop: asyncio.Event, ended: asyncio.Event, work: Awaitable[None]) -> None:
    """Run ``work`` (which ends when ``ended`` is set), setting ``ended`` once ``stop`` is."""
    following = asyncio.create_task(stop.wait())
    following.add_done_callback(lambda _: ended.set())
    try:
        await work
    finally:
        following.cancel()
