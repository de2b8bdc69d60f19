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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext

from services.inbox_consumer.dispatch import HttpHandler
from services.inbox_consumer.holding import Holder, merge_claims
from services.inbox_consumer.keepalive import KeepAlive
from services.inbox_consumer.metrics import ConsumerMetrics
from services.inbox_consumer.puller import ConsumerGone, Puller
from shared import telemetry
from shared.adapters import dead_letters, inbox
from shared.adapters.inbox import ClaimResult, InboxEntry
from shared.adapters.postgres import DATABASE_ERRORS, Conn
from shared.contracts.topology import DurableSpec
from shared.domain.ack import Ack, DeadLetter, Decision, HandlerResponse, Nak, RetryPolicy, decide
from shared.domain.envelope import Envelope, Identified, format_timestamp, identify
from shared.domain.errors import PoisonError
from shared.domain.subjects import REPLAY_PREFIX
from shared.runtime.metrics import RoleMetrics

log = logging.getLogger("ferry.inbox_consumer")

#: Largest message body the consumer parses (the default stream max_msg_size).
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
#: Most of a raw (unparseable) body a dead-letter record keeps.
RECORD_BODY_LIMIT = 64 * 1024
#: The decision code of a delivery that failed on its last attempt.
EXHAUSTED = "MAX_DELIVERIES_EXCEEDED"
#: First and longest pause (s) between inbox claims while the database is unreachable.
INBOX_RETRY_INITIAL = 0.2
INBOX_RETRY_MAX = 5.0
#: Delay before a copy that lost the race for an id is offered again.
CONTENDED_DELAY = 1.0
#: Pause before pulling again from a durable that was deleted under us.
GONE_PAUSE = 5.0
#: Answers to "is the durable back?" that mean: not yet (or cannot tell yet) — not found,
#: no connection, no responders, a timeout, no stream leader (APIError 503).
STILL_GONE: tuple[type[BaseException], ...] = (NatsError, OSError)
#: Batches processed at once by default (see InboxConsumer.pipeline).
DEFAULT_PIPELINE = 4
#: Failures that leave a dead letter unwritten: the message is nak'ed and tried again.
#: Any NATS error: no stream leader (NoStreamResponseError, APIError) while NATS
#: restarts, a timeout, a closed connection.
DEAD_LETTER_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, NatsError)
#: The reason code of a message whose handling raised something unexpected.
CONSUMER_ERROR = "CONSUMER_ERROR"


@dataclass
class ConsumerStats:
    """Counters the role exposes (and tests read)."""

    fetched: int = 0
    processed: int = 0
    duplicates: int = 0
    retries: int = 0
    dead_lettered: int = 0
    exhausted: int = 0
    handler_calls: int = 0
    contended: int = 0
    auth_refusals: int = 0
    inbox_unavailable: int = 0
    consumer_errors: int = 0
    alerts: int = 0
    bound: bool = False
    retries_by_reason: dict[str, int] = field(default_factory=dict)


@dataclass
class Delivery:
    """One fetched message and what we could learn from it."""

    msg: Msg
    message_id: uuid.UUID
    attempt: int
    stream_seq: int
    envelope: Envelope | None
    poison: PoisonError | None
    #: The ``process`` span while the delivery is handled (None when tracing is off).
    span: telemetry.Span | None = None

    @property
    def replay(self) -> bool:
        """Whether this is a dlq-replayer's (or operator's) replay of a dead letter."""
        return self.msg.subject.startswith(REPLAY_PREFIX + ".")

    @property
    def traceparent(self) -> str | None:
        """The W3C traceparent header, when well-formed: anything else (a NUL, 10 kB) is
        dropped here, before the inbox, the handler call or a dead letter refuses it."""
        value = (self.msg.headers or {}).get("traceparent")
        return value.strip() if value and telemetry.parse_traceparent(value) else None

    @property
    def subject(self) -> str:
        """The event's own subject (a replay travels on the durable's replay subject)."""
        if self.replay and self.envelope is not None:
            return self.envelope.subject
        return self.msg.subject

    def entry(self) -> InboxEntry:
        """The inbox row to record."""
        env = self.envelope
        return InboxEntry(
            message_id=self.message_id,
            subject=self.subject,
            event_type=env.event_type if env else None,
            event_version=env.event_version if env else None,
            occurred_at=env.occurred_at if env else None,
            stream_seq=self.stream_seq,
            traceparent=self.traceparent,
        )


def parse_delivery(msg: Msg, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Delivery:
    """Parse without raising: a defect is kept as ``poison`` for the dead-letter path.

    A body over ``max_bytes`` is not even parsed: it is poison ``MESSAGE_TOO_LARGE``. A
    body that makes parsing raise is poison ``CONSUMER_ERROR``, keyed like an unparseable
    one (its ``Nats-Msg-Id``, or its stream position), so the rest of its batch goes on.
    """
    meta = msg.metadata

    def identified(data: bytes) -> Identified:
        return identify(
            data,
            subject=msg.subject,
            msg_id_header=(msg.headers or {}).get("Nats-Msg-Id"),
            stream=meta.stream,
            seq=meta.sequence.stream,
        )

    size, problem = len(msg.data), None
    if size > max_bytes:
        problem = PoisonError("MESSAGE_TOO_LARGE", f"{size} bytes exceeds {max_bytes}")
    else:
        try:
            found = identified(msg.data)
        except Exception as exc:
            log.error("could not parse a message: %r", exc, exc_info=exc)
            detail = f"parsing raised {type(exc).__name__}: {exc}"[:500]
            problem = PoisonError(CONSUMER_ERROR, detail)
    if problem is not None:
        found = Identified(identified(b"").message_id, None, problem)
    seq = meta.sequence.stream
    return Delivery(msg, found.message_id, meta.num_delivered, seq, found.envelope, found.poison)


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
    ) -> None:
        self.pool, self.js, self.durable, self.spec = pool, js, durable, spec
        self.handler, self.owner, self.policy = handler, owner, policy
        self.lease_seconds, self.accepted = lease_seconds, accepted
        self.slots = asyncio.Semaphore(concurrency)
        self.stats = ConsumerStats()
        self.metrics = metrics or ConsumerMetrics(
            RoleMetrics("inbox-consumer"), durable=durable, stream=spec.stream
        )
        self.metrics.watch(self)
        self.heartbeat_every = max(spec.ack_wait / 3, 0.5)
        #: Heart-beats every message in hand until it is settled.
        self.keeper = KeepAlive(self.heartbeat_every)
        #: Runs the inbox writes, holding through database outages.
        longest = min(INBOX_RETRY_MAX, self.heartbeat_every)
        self.holder = Holder(pool, first_pause=INBOX_RETRY_INITIAL, longest_pause=longest)
        self.holder.on_failure = self._inbox_failed
        #: Pauses (s) while the handler refuses our credentials, doubling up to the second.
        self.auth_retry = (1.0, 30.0)
        self._stop = asyncio.Event()
        self.max_message_bytes = DEFAULT_MAX_MESSAGE_BYTES
        #: Batches in process at once; their messages all count against max_ack_pending.
        self.pipeline = DEFAULT_PIPELINE
        self._puller: Puller | None = None
        #: Seconds a batch waits, after its first message, for the ones right behind it —
        #: only while another batch is in process (see :meth:`run`).
        self.linger = 0.0

    async def run(self, stop: asyncio.Event, *, fetch_timeout: float) -> None:
        """Pull and process batches until ``stop``; batches in hand are finished first.

        Up to :attr:`pipeline` batches are processed at once, so the handler is busy while
        the next batch is claimed in the inbox and the previous one is settled.
        """
        self._stop = self.holder.stop = stop
        await self.js.consumer_info(self.spec.stream, self.durable)  # fails clearly if absent
        puller = Puller(
            self.js, stream=self.spec.stream, durable=self.durable, window=self.spec.batch_size
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
                    msgs = await puller.next_batch(
                        self.spec.batch_size, fetch_timeout, linger=linger
                    )
                except ConsumerGone as exc:
                    self.stats.bound = False  # /readyz fails until it is back
                    log.error("%s; looking again in %.0fs", exc, GONE_PAUSE)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=GONE_PAUSE)
                    try:
                        await self.js.consumer_info(self.spec.stream, self.durable)
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
                await self._nak(msg, 0.0)
            beating.cancel()

    def _batch_done(self, task: asyncio.Task[None], busy: set[asyncio.Task[None]]) -> None:
        """Forget a finished batch (:meth:`process_batch` settles its own failures)."""
        busy.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            self._unexpected("batch", exc)

    async def process_batch(self, msgs: list[Msg]) -> None:
        """Record, dispatch and settle one fetched batch; its messages are kept alive
        until settled. Whatever escapes for the batch nak's what is left of it."""
        self.keeper.hold(msgs)
        try:
            await self._process_batch(msgs)
        except Exception as exc:
            self._unexpected("batch", exc)
            for msg in msgs:
                if not msg.is_acked:
                    await self._nak(msg, self.policy.delay(_attempt(msg)))
        finally:
            self.keeper.release(msgs)

    async def _process_batch(self, msgs: list[Msg]) -> None:
        unique: dict[uuid.UUID, Delivery] = {}
        for msg in msgs:
            delivery = parse_delivery(msg, self.max_message_bytes)
            if delivery.message_id in unique:  # the same id twice in one batch
                await self._nak(delivery.msg, CONTENDED_DELAY)
                continue
            unique[delivery.message_id] = delivery
        claim = await self._claim_holding(list(unique.values()))
        if claim is None:
            return
        await self._settle_unclaimed(unique, claim)
        claimed = [unique[mid] for mid in claim.claimed]
        for delivery in claimed:
            delivery.span = self._process_span(delivery)
        decisions = await asyncio.gather(*(self._traced_decide(d) for d in claimed))
        await self._settle(list(zip(claimed, decisions, strict=True)))

    async def _claim_holding(self, deliveries: list[Delivery]) -> ClaimResult | None:
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
                await self._nak(delivery.msg, CONTENDED_DELAY)
        return claim

    async def _claim_singly(
        self, deliveries: list[Delivery], exc: BaseException
    ) -> ClaimResult | None:
        """One row may be unstorable (a NUL in its subject): claim each message alone. One
        refused alone is nak'ed with its back-off — it can be neither recorded nor
        dead-lettered here; its exhaustion reaches the dlq-router — and the rest go on."""
        log.warning("claim of %d refused (%r): claiming one by one", len(deliveries), exc)
        claims = []
        for delivery in deliveries:
            try:
                one = await self.holder.run("claim one", self._claim_work([delivery]))
            except asyncpg.PostgresError as refused:
                self._unexpected("claim", refused, delivery)
                await self._nak(delivery.msg, self.policy.delay(delivery.attempt))
                continue
            if one is None:
                return None
            claims.append(one)
        return merge_claims(claims)

    def _claim_work(self, deliveries: list[Delivery]) -> Callable[[Conn], Awaitable[ClaimResult]]:
        return lambda conn: self._claim(conn, deliveries)

    async def _claim(self, conn: Conn, deliveries: list[Delivery]) -> ClaimResult:
        return await inbox.claim_batch(
            conn,
            durable=self.durable,
            owner=self.owner,
            lease_seconds=self.lease_seconds,
            entries=[d.entry() for d in deliveries],
        )

    async def _settle_unclaimed(
        self, unique: dict[uuid.UUID, Delivery], claim: ClaimResult
    ) -> None:
        for mid in claim.final:
            self.stats.duplicates += 1
            await self._ack(unique[mid].msg)
        for mid, lease_left in claim.leased.items():
            self.stats.contended += 1
            await self._nak(unique[mid].msg, lease_left + CONTENDED_DELAY)

    def _process_span(self, delivery: Delivery) -> telemetry.Span | None:
        """The delivery's ``process`` span, child of the context its headers carry."""
        if not telemetry.active():
            return None
        env = delivery.envelope
        return telemetry.start_span(
            f"process {delivery.subject}",
            kind=telemetry.SpanKind.CONSUMER,
            parent=telemetry.extract(delivery.msg.headers),
            attributes=lambda: telemetry.messaging_attributes(
                operation_type="process",
                operation_name="process",
                destination=delivery.subject,
                message_id=str(delivery.message_id),
                consumer_group=self.durable,
                extra={
                    "messaging.message.delivery_attempt": delivery.attempt,
                    "messaging.message.conversation_id": env.correlation_id if env else None,
                    "ferry.stream": self.spec.stream,
                    "ferry.stream.sequence": delivery.stream_seq,
                    "ferry.event.type": env.event_type if env else None,
                    "ferry.replay": delivery.replay,
                },
            ),
        )

    def _log_fields(self, delivery: Delivery) -> contextlib.AbstractContextManager[None]:
        traceparent = delivery.traceparent
        return telemetry.log_fields(message_id=str(delivery.message_id), traceparent=traceparent)

    async def _traced_decide(self, delivery: Delivery) -> tuple[Decision, int | None]:
        """:meth:`_decide` inside the delivery's span (the handler call is its child).

        Whatever it raises for this one message becomes its dead letter (CONSUMER_ERROR,
        replayable once the cause is fixed); the rest of the batch goes on.
        """
        with telemetry.current(delivery.span), self._log_fields(delivery):
            try:
                return await self._decide(delivery)
            except Exception as exc:
                self._unexpected("decide", exc, delivery)
                return DeadLetter(CONSUMER_ERROR, f"{type(exc).__name__}: {exc}"[:500]), None

    @contextlib.contextmanager
    def _settling(self, delivery: Delivery, decision: Decision) -> Iterator[None]:
        """The ``settle`` span of one delivery; ends its ``process`` span afterwards."""
        with telemetry.current(delivery.span), self._log_fields(delivery):
            if isinstance(decision, Ack):
                operation = "ack"
            elif isinstance(decision, Nak) or decision.reason_code == EXHAUSTED:
                operation = "nak"
            else:
                operation = "term"
            span = None
            if delivery.span is not None and delivery.span.is_recording():
                span = telemetry.start_span(
                    f"{operation} {delivery.subject}",
                    kind=telemetry.SpanKind.CLIENT,
                    attributes=telemetry.messaging_attributes(
                        operation_type="settle",
                        operation_name=operation,
                        destination=delivery.subject,
                        message_id=str(delivery.message_id),
                        consumer_group=self.durable,
                    ),
                )
            try:
                with telemetry.current(span):
                    yield
            finally:
                telemetry.end_span(span)
                error = None if isinstance(decision, Ack) else _decision_error(decision)
                telemetry.end_span(delivery.span, error)
                delivery.span = None

    async def _decide(self, delivery: Delivery) -> tuple[Decision, int | None]:
        """What to do with a claimed delivery, and the handler status if it was called."""
        if delivery.poison is not None:
            return DeadLetter(delivery.poison.reason_code, delivery.poison.detail), None
        envelope = delivery.envelope
        assert envelope is not None
        key = (envelope.event_type, envelope.event_version)
        if self.accepted is not None and key not in self.accepted:
            detail = f"{self.durable} handles no {envelope.event_type}.v{envelope.event_version}"
            return DeadLetter("UNKNOWN_EVENT", detail), None
        # The registry's accepted set carries each version's schema validator; a payload
        # that fails it can never succeed (poison), so the handler is not called.
        from shared.contracts.events import AcceptedEvents

        if isinstance(self.accepted, AcceptedEvents):
            problem = self.accepted.payload_error(key, envelope.payload)
            if problem is not None:
                return DeadLetter("SCHEMA_INVALID", problem), None
        async with self.slots:
            outcome = await self._call_with_heartbeat(delivery, envelope)
            if _refused(outcome):
                outcome = await self._hold_while_refused(delivery, envelope, outcome)
        status = outcome.status if isinstance(outcome, HandlerResponse) else None
        return decide(outcome, attempt=delivery.attempt, policy=self.policy), status

    async def _hold_while_refused(
        self, delivery: Delivery, envelope: Envelope, outcome: Any
    ) -> Any:
        """The handler refuses our credentials (401/403): a configuration error, not poison.

        Hold the message (heart-beating, so JetStream neither redelivers it nor counts a
        delivery), alert, and call again with a doubling pause until the credentials are
        fixed. Only a stop ends the hold early; the refusal is then nak'ed like a retry.
        """
        pause, longest = self.auth_retry
        while _refused(outcome) and not self._stop.is_set():
            self.stats.auth_refusals += 1
            self.stats.alerts += 1
            log.error(
                "handler refused our credentials (HTTP %s): check the durable's signing "
                "secret (FERRY_HANDLER_SECRET) and the handler's; holding the message",
                outcome.status,
                extra={"durable": self.durable, "message_id": str(delivery.message_id)},
            )
            with contextlib.suppress(TimeoutError):  # the keeper heart-beats meanwhile
                await asyncio.wait_for(self._stop.wait(), timeout=pause)
            pause = min(pause * 2, longest)
            outcome = await self._call_with_heartbeat(delivery, envelope)
        return outcome

    async def _call_with_heartbeat(self, delivery: Delivery, envelope: Envelope) -> Any:
        """Call the handler; the keeper heart-beats the message during the call, unless
        the durable turned heartbeats off (the lint then requires timeout < ack_wait)."""
        call = self._timed(
            self.handler.handle(self._request_body(delivery, envelope), self._headers(delivery))
        )
        self.stats.handler_calls += 1
        if self.spec.heartbeats:
            return await call
        with self.keeper.paused(delivery.msg):
            return await call

    async def _timed(self, call: Awaitable[Any]) -> Any:
        """Await the handler call, counting its answer and timing it."""
        clock = asyncio.get_running_loop()
        started = clock.time()
        outcome = await call
        self.metrics.handled(outcome, clock.time() - started)
        return outcome

    def _request_body(self, delivery: Delivery, envelope: Envelope) -> dict[str, Any]:
        body = envelope.to_dict()
        body["delivery"] = {
            "attempt": delivery.attempt,
            "max_attempts": self.policy.max_deliver,
            "stream_sequence": delivery.stream_seq,
            "durable": self.durable,
        }
        # INFRA-005 §2 names, for the Mediation workers.
        body.update(
            messageId=envelope.message_id,
            traceKey=envelope.correlation_id or envelope.message_id,
            opportunityKey=envelope.payload.get("opportunity_key"),
            module=envelope.context,
            eventType=envelope.event_type,
            payloadDigest=body["payload_digest"],
            createdAt=format_timestamp(envelope.occurred_at),
            retryCount=delivery.attempt - 1,
            maxRetries=self.policy.max_deliver - 1,
        )
        return body

    def _headers(self, delivery: Delivery) -> dict[str, str]:
        headers = {"Idempotency-Key": str(delivery.message_id)}
        traceparent = delivery.traceparent
        if traceparent:
            headers["traceparent"] = traceparent
        return headers

    async def _settle(self, results: list[tuple[Delivery, tuple[Decision, int | None]]]) -> None:
        processed = {d.message_id: s or 200 for d, (dec, s) in results if isinstance(dec, Ack)}
        if processed and not await self._mark_processed(processed):
            processed = {}  # left unacked: the redelivery will get 409 and be marked then
        for delivery, (decision, status) in results:
            try:
                await self._settle_one(delivery, decision, status, processed)
            except Exception as exc:
                self._unexpected("settle", exc, delivery)
                if not delivery.msg.is_acked:
                    await self._nak(delivery.msg, self.policy.delay(delivery.attempt))

    async def _mark_processed(self, processed: dict[uuid.UUID, int]) -> bool:
        async def mark(conn: Conn) -> bool:
            await inbox.mark_processed(conn, self.durable, processed)
            return True

        try:
            return await self.holder.run(f"mark {len(processed)} processed", mark) is not None
        except DATABASE_ERRORS as exc:
            log.warning("could not mark %d processed: %s", len(processed), exc)
            return False

    async def _settle_one(
        self, delivery: Delivery, decision: Decision, status: int | None, processed: Any
    ) -> None:
        with self._settling(delivery, decision):
            if isinstance(decision, Ack):
                if delivery.message_id in processed:
                    self.stats.processed += 1
                    await self._ack(delivery.msg)
                    self.metrics.processed(_occurred_at(delivery))
            elif isinstance(decision, Nak):
                await self._retry(delivery, decision, status)
            else:
                await self._dead_letter(delivery, decision, status)

    async def _retry(self, delivery: Delivery, decision: Nak, status: int | None) -> None:
        self.stats.retries += 1
        reason = _retry_reason(status, decision.reason)
        self.stats.retries_by_reason[reason] = self.stats.retries_by_reason.get(reason, 0) + 1
        if decision.alert:
            self.stats.alerts += 1
            log.error(
                "handler configuration problem: %s",
                decision.reason,
                extra={"durable": self.durable, "message_id": str(delivery.message_id)},
            )
        entry = _history(delivery, status, reason, decision.reason)
        await self._release(delivery, decision.reason, status, reason, entry)
        await self._nak(delivery.msg, decision.delay)

    async def _release(
        self, delivery: Delivery, error: str, status: int | None, reason: str, entry: Any
    ) -> None:
        """Record the failed attempt and release the lease before the nak.

        While the database is unreachable the message is held (kept alive) and the write
        tried again: nak'ing with the lease still held would make the redelivery a
        contended copy, which spends a delivery without calling the handler.
        """
        await self.holder.run(
            f"record the retry of {delivery.message_id}",
            lambda conn: inbox.mark_retrying(
                conn,
                self.durable,
                delivery.message_id,
                error=error,
                status=status,
                reason_code=reason,
                history_entry=entry,
            ),
        )

    async def _dead_letter(
        self, delivery: Delivery, decision: DeadLetter, status: int | None
    ) -> None:
        if decision.reason_code == EXHAUSTED:
            reason = _retry_reason(status, decision.detail)
            entry = _history(delivery, status, reason, decision.detail)
            await self._exhausted(delivery, decision, status, entry)
            return
        entry = _history(delivery, status, decision.reason_code, decision.detail)
        try:
            async with self.pool.acquire() as conn:
                history = await inbox.retry_history(conn, self.durable, delivery.message_id)
                outcome = await dead_letters.record_dead_letter(
                    conn,
                    self.js,
                    self._failure(delivery, decision, status, history, entry),
                    self.spec,
                )
        except DEAD_LETTER_ERRORS as exc:
            # No stream leader (a NATS restart), the database away...: nothing written.
            self.metrics.consumer_error("dead_letter")
            detail = f"dead letter not written: {type(exc).__name__}: {exc}"
            log.warning("%s; it will be redelivered", detail, extra=self._ids(delivery))
            entry = _history(delivery, status, decision.reason_code, detail)
            await self._release(delivery, detail, status, decision.reason_code, entry)
            await self._nak(delivery.msg, self.policy.delay(delivery.attempt))
            return
        self.stats.dead_lettered += 1
        if outcome == "recorded":
            self.metrics.dead_lettered(decision.reason_code)
        log.info(
            "dead-lettered",
            extra={
                "durable": self.durable,
                "message_id": str(delivery.message_id),
                "reason": decision.reason_code,
                "outcome": outcome,
            },
        )
        # term, not ack: JetStream will not redeliver it, and its MSG_TERMINATED advisory
        # reaches the dlq-router, which finds the record and leaves it alone.
        self.keeper.release([delivery.msg])
        await _quiet(delivery.msg.term())

    async def _exhausted(
        self, delivery: Delivery, decision: DeadLetter, status: int | None, entry: dict[str, Any]
    ) -> None:
        """The last delivery failed: record the attempt and let JetStream give up on it.

        The nak of the final delivery makes JetStream emit MAX_DELIVERIES, captured in the
        topology's advisory stream; the dlq-router turns it into the record with the whole
        retry history. One path for every exhaustion — failing handler or crashing
        consumer alike.
        """
        self.stats.exhausted += 1
        await self._release(delivery, decision.detail, status, decision.reason_code, entry)
        log.warning(
            "deliveries exhausted; the dlq-router records it",
            extra={"durable": self.durable, "message_id": str(delivery.message_id)},
        )
        await self._nak(delivery.msg, 0.0)

    def _failure(
        self,
        delivery: Delivery,
        decision: DeadLetter,
        status: int | None,
        history: list[dict[str, Any]],
        entry: dict[str, Any],
    ) -> dead_letters.Failure:
        env = delivery.envelope
        payload: Any = env.to_dict() if env else _raw_body(delivery.msg.data)
        return dead_letters.Failure(
            durable=self.durable,
            message_id=delivery.message_id,
            stream=self.spec.stream,
            stream_seq=delivery.stream_seq,
            original_subject=delivery.subject,
            reason_code=decision.reason_code,
            last_error=decision.detail,
            attempts=delivery.attempt,
            payload=payload,
            retry_history=history,
            source="consumer",
            event_type=env.event_type if env else None,
            event_version=env.event_version if env else None,
            occurred_at=env.occurred_at if env else None,
            traceparent=delivery.traceparent,
            handler_status=status,
            history_entry=entry,
        )

    async def _ack(self, msg: Msg) -> None:
        self.keeper.release([msg])
        await _quiet(msg.ack())

    async def _nak(self, msg: Msg, delay: float) -> None:
        self.keeper.release([msg])
        await _quiet(msg.nak(delay=delay if math.isfinite(delay) and delay > 0 else 0.0))

    def _inbox_failed(self) -> None:
        self.stats.inbox_unavailable += 1

    def _ids(self, delivery: Delivery) -> dict[str, str]:
        return {"durable": self.durable, "message_id": str(delivery.message_id)}

    def _unexpected(self, stage: str, exc: BaseException, delivery: Delivery | None = None) -> None:
        """Something raised that the consumer does not expect: log and count it; the
        caller settles the message(s) concerned and the role goes on."""
        self.stats.consumer_errors += 1
        self.metrics.consumer_error(stage)
        extra = self._ids(delivery) if delivery is not None else {"durable": self.durable}
        log.error("unexpected error (%s): %r", stage, exc, exc_info=exc, extra=extra)


def _raw_body(data: bytes) -> Any:
    """An unparseable body as the record keeps it: whole, or its head when it is large."""
    if len(data) <= RECORD_BODY_LIMIT:
        return data.decode("utf-8", "replace")
    return {
        "truncated": True,
        "bytes": len(data),
        "head": data[:RECORD_BODY_LIMIT].decode("utf-8", "replace"),
    }


def _refused(outcome: Any) -> bool:
    """The handler says our credentials are wrong (a signing-secret mismatch)."""
    return isinstance(outcome, HandlerResponse) and outcome.status in (401, 403)


def _occurred_at(delivery: Delivery) -> datetime | None:
    return delivery.envelope.occurred_at if delivery.envelope is not None else None


def _decision_error(decision: Decision) -> str:
    if isinstance(decision, Nak):
        return f"retry: {decision.reason}"
    assert isinstance(decision, DeadLetter)
    return f"{decision.reason_code}: {decision.detail}"


def _retry_reason(status: int | None, reason: str) -> str:
    """A retry's reason code: ``HTTP_503``, ``handler_timeout``, ``handler_unreachable``."""
    return "HTTP_" + str(status) if status else reason.split(":")[0].replace(" ", "_")


def _history(delivery: Delivery, status: int | None, reason: str, detail: str) -> dict[str, Any]:
    return {
        "attempt": delivery.attempt,
        "at": format_timestamp(datetime.now(UTC)),
        "status": status,
        "reason": reason,
        "detail": detail[:500],
    }


def _attempt(msg: Msg) -> int:
    """The delivery count of a message (1 when its metadata cannot be read)."""
    try:
        return int(msg.metadata.num_delivered)
    except Exception:
        return 1


async def _quiet(ack: Any) -> None:
    """Send an ack/nak/in_progress; a lost one only causes a redelivery the inbox absorbs."""
    try:
        await ack
    except (NatsError, OSError) as exc:
        log.warning("could not send ack/nak: %s", exc)
