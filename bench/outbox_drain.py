"""Benchmark: outbox-publisher drain of a backlog beside raw JetStream pipelined publish.

    python -m bench.outbox_drain [--rows 100000]

Starts its own nats-server (file store, ``sync_interval: always``) and PostgreSQL
(default durability settings) in temporary directories, then measures, in one run:

* raw: JetStream publish of N messages with unique Nats-Msg-Id, 1,000 PubAcks in flight;
* drain: the outbox-publisher (the role's own class) emptying an N-row outbox.

Prints a table and writes JSON to bench/results/. Run by hand, not in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

import asyncpg
import nats

from devstack.nats import NatsServer
from devstack.postgres import PostgresServer
from services.outbox_publisher.publisher import OutboxPublisher
from shared.adapters.notify import listen
from shared.adapters.postgres import migrate_database
from shared.provision import Caps, provision
from shared.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 1000


async def raw_publish(url: str, rows: int) -> float:
    """Messages per second of pipelined JetStream publishes (unique Nats-Msg-Id)."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="RAW", subjects=["raw.>"], max_bytes=2 * 1000**3)
    body = b'{"payload": "' + b"x" * 200 + b'"}'
    start = time.perf_counter()
    for base in range(0, rows, WINDOW):
        futures = [
            await js.publish_async("raw.event.v1", body, headers={"Nats-Msg-Id": f"raw-{i}"})
            for i in range(base, min(base + WINDOW, rows))
        ]
        await asyncio.gather(*futures)
    elapsed = time.perf_counter() - start
    await nc.close()
    return rows / elapsed


async def outbox_drain(url: str, dsn: str, rows: int) -> float:
    """Rows per second the outbox-publisher moves from a full outbox into the stream."""
    topology = load_topology(ROOT / "topologies/sea-vibespro.yaml")
    await migrate_database(dsn)
    conn = await asyncpg.connect(dsn)
    await conn.execute(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)"
        " SELECT gen_random_uuid(), 'model', 'm' || (g % 1000), 'model_published',"
        " jsonb_build_object('model_id', 'm' || (g % 1000), 'name', repeat('x', 150))"
        " FROM generate_series(1, $1) g",
        rows,
    )
    nc = await nats.connect(url)
    await provision(nc.jetstream(), topology, caps=Caps(max_replicas=1, max_bytes=2 * 1000**3))
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=5)
    ctx = topology.contexts["sea"]
    assert ctx.stream is not None
    publisher = OutboxPublisher(
        pool=pool,
        js=nc.jetstream(),
        context="sea",
        namespace=ctx.namespace,
        stream=ctx.stream.name,
        batch_size=500,
        publish_timeout=10.0,
    )
    stop = asyncio.Event()
    start = time.perf_counter()
    tasks = [asyncio.create_task(listen(dsn, "ferry_outbox", publisher.notify, stop))]
    tasks += [asyncio.create_task(publisher.run_worker(stop, poll_interval=0.05)) for _ in range(3)]
    await _until_drained(conn)
    elapsed = time.perf_counter() - start
    stop.set()
    await asyncio.gather(*tasks)
    in_stream = (await nc.jetstream().stream_info("SEA_EVENTS")).state.messages
    assert in_stream == rows, f"stream holds {in_stream}, expected {rows}"
    await pool.close()
    await conn.close()
    await nc.close()
    return rows / elapsed


async def _until_drained(conn: asyncpg.Connection) -> None:
    pending = "SELECT count(*) FROM outbox_events WHERE published_at IS NULL"
    while True:
        if not await conn.fetchval(pending):
            return
        await asyncio.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.outbox_drain")
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ferry-bench-"))
    base.chmod(0o711)
    try:
        with NatsServer(base / "nats") as ns, PostgresServer(base / "pg") as pg:
            pg.create_database("bench")
            raw = asyncio.run(raw_publish(ns.url, args.rows))
            drain = asyncio.run(outbox_drain(ns.url, pg.dsn("bench"), args.rows))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result = {
        "rows": args.rows,
        "raw_publish_msg_s": round(raw),
        "publisher_drain_msg_s": round(drain),
        "ratio": round(drain / raw, 2),
        "sync_interval": "always",
    }
    print(f"{'measure':<40}{'msg/s':>10}")
    print(f"{'raw JetStream pipelined publish':<40}{raw:>10.0f}")
    print(f"{'outbox-publisher drain':<40}{drain:>10.0f}")
    print(f"{'drain / raw':<40}{drain / raw:>10.2f}")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "outbox_drain.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
