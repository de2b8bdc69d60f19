"""outbox-publisher past the faults its first tests imagined (issue 22), on real servers.

No attempt count overflows the back-off; a row that cannot be published is set aside
(visible, counted, audited, republishable) while its aggregate's later rows wait and every
other aggregate is published; sizes are the UTF-8 bytes that go out; nothing one row or
one batch raises ends a worker.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import defaultdict
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from bench.sections import fill_outbox
from services.outbox_publisher.metrics import PublisherMetrics
from services.outbox_publisher.publisher import OutboxPublisher
from shared.access.identities import Identity
from shared.access.streams import provision
from shared.adapters import outbox, outbox_set_aside
from shared.adapters.notify import listen
from shared.runtime.metrics import RoleMetrics
from tests.conftest import CAPS, Env, ferry
from tests.helpers import eventually, insert_events, stream_messages

pytestmark = pytest.mark.integration
STREAM = "SEA_EVENTS"
#: An integer of more digits than Python's int() parses: valid JSON, valid jsonb.
HUGE_NUMBER = "1" + "0" * 5000


class Publisher:
    """An in-process outbox-publisher of ``sea`` with the settings a test needs."""

    def __init__(self, env: Env, js: JetStreamContext, **options: Any) -> None:
        self.env, self.js = env, js
        self.concurrency = options.pop("concurrency", 2)
        self.options = {"batch_size": 20, "publish_timeout": 2.0, "retry_initial": 0.05,
                        "retry_max": 0.3, **options}  # fmt: skip
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> OutboxPublisher:
        ctx = self.env.topology.contexts["sea"]
        assert ctx.stream is not None
        dsn = self.env.dsn("sea")
        self.pool = await asyncpg.create_pool(dsn, min_size=1, max_size=self.concurrency + 1)
        metrics = PublisherMetrics(RoleMetrics("outbox-publisher"), context="sea",
                                   stream=ctx.stream.name)  # fmt: skip
        publisher = OutboxPublisher(
            pool=self.pool, js=self.js, context="sea", namespace=ctx.namespace,
            stream=ctx.stream.name, metrics=metrics, **self.options,
        )  # fmt: skip
        self.tasks.append(asyncio.create_task(listen(dsn, "ferry_outbox", publisher.notify,
                                                     self.stop)))  # fmt: skip
        self.workers = [
            asyncio.create_task(publisher.run_worker(self.stop, poll_interval=0.3))
            for _ in range(self.concurrency)
        ]
        return publisher

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await asyncio.wait_for(
            asyncio.gather(*self.tasks, *self.workers, return_exceptions=True), timeout=15
        )
        await self.pool.close()


async def _insert_raw(conn: asyncpg.Connection, aggregate: str, payload: str) -> uuid.UUID:
    """One event written with plain SQL, as a non-Python producer would."""
    event_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload) "
        "VALUES ($1, 'model', $2, 'model_published', $3::jsonb)",
        event_id, aggregate, payload,
    )  # fmt: skip
    return event_id


async def _insert_behind(conn: asyncpg.Connection, aggregate: str, count: int) -> list[str]:
    ids = await insert_events(conn, count, aggregates=1)
    await conn.execute(
        "UPDATE outbox_events SET aggregate_id = $1 WHERE id = ANY($2::uuid[])", aggregate, ids
    )
    return ids


async def _pending(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM outbox_events WHERE published_at IS NULL"))


async def _published_ids(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch("SELECT id::text FROM outbox_events WHERE published_at IS NOT NULL")
    return {r["id"] for r in rows}


async def _assert_stream_is_published_rows_in_order(nc: NATS, conn: asyncpg.Connection) -> int:
    """The stream holds exactly the rows marked published, once each, in per-aggregate seq
    order; returns how many."""
    msgs = await stream_messages(nc.jetstream(), STREAM)
    ids = [m.msg_id for m in msgs]
    assert len(ids) == len(set(ids)), "an event id appears twice in the stream"
    assert set(ids) == await _published_ids(conn), "stream and published outbox rows differ"
    rows = await conn.fetch(
        "SELECT id::text, aggregate_id FROM outbox_events WHERE published_at IS NOT NULL "
        "ORDER BY seq"
    )
    expected: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        expected[r["aggregate_id"]].append(r["id"])
    seen: dict[str, list[str]] = defaultdict(list)
    for m in msgs:
        seen[m.body["aggregate_id"]].append(m.msg_id)
    assert seen == expected, "per-aggregate order differs from outbox order"
    return len(ids)


# --------------------------------------------------------------- back-off arithmetic


@pytest.mark.parametrize("attempts", [47, 1000, 2**31 - 1])
async def test_no_attempt_count_overflows_the_claim(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection, attempts: int
) -> None:
    """A row left with any attempt count (a long outage leaves ~47) neither breaks the claim
    nor the marking: it and every later event are published."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    await insert_events(sea_conn, 5, aggregates=1)
    await sea_conn.execute(
        "UPDATE outbox_events SET publish_attempts = $1, publish_error = 'earlier outage', "
        "last_attempt_at = now() - interval '2 minutes' "
        "WHERE seq = (SELECT min(seq) FROM outbox_events)",
        attempts,
    )
    # One more row backing off right now, its attempt count just as large: the claim
    # computes its back-off too, and must leave it (and only its aggregate) alone.
    await insert_events(sea_conn, 3, aggregates=1)
    await sea_conn.execute(
        "UPDATE outbox_events SET aggregate_id = 'busy', publish_attempts = $1, "
        "last_attempt_at = now() + interval '1 hour', publish_error = 'x' "
        "WHERE seq = (SELECT max(seq) - 2 FROM outbox_events)",
        attempts,
    )
    async with sea_conn.transaction():
        claimed = await outbox.claim(sea_conn, 100)
    assert len(claimed.rows) == 7 and claimed.held_back == 0
    async with Publisher(env, nc.jetstream()):
        await insert_events(sea_conn, 20, aggregates=4)  # later events
        await eventually(lambda: _pending_is(sea_conn, 1), timeout=20, what="all but one")
    assert await _assert_stream_is_published_rows_in_order(nc, sea_conn) == 27
    head = await sea_conn.fetchrow(
        "SELECT publish_attempts, published_at FROM outbox_events ORDER BY seq LIMIT 1"
    )
    assert head is not None
    assert head["published_at"] is not None
    assert head["publish_attempts"] == min(attempts + 1, 2**31 - 1)


async def _pending_is(conn: asyncpg.Connection, count: int) -> bool:
    return await _pending(conn) == count


async def test_rows_behind_a_backing_off_row_do_not_fill_the_claim(
    env: Env, sea_conn: asyncpg.Connection
) -> None:
    """More rows wait behind a failing row than a claim takes: the claim still returns
    rows of other aggregates, and locks none of the waiting ones."""
    await _insert_raw(sea_conn, "stuck", '{"n": 0}')
    await _insert_behind(sea_conn, "stuck", 30)
    others = await insert_events(sea_conn, 10, aggregates=10)
    await sea_conn.execute(
        "UPDATE outbox_events SET publish_attempts = 3, publish_error = 'refused', "
        "last_attempt_at = now() WHERE seq = (SELECT min(seq) FROM outbox_events)"
    )
    async with sea_conn.transaction():
        claimed = await outbox.claim(sea_conn, 10)
    assert sorted(str(r.id) for r in claimed.rows) == sorted(others)
    assert claimed.held_back == 0


async def test_the_claim_probes_the_failing_index_once_per_row_whatever_the_statistics(
    env: Env, sea_conn: asyncpg.Connection
) -> None:
    """Statistics taken while nothing failed, then every aggregate's head backing off (a
    long outage): the claim still looks up each walked row's blockers in idx_outbox_failing
    (an index condition per row), never a list of all failing rows rescanned per row —
    which is quadratic in the backlog. Nothing is claimable, and nothing is locked."""
    await insert_events(sea_conn, 2000, aggregates=200)
    await sea_conn.execute("ANALYZE outbox_events")
    await sea_conn.execute(
        "UPDATE outbox_events SET publish_attempts = 30, publish_error = 'no PubAck', "
        "last_attempt_at = now() + interval '1 hour' "
        "WHERE seq IN (SELECT min(seq) FROM outbox_events GROUP BY aggregate_id)"
    )
    async with sea_conn.transaction():
        plan = "\n".join(r[0] for r in await sea_conn.fetch(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + outbox._CLAIM, 500))  # fmt: skip
    probe = "Index Cond: ((aggregate_type = o.aggregate_type) AND (aggregate_id = "
    blockers = "Index Scan using idx_outbox_failing on outbox_events b"
    assert blockers in plan, plan
    # Each walked row probes it once: 1,800 loops of the probe (PostgreSQL 18 also
    # counts "Index Searches: 1800"; 15 says loops only).
    probe_line = next(line for line in plan.splitlines() if blockers in line)
    assert probe in plan and "loops=1800)" in probe_line, plan
    assert "Materialize" not in plan and "Anti Join" not in plan, plan
    # The candidates are not joined back to the table (a scan of all of it per claim).
    assert "Seq Scan" not in plan, plan
    async with sea_conn.transaction():
        assert await outbox.claim(sea_conn, 500) == outbox.Claim([], 0)


async def test_a_backlog_grown_since_the_statistics_is_claimed_by_walking_the_index(
    env: Env, sea_conn: asyncpg.Connection
) -> None:
    """Statistics taken on an empty outbox, then a backlog of 20,000 rows (an outage's,
    before autovacuum analyzes): in the publisher's claim transaction the claim still
    walks the pending rows in seq order and stops at its limit, instead of fetching and
    sorting all of them at every claim."""
    await sea_conn.execute("ANALYZE outbox_events")
    await fill_outbox(sea_conn, 20_000, traced=False)
    await sea_conn.execute(outbox.CLAIM_TRANSACTION)
    try:
        plan = "\n".join(r[0] for r in await sea_conn.fetch(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + outbox._CLAIM, 250))  # fmt: skip
        assert "Index Scan using idx_outbox_claimable on outbox_events o" in plan, plan
        assert "Bitmap" not in plan and "Seq Scan" not in plan, plan
        # It stops at its limit: 250 rows locked (18 prints "250.00", 15 "250").
        locked = plan.split("LockRows")[1].split("\n")[0]
        assert re.search(r"\(actual rows=250(\.00)? loops=1\)", locked), plan
        assert len((await outbox.claim(sea_conn, 250)).rows) == 250
    finally:
        await sea_conn.execute("ROLLBACK")


# ------------------------------------------------------------------ set-aside rows


async def test_a_poison_row_is_set_aside_and_every_other_aggregate_publishes(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    """A row whose payload Python cannot parse (plain SQL) is set aside at once; 100 rows
    of its aggregate wait behind it (5 claims' worth), and all 1,000 rows of the other
    aggregates are published — counted in the stream against the outbox."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    poison = await _insert_raw(sea_conn, "poison", f'{{"n": {HUGE_NUMBER}}}')
    behind = await _insert_behind(sea_conn, "poison", 100)
    others = await insert_events(sea_conn, 1000, aggregates=10)
    async with Publisher(env, nc.jetstream(), batch_size=20) as publisher:
        await eventually(lambda: _pending_is(sea_conn, 101), timeout=60, what="1,000 published")
    assert await _assert_stream_is_published_rows_in_order(nc, sea_conn) == 1000
    assert await _published_ids(sea_conn) == set(others)
    row = await sea_conn.fetchrow(
        "SELECT publish_attempts, publish_error, set_aside_at, set_aside_reason "
        "FROM outbox_events WHERE id = $1",
        poison,
    )
    assert row is not None
    assert row["set_aside_reason"] == "PAYLOAD_INVALID" and row["set_aside_at"] is not None
    assert row["publish_attempts"] == 1, "not retried: it can never be published as it is"
    assert "4300 digits" in row["publish_error"]
    assert (
        await sea_conn.fetchval(
            "SELECT count(*) FROM outbox_events"
            " WHERE id = ANY($1::uuid[]) AND publish_attempts = 0",
            behind,
        )
        == 100
    ), "the rows behind it were never attempted"
    [listed] = await outbox_set_aside.set_aside_rows(sea_conn)
    assert (listed["id"], listed["waiting"], listed["reason"]) == (poison, 100, "PAYLOAD_INVALID")
    [audit] = await outbox_set_aside.actions(sea_conn, poison)
    assert (audit["action"], audit["actor"], audit["reason"]) == (
        "set_aside",
        "outbox-publisher",
        "PAYLOAD_INVALID",
    )
    assert publisher.stats.set_aside == 1
    registry = publisher.metrics.role.registry
    labels = {"context": "sea", "reason": "PAYLOAD_INVALID"}
    assert registry.get_sample_value("ferry_outbox_rows_set_aside_total", labels) == 1


@pytest.mark.parametrize(
    ("column", "value", "error"),
    [
        ("payload", f'{{"n": {HUGE_NUMBER}}}', "4300 digits"),
        # RecursionError in json.loads, or the envelope's own depth limit: either way,
        ("payload", '{"deep": ' + "[" * 5000 + "]" * 5000 + "}", "cannot build the message"),
        ("occurred_at", "-infinity", "out of range"),
    ],
    ids=["huge-integer", "deep-nesting", "minus-infinity"],
)
async def test_each_unbuildable_row_is_set_aside_at_once(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection, column: str, value: str, error: str
) -> None:
    """What plain SQL can store but no envelope can carry is set aside on its first
    attempt, the error on the row; a later aggregate is published."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    bad = await _insert_raw(sea_conn, "bad", '{"n": 1}')
    cast = "jsonb" if column == "payload" else "timestamptz"
    await sea_conn.execute(f"UPDATE outbox_events SET {column} = $1::text::{cast}", value)
    [good] = await insert_events(sea_conn, 1, aggregates=1)
    async with Publisher(env, nc.jetstream()):
        await eventually(lambda: _pending_is(sea_conn, 1), timeout=20, what="good published")
        await eventually(lambda: _set_aside_count(sea_conn, 1), timeout=20, what="set aside")
    row = await sea_conn.fetchrow(
        "SELECT publish_attempts, publish_error, set_aside_reason FROM outbox_events WHERE id = $1",
        bad,
    )
    assert row is not None
    assert (row["publish_attempts"], row["set_aside_reason"]) == (1, "PAYLOAD_INVALID")
    assert error in row["publish_error"]
    assert await _published_ids(sea_conn) == {good}


async def test_operator_lists_and_republishes_a_set_aside_row_with_a_reason(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    """``ferry outbox list --failed`` shows the row and what waits behind it; ``republish``
    resets it, is audited, and (the payload fixed) the aggregate drains in order."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    poison = await _insert_raw(sea_conn, "poison", f'{{"n": {HUGE_NUMBER}}}')
    await _insert_behind(sea_conn, "poison", 7)
    async with Publisher(env, nc.jetstream()):
        await eventually(lambda: _set_aside_count(sea_conn, 1), timeout=20, what="set aside")
        listed = await asyncio.to_thread(ferry, env, "outbox", "list", "--context", "sea",
                                         "--failed")  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert str(poison) in listed.stdout and "PAYLOAD_INVALID" in listed.stdout
        assert "7 waiting behind it" in listed.stdout and "4300 digits" in listed.stdout
        no_reason = await asyncio.to_thread(ferry, env, "outbox", "republish", "--context",
                                            "sea", "--id", str(poison))  # fmt: skip
        assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
        no_rows = await asyncio.to_thread(ferry, env, "outbox", "republish", "--context",
                                          "sea", "--reason", "which?")  # fmt: skip
        assert no_rows.returncode == 2 and "--all-failed" in no_rows.stderr
        unknown = uuid.uuid4()
        refused = await asyncio.to_thread(ferry, env, "outbox", "republish", "--context", "sea",
                                          "--id", str(unknown), "--reason", "try")  # fmt: skip
        assert refused.returncode == 1 and f"{unknown} is not a set-aside row" in refused.stderr
        await sea_conn.execute("UPDATE outbox_events SET payload = '{\"n\": 1}' WHERE id = $1",
                               poison)  # fmt: skip
        done = await asyncio.to_thread(
            ferry, env, "outbox", "republish", "--context", "sea", "--id", str(poison),
            "--reason", "payload corrected by hand (ticket 42)", "--actor", "alice",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        await eventually(lambda: _pending_is(sea_conn, 0), timeout=20, what="aggregate drained")
    assert await _assert_stream_is_published_rows_in_order(nc, sea_conn) == 8
    audit = await outbox_set_aside.actions(sea_conn, poison)
    assert [(a["action"], a["actor"]) for a in audit] == [
        ("set_aside", "outbox-publisher"),
        ("republish", "alice"),
    ]
    assert audit[1]["reason"] == "payload corrected by hand (ticket 42)"
    assert '"was": "PAYLOAD_INVALID"' in audit[1]["details"]


async def _set_aside_count(conn: asyncpg.Connection, count: int) -> bool:
    found = await conn.fetchval("SELECT count(*) FROM outbox_events WHERE set_aside_at IS NOT NULL")
    return int(found) == count


async def test_the_publishers_own_login_can_set_rows_aside(
    env: Env, sea_conn: asyncpg.Connection
) -> None:
    """The outbox-publisher login (shared/access/db_roles.py) writes the set-aside columns and
    appends to the audit, which it cannot erase."""
    event_id = await _insert_raw(sea_conn, "x", '{"n": 1}')
    dsn = env.role_dsn(Identity("outbox-publisher", "sea"), env.topology.contexts["sea"].database)
    pub = await asyncpg.connect(dsn)
    try:
        async with pub.transaction():
            [row] = (await outbox.claim(pub, 10)).rows
            failure = outbox.Failure("too big", set_aside=outbox.MESSAGE_TOO_LARGE)
            assert await outbox.mark_failed(pub, {row.seq: failure}, max_attempts=5) == {
                row.seq: "MESSAGE_TOO_LARGE"
            }
        with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError):  # audit: append only
            await pub.execute("DELETE FROM outbox_actions")
    finally:
        await pub.close()
    [audit] = await outbox_set_aside.actions(sea_conn, event_id)
    assert (audit["action"], audit["reason"]) == ("set_aside", "MESSAGE_TOO_LARGE")


async def test_an_error_quoting_odd_text_is_still_recorded(
    env: Env, sea_conn: asyncpg.Connection
) -> None:
    """An error message with a NUL or a lone surrogate (text PostgreSQL cannot store) is
    recorded escaped, instead of failing the batch's statement again and again."""
    await _insert_raw(sea_conn, "x", '{"n": 1}')
    async with sea_conn.transaction():
        [row] = (await outbox.claim(sea_conn, 10)).rows
        odd = outbox.Failure("ValueError: bad \x00 and \ud800 here")
        await outbox.mark_failed(sea_conn, {row.seq: odd}, max_attempts=5)
    stored = await sea_conn.fetchval("SELECT publish_error FROM outbox_events")
    assert stored == "ValueError: bad \\x00 and \\ud800 here"


class RefusingJetStream:
    """The real JetStream context, except that publishes of ``refused`` ids raise — an
    error type the publisher has never seen, as a future client version might raise."""

    def __init__(self, js: JetStreamContext, refused: set[str]) -> None:
        self.js, self.refused = js, refused

    async def publish_async(self, subject: str, payload: bytes, **kw: Any) -> Any:
        if kw["headers"]["Nats-Msg-Id"] in self.refused:
            raise LookupError("refused by the test")
        return await self.js.publish_async(subject, payload, **kw)


async def test_a_refused_row_is_set_aside_after_the_configured_attempts(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    refused = await _insert_raw(sea_conn, "r", '{"n": 1}')
    others = await insert_events(sea_conn, 50, aggregates=5)
    js = RefusingJetStream(nc.jetstream(), {str(refused)})
    async with Publisher(env, js, max_publish_attempts=3) as publisher:  # type: ignore[arg-type]
        await eventually(lambda: _set_aside_count(sea_conn, 1), timeout=20, what="set aside")
        assert all(not task.done() for task in publisher_tasks(publisher))
    row = await sea_conn.fetchrow(
        "SELECT publish_attempts, publish_error, set_aside_reason FROM outbox_events WHERE id = $1",
        refused,
    )
    assert row is not None
    assert dict(row) == {
        "publish_attempts": 3,
        "publish_error": "LookupError: refused by the test",
        "set_aside_reason": "PUBLISH_REFUSED",
    }
    assert await _published_ids(sea_conn) == set(others)


def publisher_tasks(publisher: OutboxPublisher) -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if "run_worker" in repr(t.get_coro())]


async def test_an_outage_never_sets_a_row_aside(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    """With no stream to answer, rows fail attempt after attempt — far past the cap — and
    are published, in order, once the stream exists: an outage is not the row's fault."""
    ids = await insert_events(sea_conn, 6, aggregates=2)
    async with Publisher(env, nc.jetstream(), max_publish_attempts=2):
        await eventually(lambda: _head_attempts_over(sea_conn, 4), timeout=30, what="attempts")
        assert await _set_aside_count(sea_conn, 0)
        await provision(nc.jetstream(), env.topology, caps=CAPS)
        await eventually(lambda: _pending_is(sea_conn, 0), timeout=30, what="published")
    assert await _assert_stream_is_published_rows_in_order(nc, sea_conn) == len(ids)


async def _head_attempts_over(conn: asyncpg.Connection, count: int) -> bool:
    return bool(await conn.fetchval("SELECT min(publish_attempts) > $1 FROM outbox_events "
                                    "WHERE publish_attempts > 0", count))  # fmt: skip


# ------------------------------------------------------------------- wire sizes


async def test_sizes_are_the_utf8_bytes_that_go_out(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    """Against a 64 KiB stream limit: 20,000 Cyrillic letters (40 KB as UTF-8, 120 KB as
    ASCII escapes) are published whole; 40,000 (80 KB) are set aside as too large, the
    error giving the bytes; a payload over the server's max_payload (1 MiB) likewise."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    fits = await _insert_raw(sea_conn, "a", '{"name": "%s"}' % ("я" * 20_000))
    over = await _insert_raw(sea_conn, "b", '{"name": "%s"}' % ("я" * 40_000))
    async with Publisher(env, nc.jetstream(), max_message_bytes=64 * 1024):
        await eventually(lambda: _pending_is(sea_conn, 1), timeout=20, what="one published")
    huge = await _insert_raw(sea_conn, "c", '{"name": "%s"}' % ("x" * 1_100_000))
    async with Publisher(env, nc.jetstream()):  # no limit of its own: the server's
        await eventually(lambda: _set_aside_count(sea_conn, 2), timeout=20, what="set aside")
    [msg] = await stream_messages(nc.jetstream(), STREAM)
    assert msg.msg_id == str(fits) and msg.body["payload"]["name"] == "я" * 20_000
    rows = {
        r["id"]: r
        for r in await sea_conn.fetch(
            "SELECT id, set_aside_reason, publish_error, publish_attempts FROM outbox_events "
            "WHERE set_aside_at IS NOT NULL"
        )
    }
    assert rows.keys() == {over, huge}
    assert {r["set_aside_reason"] for r in rows.values()} == {"MESSAGE_TOO_LARGE"}
    assert {r["publish_attempts"] for r in rows.values()} == {1}
    assert "over the stream's max_msg_size of 65536 bytes" in rows[over]["publish_error"]
    size = int(rows[over]["publish_error"].split()[2])
    assert 80_000 < size < 81_000, "measured in UTF-8 bytes, not characters or escapes"
    assert "MaxPayloadError" in rows[huge]["publish_error"]


# ------------------------------------------------------------- nothing ends a worker


async def test_a_batch_raising_the_unexpected_does_not_end_the_worker(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    """An exception no one planned for (not a database error) out of a batch is logged,
    counted and retried; the worker goes on and publishes everything."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    ids = await insert_events(sea_conn, 40, aggregates=4)
    async with Publisher(env, nc.jetstream(), concurrency=1) as publisher:
        real = publisher.publish_batch
        failures = iter(range(3))

        async def flaky() -> Any:
            if next(failures, None) is not None:
                raise KeyError("a bug")
            return await real()

        publisher.publish_batch = flaky  # type: ignore[method-assign]
        await eventually(lambda: _pending_is(sea_conn, 0), timeout=20, what="published")
    assert publisher.stats.batch_errors == 3
    assert publisher.stats.errors_by_kind["KeyError"] == 3
    assert await _assert_stream_is_published_rows_in_order(nc, sea_conn) == len(ids)


async def test_where_shows_a_set_aside_row_and_what_waits_behind_it(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    """``ferry where`` names the set-aside state of the row, and for a later row of its
    aggregate, the row it waits behind."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    poison = await _insert_raw(sea_conn, "poison", f'{{"n": {HUGE_NUMBER}}}')
    [behind] = await _insert_behind(sea_conn, "poison", 1)
    async with Publisher(env, nc.jetstream()):
        await eventually(lambda: _set_aside_count(sea_conn, 1), timeout=20, what="set aside")
    seq = await sea_conn.fetchval("SELECT seq FROM outbox_events WHERE id = $1", poison)
    shown = ferry(env, "where", str(poison))
    assert shown.returncode == 0, shown.stderr
    assert "SET ASIDE" in shown.stdout and "(PAYLOAD_INVALID)" in shown.stdout
    assert "ferry outbox republish --context sea" in shown.stdout
    waiting = ferry(env, "where", behind)
    assert waiting.returncode == 0, waiting.stderr
    assert f"waits behind outbox row #{seq} of its aggregate" in waiting.stdout
