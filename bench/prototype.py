"""The bare-bones pipeline: the least code that moves an outbox row to a handler.

The issue's reference machine ran "a bare-bones prototype of the whole pipeline" as the
yardstick for the end-to-end targets. Hardware differs, so the bench measures its own on
the same machine, servers and producer as Ferry, and prints Ferry's latency and CPU
beside it. Same path, same round trips a careful minimal design needs, nothing else:

``publisher``  one connection, LISTEN ``ferry_outbox`` (the outbox trigger's NOTIFY);
               per turn: BEGIN, claim up to 500 unpublished rows ``FOR UPDATE SKIP
               LOCKED`` in seq order, publish each to JetStream with ``Nats-Msg-Id``
               (acks awaited together), mark them published, COMMIT.
``consumer``   the durable's pull requests kept outstanding on a private inbox; per batch
               of what arrived (at most 50, up to 4 batches at once): record the ids in
               an inbox table in one statement, POST each new one to the handler
               concurrently, mark the 200s processed in one statement, ack.
``handler``    aiohttp, ``POST /handle``: the idempotency claim and the state upsert in
               one statement, 200.

What it leaves out is what Ferry is for: tracing, metrics, health, envelopes checked
against a registry, per-aggregate order, leases, retries with backoff, dead letters,
signed requests, reconnect handling, graceful drain. So Ferry's figure over this one is
the price of those, and the prototype's figure is what the servers and a Python client
allow on this machine.

Run by the bench (``--sections prototype``), one process per role::

    python -m bench.prototype publisher --dsn DSN --nats-url URL --ready FILE
    python -m bench.prototype consumer  --dsn DSN --nats-url URL --url URL --ready FILE
    python -m bench.prototype handler   --dsn DSN --port PORT --ready FILE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import nats
from aiohttp import web
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from shared.runtime import loop as event_loop
from shared.waits import sleep_unless, within

STREAM, DURABLE, NAMESPACE = "SEA_EVENTS", "vibespro__from_sea", "sea.event"
#: Rows one publisher turn claims; messages one consumer batch takes; batches at once.
CLAIM, BATCH, PIPELINE = 500, 50, 4
#: Messages the consumer keeps requested (the durable's max_ack_pending).
WINDOW = 200
#: Longest sleep of an idle publisher between looks (NOTIFY normally wakes it).
POLL_SECONDS = 1.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS proto_inbox (
  id UUID PRIMARY KEY, occurred_at TIMESTAMPTZ NOT NULL,
  received_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(), processed_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS proto_applied (
  id UUID PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS proto_models (
  model_id TEXT PRIMARY KEY, name TEXT NOT NULL, updated_at TIMESTAMPTZ NOT NULL);
"""

_CLAIM_OUTBOX = (
    "SELECT id, event_type, event_version, payload::text AS payload, occurred_at"
    " FROM outbox_events WHERE published_at IS NULL ORDER BY seq LIMIT $1"
    " FOR UPDATE SKIP LOCKED"
)
_MARK_PUBLISHED = "UPDATE outbox_events SET published_at = now() WHERE id = ANY($1::uuid[])"
_CLAIM_INBOX = (
    "INSERT INTO proto_inbox (id, occurred_at)"
    " SELECT * FROM unnest($1::uuid[], $2::timestamptz[]) ON CONFLICT DO NOTHING RETURNING id"
)
_MARK_PROCESSED = (
    "UPDATE proto_inbox SET processed_at = clock_timestamp() WHERE id = ANY($1::uuid[])"
)
_APPLY = (
    "WITH claim AS (INSERT INTO proto_applied (id) VALUES ($1) ON CONFLICT DO NOTHING"
    " RETURNING id)"
    " INSERT INTO proto_models (model_id, name, updated_at) SELECT $2, $3, now() FROM claim"
    " ON CONFLICT (model_id) DO UPDATE SET name = EXCLUDED.name, updated_at = now()"
)


def _stopping() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _ready(path: str) -> None:
    Path(path).write_text("ready\n")


# ------------------------------------------------------------------------- publisher


async def publisher(dsn: str, nats_url: str, ready: str) -> None:
    stop = _stopping()
    wake = asyncio.Event()
    listener = await asyncpg.connect(dsn)
    await listener.add_listener("ferry_outbox", lambda *_: wake.set())
    conn = await asyncpg.connect(dsn)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    _ready(ready)
    while not stop.is_set():
        wake.clear()
        async with conn.transaction():
            rows = await conn.fetch(_CLAIM_OUTBOX, CLAIM)
            if rows:
                await asyncio.gather(*(
                    js.publish(
                        f"{NAMESPACE}.{r['event_type']}.v{r['event_version']}",
                        _body(r),
                        headers={"Nats-Msg-Id": str(r["id"])},
                    )
                    for r in rows
                ))  # fmt: skip
                await conn.execute(_MARK_PUBLISHED, [r["id"] for r in rows])
        if not rows:
            await sleep_unless(wake, POLL_SECONDS)
    await nc.drain()
    await conn.close()
    await listener.close()


def _body(row: asyncpg.Record) -> bytes:
    return (
        f'{{"id":"{row["id"]}","occurred_at":"{row["occurred_at"].isoformat()}",'
        f'"payload":{row["payload"]}}}'
    ).encode()


# -------------------------------------------------------------------------- consumer


async def consumer(dsn: str, nats_url: str, url: str, ready: str) -> None:
    stop = _stopping()
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=PIPELINE + 1)
    await pool.execute(SCHEMA)
    nc = await nats.connect(nats_url)
    queue: asyncio.Queue[Msg] = asyncio.Queue()
    credit = 0
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{DURABLE}"
    inbox = nc.new_inbox()

    async def on_msg(msg: Msg) -> None:
        nonlocal credit
        if JetStreamContext.is_status_msg(msg):  # a request expired (408) or ended (409)
            credit = 0
            await top_up()
            return
        credit -= 1
        queue.put_nowait(msg)

    async def top_up() -> None:
        nonlocal credit
        want = WINDOW - credit - queue.qsize()
        if want > 0 and (want >= WINDOW // 2 or credit <= 0):
            request = {"batch": want, "expires": 5_000_000_000}
            await nc.publish(subject, json.dumps(request).encode(), reply=inbox)
            credit += want

    await nc.subscribe(inbox, cb=on_msg)
    slots = asyncio.Semaphore(PIPELINE)
    tasks: set[asyncio.Task[None]] = set()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=WINDOW))
    _ready(ready)
    while not stop.is_set():
        await top_up()
        try:
            first = await within(1.0, queue.get())
        except TimeoutError:
            continue
        batch = [first]
        while len(batch) < BATCH and not queue.empty():
            batch.append(queue.get_nowait())
        await slots.acquire()
        task = asyncio.create_task(_consume(pool, session, url, batch))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        task.add_done_callback(lambda _: slots.release())
    if tasks:
        await asyncio.wait(tasks)
    await session.close()
    await nc.drain()
    await pool.close()


async def _consume(
    pool: asyncpg.Pool, session: aiohttp.ClientSession, url: str, batch: list[Msg]
) -> None:
    docs = [json.loads(m.data) for m in batch]
    ids = [uuid.UUID(d["id"]) for d in docs]
    occurred = [datetime.fromisoformat(d["occurred_at"]) for d in docs]
    fresh = {r["id"] for r in await pool.fetch(_CLAIM_INBOX, ids, occurred)}
    todo = [(m, d, i) for m, d, i in zip(batch, docs, ids, strict=True) if i in fresh]

    async def call(doc: dict[str, Any]) -> int:
        async with session.post(url, json=doc) as response:
            await response.read()
            return response.status

    statuses = await asyncio.gather(*(call(d) for _, d, _ in todo))
    done = [i for (_, _, i), status in zip(todo, statuses, strict=True) if status == 200]
    if done:
        await pool.execute(_MARK_PROCESSED, done)
    redeliver = {i for (_, _, i), status in zip(todo, statuses, strict=True) if status != 200}
    for msg, _, mid in zip(batch, docs, ids, strict=True):
        await (msg.nak() if mid in redeliver else msg.ack())


# --------------------------------------------------------------------------- handler


def handler(dsn: str, port: int, ready: str) -> None:
    pool: asyncpg.Pool | None = None

    async def start(app: web.Application) -> None:
        nonlocal pool
        pool = await asyncpg.create_pool(dsn, min_size=4, max_size=16)
        await pool.execute(SCHEMA)
        _ready(ready)

    async def handle(request: web.Request) -> web.Response:
        doc = json.loads(await request.read())
        payload = doc["payload"]
        # The consumer's body, or Ferry's envelope (the raw POST baseline sends one).
        message_id = uuid.UUID(doc["id"] if "id" in doc else doc["message_id"])
        assert pool is not None
        await pool.execute(_APPLY, message_id, payload["model_id"], payload["name"])
        return web.json_response({"status": "processed"})

    app = web.Application()
    app.router.add_post("/handle", handle)
    app.on_startup.append(start)
    factory = event_loop.loop_factory()  # the roles' loop (FERRY_EVENT_LOOP)
    loop = factory() if factory is not None else None
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=loop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prototype")
    parser.add_argument("role", choices=["publisher", "consumer", "handler"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--nats-url")
    parser.add_argument("--url", help="the handler's /handle URL (consumer)")
    parser.add_argument("--port", type=int, help="the handler's port")
    parser.add_argument("--ready", required=True, help="file written once the role is ready")
    args = parser.parse_args(argv)
    if args.role == "publisher":
        event_loop.run(publisher(args.dsn, args.nats_url, args.ready))
    elif args.role == "consumer":
        event_loop.run(consumer(args.dsn, args.nats_url, args.url, args.ready))
    else:
        handler(args.dsn, args.port, args.ready)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
