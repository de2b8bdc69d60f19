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

A call carries at most N events and at most :data:`BATCH_BODY_BYTES` of them (each
counted as its message's bytes plus :data:`EVENT_OVERHEAD`): a handler that accepts every
per-message call (whose body is one message, up to ``FERRY_MAX_MESSAGE_BYTES``, 1 MiB by
default, as is a handler's usual body limit) is never sent a batch body it refuses whole
with a 413 — which would dead-letter every event of the call ``HANDLER_BAD_REQUEST``. An
event that alone exceeds the budget goes in a call of its own.

Ordered durables (``ordering: key``) batch differently (:class:`BatchGatherer`): a key's
events still reach the handler one at a time, each in its key's turn (the sequencer awaits
an event's decision before it moves to the key's next one); only the calls of events of
*different* keys that ask for a decision at about the same time travel together. Each
waiting event gets its own decision back, so a key parks or goes on exactly as with
per-message calls; and since a key has at most one event in flight, the events of one
call are all of distinct keys — the handler's batch transaction cannot reorder a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from services.inbox_consumer.deciding import Decider, Unexpected, refused
from services.inbox_consumer.delivery import CONSUMER_ERROR, Delivery
from shared.domain.ack import DeadLetter, Decision, HandlerFailure, HandlerResponse, decide
from shared.domain.batch_call import (
    MALFORMED_KIND,
    BatchAnswer,
    MalformedAnswer,
    batch_document,
    batch_headers,
)
from shared.domain.ports import BatchOutcome
from shared.waits import sleep_unless

log = logging.getLogger("ferry.inbox_consumer")

Decided = tuple[Decision, int | None]
#: Most bytes of events in one batch call (see the module doc).
BATCH_BODY_BYTES = 1024 * 1024
#: Bytes an event is counted beyond its message's: the call's fields (attempt, durable,
#: stream sequence...), its traceparent, the document's own bytes.
EVENT_OVERHEAD = 512


def split_calls(sizes: Sequence[int], count: int, budget: int) -> list[list[int]]:
    """The positions of ``sizes`` (events' bytes) cut into calls, in order: at most
    ``count`` events and at most ``budget`` bytes a call (an event over ``budget`` on its
    own)."""
    calls: list[list[int]] = []
    current: list[int] = []
    used = 0
    for position, size in enumerate(sizes):
        if current and (len(current) >= count or used + size > budget):
            calls.append(current)
            current, used = [], 0
        current.append(position)
        used += size
    if current:
        calls.append(current)
    return calls


def event_bytes(delivery: Delivery) -> int:
    """What ``delivery`` is counted in a call's budget."""
    return len(delivery.msg.data) + EVENT_OVERHEAD


class BatchCaller:
    """Decides claimed deliveries N to a handler call (see the module doc)."""

    def __init__(
        self,
        decider: Decider,
        *,
        size: int,
        unexpected: Unexpected,
        body_bytes: int = BATCH_BODY_BYTES,
    ) -> None:
        self.decider, self.size, self.unexpected = decider, size, unexpected
        self.body_bytes = body_bytes

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
        sizes = [event_bytes(deliveries[i]) for i in calling]
        groups = [
            [calling[at] for at in call] for call in split_calls(sizes, self.size, self.body_bytes)
        ]
        answers = await asyncio.gather(
            *(self.call([deliveries[i] for i in group]) for group in groups)
        )
        for group, answer in zip(groups, answers, strict=True):
            decided.update(zip(group, answer, strict=True))
        return [decided[index] for index in range(len(deliveries))]

    async def call(self, group: list[Delivery], *, in_slot: bool = False) -> list[Decided]:
        """Batch calls for ``group`` (one, unless its events exceed the byte budget: then
        one after another), within a concurrency slot (``in_slot``: the caller holds one
        already); whatever a call raises dead-letters its events as CONSUMER_ERROR
        (replayable once fixed), as one message's decision would."""
        if in_slot:
            return await self._calls(group)
        async with self.decider.slots:
            return await self._calls(group)

    async def _calls(self, group: list[Delivery]) -> list[Decided]:
        decided: list[Decided] = []
        sizes = [event_bytes(delivery) for delivery in group]
        for positions in split_calls(sizes, self.size, self.body_bytes):
            part = [group[at] for at in positions]
            try:
                outcome, seconds = await self._exchange(part)
                decided += self._decisions(part, outcome, seconds)
            except Exception as exc:
                self.unexpected("decide", exc, part[0])
                detail = f"{type(exc).__name__}: {exc}"[:500]
                decided += [(DeadLetter(CONSUMER_ERROR, detail), None) for _ in part]
        return decided

    async def _exchange(self, group: list[Delivery]) -> tuple[BatchOutcome, float]:
        """POST the call (again and again while our credentials are refused); the outcome
        and the seconds its last POST took."""
        decider = self.decider
        clock = asyncio.get_running_loop()
        started = clock.time()
        outcome = await self._post(group)
        pause, longest = decider.auth_retry
        while refused(outcome) and not decider.stop.is_set():
            self._refused(group, outcome)
            await sleep_unless(decider.stop, pause)  # the keeper heart-beats meanwhile
            pause = min(pause * 2, longest)
            started = clock.time()
            outcome = await self._post(group)
        return outcome, clock.time() - started

    def _decisions(
        self, group: list[Delivery], outcome: BatchOutcome, seconds: float
    ) -> list[Decided]:
        """Each event's decision from the call's outcome, by the ACK table."""
        decider = self.decider
        self._report(group, outcome)
        decided: list[Decided] = []
        for delivery in group:
            one = outcome_of(outcome, delivery)
            decider.metrics.handled(one, seconds)
            status = one.status if isinstance(one, HandlerResponse) else None
            decided.append((decide(one, attempt=delivery.attempt, policy=decider.policy), status))
        return decided

    async def _post(self, group: list[Delivery]) -> BatchOutcome:
        outcome: BatchOutcome = await self.decider.guarded(lambda: self._post_once(group))
        return outcome

    async def _post_once(self, group: list[Delivery]) -> BatchOutcome:
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
        self.decider.alert_refused(outcome.status, group[0], f"the batch of {len(group)}")

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


#: One event waiting for its decision in a :class:`BatchGatherer`.
Waiting = tuple[Delivery, "asyncio.Future[Decided]"]


class BatchGatherer:
    """Per-event decisions sent N to a call, for a sequencer (``ordering: key``).

    :meth:`decide` is awaited by one key's task for one event, like
    :meth:`.deciding.Decider.decide`; the event waits beside those of other keys that
    asked meanwhile. A *sender* task is started as soon as ``size`` events wait that no
    sender will take, and otherwise at the next turn of the event loop after the first
    request (so every key that became ready in one turn — a fetched batch's keys, the keys
    of one call's answers — shares a call). A sender takes its events only once it holds a
    concurrency slot: while every slot is busy, waiting events gather into fuller calls.
    Each call is :meth:`BatchCaller.call` (wire format 1, the per-event ACK table).

    A waiter cancelled before its call leaves it; one cancelled during its call leaves
    the call to the others (its answer is dropped, as a cancelled per-message call's is).
    """

    def __init__(self, caller: BatchCaller) -> None:
        self.caller, self.size = caller, caller.size
        self._waiting: deque[Waiting] = deque()
        #: Senders started that do not hold a slot yet (each will take up to ``size``).
        self._senders = 0
        self._flush_due = False
        self._tasks: set[asyncio.Task[None]] = set()
        #: Events sent and calls made (for tests and the curious).
        self.sent = 0
        self.calls = 0

    async def decide(self, delivery: Delivery) -> Decided:
        """``delivery``'s decision (and handler status), through a shared batch call."""
        try:
            early = self.caller.decider.without_call(delivery)
        except Exception as exc:
            self.caller.unexpected("decide", exc, delivery)
            return DeadLetter(CONSUMER_ERROR, f"{type(exc).__name__}: {exc}"[:500]), None
        if early is not None:
            return early, None
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Decided] = loop.create_future()
        entry = (delivery, waiter)
        self._waiting.append(entry)
        if len(self._waiting) - self._senders * self.size >= self.size:
            self._start_sender()  # a full call's worth that no sender will take
        elif not self._flush_due:
            self._flush_due = True
            loop.call_soon(self._flush)
        try:
            return await waiter
        except asyncio.CancelledError:
            for index, queued in enumerate(self._waiting):  # not sent yet: leave the queue
                if queued is entry:
                    del self._waiting[index]
                    break
            raise

    def _flush(self) -> None:
        """Enough senders for every waiting event (the loop turn after a request)."""
        self._flush_due = False
        while len(self._waiting) > self._senders * self.size:
            self._start_sender()

    def _start_sender(self) -> None:
        self._senders += 1
        task = asyncio.create_task(self._send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self) -> None:
        slotted = False
        group: list[Waiting] = []
        try:
            async with self.caller.decider.slots:
                slotted = True
                self._senders -= 1
                while self._waiting and len(group) < self.size:
                    entry = self._waiting.popleft()
                    if not entry[1].done():  # cancelled meanwhile
                        group.append(entry)
                if not group:
                    return  # another sender took them
                self.calls += 1
                self.sent += len(group)
                decided = await self.caller.call([d for d, _ in group], in_slot=True)
            for (_, waiter), one in zip(group, decided, strict=True):
                if not waiter.done():
                    waiter.set_result(one)
        finally:
            if not slotted:  # cancelled before its slot: another sender takes its events
                self._senders -= 1
                if self._waiting and not self._flush_due:
                    self._flush_due = True
                    asyncio.get_running_loop().call_soon(self._flush)
            for _, waiter in group:  # the sender itself was cancelled: so are its waiters
                if not waiter.done():
                    waiter.cancel()
