"""Benchmark: consumer-side latency at fixed offered loads (JetStream → inbox → handler).

    python -m bench.consumer_latency [--rates 200,600,1000] [--seconds 10]

Starts its own nats-server (file store, ``sync_interval: always``) and PostgreSQL, runs
the inbox-consumer's own class for one durable against a minimal aiohttp handler, and
publishes envelopes straight into the stream at each fixed rate. Latency is the time
from the envelope's occurred_at (set just before its publish) to the handler receiving
it, so it measures JetStream delivery, the pull loop, the inbox claim and the HTTP hop —
not the outbox publisher. Prints a table and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import nats
from aiohttp import web

from devstack.nats import NatsServer
from devstack.ports import free_port
from devstack.postgres import PostgresServer
from services.inbox_consumer.consumer import InboxConsumer
from services.inbox_consumer.dispatch import HttpHandler
from shared.adapters.postgres import migrate_database
from shared.domain.ack import RetryPolicy
from shared.domain.envelope import Envelope, parse_timestamp
from shared.provision import Caps, provision
from shared.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
DURABLE = "sea__from_vibespro"


class Handler:
    """Answers 200 and notes when each message arrived."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        sent = parse_timestamp(body["occurred_at"])
        self.latencies_ms.append((datetime.now(UTC) - sent).total_seconds() * 1000)
        return web.Response(status=200)


def _envelope() -> Envelope:
    return Envelope(
        message_id=str(uuid.uuid4()),
        subject="vibespro.event.vibe_created.v1",
        context="vibespro",
        event_type="vibe_created",
        event_version=1,
        occurred_at=datetime.now(UTC),
        aggregate_type="vibe",
        aggregate_id="v1",
        payload={"vibe_id": "v1", "title": "bench"},
    )


async def run(url: str, dsn: str, rates: list[int], seconds: float) -> list[dict[str, Any]]:
    topology = load_topology(ROOT / "topologies/sea-vibespro.yaml")
    await migrate_database(dsn)
    nc = await nats.connect(url)
    js = nc.jetstream()
    await provision(js, topology, caps=Caps(max_replicas=1, max_bytes=1000**3))
    handler = Handler()
    app = web.Application()
    app.router.add_post("/handle", handler.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    spec = topology.durables[DURABLE]
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
    http = HttpHandler(f"http://127.0.0.1:{port}/handle", timeout=10, connections=64)
    consumer = InboxConsumer(
        pool=pool, js=js, durable=DURABLE, spec=spec, handler=http, owner="bench",
        concurrency=64, lease_seconds=40, policy=RetryPolicy(tuple(spec.backoff), 20),
        accepted=None,
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop, fetch_timeout=1.0))
    results = []
    try:
        for rate in rates:
            handler.latencies_ms.clear()
            sent = await _offer(js, rate, seconds)
            await _received(handler, sent, timeout=30)
            lat = handler.latencies_ms
            q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [0.0] * 99
            results.append(
                {"rate": rate, "sent": sent, "received": len(lat),
                 "p50_ms": round(q[49], 1), "p95_ms": round(q[94], 1), "p99_ms": round(q[98], 1)}
            )  # fmt: skip
            print(f"  {rate:>6} msg/s: p50 {q[49]:7.1f}  p95 {q[94]:7.1f}  p99 {q[98]:7.1f} ms")
    finally:
        stop.set()
        await task
        await http.close()
        await pool.close()
        await runner.cleanup()
        await nc.close()
    return results


async def _received(handler: Handler, count: int, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(handler.latencies_ms) < count and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)


async def _offer(js: Any, rate: int, seconds: float) -> int:
    """Publish at ``rate`` per second for ``seconds`` (each envelope stamped at publish)."""
    start = time.monotonic()
    sent = 0
    pending = []
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate)
        while sent < due:
            env = _envelope()
            pending.append(
                await js.publish_async(
                    env.subject, env.to_wire(), headers={"Nats-Msg-Id": env.message_id}
                )
            )
            sent += 1
        if len(pending) > 500:
            await asyncio.gather(*pending)
            pending.clear()
        await asyncio.sleep(0.002)
    await asyncio.gather(*pending)
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.consumer_latency")
    parser.add_argument("--rates", default="200,600,1000")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    base = Path(tempfile.mkdtemp(prefix="ferry-bench-"))
    base.chmod(0o711)
    print(f"consumer latency, {DURABLE}, {args.seconds:.0f}s per rate (occurred_at → handler)")
    try:
        with NatsServer(base / "nats") as ns, PostgresServer(base / "pg") as pg:
            pg.create_database("bench")
            results = asyncio.run(run(ns.url, pg.dsn("bench"), rates, args.seconds))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "consumer_latency.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
