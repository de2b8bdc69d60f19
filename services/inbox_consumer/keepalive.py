"""Heartbeats for every message the consumer holds, from fetch to settlement.

A message that is neither acked, nak'ed nor terminated within the durable's ack_wait is
redelivered, and every redelivery counts against max_deliver. The consumer holds
messages for reasons that say nothing about them — waiting for a handler slot behind a
batch held by a 401/403, an unreachable inbox, a retried database write — so each one is
sent ``in_progress`` every ``every`` seconds until it is settled (:meth:`KeepAlive.release`).
Messages that arrived but wait in the puller to be handed out are beaten too (``extra``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator

from shared.adapters.jetstream import NATS_FAILURES
from shared.domain.ports import MessageInHand

log = logging.getLogger("ferry.inbox_consumer")


class KeepAlive:
    """The messages in hand, beaten every ``every`` seconds by :meth:`run`."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._held: dict[int, MessageInHand] = {}
        #: Heartbeats sent (tests and logs read it).
        self.beats = 0
        #: Set when the partition these messages belong to was lost (its lease fenced):
        #: no more heartbeats, so JetStream redelivers them to the new owner on time.
        self.fenced = False

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, msgs: Iterable[MessageInHand]) -> None:
        """Keep ``msgs`` alive until released."""
        for msg in msgs:
            self._held[id(msg)] = msg

    def release(self, msgs: Iterable[MessageInHand]) -> None:
        """Stop beating ``msgs`` (settled, or about to be)."""
        for msg in msgs:
            self._held.pop(id(msg), None)

    @contextlib.contextmanager
    def paused(self, msg: MessageInHand) -> Iterator[None]:
        """Leave ``msg`` alone for a while (a handler call on a durable without heartbeats)."""
        held = self._held.pop(id(msg), None) is not None
        try:
            yield
        finally:
            if held and not msg.is_acked:
                self._held[id(msg)] = msg

    async def run(self, extra: Callable[[], Awaitable[None]] | None = None) -> None:
        """Beat until cancelled."""
        while True:
            await asyncio.sleep(self.every)
            if self.fenced:
                continue
            try:
                await self.beat()
                if extra is not None:
                    await extra()
            except Exception as exc:  # never let one bad beat stop the others for good
                log.error("heartbeat round failed: %r", exc, exc_info=exc)

    async def beat(self) -> None:
        """One ``in_progress`` for every held message not yet settled."""
        for msg in list(self._held.values()):
            if msg.is_acked:
                self._held.pop(id(msg), None)
                continue
            try:
                await msg.in_progress()
                self.beats += 1
            except NATS_FAILURES as exc:
                # Lost: at worst a redelivery the inbox absorbs.
                log.warning("could not send in_progress: %s", exc)
                return
