"""Database work the consumer holds its messages for, rather than nak them.

An unreachable inbox says nothing about the messages: nak'ing them would spend a
delivery per attempt, and over a long outage exhaust max_deliver and dead-letter healthy
events. So the write is tried again, with a doubling pause, while the messages concerned
are kept alive (:mod:`services.inbox_consumer.keepalive`). A server error — the database
answered, and refused — is tried :data:`WRITE_TRIES` times and then raised: it may be
this data, and the caller decides for the messages concerned.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from shared.adapters.inbox import ClaimResult
from shared.adapters.postgres import CONNECTION_ERRORS, DATABASE_ERRORS, Conn, Pool
from shared.domain.ports import InboxClaim
from shared.waits import sleep_unless

log = logging.getLogger("ferry.inbox_consumer")

#: Tries of a database write that fails with a server error (not a lost connection)
#: before it is raised to the caller.
WRITE_TRIES = 3

T = TypeVar("T")


class Holder:
    """Runs database work through ``pool`` until it is done, refused, or ``stop`` is set."""

    def __init__(
        self,
        pool: Pool,
        *,
        first_pause: float,
        longest_pause: float,
        on_failure: Callable[[], None] = lambda: None,
    ) -> None:
        self.pool = pool
        self.first_pause, self.longest_pause = first_pause, longest_pause
        #: Set when the role stops (the run loop hands its stop event over).
        self.stop = asyncio.Event()
        #: Called on every failed try (the consumer counts them).
        self.on_failure = on_failure

    async def run(self, what: str, work: Callable[[Conn], Awaitable[T]]) -> T | None:
        """``work``'s result; None when stopping with the database still away."""
        pause, tries = self.first_pause, 0
        while True:
            try:
                async with self.pool.acquire() as conn:
                    return await work(conn)
            except DATABASE_ERRORS as exc:
                tries += 1
                self.on_failure()
                if not isinstance(exc, CONNECTION_ERRORS) and tries >= WRITE_TRIES:
                    raise
                if self.stop.is_set():
                    log.warning("could not %s (%s) while stopping", what, exc)
                    return None
                log.warning("could not %s (%s): holding, again in %.1fs", what, exc, pause)
            await sleep_unless(self.stop, pause)
            pause = min(pause * 2, self.longest_pause)


def merge_claims(claims: Sequence[InboxClaim]) -> ClaimResult:
    """One claim result from the results of claiming parts of a batch."""
    merged = ClaimResult(claimed={}, final=set(), leased={})
    for claim in claims:
        merged.claimed.update(claim.claimed)
        merged.final.update(claim.final)
        merged.leased.update(claim.leased)
    return merged
