"""The failure groups' counts are kept as dead letters change (migration 0027): after any
sequence of inserts, moves between statuses and groups, deletes, truncations and folds —
in turn or at once from several connections — the counts the Failures page reads equal
the dead letters counted directly, and the page's groups name each group's newest letter.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from services.console import data
from shared.adapters import dead_letters
from tests.conftest import Env

pytestmark = pytest.mark.integration

DURABLES = ("vibespro__from_sea", "sea__from_vibespro")
REASONS = ("HANDLER_REJECTED", "MAX_DELIVERIES_EXCEEDED", "SCHEMA_INVALID")
#: Error templates: the number varies within a group, the words make the groups.
ERRORS = ("order {} has no model", "timeout after {} ms", "schema: field {} missing")
STATUSES = ("dead", "held", "replaying", "replayed", "parked", "discarded")
EVERY = list(STATUSES)

_TRUTH = """
SELECT durable, reason_code, fingerprint, status, count(*) AS count,
       min(first_dead_lettered_at) AS first_seen
FROM dead_letters GROUP BY durable, reason_code, fingerprint, status
"""
_INSERT = """
INSERT INTO dead_letters (durable, message_id, stream, original_subject, reason_code,
                          last_error, record, dlq_subject, source, status,
                          first_dead_lettered_at, dead_lettered_at)
SELECT d, m, 'S', 'x.y.v1', r, e, '{}', 'sea.dlq', 'consumer', s, t, t
FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::timestamptz[])
  AS u(d, m, r, e, s, t)
ON CONFLICT (durable, message_id) DO NOTHING
"""


async def _kept(conn: asyncpg.Connection) -> Counter[tuple[str, ...]]:
    """What the page reads: the folded counts plus the pending changes."""
    rows = await conn.fetch(data.COUNTS, list(DURABLES), EVERY, None)
    return Counter({(r["durable"], r["reason_code"], r["fingerprint"], r["status"]): r["count"]
                    for r in rows})  # fmt: skip


async def _truth(conn: asyncpg.Connection) -> Counter[tuple[str, ...]]:
    rows = await conn.fetch(_TRUTH)
    return Counter({(r["durable"], r["reason_code"], r["fingerprint"], r["status"]): r["count"]
                    for r in rows})  # fmt: skip


class Letters:
    """Random changes to the dead letters, as the roles and operators make them."""

    def __init__(
        self, conn: asyncpg.Connection, rng: random.Random, *, narrow: bool = False
    ) -> None:
        self.conn, self.rng = conn, rng
        #: Narrow: two groups, so concurrent changes meet on the same few counts.
        self.durables, self.reasons = (DURABLES[:1], REASONS[:2]) if narrow else (DURABLES, REASONS)
        self.errors = ERRORS[:1] if narrow else ERRORS
        self.statuses = STATUSES
        self.ids: list[tuple[str, uuid.UUID]] = []
        self.clock = datetime(2026, 1, 1, tzinfo=UTC)

    def _error(self) -> str:
        return self.rng.choice(self.errors).format(self.rng.randrange(10_000))

    async def insert(self, n: int, *, again: bool = False) -> None:
        rows: list[list[Any]] = [[], [], [], [], [], []]
        for _ in range(n):
            if again and self.ids:  # the same message dead-lettered by a second path
                durable, message_id = self.rng.choice(self.ids)
            else:
                durable, message_id = self.rng.choice(self.durables), uuid.uuid4()
                self.ids.append((durable, message_id))
            self.clock += timedelta(seconds=self.rng.randrange(1, 100))
            for column, value in zip(rows, (durable, message_id, self.rng.choice(self.reasons),
                                            self._error(), self.rng.choice(self.statuses),
                                            self.clock), strict=True):  # fmt: skip
                column.append(value)
        await self.conn.execute(_INSERT, *rows)

    def _some(self, n: int) -> list[uuid.UUID]:
        return [m for _, m in self.rng.sample(self.ids, min(n, len(self.ids)))]

    async def move(self, n: int) -> None:
        """A status change (replay, park, discard), a new error or reason (a replay that
        failed again), or nothing that moves a letter (a publish confirmed)."""
        ids = self._some(n)
        change = self.rng.choice(("status", "error", "reason", "none"))
        if change == "status":
            await self.conn.execute(
                "UPDATE dead_letters SET status = $2 WHERE message_id = ANY($1::uuid[])",
                ids, self.rng.choice(self.statuses),
            )  # fmt: skip
        elif change == "error":
            await self.conn.execute(
                "UPDATE dead_letters SET last_error = $2, dead_lettered_at = now()"
                " WHERE message_id = ANY($1::uuid[])", ids, self._error(),
            )  # fmt: skip
        elif change == "reason":
            await self.conn.execute(
                "UPDATE dead_letters SET reason_code = $2 WHERE message_id = ANY($1::uuid[])",
                ids, self.rng.choice(self.reasons),
            )  # fmt: skip
        else:
            await self.conn.execute(
                "UPDATE dead_letters SET updated_at = now(), attempts = attempts + 1"
                " WHERE message_id = ANY($1::uuid[])", ids,
            )  # fmt: skip

    async def delete(self, n: int) -> None:
        ids = self._some(n)
        await self.conn.execute("DELETE FROM dead_letters WHERE message_id = ANY($1::uuid[])", ids)
        gone = set(ids)
        self.ids = [(d, m) for d, m in self.ids if m not in gone]

    async def step(self) -> str:
        kind = self.rng.choices(("insert", "again", "move", "delete", "fold", "rollback"),
                                weights=(5, 1, 6, 2, 2, 1))[0]  # fmt: skip
        if kind == "insert":
            await self.insert(self.rng.randrange(1, 30))
        elif kind == "again":
            await self.insert(self.rng.randrange(1, 5), again=True)
        elif kind == "move":
            await self.move(self.rng.randrange(1, 20))
        elif kind == "delete":
            await self.delete(self.rng.randrange(1, 10))
        elif kind == "fold":
            await dead_letters.fold_groups(self.conn)
        else:  # changes rolled back leave no change behind
            with contextlib.suppress(_Rollback):
                async with self.conn.transaction():
                    await self.insert(5)
                    await self.move(5)
                    raise _Rollback
            known = {m for (m,) in await self.conn.fetch("SELECT message_id FROM dead_letters")}
            self.ids = [(d, m) for d, m in self.ids if m in known]
        return kind


class _Rollback(Exception):
    """Raised to roll a transaction of changes back."""


@pytest.fixture
async def conn(env: Env) -> Any:
    connection = await asyncpg.connect(env.dsn("vibespro"))
    await connection.execute("TRUNCATE dead_letters CASCADE")
    try:
        yield connection
    finally:
        await connection.close()


async def test_the_counts_follow_every_change_in_turn(conn: asyncpg.Connection) -> None:
    letters = Letters(conn, random.Random(48))
    kinds: Counter[str] = Counter()
    for step in range(300):
        kinds[await letters.step()] += 1
        kept, truth = await _kept(conn), await _truth(conn)
        assert kept == truth, f"step {step}: kept and counted differ"
    assert min(kinds.values()) >= 10, kinds  # every kind of change was made
    assert sum((await _truth(conn)).values()) > 100
    # Folded, nothing is pending and the counts are the same.
    assert await dead_letters.fold_groups(conn) >= 0
    assert await conn.fetchval("SELECT count(*) FROM dead_letter_group_changes") == 0
    assert await _kept(conn) == await _truth(conn)
    assert await conn.fetchval("SELECT count(*) FROM dead_letter_groups WHERE count <= 0") == 0
    # (a negative count is a concurrent fold's half-way mark: none after a fold alone)
    # A truncation empties the counts with the letters.
    await conn.execute("TRUNCATE dead_letters CASCADE")
    assert await _kept(conn) == Counter()
    await letters.insert(10)
    assert await _kept(conn) == await _truth(conn)


async def test_first_seen_is_the_earliest_first_failure_while_letters_only_arrive(
    conn: asyncpg.Connection,
) -> None:
    letters = Letters(conn, random.Random(7))
    for _ in range(20):
        await letters.insert(letters.rng.randrange(1, 20))
        if letters.rng.random() < 0.3:
            await dead_letters.fold_groups(conn)
    rows = await conn.fetch(data.COUNTS, list(DURABLES), EVERY, None)
    truth = {(r["durable"], r["reason_code"], r["fingerprint"], r["status"]): r["first_seen"]
             for r in await conn.fetch(_TRUTH)}  # fmt: skip
    assert rows and all(
        r["first_seen"] == truth[(r["durable"], r["reason_code"], r["fingerprint"], r["status"])]
        for r in rows
    )


async def test_the_counts_hold_under_concurrent_writers_and_folds(env: Env) -> None:
    """Four writers change letters of two groups while three connections fold, all at
    once: a letter's arrival and its departure may be taken by different folds."""
    dsn = env.dsn("vibespro")
    setup = await asyncpg.connect(dsn)
    await setup.execute("TRUNCATE dead_letters CASCADE")

    async def writer(seed: int) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            letters = Letters(conn, random.Random(seed), narrow=True)
            for _ in range(150):
                # A few letters at a time, so the counts come and go through zero: the
                # moment a fold could empty a count that another fold is about to raise.
                kind = letters.rng.choice(("insert", "move", "delete"))
                async with conn.transaction():  # several changes in one transaction
                    await getattr(letters, kind)(letters.rng.randrange(1, 3))
                    await letters.move(1)
        finally:
            await conn.close()

    async def folder(stop: asyncio.Event) -> int:
        conn = await asyncpg.connect(dsn)
        folds = 0
        try:
            while not stop.is_set():
                await dead_letters.fold_groups(conn)
                folds += 1
        finally:
            await conn.close()
        return folds

    stop = asyncio.Event()
    folders = [asyncio.create_task(folder(stop)) for _ in range(3)]
    try:
        await asyncio.gather(*(writer(seed) for seed in range(4)))
    finally:
        stop.set()
    folds = await asyncio.gather(*folders)
    try:
        assert all(n > 0 for n in folds), folds
        truth = await _truth(setup)
        assert sum(truth.values()) > 20
        assert await _kept(setup) == truth
        await dead_letters.fold_groups(setup)
        assert await _kept(setup) == truth
    finally:
        await setup.close()


async def test_the_pages_groups_name_each_groups_newest_letter(conn: asyncpg.Connection) -> None:
    letters = Letters(conn, random.Random(3))
    for _ in range(30):
        await letters.step()
    await letters.insert(30)
    open_ = list(data.OPEN_STATUSES)
    rows = await conn.fetch(data._GROUPS, list(DURABLES), open_, None)
    expected = await conn.fetch(
        """
        SELECT durable, reason_code, fingerprint, count(*) AS count,
               max(dead_lettered_at) AS last_seen, array_agg(DISTINCT status) AS statuses
        FROM dead_letters WHERE status = ANY($1::text[])
        GROUP BY durable, reason_code, fingerprint
        """,
        open_,
    )
    assert len(rows) == len(expected) > 1
    want = {(r["durable"], r["reason_code"], r["fingerprint"]): r for r in expected}
    for row in rows:
        truth = want[(row["durable"], row["reason_code"], row["fingerprint"])]
        assert row["count"] == truth["count"]
        assert sorted(row["statuses"]) == sorted(truth["statuses"])
        assert row["last_seen"] == truth["last_seen"]
        newest = await conn.fetch(
            "SELECT last_error FROM dead_letters WHERE durable = $1 AND reason_code = $2"
            " AND fingerprint = $3 AND status = ANY($4::text[]) AND dead_lettered_at = $5",
            row["durable"], row["reason_code"], row["fingerprint"], open_, row["last_seen"],
        )  # fmt: skip
        assert row["last_error"] in {r["last_error"] for r in newest}
    seen = [r["last_seen"] for r in rows]
    assert seen == sorted(seen, reverse=True), "latest group first"


async def test_a_fold_that_takes_a_departure_without_its_arrival_keeps_the_debt(
    env: Env, conn: asyncpg.Connection
) -> None:
    """A letter arrives and leaves (+1, then -1, pending); another fold holds the +1 (here:
    a transaction that locked it) when a fold takes the -1 alone. The count goes below
    zero and must stay there until the +1 comes: emptied, the -1 would be lost and the
    group counted once too often for ever."""
    letters = Letters(conn, random.Random(11))
    await letters.insert(1)
    await letters.delete(1)
    assert [r["delta"] for r in await conn.fetch(
        "SELECT delta FROM dead_letter_group_changes ORDER BY delta DESC")] == [1, -1]  # fmt: skip
    other = await asyncpg.connect(env.dsn("vibespro"))
    try:
        async with other.transaction():  # another fold's hands on the +1
            await other.execute(
                "SELECT 1 FROM dead_letter_group_changes WHERE delta > 0 FOR UPDATE"
            )
            assert await dead_letters.fold_groups(conn) == 1  # the -1 alone
            assert await conn.fetchval("SELECT sum(count) FROM dead_letter_groups") == -1
        # The lock is gone (that fold rolled back, say): the +1 is folded later.
        assert await dead_letters.fold_groups(conn) == 1
    finally:
        await other.close()
    assert await conn.fetchval("SELECT count(*) FROM dead_letter_groups") == 0
    assert await _kept(conn) == await _truth(conn) == Counter()
