"""Batch handler calls for a durable with ``handler: {batch: N}`` (N ≥ 2).

The claimed deliveries of one fetch that need the handler go to it N at a time, each
group in one signed ``POST`` (:mod:`shared.domain.batch_call`, wire format 1); groups run
concurrently within the durable's concurrency, one slot per call. Every event's outcome
becomes its decision by :func:`shared.domain.ack.decide`, exactly as a per-message answer
would: the inbox claims (before) and the settlement (after) are the per-message path's,
per event, unchanged.

* an answer other than 200, a timeout or no connection is the outcome of every event of
  the call (401/403 holds the whole call, as it holds one message);
* a 200 that is not a readable batch answer retries every event (``max_deliver`` bounds
  it; the last failed delivery is dead-lettered ``MAX_DELIVERIES_EXCEEDED``);
* an event without a result (or with several) is retried, never acked; a result for an
  id the call did not carry is ignored. Each is logged and counted
  (``ferry_handler_batch_problems_total``).

Ordered durables (``ordering: key``) never batch: the lint refuses it, and their events
go through the sequencer one at a time anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from services.inbox_consumer.deciding import Decider, refused
from services.inbox_consumer.delivery import CONSUMER_ERROR, Delivery
from services.inbox_consumer.dispatch import BatchOutcome
from shared.domain.ack import DeadLetter, Decision, HandlerFailure, HandlerResponse, decide
from shared.domain.batch_call import (
    MALFORMED_KIND,
    BatchAnswer,
    MalformedAnswer,
    batch_document,
    batch_headers,
)

log = logging.getLogger("ferry.inbox_consumer")

Decided = tuple[Decision, int | None]
#: Reports an unexpected exception for a delivery (the consumer logs and counts it).
Unexpected = Callable[[str, BaseException, Delivery | None], None]


class BatchCaller:
    """Decides claimed deliveries N to a handler call (see the module doc)."""

    def __init__(self, decider: Decider, *, size: int, unexpected: Unexpected) -> None:
        self.decider, self.size, self.unexpected = decider, size, unexpected

    async def decide_all(self, deliveries: list[Delivery]) -> list[Decided]:
        """Each delivery's decision (and handler status), in order."""
        decided: dict[int, Decided] = {}
        calling: list[int] = []
        for index, delivery in enumerate(deliveries):
            early = self.decider.without_call(delivery)
            if early is not None:
                decided[index] = (early, None)
            else:
                calling.append(index)
        groups = [calling[at : at + self.size] for at in range(0, len(calling), self.size)]
        answers = await asyncio.gather(
            *(self._call([deliveries[i] for i in group]) for group in groups)
        )
        for group, answer in zip(groups, answers, strict=True):
            decided.update(zip(group, answer, strict=True))
        return [decided[index] for index in range(len(deliveries))]

    async def _call(self, group: list[Delivery]) -> list[Decided]:
        """One batch call for ``group``; whatever it raises dead-letters the group as
        CONSUMER_ERROR (replayable once fixed), as one message's decision would."""
        try:
            return await self._call_group(group)
        except Exception as exc:
            self.unexpected("decide", exc, group[0])
            detail = f"{type(exc).__name__}: {exc}"[:500]
            return [(DeadLetter(CONSUMER_ERROR, detail), None) for _ in group]

    async def _call_group(self, group: list[Delivery]) -> list[Decided]:
        decider = self.decider
        clock = asyncio.get_running_loop()
        async with decider.slots:
            started = clock.time()
            outcome = await self._post(group)
            pause, longest = decider.auth_retry
            while refused(outcome) and not decider.stop.is_set():
                self._refused(group, outcome)
                with contextlib.suppress(TimeoutError):  # the keeper heart-beats meanwhile
                    await asyncio.wait_for(decider.stop.wait(), timeout=pause)
                pause = min(pause * 2, longest)
                started = clock.time()
                outcome = await self._post(group)
            seconds = clock.time() - started
        self._report(group, outcome)
        decided: list[Decided] = []
        for delivery in group:
            one = outcome_of(outcome, delivery)
            decider.metrics.handled(one, seconds)
            status = one.status if isinstance(one, HandlerResponse) else None
            decided.append((decide(one, attempt=delivery.attempt, policy=decider.policy), status))
        return decided

    async def _post(self, group: list[Delivery]) -> BatchOutcome:
        decider = self.decider
        events = []
        for delivery in group:
            assert delivery.envelope is not None
            event = decider._request_body(delivery, delivery.envelope)
            if delivery.traceparent:
                event["traceparent"] = delivery.traceparent
            events.append(event)
        call = decider.handler.handle_batch(
            batch_document(events), batch_headers(len(group)), [d.message_id for d in group]
        )
        decider.stats.handler_calls += 1
        decider.metrics.batch_called(len(group))
        if decider.spec.heartbeats:
            return await call
        with contextlib.ExitStack() as paused:
            for delivery in group:
                paused.enter_context(decider.keeper.paused(delivery.msg))
            return await call

    def _refused(self, group: list[Delivery], outcome: Any) -> None:
        decider = self.decider
        decider.stats.auth_refusals += 1
        decider.stats.alerts += 1
        log.error(
            "handler refused our credentials (HTTP %s): check the durable's signing "
            "secret (FERRY_HANDLER_SECRET) and the handler's; holding the batch of %d",
            outcome.status,
            len(group),
            extra={"durable": decider.durable, "message_id": str(group[0].message_id)},
        )

    def _report(self, group: list[Delivery], outcome: BatchOutcome) -> None:
        """Log and count what in a batch answer could not be used."""
        metrics, durable = self.decider.metrics, self.decider.durable
        if isinstance(outcome, MalformedAnswer):
            metrics.batch_problem("malformed", len(group))
            log.error(
                "handler's batch answer is malformed (%s): retrying its %d events",
                outcome.detail,
                len(group),
                extra={"durable": durable},
            )
            return
        if not isinstance(outcome, BatchAnswer):
            return
        for problem, ids in (
            ("missing", outcome.missing),
            ("duplicated", outcome.duplicated),
            ("unknown", outcome.unknown),
        ):
            if not ids:
                continue
            metrics.batch_problem(problem, len(ids))
            what = "ignored" if problem == "unknown" else "retried"
            log.error(
                "handler's batch answer: %d %s result id(s), %s: %s",
                len(ids),
                problem,
                what,
                ", ".join(str(mid) for mid in ids[:10]),
                extra={"durable": durable},
            )


def outcome_of(outcome: BatchOutcome, delivery: Delivery) -> HandlerResponse | HandlerFailure:
    """The outcome of ``delivery`` in a batch call that came to ``outcome``."""
    if isinstance(outcome, BatchAnswer):
        return outcome.outcomes[delivery.message_id]
    if isinstance(outcome, MalformedAnswer):
        return HandlerFailure(MALFORMED_KIND, outcome.detail)
    return outcome
