"""The consumer's replies to JetStream for a message in hand: ack, nak, term.

Each goes to the message through the delivery port (:class:`shared.domain.ports.
MessageInHand`: a JetStream message, or a parked copy the drainer hands over) and lets
the keeper stop beating it (:mod:`.keepalive`). A fetched message's naks and terms are
confirmed and retried, its acks remembered for re-sending after a leader change
(:mod:`shared.adapters.jetstream_answers`); what still fails (no connection) is logged,
not raised: at worst the message is redelivered, and the inbox absorbs it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable

from services.inbox_consumer.keepalive import KeepAlive
from shared.adapters.jetstream import NATS_FAILURES
from shared.domain.ports import MessageInHand

log = logging.getLogger("ferry.inbox_consumer")


class Replies:
    """Answers JetStream for the messages the keeper holds."""

    def __init__(self, keeper: KeepAlive) -> None:
        self.keeper = keeper

    def let_go(self, msg: MessageInHand) -> None:
        """No more heartbeats for ``msg`` (the caller settles it otherwise)."""
        self.keeper.release([msg])

    async def ack(self, msg: MessageInHand) -> None:
        """Ack ``msg`` (no longer kept alive)."""
        self.keeper.release([msg])
        await quiet(msg.ack())

    async def nak(self, msg: MessageInHand, delay: float) -> None:
        """Nak ``msg`` for redelivery after ``delay`` seconds (no longer kept alive)."""
        self.keeper.release([msg])
        await quiet(msg.nak(delay=delay if math.isfinite(delay) and delay > 0 else 0.0))

    async def term(self, msg: MessageInHand) -> None:
        """Terminate ``msg``: never redelivered (no longer kept alive)."""
        self.keeper.release([msg])
        await quiet(msg.term())


async def quiet(reply: Awaitable[None]) -> None:
    """Send an ack/nak/term; a lost one only causes a redelivery the inbox absorbs."""
    try:
        await reply
    except NATS_FAILURES as exc:
        log.warning("could not send ack/nak: %s", exc)
