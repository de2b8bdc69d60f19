"""A continuous pull from one durable: pull requests stay outstanding, a batch is what arrived.

nats-py's ``fetch(n, timeout)`` returns early only when messages are already waiting;
otherwise it leaves a request on the server and, once the first message arrives, waits
for the *rest of the batch* until the timeout. Two effects, both measured by the
benchmark: at low rates every message waits up to ``fetch_timeout`` before it is handled,
and two replicas of one durable starve each other (one holds max_ack_pending messages, the
other's request gets them one ack at a time and sits out its timeout for each batch —
two replicas drained at 56 msg/s where one did 738).

:class:`Puller` instead keeps up to ``window`` messages requested at all times (requests
of ``expires`` seconds with idle heartbeats) and hands out whatever has arrived, at once.
Fairness between replicas is the server's: it serves waiting requests in turn as acks
free max_ack_pending slots.

Credit bookkeeping: every request adds its batch; every delivered message takes one; a
request that ends (408 expired, 409 leadership change, ...) takes what it still had
(``Nats-Pending-Messages``). A request that vanished silently — a reconnect to a server
that lost it — shows up as missing idle heartbeats, and the credit is reset.

Deliveries lost in transit (``watch_gaps``, an ``ordering: key`` partition): one owner
pulls a partition's consumer, so the consumer sequences it receives follow one another.
A jump means deliveries the server made never arrived — sent as the connection dropped,
or discarded by the client. The server holds them as pending until their ``ack_wait``
runs out, and meanwhile hands out what follows: a key's later event would reach the
handler before its earlier one. On a jump the puller stops asking, drops what arrives
from then on (unanswered: it waits out ``ack_wait`` too, behind the lost deliveries, in
the order they were delivered), hands out only what arrived before the jump and then
raises :class:`DeliveryGap`; the partition is given up as not settled and restarted
once everything is redeliverable (:mod:`services.inbox_consumer.partition_slot`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from shared.adapters.jetstream import JetStream, JetStreamMsg, Subscription, status_of
from shared.adapters.jetstream_answers import Answers, Held
from shared.adapters.nats import NatsClient
from shared.domain.ordering import ORDERED_PULL_LIFETIME
from shared.domain.pacing import ArrivalGap
from shared.waits import within

log = logging.getLogger("ferry.inbox_consumer")

#: Lifetime of one pull request, in seconds.
REQUEST_EXPIRES = 30.0
#: Seconds a nak or term is retried until confirmed when the caller gives no policy.
DEFAULT_CONFIRM = 5.0
#: Lifetime of one pull request of an ``ordering: key`` partition (see there).
ORDERED_REQUEST_EXPIRES = ORDERED_PULL_LIFETIME
#: The server sends a heartbeat after this many idle seconds on a waiting request.
IDLE_HEARTBEAT = 5.0
#: Without a message or heartbeat for this long, outstanding requests are presumed lost.
SILENCE_LIMIT = 2 * IDLE_HEARTBEAT + 1.0
#: Seconds :meth:`Puller.stop` waits for the server's round trip and the dispatch of what
#: arrived before it gives up on the drain (the connection is down).
DRAIN_WITHIN = 5.0

STATUS_HEARTBEAT = "100"


class ConsumerGone(Exception):
    """The durable was deleted (or never existed) while we pulled from it."""


class DeliveryGap(Exception):
    """Deliveries of a partition's consumer never arrived (see the module's doc): what
    arrived after them must not be handled before they are redelivered."""


class Puller:
    """Keeps pull requests outstanding on one durable and batches what they bring."""

    def __init__(
        self,
        js: JetStream,
        *,
        stream: str,
        durable: str,
        window: int,
        expires: float = REQUEST_EXPIRES,
        answers: Answers | None = None,
        watch_gaps: bool = False,
    ) -> None:
        # The JetStream context's connection and API prefix (a domain or an account
        # export changes the prefix); nats-py has no public accessor for either.
        self._nc: NatsClient = js._nc
        self._subject = f"{js._prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.window, self.expires = window, expires
        #: How the messages are answered (naks and terms confirmed, acks remembered).
        self.answers = answers or Answers(confirm_within=DEFAULT_CONFIRM, remember_for=10.0)
        self._queue: asyncio.Queue[Held] = asyncio.Queue()
        self._credit = 0
        self._heard = time.monotonic()
        self._sub: Subscription | None = None
        self._inbox = ""
        self.gone: str | None = None
        #: The recent pace of deliveries (the consumer lingers only when it is quick).
        self.arrivals = ArrivalGap()
        #: Set by :meth:`stop`: no new request goes out (one would deliver to an inbox
        #: nobody reads), and whether every delivered message was accounted for.
        self._stopping = False
        self.drained = False
        #: Whether a jump in the consumer sequence stops the pull (the module's doc).
        self.watch_gaps = watch_gaps
        #: What never arrived, once a jump was seen (then nothing more is handed out).
        self.gap: str | None = None
        self._last_delivery: int | None = None

    @property
    def outstanding(self) -> int:
        """Messages requested and not yet delivered (tests read it)."""
        return self._credit

    async def start(self) -> None:
        """Subscribe the private inbox the requests are answered on."""
        self._stopping, self.drained = False, False
        self.gap, self._last_delivery = None, None
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(self._inbox, cb=self._on_msg)

    async def stop(self) -> list[Held]:
        """Stop asking; return the messages that arrived but were never handed out.

        The subscription is *drained*, not dropped: the UNSUB goes out, a round trip to
        the server follows, and every message the server delivered before it (into a pull
        request still open, or read off the socket but not yet dispatched) reaches the
        queue and is returned. Dropped, such a message was neither handled nor nak'ed:
        it waited out ``ack_wait`` while a partition released as clean went to a successor
        at once, which could handle a later event of its key first (issue 48's ordering
        finding). :attr:`drained` says whether the drain completed; if it did not (the
        connection was down), messages may be in flight and the caller must not call the
        partition settled.
        """
        self._stopping = True
        if self._sub is not None and self.gap is not None:
            # Nothing to drain: what arrives from now on is dropped anyway.
            sub, self._sub = self._sub, None
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await within(DRAIN_WITHIN, sub.drain())  # type: ignore[no-untyped-call]
                self.drained = True
            except Exception as exc:
                log.warning("pull subscription not drained (%r): messages may be in flight", exc)
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        left: list[Held] = []
        while not self._queue.empty():
            left.append(self._queue.get_nowait())
        if self.gap is not None:
            # Nak'ed, they would be redelivered at once, ahead of the lost deliveries;
            # unanswered, they wait out ack_wait behind them.
            return []
        return left

    async def flushed(self) -> bool:
        """Whether everything sent so far on the connection (the naks of what :meth:`stop`
        returned) has reached the server: a round trip within :data:`DRAIN_WITHIN`. A nak
        still in the client's buffer leaves its message pending on the server, where a
        successor's first pull request would pass it by."""
        try:
            await within(DRAIN_WITHIN, self._nc.flush())
        except Exception as exc:
            log.warning("connection not flushed (%r): messages may be in flight", exc)
            return False
        return True

    async def reconnected(self) -> None:
        """The connection came back: requests made before may be gone with the server
        that had them (a restart). Ask afresh now instead of after :data:`SILENCE_LIMIT`;
        a request that did survive only brings its messages to the same inbox."""
        if self._sub is None:
            return
        self._credit = 0
        await self._top_up()

    async def keep_alive(self) -> None:
        """Heartbeat the messages that arrived but wait to be handed out (``in_progress``),
        so a long hold upstream (an unreachable inbox) costs them no delivery attempt."""
        for msg in list(self._queue._queue):  # type: ignore[attr-defined]
            with contextlib.suppress(Exception):
                await msg.in_progress()

    async def next_batch(self, limit: int, timeout: float, *, linger: float = 0.0) -> list[Held]:
        """Up to ``limit`` messages: waits for the first (at most ``timeout``), then at
        most ``linger`` seconds for the ones right behind it (0: hands over at once)."""
        if self.gone is not None:
            raise ConsumerGone(self.gone)
        if self.gap is not None and self._queue.empty():
            raise DeliveryGap(self.gap)
        await self._top_up()
        if self._queue.empty():
            try:
                first = await within(timeout, self._queue.get())
            except TimeoutError:
                self._check_silence()
                if self.gone is not None:
                    raise ConsumerGone(self.gone) from None
                return []
        else:
            first = self._queue.get_nowait()
        if linger and self._queue.qsize() < limit - 1:
            # A little longer for the messages right behind the first: at a steady rate
            # that turns one-message batches (a claim and a mark each) into batches.
            await asyncio.sleep(linger)
        batch = [first]
        while len(batch) < limit and not self._queue.empty():
            batch.append(self._queue.get_nowait())
        await self._top_up()
        return batch

    async def _top_up(self) -> None:
        """Request what the window lacks, in one request, once it lacks half a window."""
        if self._stopping or self.gap is not None:
            return
        want = self.window - self._credit - self._queue.qsize()
        if want <= 0 or (self._credit > 0 and want < max(self.window // 2, 1)):
            return
        request = {"batch": want, "expires": int(self.expires * 1e9)}
        if self.expires >= 2 * IDLE_HEARTBEAT:  # else the 408 at expiry says it is alive
            request["idle_heartbeat"] = int(IDLE_HEARTBEAT * 1e9)
        try:
            await self._nc.publish(self._subject, json.dumps(request).encode(), reply=self._inbox)
        except Exception as exc:  # closed/reconnecting: the next call asks again
            log.warning("pull request not sent: %s", exc)
            return
        if self._credit == 0:
            self._heard = time.monotonic()
        self._credit += want

    def _check_silence(self) -> None:
        if self._credit > 0 and time.monotonic() - self._heard > SILENCE_LIMIT:
            log.warning(
                "no message or heartbeat for %.0fs: pull requests presumed lost, asking again",
                SILENCE_LIMIT,
            )
            self._credit = 0

    def _in_sequence(self, msg: JetStreamMsg) -> bool:
        """Whether ``msg`` may be handed out: no delivery before it went missing."""
        if self.gap is not None:
            return False
        try:
            delivery = int(msg.metadata.sequence.consumer)
        except Exception:  # not a JetStream delivery: the decoder names it
            return True
        last, self._last_delivery = self._last_delivery, delivery
        if last is not None and delivery > last + 1:
            missing = f"{last + 1}" if delivery == last + 2 else f"{last + 1}..{delivery - 1}"
            self.gap = (
                f"deliveries {missing} of {self._subject.rsplit('.', 1)[-1]} never arrived "
                f"(lost in transit; {delivery} did)"
            )
            log.warning("%s: pulling stops until they are redeliverable", self.gap)
            return False
        # In sequence, or behind the last one (a new leader or a recreated consumer
        # counting again): nothing is known missing.
        return True

    async def _on_msg(self, msg: JetStreamMsg) -> None:
        self._heard = time.monotonic()
        status = status_of(msg)
        if not status:
            self._credit = max(self._credit - 1, 0)
            if self.watch_gaps and not self._in_sequence(msg):
                return
            self.arrivals.arrived(self._heard)
            self._queue.put_nowait(self.answers.hold(msg))
            return
        if status == STATUS_HEARTBEAT:
            return
        headers = msg.headers or {}
        description = headers.get("Description", "")
        pending = headers.get("Nats-Pending-Messages")
        if pending is not None and pending.isdigit():
            self._credit = max(self._credit - int(pending), 0)
        else:
            self._credit = 0  # cannot tell what ended: ask afresh
        if status == "409" and "Leadership Change" in description:
            # The acks the old leader had not replicated are lost: send them again.
            await self.answers.resend_acks(f"{self._subject}: a leader change")
        if status == "409" and "Consumer Deleted" in description:
            self.gone = f"durable deleted: {description}"
        elif status == "404" and "Consumer" in description:
            self.gone = description
        elif status not in ("404", "408"):
            log.info("pull request ended: %s %s", status, description)
        if status == "408" and self._sub is not None and not self._stopping:
            # A request expired (an ordered partition's live a second): ask again now,
            # not when the wait for the next batch ends. Not on refusals (409 ...): the
            # next batch asks again, no tighter than the consumer's own loop.
            await self._top_up()
