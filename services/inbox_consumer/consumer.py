"""The consumer's behaviour: fetch a batch, record it in the inbox, dispatch, settle.

Per fetched batch:

1. parse each message (a malformed one is not an error here: it becomes a dead letter
   with its reason, and is never lost);
2. record the whole batch in the inbox in one statement (REQ-051) — a message whose
   outcome is already final is a duplicate (ack, skip, count); one leased by another
   delivery is left alone (nak until the lease ends), so the handler never runs twice
   at once for one id;
3. call the handler for every claimed message concurrently, heart-beating
   ``in_progress`` so ack_wait never expires under a slow handler;
4. settle each by :func:`shared.domain.ack.decide`: processed rows are marked in one
   statement and then acked; retries are marked and nak'ed with an explicit delay;
   dead letters are published (deduplicated per durable and id), marked failed, acked.

This module is the orchestrator (the run loop and :meth:`InboxConsumer.process_batch`);
the seams are modules of their own: :mod:`.delivery` (parsing), :mod:`.deciding` (the
handler call and the decision), :mod:`.settlement` (ack, nak, dead letter, retry
records) and :mod:`.spans` (spans and log fields).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping

import asyncpg
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext

from services.inbox_consumer.batching import BatchCaller
from services.inbox_consumer.deciding import Decider
from services.inbox_consumer.delivery import (
    CONSUMER_ERROR,
    DEFAULT_MAX_MESSAGE_BYTES,
    Delivery,
    attempt_of,
    parse_delivery,
)
from services.inbox_consumer.dispatch import HttpHandler
from services.inbox_consumer.holding import Holder, merge_claims
from services.inbox_consumer.keepalive import KeepAlive
from services.inbox_consumer.metrics import ConsumerMetrics
from services.inbox_consumer.ordering import Sequencer
from services.inbox_consumer.puller import ConsumerGone, Puller
from services.inbox_consumer.settlement import CONTENDED_DELAY, Settler
from services.inbox_consumer.spans import log_fields, process_span
from services.inbox_consumer.stats import ConsumerStats
from services.inbox_consumer.throttle import Throttle
from shared import telemetry
from shared.adapters.postgres import DATABASE_ERRORS, Conn
from shared.adapters.stores import PostgresInboxStore
from shared.contracts.topology import DurableSpec
from shared.domain.ack import DeadLetter, Decision, RetryPolicy
from shared.domain.ports import InboxClaim, InboxStore
from shared.runtime.metrics import RoleMetrics
from shared.waits import sleep_unless

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "ConsumerStats",
    "Delivery",
    "InboxConsumer",
    "parse_delivery",
]

log = logging.getLogger("ferry.inbox_consumer")

#: First and longest pause (s) between inbox claims while the database is unreachable.
INBOX_RETRY_INITIAL = 0.2
INBOX_RETRY_MAX = 5.0
#: Pause before pulling again from a durable that was deleted under us.
GONE_PAUSE = 5.0
#: Answers to "is the durable back?" that mean: not yet (or cannot tell yet) — not found,
#: no connection, no responders, a timeout, no stream leader (APIError 503).
STILL_GONE: tuple[type[BaseException], ...] = (NatsError, OSError)
#: Batches processed at once by default (see InboxConsumer.pipeline).
DEFAULT_PIPELINE = 4


class InboxConsumer:
    """Consumes one durable into its target context's inbox and handler."""

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        js: JetStreamContext,
        durable: str,
        spec: DurableSpec,
        handler: HttpHandler,
        owner: str,
        concurrency: int,
        lease_seconds: float,
        policy: RetryPolicy,
        accepted: frozenset[tuple[str, int]] | None,
        metrics: ConsumerMetrics | None = None,
        store: InboxStore[Conn] | None = None,
        stats: ConsumerStats | None = None,
        partition: int = 0,
        js_consumer: str | None = None,
        key_fields: Mapping[tuple[str, int], str | None] | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self.pool, self.js, self.durable, self.spec = pool, js, durable, spec
        #: The JetStream consumer pulled from: the durable, or one partition's consumer.
        self.js_consumer = js_consumer or durable
        self.partition = partition
        self.owner, self.policy = owner, policy
        self.lease_seconds, self.accepted = lease_seconds, accepted
        #: The inbox (the port; PostgreSQL's unless a test passes another).
        self.store: InboxStore[Conn] = store or PostgresInboxStore()
        shared_stats = stats is not None
        self.stats = stats or ConsumerStats()
        self.metrics = metrics or ConsumerMetrics(
            RoleMetrics("inbox-consumer"), durable=durable, stream=spec.stream
        )
        if not shared_stats:  # partitions of one durable share stats, watched once
            self.metrics.watch(self)
            if spec.ordering == "key":
                self.metrics.watch_parking(pool)
        self.heartbeat_every = max(spec.ack_wait / 3, 0.5)
        #: Heart-beats every message in hand until it is settled.
        self.keeper = KeepAlive(self.heartbeat_every)
        #: Runs the inbox writes, holding through database outages.
        longest = min(INBOX_RETRY_MAX, self.heartbeat_every)
        self.holder = Holder(pool, first_pause=INBOX_RETRY_INITIAL, longest_pause=longest)
        self.holder.on_failure = self._inbox_failed
        #: The handler call and the decision (:mod:`.deciding`).
        self.decider = Decider(
            durable=durable,
            spec=spec,
            handler=handler,
            policy=policy,
            accepted=accepted,
            concurrency=concurrency,
            keeper=self.keeper,
            stats=self.stats,
            metrics=self.metrics,
        )
        #: Batch handler calls (``handler.batch`` >= 2, unordered; an ordered durable
        #: batches through its sequencer, :class:`.batching.BatchGatherer`).
        self.batcher: BatchCaller | None = None
        if spec.handler.batch > 1 and spec.ordering != "key":
            self.batcher = BatchCaller(
                self.decider, size=spec.handler.batch, unexpected=self.unexpected
            )
        #: Inbox writes and ack / nak / term (:mod:`.settlement`).
        self.settler = Settler(
            pool=pool,
            js=js,
            store=self.store,
            durable=durable,
            spec=spec,
            policy=policy,
            keeper=self.keeper,
            holder=self.holder,
            stats=self.stats,
            metrics=self.metrics,
        )
        self.max_message_bytes = DEFAULT_MAX_MESSAGE_BYTES
        #: Batches in process at once; their messages all count against max_ack_pending.
        self.pipeline = DEFAULT_PIPELINE
        self._puller: Puller | None = None
        #: Seconds a batch waits, after its first message, for the ones right behind it —
        #: only while another batch is in process (see :meth:`run`).
        self.linger = 0.0
        #: ``ordering: key``: turns and parking for this partition (:mod:`.ordering`).
        self.sequencer: Sequencer | None = None
        if spec.ordering == "key":
            self.sequencer = Sequencer(self, partition=partition, key_fields=key_fields or {})
        #: The rate limit (INFRA-005 §7.3, :mod:`.throttle`), shared by a durable's
        #: partitions in one process; unthrottled unless the topology or an operator says.
        self.throttle = throttle or Throttle(durable, spec)

    @property
    def handler(self) -> HttpHandler:
        """The durable's handler (the decider calls it)."""
        return self.decider.handler

    @handler.setter
    def handler(self, handler: HttpHandler) -> None:
        self.decider.handler = handler

    @property
    def auth_retry(self) -> tuple[float, float]:
        """Pauses (s) while the handler refuses our credentials, doubling up to the second."""
        return self.decider.auth_retry

    @auth_retry.setter
    def auth_retry(self, pauses: tuple[float, float]) -> None:
        self.decider.auth_retry = pauses

    async def run(self, stop: asyncio.Event, *, fetch_timeout: float) -> None:
        """Pull and process batches until ``stop``; batches in hand are finished first.

        Up to :attr:`pipeline` batches are processed at once, so the handler is busy while
        the next batch is claimed in the inbox and the previous one is settled.
        """
        self.holder.stop = self.decider.stop = stop
        self.keeper.fenced = False
        # fails clearly if absent
        await self.js.consumer_info(self.spec.stream, self.js_consumer)
        draining: asyncio.Task[None] | None = None
        if self.sequencer is not None:
            await self._load_parked(stop)
            draining = asyncio.create_task(self.sequencer.drain(stop))
        puller = Puller(
            self.js, stream=self.spec.stream, durable=self.js_consumer, window=self.spec.batch_size
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
                    self.stats.bound = False  # /readyz fails until it is back
                    log.error("%s; looking again in %.0fs", exc, GONE_PAUSE)
                    await sleep_unless(stop, GONE_PAUSE)
                    try:
                        await self.js.consumer_info(self.spec.stream, self.js_consumer)
                    except STILL_GONE:
                        continue  # still gone (or unreachable): next turn raises again
                    puller.gone = None
                    self.stats.bound = True
                    continue
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
            for msg in await puller.stop():  # arrived, never handed out: let others have it
                await self.settler.nak(msg, 0.0)
            beating.cancel()
            if draining is not None:
                await draining

    async def _next_batch(
        self, puller: Puller, stop: asyncio.Event, fetch_timeout: float, linger: float
    ) -> list[Msg]:
        """The next batch, within the throttle (:mod:`.throttle`): no more messages than
        the bucket holds tokens, and a pull window shrunk to the limit ([]: stopped)."""
        allowed = await self.throttle.admit(self.spec.batch_size, stop)
        if not allowed:
            return []
        puller.window = self.throttle.window(self.spec.batch_size)
        msgs = await puller.next_batch(allowed, fetch_timeout, linger=linger)
        self.throttle.spent(len(msgs))
        return msgs

    async def _load_parked(self, stop: asyncio.Event) -> None:
        """Reload the blocked keys before the first fetch, through database outages."""
        assert self.sequencer is not None
        pause = INBOX_RETRY_INITIAL
        while not stop.is_set():
            try:
                await self.sequencer.load()
                return
            except DATABASE_ERRORS as exc:
                log.warning("cannot read parked keys yet (%s); again in %.1fs", exc, pause)
                await sleep_unless(stop, pause)
                pause = min(pause * 2, INBOX_RETRY_MAX)

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
            self.unexpected("batch", exc)

    async def process_batch(self, msgs: list[Msg]) -> None:
        """Record, dispatch and settle one fetched batch; its messages are kept alive
        until settled. Whatever escapes for the batch nak's what is left of it."""
        self.keeper.hold(msgs)
        try:
            await self._process_batch(msgs)
        except Exception as exc:
            self.unexpected("batch", exc)
            for msg in msgs:
                if not msg.is_acked:
                    await self.settler.nak(msg, self.policy.delay(attempt_of(msg)))
        finally:
            self.keeper.release(msgs)

    async def _process_batch(self, msgs: list[Msg]) -> None:
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
            processing = self.process_unordered(list(unique.values()))
        for delivery in twice:
            await self.settler.nak(delivery.msg, CONTENDED_DELAY)
        await processing

    async def process_unordered(self, deliveries: list[Delivery]) -> None:
        """Claim, decide (all at once) and settle ``deliveries`` (unique ids)."""
        unique = {d.message_id: d for d in deliveries}
        claim = await self.claim_holding(deliveries)
        if claim is None:
            return
        await self.settler.settle_unclaimed(unique, claim)
        claimed = [unique[mid] for mid in claim.claimed]
        for delivery in claimed:
            delivery.span = process_span(delivery, durable=self.durable, stream=self.spec.stream)
        if self.batcher is not None:  # handler.batch >= 2: N events per call (.batching)
            decisions = await self.batcher.decide_all(claimed)
        else:
            decisions = await asyncio.gather(*(self.traced_decide(d) for d in claimed))
        await self.settler.settle(list(zip(claimed, decisions, strict=True)))

    async def claim_holding(self, deliveries: list[Delivery]) -> InboxClaim | None:
        """Claim the batch; while the inbox is unreachable, hold it rather than nak it.

        The batch is held (:mod:`.holding`; the keeper heart-beats it, so JetStream
        neither redelivers nor counts a delivery) and no more is fetched — back-pressure —
        until the database answers. Only a stop gives up: the batch is nak'ed for another
        replica (or the next start) and None is returned. A claim the database refuses
        (not an outage) is retried one message at a time (:meth:`_claim_singly`).
        """
        try:
            claim = await self.holder.run("claim the batch", self._claim_work(deliveries))
        except asyncpg.PostgresError as exc:
            claim = await self._claim_singly(deliveries, exc)
        if claim is None:
            for delivery in deliveries:
                await self.settler.nak(delivery.msg, CONTENDED_DELAY)
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
                one = await self.holder.run("claim one", self._claim_work([delivery]))
            except asyncpg.PostgresError as refused:
                self.unexpected("claim", refused, delivery)
                await self.settler.nak(delivery.msg, self.policy.delay(delivery.attempt))
                continue
            if one is None:
                return None
            claims.append(one)
        return merge_claims(claims)

    def _claim_work(self, deliveries: list[Delivery]) -> Callable[[Conn], Awaitable[InboxClaim]]:
        return lambda conn: self._claim(conn, deliveries)

    async def _claim(self, conn: Conn, deliveries: list[Delivery]) -> InboxClaim:
        return await self.store.claim_batch(
            conn,
            durable=self.durable,
            owner=self.owner,
            lease_seconds=self.lease_seconds,
            entries=[d.entry() for d in deliveries],
        )

    async def traced_decide(self, delivery: Delivery) -> tuple[Decision, int | None]:
        """The decision (:class:`.deciding.Decider`) inside the delivery's span (the
        handler call is its child).

        Whatever it raises for this one message becomes its dead letter (CONSUMER_ERROR,
        replayable once the cause is fixed); the rest of the batch goes on.
        """
        with telemetry.current(delivery.span), log_fields(delivery):
            try:
                return await self.decider.decide(delivery)
            except Exception as exc:
                self.unexpected("decide", exc, delivery)
                return DeadLetter(CONSUMER_ERROR, f"{type(exc).__name__}: {exc}"[:500]), None

    def _inbox_failed(self) -> None:
        self.stats.inbox_unavailable += 1

    def unexpected(self, stage: str, exc: BaseException, delivery: Delivery | None = None) -> None:
        """Something raised that the consumer does not expect: log and count it; the
        caller settles the message(s) concerned and the role goes on."""
        self.settler.unexpected(stage, exc, delivery)
