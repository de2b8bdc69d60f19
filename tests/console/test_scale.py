"""The overview with many rows present: its counts, and the plans its queries use.

Nothing here is timed against a bound (the times are printed; ``python -m bench
--sections volume`` judges them against the same pages on empty tables). By default a
modest volume (10,000 dead letters, 100,000 inbox rows: seconds to insert);
``FERRY_CONSOLE_SCALE=full`` inserts what the issue asks for — 100,000 dead letters and
1,000,000 inbox rows — with ``generate_series`` (one statement each), then renders the
overview through the console process (its own login, the real HTTP path) and prints the
times. Run by hand::

    FERRY_CONSOLE_SCALE=full .venv/bin/pytest -p no:cacheprovider -s tests/console/test_scale.py
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from nats.aio.client import Client as NATS

from devstack.ports import free_port
from services.console.auth import hash_password
from shared.access.streams import provision
from tests.conftest import CAPS, Env

from .conftest import PASSWORDS, _start, _stop, wait_ready

pytestmark = pytest.mark.integration
FULL = os.environ.get("FERRY_CONSOLE_SCALE") == "full"
DEAD, INBOX = (100_000, 1_000_000) if FULL else (10_000, 100_000)

_INBOX = """
INSERT INTO inbox_messages (message_id, durable, subject, status, received_at, processed_at,
                            attempts, event_type, event_version)
SELECT gen_random_uuid(), $1, 'vibespro.event.vibe_created.v1',
       CASE WHEN i % 1000 = 0 THEN 'failed' ELSE 'processed' END,
       clock_timestamp() - i * interval '1 second',
       CASE WHEN i % 1000 = 0 THEN NULL ELSE clock_timestamp() - i * interval '1 second' END,
       1, 'vibe_created', 1
FROM generate_series($2::int, 1, -1) AS i
"""

_DEAD = """
INSERT INTO dead_letters (durable, message_id, stream, stream_seq, original_subject,
                          event_type, event_version, reason_code, last_error, attempts,
                          record, dlq_subject, source, status, first_dead_lettered_at,
                          dead_lettered_at)
SELECT $1, gen_random_uuid(), 'VIBESPRO_EVENTS', i, 'vibespro.event.vibe_created.v1',
       'vibe_created', 1,
       (ARRAY['HANDLER_REJECTED', 'MAX_DELIVERIES_EXCEEDED', 'SCHEMA_INVALID'])[1 + i % 3],
       'order ' || i || ' failed: ' || (ARRAY['timeout', 'bad total', 'unknown sku'])[1 + i % 3],
       4, jsonb_build_object('payload', jsonb_build_object('vibe_id', 'v-' || i)),
       'sea.dlq.sea__from_vibespro', 'consumer',
       (ARRAY['held', 'held', 'held', 'parked', 'replayed', 'discarded'])[1 + i % 6],
       clock_timestamp() - i * interval '10 seconds', clock_timestamp() - i * interval '10 seconds'
FROM generate_series(1, $2::int) AS i
"""


async def test_overview_and_failures_count_every_open_dead_letter_among_many_rows(
    env: Env, nc: NATS, tmp_path: Path
) -> None:
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        started = time.perf_counter()
        await conn.execute(_INBOX, "sea__from_vibespro", INBOX)
        await conn.execute(_DEAD, "sea__from_vibespro", DEAD)
        await conn.execute("VACUUM ANALYZE inbox_messages")
        await conn.execute("VACUUM ANALYZE dead_letters")
        inserted = time.perf_counter() - started
        assert await conn.fetchval("SELECT count(*) FROM inbox_messages") == INBOX
        open_rejected = await conn.fetchval(
            "SELECT count(*) FROM dead_letters WHERE reason_code = 'HANDLER_REJECTED' "
            "AND status IN ('dead', 'held', 'replaying', 'parked')"
        )
        plans = await _plans(conn)
    finally:
        await conn.close()
    for name, plan in plans.items():  # the big tables are never read whole
        assert "Seq Scan on inbox_messages" not in plan, (name, plan)

    accounts = tmp_path / "accounts.json"
    accounts.write_text(
        json.dumps({"ops": {"role": "operator", "password": hash_password(PASSWORDS["ops"])}})
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    port = free_port()
    proc = _start(
        env, "console", ["services.console"], logs, role=f"console-{env.topology.name}",
        FERRY_CONSOLE_PORT=str(port), FERRY_CONSOLE_ACCOUNTS_FILE=str(accounts),
        FERRY_CONSOLE_SAMPLE_INTERVAL="3600",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(f"{url}/readyz", proc, "console")
        jar = aiohttp.CookieJar(unsafe=True)  # cookies of 127.0.0.1
        async with aiohttp.ClientSession(cookie_jar=jar) as session:
            async with session.post(
                f"{url}/login", data={"user": "ops", "password": PASSWORDS["ops"], "next": "/"}
            ) as resp:
                assert resp.status == 200
            times, server = [], []
            for _ in range(7):
                started = time.perf_counter()
                async with session.get(f"{url}/") as resp:
                    page = await resp.text()
                    assert resp.status == 200
                    server.append(float(resp.headers["Server-Timing"].split("dur=")[1]) / 1000)
                times.append(time.perf_counter() - started)
            assert f"HANDLER_REJECTED {open_rejected:,}" in page
            started = time.perf_counter()
            async with session.get(f"{url}/failures") as resp:
                assert resp.status == 200
                failures_page = await resp.text()
            failures = time.perf_counter() - started
            # The group of every open HANDLER_REJECTED letter (one error, numbers blanked),
            # counted by the kept counts (migration 0027) after one bulk insert.
            assert f'<td class="n">{open_rejected:,}</td>' in failures_page
    finally:
        await _stop(proc)
    median = statistics.median(times[1:])  # the first pays the pools' warm-up
    print(
        f"\nconsole overview with {DEAD:,} dead letters and {INBOX:,} inbox rows "
        f"(inserted in {inserted:.1f} s): median {median * 1000:.0f} ms over "
        f"{len(times) - 1} requests (server {statistics.median(server[1:]) * 1000:.0f} ms, "
        f"first {times[0] * 1000:.0f} ms); failures page {failures * 1000:.0f} ms"
    )


async def _plans(conn: asyncpg.Connection) -> dict[str, str]:
    """EXPLAIN of the overview's per-durable queries (services/console/overview.py)."""
    from services.console import data, overview
    from shared.adapters import inbox

    durable = "sea__from_vibespro"
    queries = {
        "inbox backlog": (inbox._BACKLOG, (durable,)),
        "recent processing": (overview._RECENT, (durable, overview.RATE_WINDOW)),
        "recent dead letters": (overview._DEAD_RECENT, (durable, overview.RATE_WINDOW)),
        "dead letters by reason": (
            overview._DEAD_BY_REASON,
            ([durable], list(data.OPEN_STATUSES), None),
        ),
    }
    plans = {}
    for name, (sql, args) in queries.items():
        rows = await conn.fetch("EXPLAIN " + sql, *args)
        plans[name] = "\n".join(r[0] for r in rows)
    return plans
