"""One partition's run under a lease: let the old owner's messages come back first, then
run the work until its stop event, restarting it when it ends by itself (see the
documentation of :mod:`services.inbox_consumer.partitions`, which holds the leases)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from shared.waits import sleep_unless, within

log = logging.getLogger("ferry.inbox_consumer.partitions")

Work = Callable[[int, asyncio.Event], Awaitable[None]]
Pending = Callable[[int], Awaitable[int]]


class NotSettled(Exception):
    """Raised by the work of a stopped partition that may have left messages in flight
    (its pull subscription was not drained, or its naks not flushed): the lease is then
    released as not clean, and the next owner waits for them (``pending``) before it
    starts, as after a crash."""


@dataclass(eq=False)
class Slot:
    """One partition this replica holds a lease on."""

    partition: int
    stop: asyncio.Event
    #: time.monotonic() after which the lease no longer counts as ours.
    valid_until: float
    #: The lease may be released as clean (nothing of ours or a predecessor's is in flight).
    clean: bool
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    #: work(k, stop) is running now.
    running: bool = False
    shedding: bool = False
    releasing: bool = False
    fenced: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class SlotRunner:
    """Runs ``work`` for each slot it is given; sets ``wake`` when a run ends."""

    durable: str
    work: Work
    pending: Pending | None
    #: Bound on one ``pending`` question (a later answer is useless).
    ttl: float
    restart_pause: float
    wake: asyncio.Event
    #: Seconds after its work ended by which everything this replica fetched on a
    #: partition is redeliverable (the lease's ``hold``): a work that ended unsettled, or
    #: raised, with messages in flight restarts only then (a delivery lost in transit, a
    #: crash with messages in hand), so a key's later event cannot overtake them.
    settle_wait: float = 0.0
    #: Starts that found messages in flight (pending > 0) and waited first: takeovers, and
    #: restarts of a work that ended unsettled or raised.
    waits: int = 0
    #: Work tasks restarted after ending by themselves.
    restarts: int = 0

    async def run(self, slot: Slot, resume_at: float) -> None:
        """Wait for the old owner's messages if need be, then run (and restart) the work."""
        k = slot.partition
        try:
            if not slot.clean:
                if await self._in_flight(k):
                    self.waits += 1
                    delay = resume_at - time.monotonic()
                    log.info(
                        "%s: partition %d was taken over with messages in flight; "
                        "starting in %.1fs (they are redeliverable by now)",
                        self.durable,
                        k,
                        delay,
                    )
                    if await sleep_unless(slot.stop, delay):
                        return
                else:
                    slot.clean = True
            await self._work_until_stopped(slot)
        finally:
            slot.running = False
            slot.done.set()
            self.wake.set()

    async def _in_flight(self, k: int) -> bool:
        """Whether partition ``k``'s consumer has unacked messages (True when unknown)."""
        if self.pending is None:
            return True
        try:
            return await within(self.ttl, self.pending(k)) > 0
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "%s: pending(%d) failed (%r); assuming messages in flight", self.durable, k, exc
            )
            return True

    async def _work_until_stopped(self, slot: Slot) -> None:
        k = slot.partition
        while not slot.stop.is_set():
            slot.running, slot.clean = True, False
            try:
                await self.work(k, slot.stop)
            except asyncio.CancelledError:
                raise
            except NotSettled as exc:
                log.warning("%s: partition %d stopped unsettled: %s", self.durable, k, exc)
                outcome = "stopped unsettled"
            except Exception as exc:
                log.error("%s: work of partition %d failed: %r", self.durable, k, exc, exc_info=exc)
                outcome = "raised"
            else:
                if slot.stop.is_set():
                    slot.clean = True
                    return
                outcome = "returned"
            finally:
                slot.running = False
            if slot.stop.is_set():
                return
            self.restarts += 1
            pause = self.restart_pause
            if outcome != "returned" and await self._in_flight(k):
                self.waits += 1
                pause = max(pause, self.settle_wait)
            log.warning(
                "%s: work of partition %d %s by itself; restarting in %.1fs",
                self.durable,
                k,
                outcome,
                pause,
            )
            if await sleep_unless(slot.stop, pause):
                return
