"""Partition ownership across consumer replicas (issue 23): PostgreSQL leases, for real.

Each replica is a :class:`PartitionOwnership` in this process, with its own pool on a
fresh, migrated database. The fake work records when it ran each partition (from its
start until its stop event, or its cancellation as if the process were killed); the
central fact checked is that no two runs of one partition ever overlap. Waits are polls
with generous bounds; the only timing assertions are lower bounds the design guarantees.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from devstack.postgres import PostgresServer
from services.inbox_consumer.partition_share import fair_share, lease_validity, preference
from services.inbox_consumer.partition_slot import NotSettled
from services.inbox_consumer.partitions import PartitionOwnership
from shared.adapters import partition_leases
from shared.adapters.postgres import migrate_database
from shared.runtime.settings import ConsumerSettings

DURABLE = "sea__ordered"


# -- the pure parts ---------------------------------------------------------------------------


@given(st.integers(1, 64), st.integers(1, 16))
def test_preferred_stripes_are_disjoint_and_cover_every_partition(
    partitions: int, members: int
) -> None:
    seen: list[int] = []
    for rank in range(members):
        order = preference(partitions, members, rank)
        assert sorted(order) == list(range(partitions))
        stripe = [p for p in range(partitions) if p % members == rank]
        assert order[: len(stripe)] == stripe
        assert len(stripe) <= fair_share(partitions, members)
        seen += stripe
    assert sorted(seen) == list(range(partitions))


def test_fair_share_rounds_up() -> None:
    assert [fair_share(4, m) for m in (1, 2, 3, 4, 5)] == [4, 2, 2, 1, 1]


async def test_a_lease_must_outlast_what_its_owner_holds() -> None:
    """An owner works only while its lease outlasts ack_wait + its pull requests' lifetime (hold)
    and a margin; a lease too short for that is refused, and the default ttl fits."""
    assert lease_validity(12.0, 6.0) == pytest.approx(5.0)
    assert lease_validity(6.0, 2.5) == pytest.approx(2.9)

    async def work(k: int, stop: asyncio.Event) -> None:
        return None

    with pytest.raises(ValueError, match=r"must exceed the durable's ack_wait"):
        PartitionOwnership(
            None, durable=DURABLE, partitions=2, owner="a", ttl=6.0, hold=5.5, work=work
        )
    settings = ConsumerSettings()
    assert settings.lease_ttl(5.0) == 12.0
    assert lease_validity(settings.lease_ttl(60.0), 61.0) > 0
    assert ConsumerSettings(partition_lease_ttl=9.0).lease_ttl(60.0) == 9.0


# -- the world --------------------------------------------------------------------------------


@pytest.fixture
async def pool(pg_server: PostgresServer) -> AsyncIterator[asyncpg.Pool]:
    """A pool on a fresh database with every migration."""
    dsn = pg_server.dsn(f"t{uuid.uuid4().hex[:10]}_leases")
    await asyncio.wait_for(migrate_database(dsn), timeout=60)
    created = await asyncpg.create_pool(dsn, min_size=1, max_size=8)
    assert created is not None
    try:
        yield created
    finally:
        await created.close()


@dataclass
class Run:
    partition: int
    owner: str
    start: float
    end: float | None = None


@dataclass
class Record:
    """What every fake work did, across replicas."""

    runs: list[Run] = field(default_factory=list)
    calls: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))

    def work(
        self,
        owner: str,
        *,
        crash: dict[int, str] | None = None,
        on_stop: Callable[[int], None] | None = None,
    ) -> Callable[[int, asyncio.Event], Awaitable[None]]:
        """A work that runs until stopped; ``crash[k]`` ("raise", "unsettled": raises
        :class:`NotSettled`, or "return") ends its first run of ``k`` by itself; ``on_stop(k)``
        runs when it is stopped (it may raise)."""
        crash = dict(crash or {})

        async def work(k: int, stop: asyncio.Event) -> None:
            self.calls[owner, k] += 1
            run = Run(k, owner, time.monotonic())
            self.runs.append(run)
            try:
                how = crash.pop(k, None)
                if how == "raise":
                    raise RuntimeError(f"partition {k} broke")
                if how == "unsettled":
                    raise NotSettled(f"deliveries of partition {k} never arrived")
                if how == "return":
                    return
                await stop.wait()
                if on_stop is not None:
                    on_stop(k)
            finally:
                run.end = time.monotonic()

        return work

    def started(self, owner: str) -> dict[int, float]:
        """The first start of each partition by ``owner``."""
        first: dict[int, float] = {}
        for run in self.runs:
            if run.owner == owner:
                first.setdefault(run.partition, run.start)
        return first

    def assert_no_overlap(self) -> None:
        by_partition: dict[int, list[Run]] = defaultdict(list)
        for run in self.runs:
            by_partition[run.partition].append(run)
        for k, runs in by_partition.items():
            runs.sort(key=lambda r: r.start)
            for before, after in itertools.pairwise(runs):
                assert before.end is not None and before.end <= after.start, (
                    f"partition {k}: {before} overlaps {after}"
                )


class Replica:
    """One replica's ownership loop, run in a task."""

    def __init__(
        self,
        pool: Any,
        owner: str,
        record: Record,
        *,
        partitions: int,
        ttl: float = 1.5,
        hold: float = 0.5,
        pending: dict[int, int] | int | None = 0,
        crash: dict[int, str] | None = None,
        on_stop: Callable[[int], None] | None = None,
        restart_pause: float = 0.1,
        takeover_margin: float = 0.2,
    ) -> None:
        self.owner, self.stop = owner, asyncio.Event()
        #: When pending(k) was asked, per partition (that is, just after acquiring it).
        self.asked: dict[int, float] = {}
        #: What ownership.lost(k) said when the work of k saw its stop event.
        self.lost: dict[int, bool] = {}

        def stopped(k: int) -> None:
            self.lost[k] = self.ownership.lost(k)
            if on_stop is not None:
                on_stop(k)

        self.ownership = PartitionOwnership(
            pool,
            durable=DURABLE,
            partitions=partitions,
            owner=owner,
            ttl=ttl,
            hold=hold,
            work=record.work(owner, crash=crash, on_stop=stopped),
            pending=None if pending is None else self._pending(pending),
            restart_pause=restart_pause,
            takeover_margin=takeover_margin,
        )
        self.task = asyncio.create_task(self.ownership.run(self.stop))

    def _pending(self, answer: dict[int, int] | int) -> Callable[[int], Awaitable[int]]:
        async def pending(k: int) -> int:
            self.asked[k] = time.monotonic()
            return answer if isinstance(answer, int) else answer.get(k, 0)

        return pending

    def owned(self) -> frozenset[int]:
        return self.ownership.owned()

    async def stop_cleanly(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=20)

    async def kill(self) -> None:
        """As kill -9: the loop and its work vanish, nothing is released."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def watching(
    *replicas: Replica, among: list[Replica] | None = None
) -> AsyncIterator[list[str]]:
    """Sample every replica's owned() all along (those of ``among`` too, a list that may
    grow): two may never own one partition."""
    clashes: list[str] = []

    async def sample() -> None:
        while True:
            seen: dict[int, str] = {}
            for replica in [*replicas, *(among or [])]:
                for k in replica.owned():
                    if k in seen:
                        clashes.append(f"partition {k}: {seen[k]} and {replica.owner}")
                    seen[k] = replica.owner
            await asyncio.sleep(0.005)

    task = asyncio.create_task(sample())
    try:
        yield clashes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def lease_rows(pool: asyncpg.Pool) -> list[partition_leases.Lease]:
    async with pool.acquire() as conn:
        return await partition_leases.leases(conn, DURABLE)


async def member_rows(pool: asyncpg.Pool) -> list[str]:
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT owner FROM partition_members WHERE durable = $1", DURABLE)
    return [row["owner"] for row in rows]


ALL4 = frozenset(range(4))


# -- the adapter ------------------------------------------------------------------------------


async def test_racing_acquisitions_take_each_partition_once(pool: asyncpg.Pool) -> None:
    async def take(owner: str) -> list[int]:
        async with pool.acquire() as conn:
            got = await partition_leases.acquire(
                conn, durable=DURABLE, owner=owner, ttl=30, partitions=range(16)
            )
        return [lease.partition for lease in got]

    for _ in range(5):
        results = await asyncio.gather(*(take(f"r{i}") for i in range(4)))
        assert sorted(k for got in results for k in got) == list(range(16))
        async with pool.acquire() as conn:
            await conn.execute("UPDATE partition_leases SET released = true")


# -- the ownership loop -----------------------------------------------------------------------


async def test_one_owner_takes_every_partition_and_releases_them_on_stop(
    pool: asyncpg.Pool,
) -> None:
    record = Record()
    alone = Replica(pool, "a", record, partitions=4)
    await until(lambda: alone.owned() == ALL4, "the only replica owns every partition")
    assert await member_rows(pool) == ["a"]
    await alone.stop_cleanly()
    assert all(run.end is not None for run in record.runs)
    assert alone.lost == dict.fromkeys(ALL4, False)
    rows = await lease_rows(pool)
    assert [(r.partition, r.owner, r.released) for r in rows] == [(k, "a", True) for k in ALL4]
    assert await member_rows(pool) == []
    assert alone.ownership.acquired == 4 and alone.ownership.releases == 4


async def test_two_owners_split_the_partitions_and_never_overlap(pool: asyncpg.Pool) -> None:
    record = Record()
    a = Replica(pool, "a", record, partitions=6)
    b = Replica(pool, "b", record, partitions=6)
    async with watching(a, b) as clashes:
        await until(
            lambda: (
                len(a.owned()) == 3
                and len(b.owned()) == 3
                and a.owned() | b.owned() == set(range(6))
            ),
            "each replica owns half",
        )
        await asyncio.sleep(1.5)  # several renewal rounds: nothing moves
        assert len(a.owned()) == 3 and len(b.owned()) == 3
        await asyncio.gather(a.stop_cleanly(), b.stop_cleanly())
    assert clashes == []
    record.assert_no_overlap()


async def test_a_joining_owner_gets_its_share_from_graceful_sheds(pool: asyncpg.Pool) -> None:
    record = Record()
    # Every partition has messages in flight and a takeover would wait long: only a
    # released lease lets the newcomer start before the polls give up.
    kw: dict[str, Any] = {"partitions": 6, "pending": 5, "takeover_margin": 120.0}
    a = Replica(pool, "a", record, **kw)
    b = Replica(pool, "b", record, **kw)
    async with watching(a, b) as clashes:
        await until(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, "a and b own three each")
        shed_before = a.ownership.sheds + b.ownership.sheds
        c = Replica(pool, "c", record, **kw)
        async with watching(a, b, c) as more:
            await until(
                lambda: [len(r.owned()) for r in (a, b, c)] == [2, 2, 2],
                "the three replicas own two partitions each",
            )
            await asyncio.gather(a.stop_cleanly(), b.stop_cleanly(), c.stop_cleanly())
    assert clashes == [] and more == []
    assert a.ownership.sheds + b.ownership.sheds - shed_before == 2
    assert c.ownership.takeovers == 0 and c.ownership.waits == 0
    record.assert_no_overlap()


async def test_a_killed_owner_is_taken_over_at_once_when_nothing_is_pending(
    pool: asyncpg.Pool,
) -> None:
    record = Record()
    a = Replica(pool, "a", record, partitions=4)
    await until(lambda: a.owned() == ALL4, "a owns everything")
    await a.kill()
    # A takeover's wait is long: with nothing pending, b must not wait at all.
    b = Replica(pool, "b", record, partitions=4, pending=0, takeover_margin=120.0)
    await until(lambda: b.owned() == ALL4, "b took every partition over")
    assert b.ownership.takeovers == 4 and b.ownership.waits == 0
    await b.stop_cleanly()
    record.assert_no_overlap()


async def test_a_taker_starts_after_the_dead_owners_lease_expired(pool: asyncpg.Pool) -> None:
    """The dead owner's lease must expire first (by then what it held is redeliverable);
    partitions with messages in flight then start after the takeover margin, the others
    at once. b is already a member when a dies, so it takes the partitions on the round
    their leases expire, not a whole renewal period later."""
    record = Record()
    a = Replica(pool, "a", record, partitions=4, ttl=3.0)
    b = Replica(pool, "b", record, partitions=4, pending={2: 3, 3: 1}, takeover_margin=0.6)
    await until(lambda: len(a.owned()) == 2 and len(b.owned()) == 2, "a and b own two each")
    a_parts = a.owned()
    renewed = a.ownership.renew_every
    await a.kill()
    killed = time.monotonic()
    await until(lambda: b.owned() == ALL4, "b took every partition over")
    a_last = {run.partition: run.start for run in record.runs if run.owner == "a"}
    started = {  # b's first run of each of a's partitions after a's last run of it
        k: min(
            r.start
            for r in record.runs
            if r.owner == "b" and r.partition == k and r.start > a_last[k]
        )
        for k in a_parts
    }
    for k in a_parts:
        # The lease ran at least ttl from a's last renewal, at most a period before the kill.
        assert started[k] - killed >= 3.0 - renewed - 0.05
        if k in (2, 3):
            assert started[k] - b.asked[k] >= 0.6 - 0.05
    assert b.ownership.takeovers == len(a_parts)
    assert b.ownership.waits == len(a_parts & {2, 3})
    await b.stop_cleanly()
    record.assert_no_overlap()


class FlakyPool:
    """A pool whose database can be made unreachable (``mode``: "raise" or "hang")."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool, self.mode = pool, ""

    def acquire(self) -> Any:
        return self.pool.acquire() if not self.mode else _Down(self.mode)


class _Down:
    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def __aenter__(self) -> None:
        if self.mode == "hang":
            await asyncio.sleep(3600)
        raise ConnectionRefusedError("the database is unreachable (test)")

    async def __aexit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("outage", ["raise", "hang"])
async def test_an_owner_cut_off_from_the_database_fences_itself(
    pool: asyncpg.Pool, outage: str
) -> None:
    record = Record()
    flaky = FlakyPool(pool)
    kw: dict[str, Any] = {"partitions": 4, "pending": 1, "hold": 0.5}
    a = Replica(flaky, "a", record, **kw)
    b = Replica(pool, "b", record, **kw)
    async with watching(a, b) as clashes:
        await until(lambda: len(a.owned()) == 2 and len(b.owned()) == 2, "a and b own two each")
        lost = a.owned()
        a.lost.clear()
        flaky.mode = outage
        await until(lambda: a.ownership.fences == 2, "a fenced its two partitions")
        assert a.owned() == frozenset()
        await until(lambda: set(a.lost) == lost, "a's work saw its stop events")
        assert all(a.lost.values()), "a fenced partition's work is told it lost the lease"
        a_runs = [run for run in record.runs if run.owner == "a"]
        await until(lambda: all(run.end is not None for run in a_runs), "a's work stopped")
        await until(lambda: b.owned() == ALL4, "b took a's partitions over")
        assert b.ownership.takeovers == 2 and b.ownership.waits == 2
        # a stopped touching its partitions at least ``hold`` before their leases expired,
        # so what it held was redeliverable before b could take them. b's takeover is its
        # first run after a's (b may have held a partition at start-up and shed it to a).
        for k in lost:
            end = max(run.end or 0.0 for run in a_runs if run.partition == k)
            taken = [r.start for r in record.runs if r.owner == "b" and r.partition == k]
            taken_over = [start for start in taken if start > end]
            assert taken_over, f"b never ran partition {k} after a stopped it"
            assert min(taken_over) - end >= 0.5
        # The database comes back: a rejoins and b sheds to make room for it.
        shed_before = b.ownership.sheds
        flaky.mode = ""
        await until(lambda: len(a.owned()) == 2 and len(b.owned()) == 2, "a is back with two")
        assert b.ownership.sheds - shed_before == 2
        await asyncio.gather(a.stop_cleanly(), b.stop_cleanly())
    assert clashes == []
    assert a.ownership.renew_failures > 0
    record.assert_no_overlap()


async def test_a_work_that_ends_by_itself_is_restarted(pool: asyncpg.Pool) -> None:
    record = Record()
    alone = Replica(pool, "a", record, partitions=4, crash={1: "raise", 2: "return"})
    await until(
        lambda: alone.owned() == ALL4 and alone.ownership.restarts == 2,
        "both partitions restarted",
    )
    assert record.calls["a", 1] == record.calls["a", 2] == 2
    assert record.calls["a", 0] == record.calls["a", 3] == 1
    await alone.stop_cleanly()
    assert [r.released for r in await lease_rows(pool)] == [True] * 4


async def test_a_work_that_ends_unsettled_restarts_once_its_messages_are_redeliverable(
    pool: asyncpg.Pool,
) -> None:
    """A partition's work that ends by itself with messages in flight (a delivery lost in
    transit: the loop's NotSettled; or a crash) restarts only ``hold`` seconds later, when
    they are redeliverable: sooner, its first pull would bring the key's later events
    ahead of them. Nothing in flight: at once, as before."""
    record = Record()
    hold = 1.5
    alone = Replica(
        pool, "a", record, partitions=4, ttl=4.0, hold=hold, pending={1: 3, 2: 1},
        crash={1: "unsettled", 2: "raise", 3: "unsettled"},
    )  # fmt: skip
    await until(lambda: alone.ownership.restarts == 3, "three partitions restarted")
    await until(
        lambda: record.calls["a", 1] == record.calls["a", 2] == record.calls["a", 3] == 2,
        "1, 2 and 3 run again",
    )
    assert alone.ownership.waits >= 2, "partitions 1 and 2 had messages in flight"
    for k, least in ((1, hold), (2, hold), (3, 0.0)):
        first, second = sorted((r for r in record.runs if r.partition == k), key=lambda r: r.start)
        assert first.end is not None and second.start - first.end >= least, (k, first, second)
    await alone.stop_cleanly()
    record.assert_no_overlap()


@pytest.mark.parametrize(
    "failure",
    [
        RuntimeError("could not settle the batch in hand"),
        # The consumer loop's own word for it: stopped, its subscription not drained.
        NotSettled("its pull subscription was not drained or its naks not flushed"),
    ],
)
async def test_a_work_that_fails_to_stop_leaves_its_lease_unreleased(
    pool: asyncpg.Pool, failure: Exception
) -> None:
    """A work that raises when stopped may have left messages unacked: its lease is not
    released but expires ``hold`` later, and the next owner checks what is in flight."""

    def unsettled(k: int) -> None:
        if k == 0:
            raise failure

    record = Record()
    a = Replica(pool, "a", record, partitions=4, on_stop=unsettled)
    await until(lambda: a.owned() == ALL4, "a owns everything")
    await a.stop_cleanly()
    rows = {r.partition: r for r in await lease_rows(pool)}
    assert not rows[0].released
    assert all(rows[k].released for k in (1, 2, 3))
    b = Replica(pool, "b", record, partitions=4, pending=2, takeover_margin=120.0)
    await until(lambda: b.owned() == {1, 2, 3} and b.ownership.held() == ALL4, "b holds all")
    assert b.ownership.waits == 1 and b.ownership.takeovers == 1
    await b.stop_cleanly()
    record.assert_no_overlap()


async def churn(pool: asyncpg.Pool, record: Record, everyone: list[Replica]) -> Replica:
    """Start, stop and kill replicas at random (2 to 4 live); stop all but one, return it."""
    rng = random.Random(23)
    kw: dict[str, Any] = {"partitions": 8, "ttl": 0.8, "hold": 0.3, "pending": {1: 1, 5: 2}}
    live: list[Replica] = []
    for step in range(30):
        action = rng.choice(["start", "start", "stop", "kill"])
        if (action == "start" and len(live) < 4) or len(live) < 2:
            replica = Replica(pool, f"r{step}", record, **kw)
            live.append(replica)
            everyone.append(replica)
        elif action == "stop":
            await live.pop(rng.randrange(len(live))).stop_cleanly()
        else:
            await live.pop(rng.randrange(len(live))).kill()
        await asyncio.sleep(rng.uniform(0.05, 0.5))
    for replica in live[1:]:
        await replica.stop_cleanly()
    return live[0]


async def test_a_churning_replica_set_never_runs_a_partition_twice_at_once(
    pool: asyncpg.Pool,
) -> None:
    """Replicas start, stop cleanly and are killed at random for a while; then one stays
    and ends up owning every partition. No partition ever ran on two replicas at once."""
    record = Record()
    everyone: list[Replica] = []
    try:
        async with watching(among=everyone) as clashes:
            last = await churn(pool, record, everyone)
            await until(lambda: last.owned() == frozenset(range(8)), "the last one owns all")
            await last.stop_cleanly()
    finally:
        for replica in everyone:
            if not replica.task.done():
                await replica.kill()
    assert clashes == []
    record.assert_no_overlap()
    assert sum(r.ownership.takeovers for r in everyone) > 0
    assert sum(r.ownership.sheds for r in everyone) > 0


async def test_a_renewal_that_finds_another_owner_fences_the_partition(
    pool: asyncpg.Pool,
) -> None:
    record = Record()
    a = Replica(pool, "a", record, partitions=4)
    await until(lambda: a.owned() == ALL4, "a owns everything")
    a.lost.clear()
    async with pool.acquire() as conn:  # an intruder holds partition 2 now (say, by hand)
        await conn.execute(
            "UPDATE partition_leases SET owner = 'intruder',"
            " expires_at = clock_timestamp() + interval '1 hour'"
            " WHERE durable = $1 AND partition = 2",
            DURABLE,
        )
    await until(lambda: a.ownership.fences == 1, "a fenced partition 2")
    assert a.owned() == {0, 1, 3}
    assert a.lost == {2: True}
    await asyncio.sleep(1.0)  # three renewal rounds: a does not take it back
    assert a.owned() == {0, 1, 3}
    await a.stop_cleanly()
    rows = {r.partition: r for r in await lease_rows(pool)}
    assert rows[2].owner == "intruder" and rows[2].held


async def test_a_partition_given_up_while_waiting_to_start_is_not_released_clean(
    pool: asyncpg.Pool,
) -> None:
    """The wait for the dead owner's messages is not laundered by a release: the next
    owner waits too."""
    record = Record()
    a = Replica(pool, "a", record, partitions=2)
    await until(lambda: a.owned() == {0, 1}, "a owns everything")
    await a.kill()
    kw: dict[str, Any] = {"partitions": 2, "pending": 4, "takeover_margin": 120.0}
    b = Replica(pool, "b", record, **kw)
    await until(lambda: b.ownership.held() == {0, 1}, "b took both over")
    assert b.owned() == frozenset() and b.ownership.waits == 2
    await b.stop_cleanly()
    rows = await lease_rows(pool)
    assert [(r.owner, r.released) for r in rows] == [("b", False)] * 2
    c = Replica(pool, "c", record, **kw)
    await until(lambda: c.ownership.held() == {0, 1}, "c took both over")
    assert c.owned() == frozenset() and c.ownership.waits == 2
    await c.stop_cleanly()
    assert [run.owner for run in record.runs] == ["a", "a"]


@pytest.mark.parametrize("turns_between", [0, 1, 2, 3])
async def test_an_owner_killed_as_its_loop_wakes_ends(
    pool: asyncpg.Pool, turns_between: int
) -> None:
    """A kill that lands in the turn its renewal wait ends still ends the owner (with
    Python 3.11's asyncio.wait_for the loop went on renewing, and the kill never
    returned: a CI run hung on it)."""
    record = Record()
    a = Replica(pool, "a", record, partitions=2)
    await until(lambda: a.owned() == {0, 1}, "a owns everything")
    a.ownership._wake.set()
    for _ in range(turns_between):
        await asyncio.sleep(0)
    a.task.cancel()
    done, _ = await asyncio.wait({a.task}, timeout=10.0)
    assert done and a.task.cancelled(), "the owner went on after it was killed"
    assert [run.end is not None for run in record.runs] == [True, True]
