"""The decide/call path: what to do with a claimed delivery, calling its handler if needed.

Poison, an event the durable does not handle, or a payload its schema refuses is decided
without a call. Otherwise the handler is called (the keeper heart-beats the message
meanwhile, so ack_wait never expires under a slow handler); an answer that refuses our
credentials holds the message and calls again until they are fixed; the answer becomes
the decision by :func:`shared.domain.ack.decide` (Retry-After included).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from services.inbox_consumer.breaker import KEEP_AT_MOST, STOPPING, CircuitBreaker
from services.inbox_consumer.delivery import CONSUMER_ERROR, Delivery
from services.inbox_consumer.keepalive import KeepAlive
from services.inbox_consumer.metrics import ConsumerMetrics
from services.inbox_consumer.spans import log_fields
from services.inbox_consumer.stats import ConsumerStats
from shared import telemetry
from shared.contracts.events import AcceptedEvents
from shared.contracts.topology import BreakerSpec, DurableSpec
from shared.domain.ack import DeadLetter, Decision, HandlerResponse, RetryPolicy, decide
from shared.domain.envelope import Envelope
from shared.domain.handler_call import request_body, request_headers
from shared.domain.ports import HandlerPort
from shared.waits import sleep_unless

log = logging.getLogger("ferry.inbox_consumer")

#: Reports an unexpected exception for a delivery (the settler logs and counts it).
Unexpected = Callable[[str, BaseException, Delivery | None], None]
#: Pauses (s) while the handler refuses our credentials, by default.
AUTH_RETRY = (1.0, 30.0)


class Decider:
    """Decides each claimed delivery of one durable, calling its handler when it must."""

    def __init__(
        self,
        *,
        durable: str,
        spec: DurableSpec,
        handler: HandlerPort,
        policy: RetryPolicy,
        accepted: frozenset[tuple[str, int]] | None,
        concurrency: int,
        keeper: KeepAlive,
        stats: ConsumerStats,
        metrics: ConsumerMetrics,
        unexpected: Unexpected,
        auth_retry: tuple[float, float] = AUTH_RETRY,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.durable, self.spec, self.handler, self.policy = durable, spec, handler, policy
        self.accepted, self.keeper, self.stats, self.metrics = accepted, keeper, stats, metrics
        self.concurrency, self.unexpected = concurrency, unexpected
        self.slots = asyncio.Semaphore(concurrency)
        #: Pauses (s) while the handler refuses our credentials, doubling up to the second.
        self.auth_retry = auth_retry
        #: Set when the role stops (the run loop hands its stop event over): ends a hold
        #: on refused credentials, or a wait at the open circuit breaker.
        self.stop = asyncio.Event()
        #: Every handler call goes through it (:mod:`.breaker`).
        self.breaker = breaker or CircuitBreaker(BreakerSpec(enabled=False), durable=durable)

    async def traced(self, delivery: Delivery) -> tuple[Decision, int | None]:
        """:meth:`decide` inside the delivery's span (the handler call is its child).

        Whatever it raises for this one message becomes its dead letter (CONSUMER_ERROR,
        replayable once the cause is fixed); the rest of the batch goes on.
        """
        with telemetry.current(delivery.span), log_fields(delivery):
            try:
                return await self.decide(delivery)
            except Exception as exc:
                self.unexpected("decide", exc, delivery)
                return DeadLetter(CONSUMER_ERROR, f"{type(exc).__name__}: {exc}"[:500]), None

    async def decide(self, delivery: Delivery) -> tuple[Decision, int | None]:
        """What to do with a claimed delivery, and the handler status if it was called."""
        early = self.without_call(delivery)
        if early is not None:
            return early, None
        envelope = delivery.envelope
        assert envelope is not None
        async with self.slots:
            outcome = await self._call_with_heartbeat(delivery, envelope)
            if refused(outcome):
                outcome = await self._hold_while_refused(delivery, envelope, outcome)
        status = outcome.status if isinstance(outcome, HandlerResponse) else None
        return decide(outcome, attempt=delivery.attempt, policy=self.policy), status

    def without_call(self, delivery: Delivery) -> DeadLetter | None:
        """The decision of a delivery the handler must not be called for (poison, an
        event the durable does not handle, a payload its schema refuses), else None."""
        if delivery.poison is not None:
            return DeadLetter(delivery.poison.reason_code, delivery.poison.detail)
        envelope = delivery.envelope
        assert envelope is not None
        key = (envelope.event_type, envelope.event_version)
        if self.accepted is not None and key not in self.accepted:
            detail = f"{self.durable} handles no {envelope.event_type}.v{envelope.event_version}"
            return DeadLetter("UNKNOWN_EVENT", detail)
        # The registry's accepted set carries each version's schema validator; a payload
        # that fails it can never succeed (poison), so the handler is not called.
        if isinstance(self.accepted, AcceptedEvents):
            problem = self.accepted.payload_error(key, envelope.payload)
            if problem is not None:
                return DeadLetter("SCHEMA_INVALID", problem)
        return None

    def alert_refused(self, status: int, first: Delivery, holding: str) -> None:
        """Count and log (an alert) the handler's refusal of our credentials, ``holding``
        what (``first`` its first message)."""
        self.stats.auth_refusals += 1
        self.stats.alerts += 1
        log.error(
            "handler refused our credentials (HTTP %s): check the durable's signing "
            "secret (FERRY_HANDLER_SECRET) and the handler's; holding %s",
            status,
            holding,
            extra={"durable": self.durable, "message_id": str(first.message_id)},
        )

    async def _hold_while_refused(
        self, delivery: Delivery, envelope: Envelope, outcome: Any
    ) -> Any:
        """The handler refuses our credentials (401/403): a configuration error, not poison.

        Hold the message (heart-beating, so JetStream neither redelivers it nor counts a
        delivery), alert, and call again with a doubling pause until the credentials are
        fixed. Only a stop ends the hold early; the refusal is then nak'ed like a retry.
        """
        pause, longest = self.auth_retry
        while refused(outcome) and not self.stop.is_set():
            self.alert_refused(outcome.status, delivery, "the message")
            await sleep_unless(self.stop, pause)  # the keeper heart-beats meanwhile
            pause = min(pause * 2, longest)
            outcome = await self._call_with_heartbeat(delivery, envelope)
        return outcome

    async def _call_with_heartbeat(self, delivery: Delivery, envelope: Envelope) -> Any:
        """Call the handler once the circuit breaker lets us; the keeper heart-beats the
        message meanwhile, unless the durable turned heartbeats off (the lint then
        requires timeout < ack_wait)."""
        return await self.guarded(lambda: self._call_once(delivery, envelope))

    async def guarded(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call()`` through the circuit breaker: waits while it is open (the messages
        held meanwhile), records the outcome; :data:`~.breaker.STOPPING` if the consumer
        stopped while waiting.

        A call that failed while the breaker is open — the probe, the call whose failure
        opened it, one that was out when it opened — is not returned to be nak'ed: its
        messages stay in hand (heart-beaten, no delivery spent, no step up the back-off
        ladder, their place in max_ack_pending kept for the moment the handler is back)
        and wait for the next probe, which may be theirs."""
        kept, first_kept = 0, 0.0
        while True:
            if not await self.breaker.admit(self.stop):
                return STOPPING
            outcome: Any = STOPPING
            try:
                outcome = await call()
            finally:
                self.breaker.record(outcome)
            # Alone at the breaker, kept at most KEEP_AT_MOST times: an event the handler
            # fails on alone (no other traffic to close the breaker) still climbs its
            # ladder to a dead letter; with others waiting, kept while it stays open, up
            # to keep_for in all (events failing on their content wait on each other).
            alone = self.breaker.waiting == 0
            too_long = kept > 0 and self.breaker.clock() - first_kept >= self.breaker.keep_for
            if self.stop.is_set() or (alone and kept >= KEEP_AT_MOST) or too_long:
                return outcome
            if not self.breaker.holds(outcome):
                return outcome
            if kept == 0:
                first_kept = self.breaker.clock()
            kept += 1

    async def _call_once(self, delivery: Delivery, envelope: Envelope) -> Any:
        call = self._timed(
            self.handler.handle(self._request_body(delivery, envelope), headers(delivery))
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
        return request_body(
            envelope,
            attempt=delivery.attempt,
            max_attempts=self.policy.max_deliver,
            stream_sequence=delivery.stream_seq,
            durable=self.durable,
        )


def headers(delivery: Delivery) -> dict[str, str]:
    """The handler call's headers: the idempotency key and the trace context."""
    return request_headers(str(delivery.message_id), delivery.traceparent)


def refused(outcome: Any) -> bool:
    """The handler says our credentials are wrong (a signing-secret mismatch)."""
    return isinstance(outcome, HandlerResponse) and outcome.status in (401, 403)
