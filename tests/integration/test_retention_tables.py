"""``ferry purge`` beyond the outbox and inbox (issue 48): every audit table, the handler
SDK's claims and calls, lease rows of dropped partitions.

The mediation topology (ordered durables, a replay lane) on fresh databases; rows are
back-dated in SQL around the shipped defaults (audit rows 400 days, claims 35 days).
Every row carries a label; what must go and what must stay is written down before the
purge (the independent record) and compared label by label after it, as the topology's
own retention login runs ``ferry purge``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import yaml

from devstack.ports import free_port
from devstack.postgres import PostgresServer
from shared.access.identities import Identity
from shared.adapters.postgres import migrate_database
from shared.contracts.replay_jobs import replay_lane
from shared.ops.retention_tables import POLICIES
from shared.sdk.store import BOOKKEEPING_DDL, install
from tests.conftest import ROOT, Env

pytestmark = pytest.mark.integration

PURGER = "retention-mediation"
OLD_AUDIT, YOUNG_AUDIT = 401, 399  # days; audit_retention defaults to 400 days
OLD_CLAIM, YOUNG_CLAIM = 36, 34  # days; claims_retention defaults to 35 days
FOREIGN = "cg_not_ours"  # a durable of another topology in the same database


@pytest.fixture
async def world(tmp_path: Path, pg_server: PostgresServer) -> Env:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies/mediation.yaml").read_text())
    prefix = "r" + uuid.uuid4().hex[:10]
    for ctx in doc["contexts"].values():
        ctx["database"] = f"{prefix}_{ctx['database']}"
    env = Env(tmp_path, pg_server, "", doc)
    for database in env.topology.databases():
        await asyncio.wait_for(migrate_database(pg_server.dsn(database)), timeout=60)
    await asyncio.wait_for(env.grant_roles(), timeout=60)
    return env


async def ferry(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "shared.cli", *args],
        cwd=ROOT, env=env.settings_env(role=PURGER), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


class Ledger:
    """What the test expects: label → 'gone' or 'kept', per table."""

    def __init__(self) -> None:
        self.expect: dict[str, dict[str, str]] = {}

    def note(self, table: str, label: str, fate: str) -> str:
        self.expect.setdefault(table, {})[label] = fate
        return label


async def labels(conn: asyncpg.Connection, table: str, column: str) -> set[str]:
    return {r[0] for r in await conn.fetch(f"SELECT {column} FROM {table}")}


def db(env: Env, context: str) -> str:
    return env.topology.contexts[context].database


@pytest.fixture
async def admin(world: Env) -> AsyncIterator[dict[str, asyncpg.Connection]]:
    conns = {d: await asyncpg.connect(world.pg.dsn(d)) for d in world.topology.databases()}
    try:
        yield conns
    finally:
        for conn in conns.values():
            await conn.close()


async def _dead_letter(conn: asyncpg.Connection, durable: str, status: str) -> uuid.UUID:
    message_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO dead_letters (durable, message_id, stream, original_subject, reason_code,"
        " record, dlq_subject, source, status) VALUES ($1, $2, 'S', 'x.y.v1', 'handler',"
        " '{}', 'mediation.dead_letter', 'consumer', $3)",
        durable, message_id, status,
    )  # fmt: skip
    return message_id


async def seed_audit(env: Env, admin: dict[str, asyncpg.Connection], ledger: Ledger) -> None:
    """Rows of every audit table, each labelled in ``reason`` (or ``actor``)."""
    # outbox_actions, in a publishing context's database.
    conn = admin[db(env, "module_e")]
    for label, published, days, fate in [
        ("oa-published-old", True, OLD_AUDIT, "gone"),
        ("oa-unpublished-old", False, OLD_AUDIT, "kept"),  # its event still waits
        ("oa-published-young", True, YOUNG_AUDIT, "kept"),
        ("oa-vanished-old", None, OLD_AUDIT, "gone"),  # its event was purged long ago
    ]:
        event_id = uuid.uuid4()
        if published is not None:
            await conn.execute(
                "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type,"
                " payload, occurred_at, published_at) VALUES ($1, 'a', 'a1', 'e', '{}',"
                " now(), CASE WHEN $2 THEN now() END)",
                event_id, published,
            )  # fmt: skip
        await conn.execute(
            "INSERT INTO outbox_actions (event_id, seq, action, actor, reason, at)"
            " VALUES ($1, 1, 'set_aside', 'publisher', $2, now() - $3 * interval '1 day')",
            event_id, ledger.note("outbox_actions", label, fate), days,
        )  # fmt: skip

    # dead_letter_actions and dead_letter_edits: kept while their dead letter is open.
    conn = admin[db(env, "module_f")]
    for label, status, days, durable, fate in [
        ("dl-open-old", "dead", OLD_AUDIT, "cg_f_ingest", "kept"),
        ("dl-held-old", "held", OLD_AUDIT, "cg_f_ingest", "kept"),
        ("dl-replayed-old", "replayed", OLD_AUDIT, "cg_f_ingest", "gone"),
        ("dl-discarded-old", "discarded", OLD_AUDIT, "cg_f_ingest", "gone"),
        ("dl-none-old", None, OLD_AUDIT, "cg_f_ingest", "gone"),
        ("dl-replayed-young", "replayed", YOUNG_AUDIT, "cg_f_ingest", "kept"),
        ("dl-foreign-old", "replayed", OLD_AUDIT, FOREIGN, "kept"),  # not this topology's
    ]:
        message_id = uuid.uuid4() if status is None else await _dead_letter(conn, durable, status)
        await conn.execute(
            "INSERT INTO dead_letter_actions (durable, message_id, action, actor, reason, at)"
            " VALUES ($1, $2, 'replay', 'op', $3, now() - $4 * interval '1 day')",
            durable, message_id, ledger.note("dead_letter_actions", label, fate), days,
        )  # fmt: skip
        await conn.execute(
            "INSERT INTO dead_letter_edits (durable, message_id, replay_attempt,"
            " original_payload, edited_payload, changed, actor, reason, at)"
            " VALUES ($1, $2, 1, '{}', '{}', '{}', 'op', $3, now() - $4 * interval '1 day')",
            durable, message_id, ledger.note("dead_letter_edits", label, fate), days,
        )  # fmt: skip

    # throttle_actions and pause_actions: the durable's latest row (who set the throttle
    # or the pause in force) stays, however old.
    for i, days in enumerate((OLD_AUDIT + 2, OLD_AUDIT + 1, OLD_AUDIT)):
        fate = "kept" if i == 2 else "gone"
        await conn.execute(
            "INSERT INTO throttle_actions (durable, action, rate, actor, reason, at)"
            " VALUES ('cg_f_ingest', 'set', 5, 'op', $1, now() - $2 * interval '1 day')",
            ledger.note("throttle_actions", f"th-{i}", fate), days,
        )  # fmt: skip
        await conn.execute(
            "INSERT INTO pause_actions (durable, action, until, actor, reason, at)"
            " VALUES ('cg_f_ingest', 'pause', now() + interval '1 day', 'op', $1,"
            " now() - $2 * interval '1 day')",
            ledger.note("pause_actions", f"pa-{i}", fate), days,
        )  # fmt: skip

    # durable_rewinds: a running rewind stays, whatever its age.
    for label, outcome, days, fate in [
        ("rw-done-old", "done", OLD_AUDIT, "gone"),
        ("rw-failed-old", "failed", OLD_AUDIT, "gone"),
        ("rw-running-old", "running", OLD_AUDIT, "kept"),
        ("rw-done-young", "done", YOUNG_AUDIT, "kept"),
    ]:
        await conn.execute(
            "INSERT INTO durable_rewinds (id, durable, stream, since, dry_run, actor, reason,"
            " started_at, outcome) VALUES ($1, 'cg_f_ingest', 'S', now(), false, 'op', $2,"
            " now() - $3 * interval '1 day', $4)",
            uuid.uuid4(), ledger.note("durable_rewinds", label, fate), days, outcome,
        )  # fmt: skip

    # parked_actions (an ordered durable's): kept while its key is still parked.
    conn = admin[db(env, "module_g")]
    await conn.execute(
        "INSERT INTO parked_messages (durable, ordering_key, stream_seq, message_id,"
        " delivered_seq, subject, data) VALUES ('cg_g_archive', 'still-parked', 1, $1, 1,"
        " 'x', '\\x00')",
        uuid.uuid4(),
    )  # fmt: skip
    for label, key, days, fate in [
        ("pa-parked-old", "still-parked", OLD_AUDIT, "kept"),
        ("pa-done-old", "moved-on", OLD_AUDIT, "gone"),
        ("pa-done-young", "moved-on", YOUNG_AUDIT, "kept"),
    ]:
        await conn.execute(
            "INSERT INTO parked_actions (durable, ordering_key, message_id, action, actor,"
            " reason, at) VALUES ('cg_g_archive', $1, $2, 'discard', 'op', $3,"
            " now() - $4 * interval '1 day')",
            key, uuid.uuid4(), ledger.note("parked_actions", label, fate), days,
        )  # fmt: skip

    # partition_leases: cg_g_archive's stream has 4 partitions (0..3).
    for label, partition, expires, released, fate in [
        ("0", 0, "now() - interval '30 days'", True, "kept"),  # a partition it still has
        ("5", 5, "now() - interval '2 days'", False, "gone"),  # dropped, expired
        ("6", 6, "now() + interval '1 hour'", False, "kept"),  # dropped, still held
        ("7", 7, "now() - interval '3 days'", True, "gone"),  # dropped, released
        ("8", 8, "now() - interval '1 hour'", True, "kept"),  # dropped, within the grace
    ]:
        await conn.execute(
            "INSERT INTO partition_leases (durable, partition, owner, expires_at, released)"
            f" VALUES ('cg_g_archive', $1, $2, {expires}, $3)",
            partition, ledger.note("partition_leases", label, fate), released,
        )  # fmt: skip

    # replay_jobs, in the replay lane's database: queued and running jobs stay.
    lane = replay_lane(env.topology)
    assert lane is not None
    conn = admin[lane.database]
    for label, state, days, fate in [
        ("rj-done-old", "done", OLD_AUDIT, "gone"),
        ("rj-failed-old", "failed", OLD_AUDIT, "gone"),
        ("rj-queued-old", "queued", OLD_AUDIT, "kept"),
        ("rj-running-old", "running", OLD_AUDIT, "kept"),
        ("rj-done-young", "done", YOUNG_AUDIT, "kept"),
    ]:
        await conn.execute(
            "INSERT INTO replay_jobs (id, idempotency_key, request, request_hash, entries,"
            " actor, reason, state, total, created_at) VALUES ($1, $2, '{}', 'h', '[]', 'op',"
            " $3, $4, 0, now() - $5 * interval '1 day')",
            uuid.uuid4(), label, ledger.note("replay_jobs", label, fate), state, days,
        )  # fmt: skip


async def seed_dead_letters(env: Env, admin: dict[str, asyncpg.Connection], ledger: Ledger) -> None:
    """dead_letters (after seed_audit's, which were settled or not just now: they stay)."""
    conn = admin[db(env, "module_f")]
    # dead_letters: a settled one (replayed or discarded) goes after audit_retention, and
    # its inbox row with it if the consumer left it 'failed'; an open one stays. The dead
    # letters of seed_audit were settled (or not) just now: they stay.
    for i, row in enumerate(await conn.fetch("SELECT message_id FROM dead_letters")):
        await conn.execute(
            "UPDATE dead_letters SET last_error = $2 WHERE message_id = $1",
            row["message_id"], ledger.note("dead_letters", f"dl-now-{i}", "kept"),
        )  # fmt: skip
    for label, status, days, durable, fate in [
        ("dlr-replayed-old", "replayed", OLD_AUDIT, "cg_f_ingest", "gone"),
        ("dlr-discarded-old", "discarded", OLD_AUDIT, "cg_f_ingest", "gone"),
        ("dlr-discarded-young", "discarded", YOUNG_AUDIT, "cg_f_ingest", "kept"),
        ("dlr-dead-old", "dead", OLD_AUDIT, "cg_f_ingest", "kept"),
        ("dlr-held-old", "held", OLD_AUDIT, "cg_f_ingest", "kept"),
        ("dlr-foreign-old", "discarded", OLD_AUDIT, FOREIGN, "kept"),  # not ours
    ]:
        message_id = await _dead_letter(conn, durable, status)
        await conn.execute(
            "UPDATE dead_letters SET last_error = $2, updated_at = now() - $3 * interval '1 day'"
            " WHERE message_id = $1",
            message_id, ledger.note("dead_letters", label, fate), days,
        )  # fmt: skip
        # Its inbox row: 'processed' once replayed (the inbox's own policy keeps it, young),
        # else 'failed'; the label in last_error, its fate noted apart.
        inbox_status = "processed" if status == "replayed" else "failed"
        await conn.execute(
            "INSERT INTO inbox_messages (message_id, durable, subject, status, last_error,"
            " processed_at) VALUES ($1, $2, 'x.y.v1', $3, $4,"
            " CASE WHEN $3 = 'processed' THEN now() END)",
            message_id, durable, inbox_status, label,
        )  # fmt: skip
        INBOX_FATES[label] = "gone" if (fate, inbox_status) == ("gone", "failed") else "kept"


async def seed_claims(env: Env, admin: dict[str, asyncpg.Connection], ledger: Ledger) -> None:
    """module_f's handler tables, granted to the retention login by the SDK's install (as
    a handler service's ``purge_login`` asks); module_h's created but not granted;
    module_g has none."""
    purger = Identity("retention", "mediation").pg_role
    conn = admin[db(env, "module_f")]
    await install(conn, (), ledger=True, purge_login=purger)
    for label, days, fate in [("c-old", OLD_CLAIM, "gone"), ("c-young", YOUNG_CLAIM, "kept")]:
        for i in range(3):
            await conn.execute(
                "INSERT INTO handler_applied (message_id, handler, applied_at)"
                " VALUES ($1, $2, now() - $3 * interval '1 day')",
                uuid.uuid4(), ledger.note("handler_applied", f"{label}-{i}", fate), days,
            )  # fmt: skip
            await conn.execute(
                "INSERT INTO handler_calls (message_id, handler, attempt, status, called_at)"
                " VALUES ($1, $2, 1, 200, now() - $3 * interval '1 day')",
                uuid.uuid4(), ledger.note("handler_calls", f"{label}-{i}", fate), days,
            )  # fmt: skip
    conn = admin[db(env, "module_h")]
    for statement in BOOKKEEPING_DDL:
        await conn.execute(statement)
    await conn.execute(
        "INSERT INTO handler_applied (message_id, handler, applied_at)"
        " VALUES ($1, 'h', now() - interval '900 days')",
        uuid.uuid4(),
    )  # fmt: skip


async def seed_kpi(env: Env, admin: dict[str, asyncpg.Connection], ledger: Ledger) -> None:
    """The KPI job's results in its database (module_e's, the default): the topology's old
    windows and reasons go, young ones stay, another topology's stay; of its runs, old
    ones go but the latest of each window length stays."""
    conn = admin[db(env, "module_e")]
    for label, topology, days, fate in [
        ("kw-old", "mediation", OLD_AUDIT, "gone"),
        ("kw-young", "mediation", YOUNG_AUDIT, "kept"),
        ("kw-foreign-old", "not-ours", OLD_AUDIT, "kept"),
    ]:
        at = f"now() - {days} * interval '1 day'"
        await conn.execute(
            "INSERT INTO kpi_windows (topology, window_seconds, window_start, window_end,"
            " context, durable, subject, produced, published, received, processed,"
            " dead_lettered, handler_409, duplicate_deliveries, retries, attempts,"
            f" lost_candidates) VALUES ($1, 3600, {at}, {at} + interval '1 hour', 'module_e',"
            " 'cg_f_ingest', $2, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0)",
            topology, ledger.note("kpi_windows", label, fate),
        )  # fmt: skip
        await conn.execute(
            "INSERT INTO kpi_reasons (topology, window_seconds, window_start, context, durable,"
            f" subject, kind, reason_code, count) VALUES ($1, 3600, {at}, 'module_e',"
            " 'cg_f_ingest', '*', 'retry', $2, 1)",
            topology, ledger.note("kpi_reasons", label, fate),
        )  # fmt: skip
    for label, window, days, fate in [
        ("kr-old", 3600, OLD_AUDIT + 1, "gone"),
        ("kr-latest-old", 3600, OLD_AUDIT, "kept"),  # the latest hourly run, however old
        ("kr-daily-old", 86400, OLD_AUDIT + 1, "gone"),
        ("kr-daily-young", 86400, YOUNG_AUDIT, "kept"),
    ]:
        at = f"now() - {days} * interval '1 day'"
        await conn.execute(
            "INSERT INTO kpi_runs (run_id, topology, window_seconds, range_start, range_end,"
            " as_of, incremental, windows, events, verdict, exit_code, report_dir, started_at)"
            f" VALUES ($1, 'mediation', $2, {at}, {at}, {at}, true, 1, 1, 'met', 0, $3, {at})",
            uuid.uuid4(), window, ledger.note("kpi_runs", label, fate),
        )  # fmt: skip


#: The inbox rows of the dead letters above (label → fate): a cascade, not a policy.
INBOX_FATES: dict[str, str] = {}

LABEL_COLUMN = {
    "dead_letters": "last_error",
    "outbox_actions": "reason",
    "dead_letter_actions": "reason",
    "dead_letter_edits": "reason",
    "throttle_actions": "reason",
    "pause_actions": "reason",
    "durable_rewinds": "reason",
    "parked_actions": "reason",
    "partition_leases": "owner",
    "replay_jobs": "reason",
    "handler_applied": "handler",
    "handler_calls": "handler",
    "kpi_windows": "subject",
    "kpi_reasons": "reason_code",
    "kpi_runs": "report_dir",
}
WHERE = {
    "dead_letters": "module_f",
    "outbox_actions": "module_e",
    "dead_letter_actions": "module_f",
    "dead_letter_edits": "module_f",
    "throttle_actions": "module_f",
    "pause_actions": "module_f",
    "durable_rewinds": "module_f",
    "parked_actions": "module_g",
    "partition_leases": "module_g",
    "handler_applied": "module_f",
    "handler_calls": "module_f",
    "kpi_windows": "module_e",
    "kpi_reasons": "module_e",
    "kpi_runs": "module_e",
}


def _db_of(env: Env, table: str) -> str:
    if table == "replay_jobs":
        lane = replay_lane(env.topology)
        assert lane is not None
        return lane.database
    return db(env, WHERE[table])


async def test_purge_keeps_every_table_to_its_policy(
    world: Env, admin: dict[str, asyncpg.Connection]
) -> None:
    ledger = Ledger()
    await seed_audit(world, admin, ledger)
    await seed_dead_letters(world, admin, ledger)
    await seed_claims(world, admin, ledger)
    await seed_kpi(world, admin, ledger)
    assert set(ledger.expect) == {p.table for p in POLICIES} | {"partition_leases"}
    before = {t: await labels(admin[_db_of(world, t)], t, LABEL_COLUMN[t]) for t in ledger.expect}
    for table, fates in ledger.expect.items():
        assert set(fates) <= before[table], table

    dry = await ferry(world, "purge", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    would: dict[str, int] = {}
    for t in json.loads(dry.stdout)["tables"]:
        would[t["table"]] = would.get(t["table"], 0) + t["purged"]
    for table, fates in ledger.expect.items():
        assert would[table] == sum(f == "gone" for f in fates.values()), table
    for table in ledger.expect:  # the dry run deleted nothing
        assert (
            await labels(admin[_db_of(world, table)], table, LABEL_COLUMN[table]) == (before[table])
        )

    done = await ferry(world, "purge", "--batch", "2", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["tables"]
    for table, fates in ledger.expect.items():
        after = await labels(admin[_db_of(world, table)], table, LABEL_COLUMN[table])
        gone = {label for label, fate in fates.items() if fate == "gone"}
        kept = {label for label, fate in fates.items() if fate == "kept"}
        assert after == before[table] - gone, table
        assert kept <= after, table
    # A discarded dead letter's 'failed' inbox row went with it; every other stayed.
    inbox_after = await labels(admin[db(world, "module_f")], "inbox_messages", "last_error")
    assert inbox_after == {label for label, fate in INBOX_FATES.items() if fate == "kept"}
    assert INBOX_FATES["dlr-discarded-old"] == "gone"
    # The other durable's row (not this topology's) is untouched.
    foreign = await admin[db(world, "module_f")].fetchval(
        "SELECT count(*) FROM dead_letter_actions WHERE durable = $1", FOREIGN
    )
    assert foreign == 1
    # module_h's handler tables exist but were not granted; module_g has none.
    skipped = {(t["table"], t["database"]): t["skipped"] for t in report if t["skipped"]}
    assert set(skipped) == {
        ("handler_applied", db(world, "module_h")),
        ("handler_calls", db(world, "module_h")),
        ("handler_applied", db(world, "module_g")),
        ("handler_calls", db(world, "module_g")),
    }
    assert "not granted" in skipped[("handler_applied", db(world, "module_h"))]
    assert "no such table" in skipped[("handler_applied", db(world, "module_g"))]
    # Each measured table reports its size and its oldest row's age after the purge.
    (rewinds,) = [
        t for t in report if t["table"] == "durable_rewinds" and t["scope"] == "cg_f_ingest"
    ]
    assert rewinds["rows_estimate"] is not None and rewinds["bytes"] > 0
    assert rewinds["oldest_age_seconds"] == pytest.approx(OLD_AUDIT * 86400, abs=600)

    again = await ferry(world, "purge", "--json")
    assert {t["purged"] for t in json.loads(again.stdout)["tables"]} == {0}


async def test_one_statement_deletes_at_most_a_batch(
    world: Env, admin: dict[str, asyncpg.Connection]
) -> None:
    """Each policy's DELETE, as the retention login, takes at most ``limit`` rows."""
    conn = admin[db(world, "module_f")]
    for _ in range(7):
        await conn.execute(
            "INSERT INTO dead_letter_actions (durable, message_id, action, actor, reason, at)"
            " VALUES ('cg_f_ingest', $1, 'replay', 'op', 'r', now() - interval '500 days')",
            uuid.uuid4(),
        )  # fmt: skip
    policy = next(p for p in POLICIES if p.table == "dead_letter_actions")
    purger = Identity("retention", "mediation")
    login = await asyncpg.connect(world.role_dsn(purger, db(world, "module_f")))
    try:
        cutoff = await login.fetchval("SELECT now() - interval '400 days'")
        counts = []
        while True:
            status = await login.execute(policy.delete_sql(), "cg_f_ingest", cutoff, 3)
            counts.append(int(status.split()[-1]))
            if counts[-1] == 0:
                break
    finally:
        await login.close()
    assert counts == [3, 3, 1, 0]


async def test_a_batch_reads_a_few_pages_not_the_table(
    world: Env, admin: dict[str, asyncpg.Connection]
) -> None:
    """On a table of some size of which the purge has kept up (1 % of the rows past the
    cut-off, as between two hourly runs), a batch finds its rows reading a few pages, not
    the table (the BRIN index of migration 0019, summarized by VACUUM as autovacuum does)."""
    conn = admin[db(world, "module_f")]
    await conn.execute(
        "INSERT INTO dead_letter_actions (durable, message_id, action, actor, reason, at)"
        " SELECT 'cg_f_ingest', gen_random_uuid(), 'replay', 'op', 'r',"
        " now() - (50000 - g) * interval '1 minute' FROM generate_series(1, 50000) g"
    )
    await conn.execute("VACUUM ANALYZE dead_letter_actions")
    pages = await conn.fetchval(
        "SELECT relpages FROM pg_class WHERE oid = 'dead_letter_actions'::regclass"
    )
    policy = next(p for p in POLICIES if p.table == "dead_letter_actions")
    cutoff = await conn.fetchval("SELECT now() - interval '49500 minutes'")
    doc = await conn.fetchval(
        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {policy.delete_sql()}", "cg_f_ingest", cutoff, 50
    )
    plan = json.loads(doc)[0]["Plan"]
    (search,) = [p for p in plan["Plans"] if p.get("Parent Relationship") == "InitPlan"]
    touched = search["Shared Hit Blocks"] + search["Shared Read Blocks"]
    assert search["Actual Rows"] == 50
    assert touched < pages / 20, (touched, pages, json.dumps(search, indent=1))
    assert await conn.fetchval("SELECT count(*) FROM dead_letter_actions") == 50000 - 50


async def test_the_retention_login_deletes_audit_rows_and_nothing_more(
    world: Env, admin: dict[str, asyncpg.Connection]
) -> None:
    """DELETE on exactly the tables it purges (its durables' rows), SELECT on what decides
    a row's fate; no INSERT, no UPDATE, no other durable's row."""
    conn = admin[db(world, "module_f")]
    for durable in ("cg_f_ingest", FOREIGN):
        await conn.execute(
            "INSERT INTO throttle_actions (durable, action, rate, actor, reason)"
            " VALUES ($1, 'set', 5, 'op', 'r')",
            durable,
        )
    await _dead_letter(conn, "cg_f_ingest", "dead")
    denied = (asyncpg.InsufficientPrivilegeError,)
    login = await asyncpg.connect(
        world.role_dsn(Identity("retention", "mediation"), db(world, "module_f"))
    )
    try:
        assert await login.fetchval("SELECT count(*) FROM dead_letters") == 1
        assert await login.execute("DELETE FROM throttle_actions") == "DELETE 1"  # ours only
        for statement in (
            "UPDATE dead_letters SET status = 'discarded'",
            "UPDATE dead_letter_actions SET reason = 'x'",
            "INSERT INTO pause_actions (durable, action, actor, reason)"
            " VALUES ('cg_f_ingest', 'resume', 'x', 'x')",
            "DELETE FROM throttle_overrides",
            "DELETE FROM kpi_watermarks",  # the KPI job's state, not a result
        ):
            with pytest.raises(denied):
                await login.execute(statement)
    finally:
        await login.close()
    assert await conn.fetchval("SELECT count(*) FROM throttle_actions") == 1  # the foreign one


async def test_purge_every_serves_each_tables_figures(
    world: Env, admin: dict[str, asyncpg.Connection]
) -> None:
    """``ferry purge --every`` with FERRY_HEALTH_PORT: /metrics gives, per table and
    database, rows purged, size, oldest row's age and the policy it is held to."""
    conn = admin[db(world, "module_f")]
    for days in (OLD_AUDIT, OLD_AUDIT, 10):
        await conn.execute(
            "INSERT INTO durable_rewinds (id, durable, stream, since, dry_run, actor, reason,"
            " started_at, outcome) VALUES ($1, 'cg_f_ingest', 'S', now(), false, 'op', 'r',"
            " now() - $2 * interval '1 day', 'done')",
            uuid.uuid4(), days,
        )  # fmt: skip
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "shared.cli", "purge", "--every", "1h",
        cwd=ROOT, env=world.settings_env(role=PURGER, FERRY_HEALTH_PORT=str(port)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    found: dict[str, float] = {}
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                        text = await response.text()
                except aiohttp.ClientError:
                    text = ""
                if "ferry_retention_purged_rows_total{" in text:  # a run is done
                    break
                await asyncio.sleep(0.1)
        for line in text.splitlines():
            if line.startswith("ferry_retention_") and db(world, "module_f") in line:
                name, value = line.rsplit(" ", 1)
                found[name] = float(value)
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, out.decode()
    labels_ = f'{{database="{db(world, "module_f")}",table="durable_rewinds"}}'
    assert found[f"ferry_retention_purged_rows_total{labels_}"] == 2
    assert found[f"ferry_retention_seconds{labels_}"] == 400 * 86400
    assert found[f"ferry_retention_table_bytes{labels_}"] > 0
    assert found[f"ferry_retention_oldest_row_age_seconds{labels_}"] == pytest.approx(
        10 * 86400, abs=600
    )
    inbox = f'{{database="{db(world, "module_f")}",table="inbox_messages"}}'
    assert found[f"ferry_retention_seconds{inbox}"] == 35 * 86400


async def test_an_install_for_a_missing_retention_login_warns_and_installs(
    world: Env, admin: dict[str, asyncpg.Connection], caplog: pytest.LogCaptureFixture
) -> None:
    """A deployment without the retention role: the claim table is installed all the
    same (its transaction is not spoiled), and the log says the claims are not purged."""
    conn = admin[db(world, "module_g")]
    await install(conn, (), ledger=True, purge_login="ferry_retention_nobody")
    assert await conn.fetchval("SELECT to_regclass('handler_applied') IS NOT NULL")
    assert "no login ferry_retention_nobody" in caplog.text
