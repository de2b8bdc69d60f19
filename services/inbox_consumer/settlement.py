"""Settlement: each delivery's decision carried out, in the inbox and on JetStream.

Processed rows are marked in one statement and then acked; retries are recorded (the
lease released) and nak'ed with an explicit delay; the last failed delivery is recorded
and nak'ed so JetStream gives up on it (the dlq-router records the exhaustion); dead
letters are published (deduplicated per durable and id), marked failed, and terminated.
A dead letter that cannot be written is nak'ed and tried again. The replies to JetStream
go through the delivery port (:mod:`.replies`), never to a NATS message directly.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import Any

from services.inbox_consumer.delivery import EXHAUSTED, Delivery
from services.inbox_consumer.holding import Holder
from services.inbox_consumer.metrics import ConsumerMetrics
from services.inbox_consumer.replies import Replies
from services.inbox_consumer.spans import settling
from services.inbox_consumer.stats import ConsumerStats
from shared.adapters import dead_letters, inbox
from shared.adapters.jetstream import NATS_CLIENT_ERRORS, JetStream
from shared.adapters.postgres import DATABASE_ERRORS, Conn, Pool
from shared.contracts.topology import DurableSpec
from shared.domain.ack import Ack, DeadLetter, Decision, Nak, RetryPolicy
from shared.domain.envelope import format_timestamp
from shared.domain.ports import FailedAttempt, InboxStore

log = logging.getLogger("ferry.inbox_consumer")

#: Most of a raw (unparseable) body a dead-letter record keeps.
RECORD_BODY_LIMIT = 64 * 1024
#: Failures that leave a dead letter unwritten: the message is nak'ed and tried again.
#: Any NATS error: no stream leader (NoStreamResponseError, APIError) while NATS
#: restarts, a timeout, a closed connection.
DEAD_LETTER_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, *NATS_CLIENT_ERRORS)

#: A delivery with its decision and the handler status, if the handler was called.
Decided = tuple[Delivery, tuple[Decision, int | None]]


class Settler:
    """Settles the deliveries of one durable: inbox writes, then ack / nak / term."""

    def __init__(
        self,
        *,
        pool: Pool,
        js: JetStream,
        store: InboxStore[Conn],
        durable: str,
        spec: DurableSpec,
        policy: RetryPolicy,
        replies: Replies,
        holder: Holder,
        stats: ConsumerStats,
        metrics: ConsumerMetrics,
    ) -> None:
        self.pool, self.js, self.store, self.durable, self.spec = pool, js, store, durable, spec
        self.policy, self.replies, self.holder = policy, replies, holder
        self.stats, self.metrics = stats, metrics

    async def settle(self, results: list[Decided]) -> None:
        """Carry out each decision; one that raises is nak'ed, the rest go on."""
        processed = {d.message_id: s or 200 for d, (dec, s) in results if isinstance(dec, Ack)}
        if processed and not await self._mark_processed(processed):
            processed = {}  # left unacked: the redelivery will get 409 and be marked then
        for delivery, (decision, status) in results:
            try:
                await self._settle_one(delivery, decision, status, processed)
            except Exception as exc:
                self.unexpected("settle", exc, delivery)
                if not delivery.msg.is_acked:
                    await self.replies.nak(delivery.msg, self.policy.delay(delivery.attempt))

    async def _mark_processed(self, processed: dict[uuid.UUID, int]) -> bool:
        async def mark(conn: Conn) -> bool:
            await self.store.mark_processed(conn, self.durable, processed)
            return True

        try:
            return await self.holder.run(f"mark {len(processed)} processed", mark) is not None
        except DATABASE_ERRORS as exc:
            log.warning("could not mark %d processed: %s", len(processed), exc)
            return False

    async def _settle_one(
        self, delivery: Delivery, decision: Decision, status: int | None, processed: Any
    ) -> None:
        with settling(delivery, decision, durable=self.durable):
            if isinstance(decision, Ack):
                if delivery.message_id in processed:
                    self.stats.processed += 1
                    await self.replies.ack(delivery.msg)
                    self.metrics.processed(delivery.occurred_at)
            elif isinstance(decision, Nak):
                await self._retry(delivery, decision, status)
            else:
                await self._dead_letter(delivery, decision, status)

    async def _retry(self, delivery: Delivery, decision: Nak, status: int | None) -> None:
        await self.record_retry(delivery, decision, status)
        await self.replies.nak(delivery.msg, decision.delay)

    async def record_retry(self, delivery: Delivery, decision: Nak, status: int | None) -> None:
        """Count and record a failed attempt in the inbox (the lease released); the caller
        nak's the message, or parks it (``ordering: key``)."""
        self.stats.retries += 1
        reason = retry_reason(status, decision.reason)
        self.stats.retries_by_reason[reason] = self.stats.retries_by_reason.get(reason, 0) + 1
        if decision.alert:
            self.stats.alerts += 1
            log.error(
                "handler configuration problem: %s",
                decision.reason,
                extra={"durable": self.durable, "message_id": str(delivery.message_id)},
            )
        entry = history_entry(delivery, status, reason, decision.reason)
        await self._release(delivery, decision.reason, status, reason, entry)

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
            lambda conn: self.store.mark_retrying(
                conn, self.durable, delivery.message_id, FailedAttempt(error, status, reason, entry)
            ),
        )

    async def _dead_letter(
        self, delivery: Delivery, decision: DeadLetter, status: int | None
    ) -> None:
        if decision.reason_code == EXHAUSTED:
            reason = retry_reason(status, decision.detail)
            entry = history_entry(delivery, status, reason, decision.detail)
            await self._exhausted(delivery, decision, status, entry)
            return
        if not await self.write_dead_letter(delivery, decision, status):
            await self.replies.nak(delivery.msg, self.policy.delay(delivery.attempt))

    async def write_dead_letter(
        self,
        delivery: Delivery,
        decision: DeadLetter,
        status: int | None,
        *,
        ordering: dict[str, Any] | None = None,
        term: bool = True,
    ) -> bool:
        """Record the dead letter, mark the inbox row failed, term the message (unless
        ``term`` is False: the caller settles it); False (the attempt recorded as a retry,
        the message left unsettled) when it cannot be written.

        ``ordering`` (``ordering: key`` durables) goes into the record: the key, and whether
        its later events are held behind it or went on (order broken after it). Such a
        durable records an exhaustion here too: its retries are parked, not nak'ed, so
        JetStream never reports one.
        """
        exhausted = decision.reason_code == EXHAUSTED
        code = retry_reason(status, decision.detail) if exhausted else decision.reason_code
        entry = history_entry(delivery, status, code, decision.detail)
        try:
            async with self.pool.acquire() as conn:
                history = await inbox.retry_history(conn, self.durable, delivery.message_id)
                outcome = await dead_letters.record_dead_letter(
                    conn,
                    self.js,
                    self._failure(delivery, decision, status, history, entry, ordering),
                    self.spec,
                )
        except DEAD_LETTER_ERRORS as exc:
            # No stream leader (a NATS restart), the database away...: nothing written.
            self.metrics.consumer_error("dead_letter")
            detail = f"dead letter not written: {type(exc).__name__}: {exc}"
            log.warning("%s; it will be redelivered", detail, extra=self._ids(delivery))
            entry = history_entry(delivery, status, decision.reason_code, detail)
            await self._release(delivery, detail, status, decision.reason_code, entry)
            return False
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
        if term:
            await self.replies.term(delivery.msg)
        else:
            self.replies.let_go(delivery.msg)
        return True

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
        await self.replies.nak(delivery.msg, 0.0)

    def _failure(
        self,
        delivery: Delivery,
        decision: DeadLetter,
        status: int | None,
        history: list[dict[str, Any]],
        entry: dict[str, Any],
        ordering: dict[str, Any] | None = None,
    ) -> dead_letters.Failure:
        env = delivery.envelope
        payload: Any = env.to_dict() if env else raw_body(delivery.msg.data)
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
            ordering=ordering,
        )

    def _ids(self, delivery: Delivery) -> dict[str, str]:
        return {"durable": self.durable, "message_id": str(delivery.message_id)}

    def unexpected(self, stage: str, exc: BaseException, delivery: Delivery | None = None) -> None:
        """Something raised that the consumer does not expect: log and count it; the
        caller settles the message(s) concerned and the role goes on."""
        self.stats.consumer_errors += 1
        self.metrics.consumer_error(stage)
        extra = self._ids(delivery) if delivery is not None else {"durable": self.durable}
        log.error("unexpected error (%s): %r", stage, exc, exc_info=exc, extra=extra)


def raw_body(data: bytes) -> Any:
    """An unparseable body as the record keeps it: whole, or its head when it is large."""
    if len(data) <= RECORD_BODY_LIMIT:
        return data.decode("utf-8", "replace")
    return {
        "truncated": True,
        "bytes": len(data),
        "head": data[:RECORD_BODY_LIMIT].decode("utf-8", "replace"),
    }


def retry_reason(status: int | None, reason: str) -> str:
    """A retry's reason code: ``HTTP_503``, ``handler_timeout``, ``handler_unreachable``."""
    return "HTTP_" + str(status) if status else reason.split(":")[0].replace(" ", "_")


def history_entry(
    delivery: Delivery, status: int | None, reason: str, detail: str
) -> dict[str, Any]:
    """One attempt of the delivery's retry history."""
    return {
        "attempt": delivery.attempt,
        "at": format_timestamp(datetime.now(UTC)),
        "status": status,
        "reason": reason,
        "detail": detail[:500],
    }
