"""The publisher's linger: one worker gathers the NOTIFYs behind its wake-up into one claim.

No servers: ``publish_batch`` is scripted and NOTIFYs are calls to ``notify``, so what each
wake-up does is exact. The linger is a minute: a claim that happens ended the wait by count.
"""

from __future__ import annotations

import asyncio

from services.outbox_publisher.publisher import Batch, OutboxPublisher

POLL = 60.0
LINGER = 60.0
BATCH = 5


class Counting(OutboxPublisher):
    """Claims return one row each and are counted; ``claimed`` is set at every claim."""

    def __init__(self) -> None:
        super().__init__(
            pool=None,  # type: ignore[arg-type]
            js=None,  # type: ignore[arg-type]
            context="sea",
            namespace="ferry",
            stream="SEA",
            batch_size=BATCH,
            publish_timeout=1.0,
        )
        self.fill_linger = LINGER
        self.calls = 0
        self.claimed = asyncio.Event()

    async def publish_batch(self) -> Batch:
        self.calls += 1
        self.claimed.set()
        return Batch(1, 0, 0)


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_notifies_behind_a_wake_up_join_one_claim_ended_by_a_full_batch() -> None:
    publisher = Counting()
    stop = asyncio.Event()
    workers = [asyncio.create_task(publisher.run_worker(stop, poll_interval=POLL))
               for _ in range(3)]  # fmt: skip
    try:
        await asyncio.wait_for(publisher.claimed.wait(), timeout=10)  # the first claims
        await _settle()  # all three wait for a NOTIFY now
        publisher.arrivals.seconds = 0.001  # commits have come quickly
        publisher.claimed.clear()
        before = publisher.calls
        for _ in range(BATCH - 1):  # the wake-up and the commits behind it, one short
            publisher.notify()
            await _settle()
        assert publisher.calls == before, "a worker claimed before the batch was full"
        assert len(publisher._filling) == 1, "one worker gathers, the others stay idle"
        publisher.notify()  # the batch is full: the worker claims, once
        await asyncio.wait_for(publisher.claimed.wait(), timeout=10)
        await _settle()
        assert publisher.calls == before + 1
        assert not publisher._filling
    finally:
        stop.set()
        await asyncio.gather(*workers)


async def test_a_slow_pace_claims_at_once() -> None:
    """Commits further apart than the linger: the woken worker does not wait at all."""
    publisher = Counting()
    stop = asyncio.Event()
    worker = asyncio.create_task(publisher.run_worker(stop, poll_interval=POLL))
    try:
        await asyncio.wait_for(publisher.claimed.wait(), timeout=10)
        await _settle()
        publisher.arrivals.seconds = 2 * LINGER
        publisher.claimed.clear()
        publisher.notify()
        await asyncio.wait_for(publisher.claimed.wait(), timeout=10)
        assert not publisher._filling
    finally:
        stop.set()
        await worker
