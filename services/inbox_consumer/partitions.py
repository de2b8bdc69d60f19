"""Exclusive ownership of the partitions of an ``ordering: key`` durable across replicas.

Each partition ``k`` of the durable's stream is consumed by one JetStream consumer
(``{durable}_p{k}``), and at most one replica may run it at a time: two would hand one
key's events to the handler concurrently and out of order. Replicas agree through
PostgreSQL leases (``partition_leases``, ``partition_members`` in the durable's target
database; :mod:`shared.adapters.partition_leases`) and nothing else.

**The loop.** Every ``renew_every`` seconds (ttl/3 by default) a replica, in one statement,
marks itself a live member, renews the leases it holds (only while it is still their owner
and they have not expired) and reads who is alive and what is taken. Its fair share is
``ceil(partitions / live members)``. Below it, it takes free partitions (never leased,
released or expired), preferring those of its rank (its position among the sorted live
members): partitions ``p ≡ rank (mod members)`` first, then the others from its rank on,
so replicas reach for different partitions instead of racing for the same. Above it (a
replica joined), it sheds the extras gracefully: it sets the partition's stop event,
awaits its work, and only then marks the lease released, renewing the lease meanwhile.

**Taking a partition over without breaking a key's order.** A partition released cleanly
(its owner's work returned after its stop event: everything it fetched is settled) is
started at once. "Everything it fetched" includes what the server delivered as the owner
stopped: the owner's pull subscription is drained, not dropped (:meth:`.Puller.stop`), so a
message in transit is read and nak'ed before the release instead of waiting out ``ack_wait``
behind the successor's first fetch; and the naks are flushed (a round trip on the
connection, :meth:`.Puller.flushed`), so the server has every message back before the
successor asks. Should either fail (the connection was down), the work raises
:class:`.NotSettled` and the partition is given up uncleanly, as below. A partition whose
lease *expired* — its owner died, or lost the database and fenced itself — may still have
messages its owner fetched and never acked. JetStream redelivers those once their
``ack_wait`` has run out, and from then on hands redeliveries out before new messages; a new
owner that fetched earlier would get the key's *later* events first. The lease is therefore
built so that **its expiry is a moment by which everything its owner fetched is
redeliverable**: an owner works on a partition only while its lease has more than ``hold``
seconds left (``hold`` = the durable's ``ack_wait`` plus its pull requests' lifetime, plus a
margin), so its last ``in_progress`` and the last message its last pull request could bring
have both run out by the expiry. A dead owner's last sign of life is earlier still. The new
owner asks ``pending(k)`` (the consumer's ``num_ack_pending``): 0 means nothing is in flight
and it starts at once; otherwise (or if it cannot tell) it starts :data:`TAKEOVER_MARGIN`
after acquiring, never ``ack_wait`` later. An owner that gives a partition up uncleanly (its
work raised) does not release it: it sets the expiry ``hold`` seconds ahead, which keeps the
same promise. A takeover therefore costs at most the ttl (plus the renewal round that
notices it: a replica below its share wakes when the earliest lease it could take expires),
so an ordered durable wants a short ``ack_wait`` (heartbeats keep long handler calls alive)
and a ttl a few seconds above ``hold``.

A handler call the old owner started may still be running when the new owner calls the
same event (an HTTP request outlives its caller): the handler's claim decides which one
applies it, and the new owner goes on to the key's next event only after a 200 or a 409
(a 409 means the claim is committed), so the key's order holds.

**Work.** ``work(k, stop_k)`` consumes partition ``k`` until ``stop_k`` is set. If it ends
by itself while the lease is held (it raised, or returned), it is logged and restarted
after :data:`RESTART_PAUSE` (no replica exits because of one partition); if it raised
(:class:`.NotSettled` included: deliveries lost in transit, :class:`.DeliveryGap`) and
``pending`` says messages are in flight, only ``hold`` seconds later, when they are
redeliverable, as for a takeover. A work that returns after its stop event has settled
its messages (the lease is released cleanly); one that raises, or that never ran or
crashed, leaves the lease to expire ``hold`` seconds later (unclean: the next owner checks
``pending``).

**Stop and kill.** When ``stop`` is set, :meth:`PartitionOwnership.run` stops every work
(sets the events, awaits the tasks, renewing meanwhile), releases every lease, deletes its
member row and returns. Cancelling ``run`` (or killing the process) releases nothing: the
leases expire and the next owners treat the partitions as taken over from a dead owner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from shared.adapters import partition_leases as sql
from shared.adapters.postgres import DATABASE_ERRORS, Pool
from shared.waits import sleep_unless, within

from .partition_share import fair_share, fence_margin, lease_validity, preference
from .partition_slot import Pending, Slot, SlotRunner, Work

log = logging.getLogger("ferry.inbox_consumer.partitions")

#: Pause before a work task that ended by itself is started again.
RESTART_PAUSE = 1.0
#: Seconds a takeover with messages in flight waits after acquiring the lease (the
#: previous owner's held messages are redeliverable by the expiry already).
TAKEOVER_MARGIN = 0.5
#: Seconds past the earliest expiry of a lease we could take that a replica below its
#: share wakes (instead of waiting for its next renewal round).
EXPIRY_WAKE = 0.05
#: Longest wait (s) for the cancelled work tasks when ``run`` itself is cancelled.
ABANDON_WAIT = 1.0
#: Members not seen for this many ttls are deleted by the others.
FORGET_AFTER_TTLS = 10

T = TypeVar("T")


class PartitionOwnership:
    """Holds this replica's fair share of ``partitions`` and runs ``work`` for each.

    See the module's documentation. Counters (read them for metrics): :attr:`acquired`,
    :attr:`takeovers`, :attr:`waits`, :attr:`sheds`, :attr:`releases`, :attr:`fences`,
    :attr:`restarts`, :attr:`renew_failures`; :attr:`members` and :attr:`share` are the last
    round's view.
    """

    def __init__(
        self,
        pool: Pool,
        *,
        durable: str,
        partitions: int,
        owner: str,
        ttl: float,
        hold: float,
        work: Work,
        pending: Pending | None = None,
        renew_every: float | None = None,
        restart_pause: float = RESTART_PAUSE,
        takeover_margin: float = TAKEOVER_MARGIN,
    ) -> None:
        if partitions < 1:
            raise ValueError("partitions must be at least 1")
        if ttl <= 0 or hold < 0:
            raise ValueError("ttl must be positive and hold not negative")
        self.pool, self.durable, self.partitions, self.owner = pool, durable, partitions, owner
        self.ttl, self.hold, self.takeover_margin = ttl, hold, takeover_margin
        #: A lease counts as ours until the start of its last renewal plus this.
        self.valid_for = lease_validity(ttl, hold)
        if self.valid_for <= 0:
            raise ValueError(
                f"a partition lease of {ttl:g}s leaves no time to work: it must exceed the "
                f"durable's ack_wait plus its pull requests' lifetime ({hold:g}s) and a margin "
                f"({fence_margin(ttl):g}s)"
            )
        self.renew_every = (
            renew_every if renew_every is not None else min(ttl / 3, self.valid_for / 2)
        )
        if not 0 < self.renew_every < self.valid_for:
            raise ValueError("renew_every must be positive and shorter than the lease's validity")
        #: Seconds until the earliest expiry of another owner's lease (last round's view).
        self._next_expiry: float | None = None
        self._slots: dict[int, Slot] = {}
        #: Fenced partitions whose work has not ended yet: not to be taken again before.
        self._draining: dict[int, Slot] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._runner = SlotRunner(
            durable, work, pending, ttl, restart_pause, self._wake, settle_wait=hold
        )
        #: Leases taken (every acquisition, first ones included).
        self.acquired = 0
        #: Acquisitions of another owner's expired (not released) lease.
        self.takeovers = 0
        #: Partitions given up to make room for another replica.
        self.sheds = 0
        #: Leases released (sheds and stops; clean or not).
        self.releases = 0
        #: Partitions lost: the lease expired locally or another owner holds it.
        self.fences = 0
        #: Renewal rounds that failed (database unreachable, slow, or erring).
        self.renew_failures = 0
        #: Live members and fair share at the last successful round (0 before it).
        self.members = 0
        self.share = 0

    # -- what callers read ---------------------------------------------------------------

    @property
    def waits(self) -> int:
        """Starts that found messages in flight (pending > 0) and waited first: takeovers
        (until the old owner's are redeliverable) and restarts of a work that ended
        unsettled or raised (``hold``)."""
        return self._runner.waits

    @property
    def restarts(self) -> int:
        """Work tasks restarted after ending by themselves."""
        return self._runner.restarts

    def owned(self) -> frozenset[int]:
        """Partitions whose work is running now under a lease that is locally valid."""
        now = time.monotonic()
        return frozenset(
            k
            for k, slot in self._slots.items()
            if slot.running and not slot.fenced and slot.valid_until > now
        )

    def lost(self, partition: int) -> bool:
        """Whether ``partition`` was fenced while its work still runs: its stop event means
        "abandon what you hold" (stop heart-beating, stop pulling), not "finish it"."""
        slot = self._draining.get(partition)
        return slot is not None and not slot.done.is_set()

    def held(self) -> frozenset[int]:
        """Partitions leased (about to start, running, or being shed)."""
        return frozenset(k for k, slot in self._slots.items() if not slot.fenced)

    # -- the loop --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Own partitions until ``stop``; then stop their work and release them."""
        watcher = asyncio.create_task(self._wake_on(stop))
        try:
            while True:
                self._wake.clear()
                await self._round(stopping=stop.is_set())
                if stop.is_set():
                    self._shed(list(self._slots.values()), reason="stopping")
                    if not self._slots and not self._draining:
                        break
                await sleep_unless(self._wake, self._pause())
            await self._leave()
        except asyncio.CancelledError:
            await self._abandon()
            raise
        finally:
            watcher.cancel()

    def _pause(self) -> float:
        """Until the next round: the renewal period, or less when a lease we could take (we
        are below our share) expires sooner."""
        below = len([s for s in self._slots.values() if not s.shedding]) < self.share
        if below and self._next_expiry is not None:
            return max(min(self.renew_every, self._next_expiry + EXPIRY_WAKE), EXPIRY_WAKE)
        return self.renew_every

    async def _wake_on(self, event: asyncio.Event) -> None:
        await event.wait()
        self._wake.set()

    async def _leases(self, op: Callable[..., Awaitable[T]], **args: Any) -> T:
        """``op`` of the partition leases (:mod:`shared.adapters.partition_leases`) for this
        durable and owner, on a pooled connection, bounded by the ttl (a later answer is
        useless)."""

        async def attempt() -> T:
            async with self.pool.acquire() as conn:
                return await op(conn, durable=self.durable, owner=self.owner, **args)

        return await within(self.ttl, attempt())

    async def _round(self, *, stopping: bool) -> None:
        """Renew, then (unless stopping) take or shed partitions toward the fair share."""
        for k, slot in list(self._draining.items()):
            if slot.done.is_set():
                del self._draining[k]
        state = await self._renew()
        if state is None:
            return
        self.members = len(state.members)
        self.share = fair_share(self.partitions, self.members)
        self._next_expiry = state.next_expiry
        if not stopping:
            await self._balance(state)

    async def _renew(self) -> sql.Round | None:
        """One heartbeat: extend the leases renewed, fence those found lost; None if the
        database did not answer (the leases then run out by the clock)."""
        started = time.monotonic()
        mine = [slot for slot in self._slots.values() if not slot.fenced]
        try:
            state = await self._leases(
                sql.heartbeat,
                ttl=self.ttl,
                held=[slot.partition for slot in mine],
                forget_after=self.ttl * FORGET_AFTER_TTLS,
            )
        except DATABASE_ERRORS as exc:
            self.renew_failures += 1
            log.warning(
                "%s: partition lease renewal failed (%r); %d partition(s) at risk",
                self.durable,
                exc,
                len(mine),
            )
            return None
        for slot in mine:
            if slot.fenced or self._slots.get(slot.partition) is not slot:
                continue
            if slot.partition in state.renewed:
                self._extend(slot, started)
            elif not slot.releasing:
                self._fence(slot, "the lease is no longer ours")
        return state

    async def _balance(self, state: sql.Round) -> None:
        """Shed the partitions above the fair share, or take free ones up to it."""
        order = preference(self.partitions, self.members, state.members.index(self.owner))
        active = [s for s in self._slots.values() if not s.fenced and not s.shedding]
        if len(active) > self.share:
            rank = {k: i for i, k in enumerate(order)}
            extras = sorted(active, key=lambda s: rank[s.partition])[self.share :]
            self.sheds += len(extras)
            self._shed(extras, reason=f"fair share is {self.share} of {self.members} members")
        elif len(active) < self.share:
            free = [
                k
                for k in order
                if k not in state.taken and k not in self._slots and k not in self._draining
            ]
            if free:
                await self._acquire(free[: self.share - len(active)])

    async def _acquire(self, partitions: list[int]) -> None:
        started = time.monotonic()
        try:
            taken = await self._leases(sql.acquire, ttl=self.ttl, partitions=partitions)
        except DATABASE_ERRORS as exc:
            log.warning("%s: taking partitions %s failed (%r)", self.durable, partitions, exc)
            return
        answered = time.monotonic()
        for lease in taken:
            self.acquired += 1
            took_over = lease.previous_owner not in (None, self.owner)
            if took_over and not lease.clean:
                self.takeovers += 1
            resume_at = answered if lease.clean else answered + self.takeover_margin
            slot = Slot(lease.partition, asyncio.Event(), started, clean=lease.clean)
            self._slots[lease.partition] = slot
            self._extend(slot, started)
            slot.task = self._spawn(self._runner.run(slot, resume_at))
            log.info(
                "%s: partition %d acquired (%s)",
                self.durable,
                lease.partition,
                "fresh"
                if lease.previous_owner is None
                else f"from {lease.previous_owner}, "
                + ("released" if lease.previous_released else "expired"),
            )

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- one partition ---------------------------------------------------------------------

    def _extend(self, slot: Slot, renewed_at: float) -> None:
        """The lease was renewed by a statement started at ``renewed_at``."""
        slot.valid_until = renewed_at + self.valid_for
        if slot.timer is not None:
            slot.timer.cancel()
        delay = max(slot.valid_until - time.monotonic(), 0.0)
        slot.timer = asyncio.get_running_loop().call_later(
            delay, self._fence, slot, "its lease expired before a renewal succeeded"
        )

    def _fence(self, slot: Slot, reason: str) -> None:
        """Stop ``slot``'s work at once; the lease is not ours any more."""
        if slot.fenced:
            return
        slot.fenced = True
        slot.stop.set()
        if slot.timer is not None:
            slot.timer.cancel()
        self.fences += 1
        log.warning("%s: partition %d fenced: %s", self.durable, slot.partition, reason)
        if self._slots.get(slot.partition) is slot:
            del self._slots[slot.partition]
        if not slot.done.is_set():
            self._draining[slot.partition] = slot
        self._wake.set()

    def _shed(self, slots: Iterable[Slot], *, reason: str) -> None:
        for slot in slots:
            if slot.shedding or slot.fenced:
                continue
            slot.shedding = True
            log.info("%s: giving partition %d up (%s)", self.durable, slot.partition, reason)
            self._spawn(self._give_up(slot))

    async def _give_up(self, slot: Slot) -> None:
        """Stop the work, await it, release the lease (retrying until it is lost)."""
        slot.stop.set()
        await slot.done.wait()
        while not slot.fenced:
            slot.releasing = True
            try:
                released = await self._leases(
                    sql.release, partition=slot.partition, clean=slot.clean, hold=self.hold
                )
            except DATABASE_ERRORS as exc:
                slot.releasing = False
                log.warning(
                    "%s: releasing partition %d failed (%r)", self.durable, slot.partition, exc
                )
                await asyncio.sleep(self.renew_every)
                continue
            if released:
                self.releases += 1
            if slot.timer is not None:
                slot.timer.cancel()
            if self._slots.get(slot.partition) is slot:
                del self._slots[slot.partition]
            log.info(
                "%s: partition %d released (%s)",
                self.durable,
                slot.partition,
                "clean" if slot.clean else f"expiring in {self.hold:g}s: messages may be in flight",
            )
            break
        self._wake.set()

    async def _leave(self) -> None:
        try:
            await self._leases(sql.leave)
        except DATABASE_ERRORS as exc:
            log.warning("%s: could not leave the members (%r); it ages out", self.durable, exc)

    async def _abandon(self) -> None:
        """Cancelled (as if killed): cancel every work now, release nothing."""
        for slot in [*self._slots.values(), *self._draining.values()]:
            if slot.timer is not None:
                slot.timer.cancel()
            slot.running = False
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        self._slots.clear()
        self._draining.clear()
        if tasks:
            await asyncio.wait(tasks, timeout=ABANDON_WAIT)
