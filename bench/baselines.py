"""Raw baselines: what the servers and the handler give a bare client, without Ferry.

    python -m bench.baselines js-publish   --nats-url URL --rows N
    python -m bench.baselines js-consume   --nats-url URL --rows N
    python -m bench.baselines pg-txn       --dsn DSN --seconds S [--connections 8]
    python -m bench.baselines http-handler --url URL --seconds S [--concurrency 64]
    python -m bench.baselines http-echo    --seconds S [--concurrency 64]

Each runs in its own process and prints one result line (see :mod:`bench.common`):

* ``js-publish``: N messages of an envelope's size into a file-stored stream ``RAW``,
  each with a unique ``Nats-Msg-Id`` (so JetStream's duplicate check runs), 1,000
  PubAcks in flight — the best a Python client gets from this server.
* ``js-consume``: a pull consumer on ``RAW`` with the durables' settings (batches of 50,
  200 acks pending, explicit acks), fetching and acking all N.
* ``pg-txn``: the state + outbox transaction of a producer in plain SQL (upsert of the
  aggregate row, INSERT of the outbox row, commit), closed loop over N connections.
* ``http-handler``: POST /handle to the example handler with the consumer's own HTTP
  client, each a new event (so the handler does its whole idempotent write), closed
  loop with the consumer's default concurrency.
* ``http-echo``: the same client and requests against a bare aiohttp server (its own
  process, started here) that reads the body and answers 200 — the HTTP round trip
  alone, to set the machine beside the issue's reference figure for it. The server's
  CPU time is included in the result.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import nats
from nats.js.api import AckPolicy, ConsumerConfig

from bench.common import AGGREGATES, emit, summarize
from services.inbox_consumer.dispatch import HttpHandler
from shared.domain.ack import HandlerResponse
from shared.domain.envelope import Envelope, payload_digest
from shared.runtime import loop as event_loop

#: PubAcks in flight for the raw publish.
WINDOW = 1000
STREAM = "RAW"
SUBJECT = "raw.event.model_published.v1"
#: The durables' fetch batch and max_ack_pending (topologies/sea-vibespro.yaml).
FETCH_BATCH = 50
MAX_ACK_PENDING = 200


def envelope(index: int) -> Envelope:
    """An event of the bench's kind (SEA's model_published), as Ferry carries it."""
    key = index % AGGREGATES
    payload = {"model_id": f"m{key}", "name": f"bench model {index}"}
    return Envelope(
        message_id=str(uuid.uuid4()), subject="sea.event.model_published.v1", context="sea",
        event_type="model_published", event_version=1, occurred_at=datetime.now(UTC),
        aggregate_type="model", aggregate_id=f"m{key}", payload=payload,
        payload_digest=payload_digest(payload),
    )  # fmt: skip


async def js_publish(url: str, rows: int) -> dict[str, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=["raw.>"], max_bytes=2 * 1000**3)
    bodies = [envelope(i).to_wire() for i in range(min(rows, 1000))]
    cpu0, start = time.process_time(), time.perf_counter()
    for base in range(0, rows, WINDOW):
        futures = [
            await js.publish_async(
                SUBJECT, bodies[i % len(bodies)], headers={"Nats-Msg-Id": str(uuid.uuid4())}
            )
            for i in range(base, min(base + WINDOW, rows))
        ]
        await asyncio.gather(*futures)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    stored = (await js.stream_info(STREAM)).state.messages
    await nc.close()
    return {"msg_s": rows / elapsed, "seconds": elapsed, "count": rows, "stored": stored,
            "cpu_s": cpu}  # fmt: skip


async def js_consume(url: str, rows: int) -> dict[str, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    config = ConsumerConfig(
        durable_name="raw", ack_policy=AckPolicy.EXPLICIT, max_ack_pending=MAX_ACK_PENDING,
        ack_wait=120,
    )  # fmt: skip
    await js.add_consumer(STREAM, config)
    psub = await js.pull_subscribe_bind(durable="raw", stream=STREAM)
    done = 0
    cpu0, start = time.process_time(), time.perf_counter()
    while done < rows:
        msgs = await psub.fetch(FETCH_BATCH, timeout=5)
        for msg in msgs:
            await msg.ack()
        done += len(msgs)
    await nc.flush()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    await nc.close()
    return {"msg_s": done / elapsed, "seconds": elapsed, "count": done, "cpu_s": cpu}


_UPSERT = (
    "INSERT INTO bench_state (id, n, updated_at) VALUES ($1, $2, now())"
    " ON CONFLICT (id) DO UPDATE SET n = EXCLUDED.n, updated_at = EXCLUDED.updated_at"
)
_OUTBOX = (
    "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version,"
    " payload, occurred_at) VALUES ($1, 'model', $2, 'model_published', 1, $3::jsonb, now())"
)


async def _together(loop: Callable[[], Awaitable[None]], copies: int) -> tuple[float, float]:
    """Run ``copies`` of ``loop`` at once: (wall seconds, this process's CPU seconds)."""
    cpu0, start = time.process_time(), time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(copies)))
    return time.perf_counter() - start, time.process_time() - cpu0


async def pg_txn(dsn: str, seconds: float, connections: int) -> dict[str, Any]:
    pool = await asyncpg.create_pool(dsn, min_size=connections, max_size=connections)
    async with pool.acquire() as conn:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_state"
            " (id TEXT PRIMARY KEY, n BIGINT NOT NULL, updated_at TIMESTAMPTZ NOT NULL)"
        )
    counter = iter(range(1 << 62))
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        while time.perf_counter() < deadline:
            index = next(counter)
            key = f"m{index % AGGREGATES}"
            began = time.perf_counter()
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(_UPSERT, key, index)
                body = f'{{"model_id": "{key}", "name": "bench model {index}"}}'
                await conn.execute(_OUTBOX, uuid.uuid4(), key, body)
            latencies.append((time.perf_counter() - began) * 1000)

    elapsed, cpu = await _together(loop, connections)
    await pool.close()
    return {"txn_s": len(latencies) / elapsed, "seconds": elapsed, "count": len(latencies),
            "latency_ms": summarize(latencies), "cpu_s": cpu}  # fmt: skip


async def http_handler(url: str, seconds: float, concurrency: int) -> dict[str, Any]:
    client = HttpHandler(url, timeout=10, connections=concurrency)
    statuses: dict[str, int] = {}
    latencies: list[float] = []
    counter = iter(range(1 << 62))
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        while time.perf_counter() < deadline:
            index = next(counter)
            env = envelope(index)
            body = env.to_dict()
            body["delivery"] = {"attempt": 1, "max_attempts": 20, "stream_sequence": index + 1,
                                "durable": "vibespro__from_sea"}  # fmt: skip
            began = time.perf_counter()
            outcome = await client.handle(body, {"Idempotency-Key": env.message_id})
            latencies.append((time.perf_counter() - began) * 1000)
            key = str(outcome.status) if isinstance(outcome, HandlerResponse) else outcome.kind
            statuses[key] = statuses.get(key, 0) + 1

    elapsed, cpu = await _together(loop, concurrency)
    await client.close()
    return {"req_s": len(latencies) / elapsed, "seconds": elapsed, "count": len(latencies),
            "statuses": statuses, "latency_ms": summarize(latencies), "cpu_s": cpu}  # fmt: skip


async def http_echo(seconds: float, concurrency: int) -> dict[str, Any]:
    """:func:`http_handler` against a bare aiohttp server in a child process."""
    import psutil

    from devstack.ports import free_port

    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.baselines", "echo-server", "--port", str(port)
    )
    try:
        await _until_listening(port, server)
        child = psutil.Process(server.pid)
        cpu0 = child.cpu_times()
        result = await http_handler(f"http://127.0.0.1:{port}/handle", seconds, concurrency)
        cpu1 = child.cpu_times()
    finally:
        server.terminate()
        await server.wait()
    server_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    result["server_cpu_s"] = server_cpu
    result["cpu_s"] += server_cpu
    return result


async def _until_listening(port: int, server: asyncio.subprocess.Process) -> None:
    for _ in range(200):
        if server.returncode is not None:
            raise RuntimeError(f"the echo server exited with {server.returncode}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
    raise RuntimeError(f"the echo server did not listen on port {port} within 10 s")


def echo_server(port: int) -> None:
    """Serve ``POST /handle``: read the body, answer 200 with a small JSON body."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"status": "processed"})

    app = web.Application()
    app.router.add_post("/handle", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines")
    parser.add_argument(
        "kind",
        choices=["js-publish", "js-consume", "pg-txn", "http-handler", "http-echo", "echo-server"],
    )
    parser.add_argument("--port", type=int)
    parser.add_argument("--nats-url")
    parser.add_argument("--dsn")
    parser.add_argument("--url")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args(argv)
    if args.kind == "js-publish":
        result = event_loop.run(js_publish(args.nats_url, args.rows))
    elif args.kind == "js-consume":
        result = event_loop.run(js_consume(args.nats_url, args.rows))
    elif args.kind == "pg-txn":
        result = event_loop.run(pg_txn(args.dsn, args.seconds, args.connections))
    elif args.kind == "echo-server":
        echo_server(args.port)
        return 0
    elif args.kind == "http-echo":
        result = event_loop.run(http_echo(args.seconds, args.concurrency))
    else:
        result = event_loop.run(http_handler(args.url, args.seconds, args.concurrency))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
