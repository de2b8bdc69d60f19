"""Answering JetStream for a fetched message without losing the answer silently.

An ack, nak or term is a message to the durable's consumer leader. Sent while that leader
changes (a JetStream failover: a killed node, a partition) or while the connection is
away, it can reach nobody, and nats-py's ``msg.nak()`` cannot tell: it publishes and
forgets. The message then waits out its whole ``ack_wait`` — measured: a transiently
failing event retried 121 s after its 503 on a three-node cluster with the stream leader
killed, instead of the back-off ladder's 1 s (issue 44). So, per consumer loop,
:class:`Answers` wraps every fetched message in a :class:`Held`, whose

* **nak and term are confirmed**: sent as requests (JetStream answers an ack-type request
  once its consumer leader has it) and retried with a growing pause until confirmed, for
  at most ``confirm_within`` seconds — less than the time before JetStream redelivers the
  message by itself (the last heartbeat plus ``ack_wait``), after which a late nak could
  delay the *next* delivery instead;
* **ack is remembered**: acks stay fire-and-forget (one per processed event: a request
  each would cost the drain its replies), and the reply subjects of the last
  ``remember_for`` seconds are kept. When the consumer hears its leader changed (a 409
  "Leadership Change" on its pull request) or its connection came back, it sends them
  all again (:meth:`Answers.resend_acks`): acking an acked message is a no-op for
  JetStream, while a lost ack would hold a ``max_ack_pending`` slot for a whole
  ``ack_wait`` and bring the event back for a redundant delivery.

``in_progress`` stays a plain publish: the next heartbeat follows within a third of
``ack_wait``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg

from shared.adapters.jetstream import NATS_FAILURES

log = logging.getLogger("ferry.jetstream")

#: Longest wait (s) for one confirmation; the first pause between tries, and the longest.
CONFIRM_TIMEOUT = 1.0
#: Wait (s) for the one try of an answer sent after its outage's retrying ended.
LAST_TRY_TIMEOUT = 0.25
FIRST_PAUSE, LONGEST_PAUSE = 0.1, 2.0
#: Most ack reply subjects remembered per consumer loop (a bound on memory at any rate).
REMEMBER_MOST = 20_000

_NAK, _TERM, _ACK = b"-NAK", b"+TERM", b"+ACK"


@dataclass
class AnswerStats:
    """What confirming cost: read by the consumer's metrics and by tests."""

    #: Naks and terms confirmed only after one or more failed tries.
    confirmed_late: int = 0
    #: Naks and terms never confirmed within ``confirm_within`` (JetStream redelivers the
    #: message after its ack_wait instead).
    unconfirmed: int = 0
    #: Acks sent again after a leader change or a reconnect.
    acks_resent: int = 0


class Answers:
    """The answering policy of one consumer loop (see the module's documentation)."""

    def __init__(
        self,
        *,
        confirm_within: float,
        remember_for: float,
        stats: AnswerStats | None = None,
    ) -> None:
        self.confirm_within, self.remember_for = confirm_within, remember_for
        self.stats = stats if stats is not None else AnswerStats()
        self._recent: collections.deque[tuple[float, str]] = collections.deque(maxlen=REMEMBER_MOST)
        self._client: Any = None
        #: While answers fail: when the retrying of this outage ends (shared, so a batch
        #: of naks during one outage waits ``confirm_within`` in all, not each).
        self._outage_ends: float | None = None

    def hold(self, msg: Msg) -> Held:
        """``msg`` as the consumer holds it."""
        if self._client is None:
            self._client = msg._client
        return Held(msg, self)

    def remember(self, reply: str) -> None:
        """An ack was sent to ``reply``."""
        now = time.monotonic()
        self._recent.append((now, reply))
        self._forget(now)

    def _forget(self, now: float) -> None:
        while self._recent and now - self._recent[0][0] > self.remember_for:
            self._recent.popleft()

    async def resend_acks(self, why: str) -> int:
        """Send every remembered ack again (``why``: what was heard); how many were sent."""
        self._forget(time.monotonic())
        replies = [reply for _, reply in self._recent]
        if not replies or self._client is None:
            return 0
        sent = 0
        try:
            for reply in replies:
                await self._client.publish(reply, _ACK)
                sent += 1
        except NATS_FAILURES as exc:
            log.warning("re-sending acks after %s stopped at %d: %s", why, sent, exc)
        self.stats.acks_resent += sent
        log.info("%s: re-sent the last %d ack(s) in case the old leader lost them", why, sent)
        return sent

    async def confirm(self, msg: Msg, payload: bytes) -> bool:
        """Send ``payload`` (a nak or a term) to ``msg``'s reply subject until JetStream
        confirms it; whether it was confirmed. The retrying is bounded per outage: the
        first answer that fails opens it for ``confirm_within`` seconds, the answers sent
        meanwhile retry until then too, and one sent after it gets a single short try
        (whose success, like any, ends the outage)."""
        now = time.monotonic()
        deadline = self._outage_ends if self._outage_ends is not None else now + self.confirm_within
        pause, tries = FIRST_PAUSE, 0
        while True:
            tries += 1
            left = deadline - time.monotonic()
            wait = min(CONFIRM_TIMEOUT, left) if left > 0 else LAST_TRY_TIMEOUT
            try:
                await msg._client.request(msg.reply, payload, timeout=wait)
            except NATS_FAILURES as exc:
                if self._outage_ends is None:
                    self._outage_ends = deadline
                if time.monotonic() + pause >= deadline:
                    self._given_up(msg, payload, tries, exc)
                    return False
                await asyncio.sleep(pause)
                pause = min(pause * 2, LONGEST_PAUSE)
                continue
            self._outage_ends = None
            if tries > 1:
                self.stats.confirmed_late += 1
                log.info(
                    "%s of stream seq %s confirmed on try %d", _kind(payload), _seq(msg), tries
                )
            return True

    def _given_up(self, msg: Msg, payload: bytes, tries: int, exc: BaseException) -> None:
        self.stats.unconfirmed += 1
        log.warning(
            "%s of stream seq %s not confirmed after %d tries (%r): JetStream redelivers it "
            "after its ack_wait",
            _kind(payload),
            _seq(msg),
            tries,
            exc,
        )


def _kind(payload: bytes) -> str:
    return payload.split(b" ")[0].decode()


def _seq(msg: Msg) -> Any:
    try:
        return msg.metadata.sequence.stream
    except Exception:
        return "?"


class Held:
    """A fetched JetStream message in the consumer's hands (the delivery port,
    :class:`shared.domain.ports.FetchedMessage`), answered under :class:`Answers`."""

    __slots__ = ("_answers", "_msg")

    def __init__(self, msg: Msg, answers: Answers) -> None:
        self._msg, self._answers = msg, answers

    @property
    def subject(self) -> str:
        return self._msg.subject

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def headers(self) -> dict[str, str] | None:
        return self._msg.headers

    @property
    def metadata(self) -> Any:
        return self._msg.metadata

    @property
    def is_acked(self) -> bool:
        return self._msg.is_acked

    async def ack(self) -> None:
        await self._msg.ack()
        self._answers.remember(self._msg.reply)

    async def nak(self, delay: float | None = None) -> None:
        payload = _NAK
        if delay:
            payload += b" " + json.dumps({"delay": int(delay * 1e9)}).encode()
        await self._answer(payload)

    async def term(self) -> None:
        await self._answer(_TERM)

    async def in_progress(self) -> None:
        await self._msg.in_progress()

    async def _answer(self, payload: bytes) -> None:
        self._msg._check_reply()  # refuses a second final answer, as nats-py does
        self._msg._ackd = True
        await self._answers.confirm(self._msg, payload)
