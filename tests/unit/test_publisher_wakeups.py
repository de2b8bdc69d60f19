"""The publisher's workers hand each other held-back rows without losing a wake-up.

No servers: ``publish_batch`` is scripted, so the interleaving that matters is exact.
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.outbox_publisher.publisher import Batch, OutboxPublisher

#: Far longer than the test waits: a worker that is only woken by the poll fails it.
POLL = 60.0


class Scripted(OutboxPublisher):
    """Answers each claim (in the order workers make them) from a script."""

    def __init__(self, script: list[Any]) -> None:
        super().__init__(
            pool=None,  # type: ignore[arg-type]
            js=None,  # type: ignore[arg-type]
            context="sea",
            namespace="ferry",
            stream="SEA",
            batch_size=20,
            publish_timeout=1.0,
        )
        self.script = script
        self.calls = 0

    async def publish_batch(self) -> Batch:
        step = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        result: Batch = await step(self)
        return result


async def nothing(_: Scripted) -> Batch:
    return Batch(0, 0, 0)


async def run_until(publisher: Scripted, resumed: asyncio.Event) -> None:
    """Two workers on ``publisher`` until ``resumed`` (well before the poll), then stopped."""
    stop = asyncio.Event()
    workers = [
        asyncio.create_task(publisher.run_worker(stop, poll_interval=POLL)) for _ in range(2)
    ]
    try:
        await asyncio.wait_for(resumed.wait(), timeout=10)
    finally:
        stop.set()
        await asyncio.gather(*workers)


async def test_a_commit_during_a_held_back_claim_is_not_missed() -> None:
    """Worker B's claim finds rows held back behind worker A's open batch. A commits and
    looks for a held-back worker to wake *before* B's claim has answered, so B is not yet
    among them: B must still claim again at once, not wait for the poll."""
    b_claiming, a_looked = asyncio.Event(), asyncio.Event()
    resumed = asyncio.Event()

    async def a_commits(_: Scripted) -> Batch:
        await b_claiming.wait()  # A's batch is open while B claims
        return Batch(20, 0, 0)  # a full batch: A claims again at once

    async def b_held_back(_: Scripted) -> Batch:
        b_claiming.set()
        await a_looked.wait()  # B's answer arrives after A's commit was handled
        return Batch(0, 0, 5)

    async def a_again(_: Scripted) -> Batch:
        a_looked.set()  # A is claiming again: its post-commit wake-up has run
        return Batch(0, 0, 0)

    async def b_resumes(_: Scripted) -> Batch:
        resumed.set()
        return Batch(5, 0, 0)

    publisher = Scripted([a_commits, b_held_back, a_again, b_resumes, nothing])
    await run_until(publisher, resumed)
    assert publisher.stats.held_back == 1
    assert publisher.stats.released == 1


async def test_a_commit_after_the_held_back_worker_waits_wakes_it() -> None:
    """The ordinary order: B waits first, then A's commit wakes it."""
    b_waiting = asyncio.Event()
    resumed = asyncio.Event()

    async def a_slow_commit(p: Scripted) -> Batch:
        # B's answer and its registration as held back happen in one step of its task,
        # before this one runs again.
        await b_waiting.wait()
        assert p._held_back, "B should be waiting for a commit by now"
        return Batch(3, 0, 0)

    async def b_held_back(_: Scripted) -> Batch:
        b_waiting.set()
        return Batch(0, 0, 2)

    async def b_resumes(_: Scripted) -> Batch:
        resumed.set()
        return Batch(2, 0, 0)

    publisher = Scripted([a_slow_commit, b_held_back, b_resumes, nothing])
    await run_until(publisher, resumed)
    assert publisher.stats.held_back == 1
    assert publisher.stats.released == 1
