"""The outbox watch's own rules, with a stand-in publisher and database.

The watch against real servers (the NOTIFYs spared, the race after a promise) is
tests/integration/test_outbox_watch.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from services.outbox_publisher.watch import OutboxWatch
from shared.domain.pacing import ArrivalGap

PERIOD = 0.01


class Publisher:
    """Counts the watch's ticks; each tick "claims" ``rows_per_tick`` rows."""

    def __init__(self, rows_per_tick: int = 1) -> None:
        self.arrivals = ArrivalGap()
        self.claimed_rows = 0
        self.ticks = 0
        self.rows_per_tick = rows_per_tick

    def tick(self) -> None:
        self.ticks += 1
        self.claimed_rows += self.rows_per_tick


class Pool:
    """Records the watch's statements; ``down`` makes every connection attempt fail,
    ``refuse`` every statement raise that error."""

    def __init__(self, down: bool = False, refuse: BaseException | None = None) -> None:
        self.down, self.refuse = down, refuse
        self.statements: list[str] = []

    @contextlib.asynccontextmanager
    async def acquire(self, timeout: float | None = None) -> AsyncIterator[Any]:
        if self.down:
            raise OSError("connection refused")
        yield self

    async def execute(self, sql: str, *args: object, timeout: float | None = None) -> str:
        self.statements.append(sql.split()[0])
        if self.refuse is not None:
            raise self.refuse
        return "OK"


def _watch(pool: Pool, publisher: Publisher, lease: float = 0.2) -> OutboxWatch:
    return OutboxWatch(
        pool,  # type: ignore[arg-type]
        publisher,
        period=PERIOD,
        poll_interval=0.1,
        lease=lease,
        instance="test",
    )


def _quick_notifies(publisher: Publisher, watch: OutboxWatch) -> None:
    for index in range(3):
        publisher.arrivals.arrived(now=index * PERIOD / 10)
        watch.arrived()


def test_a_period_must_fit_twice_in_the_lease() -> None:
    for period, lease in ((0.0, 1.0), (-1.0, 1.0), (0.5, 1.0)):
        with pytest.raises(ValueError, match="2 x period < lease"):
            OutboxWatch(Pool(), Publisher(), period=period, poll_interval=1.0, lease=lease)  # type: ignore[arg-type]


async def test_slow_notifies_never_start_a_watch() -> None:
    publisher, pool = Publisher(), Pool()
    watch = _watch(pool, publisher)
    for index in range(5):
        publisher.arrivals.arrived(now=index * 1.0)  # one a second, the period is 10 ms
        watch.arrived()
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert watch.watches == 0 and publisher.ticks == 0
    assert pool.statements == ["DELETE"]  # only the stale promises of long-gone publishers


async def test_a_watch_promises_renews_while_rows_come_and_deletes_its_promise() -> None:
    publisher, pool = Publisher(), Pool()
    watch = _watch(pool, publisher, lease=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    _quick_notifies(publisher, watch)
    await asyncio.sleep(0.3)
    assert watch.watching and watch.watches == 1
    # Rows keep coming: the promise was renewed at half its lease, more than once.
    assert pool.statements.count("INSERT") >= 3
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert pool.statements[-1] == "DELETE"
    assert not watch.watching


async def test_a_quiet_watch_ends_then_keeps_claiming_for_late_commits() -> None:
    publisher, pool = Publisher(rows_per_tick=0), Pool()
    watch = _watch(pool, publisher)
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    _quick_notifies(publisher, watch)
    await asyncio.sleep(watch.quiet + 0.05)
    assert not watch.watching
    assert pool.statements[-1] == "DELETE"
    during = publisher.ticks
    # After the promise, claims at one period, two, four... up to the poll interval.
    await asyncio.sleep(0.2)
    assert publisher.ticks > during
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    # A NOTIFY must come quickly twice before the next watch, not once.
    assert not publisher.arrivals.expects_within(PERIOD)


async def test_with_the_database_away_the_watch_goes_on_claiming_and_never_raises() -> None:
    """Its promise could not be written, or it was and the answer got lost: the period
    binds until the promise would have lapsed. Nothing escapes the watch's task."""
    publisher, pool = Publisher(rows_per_tick=0), Pool(down=True)
    watch = _watch(pool, publisher, lease=0.5)
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    _quick_notifies(publisher, watch)
    await asyncio.sleep(0.05)
    assert watch.errors >= 2  # the stale-promise clean-up and the promise
    # Quiet after 0.1 s, the delete fails too: ticks go on each period until the lease
    # (0.5 s from the failed promise) is surely over.
    await asyncio.sleep(0.2)
    assert not watch.watching
    ticks = publisher.ticks
    await asyncio.sleep(0.1)
    assert publisher.ticks >= ticks + 3
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert not task.cancelled() and task.exception() is None


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.UndefinedTableError('relation "outbox_watch" does not exist'),
        asyncpg.InsufficientPrivilegeError("permission denied for table outbox_watch"),
    ],
)
async def test_a_missing_table_or_grant_turns_the_watch_off_with_one_clear_error(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    publisher, pool = Publisher(), Pool(refuse=error)
    watch = _watch(pool, publisher)
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    for _ in range(3):
        _quick_notifies(publisher, watch)
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert watch.disabled and watch.watches == 0
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1
    assert "ferry migrate" in errors[0].getMessage()
    assert type(error).__name__ in errors[0].getMessage()


class FlakyPublisher(Publisher):
    """Its first tick raises: a bug somewhere behind the watch."""

    def tick(self) -> None:
        if self.ticks == 0:
            self.ticks += 1
            raise RuntimeError("a surprise")
        super().tick()


async def test_a_surprise_inside_a_watch_is_logged_and_later_watches_still_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    publisher, pool = FlakyPublisher(), Pool()
    watch = _watch(pool, publisher, lease=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    _quick_notifies(publisher, watch)
    await asyncio.sleep(0.3)
    assert watch.errors == 1 and watch.watches == 1
    assert any("outbox watch failed" in r.getMessage() for r in caplog.records)
    assert pool.statements[-1] == "DELETE"  # its promise was withdrawn on the way out
    _quick_notifies(publisher, watch)
    await asyncio.sleep(0.1)
    assert watch.watches == 2 and watch.watching
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert task.exception() is None
