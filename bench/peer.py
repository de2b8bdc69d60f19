"""The closest Python peer: faststream-outbox relaying an outbox table into JetStream.

    python -m bench.peer --dsn DSN --nats-url URL --rows N [--workers W]

Runs in its own process, like the outbox-publisher role. It fills faststream-outbox's
own table (``make_outbox_table``) with ``N`` rows of the same size as Ferry's events,
each carrying a unique ``Nats-Msg-Id`` header, then relays them with the package's
documented pattern — a FastStream ``NatsBroker`` JetStream publisher stacked on an
``OutboxBroker`` subscriber, inbound headers propagated — into a file-stored stream
``PEER`` of the same nats-server. The drain ends when the table is empty (the package
deletes a row once its relay succeeded) and the stream holds ``N`` messages.

The rate is measured like the outbox-publisher's: messages in the stream divided by
the time between the stream's first and last message. Prints one JSON object on
stdout; when the package is missing or fails, the object carries ``error`` with the
precise reason instead of a rate.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import traceback
from typing import Any

import asyncpg
import nats

from bench.common import emit, progress, stream_span

#: faststream-outbox's queue name for the relay and the table it lives in.
QUEUE = "relay"
TABLE = "peer_outbox"
STREAM = "PEER"
SUBJECT = "peer.event.model_published.v1"
#: A body as large as a Ferry envelope of the bench's events (~450 bytes of JSON).
BODY_SQL = (
    "convert_to(json_build_object('message_id', gen_random_uuid(), 'subject', $2::text,"
    " 'context', 'sea', 'event_type', 'model_published', 'event_version', 1,"
    " 'occurred_at', now(), 'aggregate_type', 'model', 'aggregate_id', 'm' || (g % 1000),"
    " 'payload', json_build_object('model_id', 'm' || (g % 1000), 'name', repeat('x', 150)))"
    "::text, 'UTF8')"
)


async def _fill(engine: Any, dsn: str, rows: int) -> None:
    from faststream_outbox import make_outbox_table
    from sqlalchemy import MetaData

    metadata = MetaData()
    make_outbox_table(metadata, table_name=TABLE)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f"INSERT INTO {TABLE} (queue, payload, headers)"
            f" SELECT $3::text, {BODY_SQL},"
            " jsonb_build_object('Nats-Msg-Id', gen_random_uuid()::text)"
            " FROM generate_series(1, $1::int) g",
            rows,
            SUBJECT,
            QUEUE,
        )
        await conn.execute(f"ANALYZE {TABLE}")
    finally:
        await conn.close()


async def drain(
    dsn: str, nats_url: str, rows: int, workers: int, batch: int, budget: float
) -> dict[str, Any]:
    """Fill, relay, and measure; raises ImportError when the package is not installed."""
    from faststream import Response
    from faststream.nats import JStream, NatsBroker
    from faststream_outbox import OutboxBroker, make_outbox_table
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import create_async_engine

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=["peer.>"], max_bytes=2 * 1000**3)
    url = dsn.replace("postgresql://", "postgresql+asyncpg://", 1)
    engine = create_async_engine(url, pool_size=workers + 4, max_overflow=4)
    await _fill(engine, dsn, rows)

    metadata = MetaData()
    table = make_outbox_table(metadata, table_name=TABLE)
    outbox = OutboxBroker(engine, outbox_table=table, log_level=logging.DEBUG)
    broker = NatsBroker(nats_url, log_level=logging.DEBUG)
    publisher = broker.publisher(SUBJECT, stream=JStream(STREAM, declare=False))

    @publisher
    @outbox.subscriber(
        QUEUE,
        max_workers=workers,
        fetch_batch_size=batch,
        terminal_flush_batch_size=min(batch, 100),
        min_fetch_interval=0.01,
        max_fetch_interval=0.5,
        propagate_inbound_headers=True,
    )
    async def relay(body: dict[str, Any]) -> Response:
        return Response(body)

    await broker.start()
    cpu0, started = time.process_time(), time.perf_counter()
    await outbox.start()
    await _until_relayed(js, engine, rows, started, budget)
    cpu = time.process_time() - cpu0
    await outbox.stop()
    await broker.stop()
    await engine.dispose()
    first, last, in_stream = await stream_span(js, STREAM)
    await nc.close()
    elapsed = max(last - first, 1e-6)
    return {
        "rows": rows,
        "in_stream": in_stream,
        "msg_s": in_stream / elapsed,
        "seconds": elapsed,
        "workers": workers,
        "fetch_batch_size": batch,
        "cpu_s": cpu,
    }


async def _until_relayed(js: Any, engine: Any, rows: int, started: float, budget: float) -> None:
    """Wait until the stream holds every row (cheap to ask), then until the table is empty.

    Past ``budget`` seconds, stop waiting: the rate of what was relayed is reported.
    """
    from sqlalchemy import text

    deadline = started + budget
    last_report = started
    while time.perf_counter() < deadline:
        stored = int((await js.stream_info(STREAM)).state.messages)
        if stored >= rows:
            break
        if time.perf_counter() - last_report >= 5:
            progress(f"faststream-outbox: {stored:,}/{rows:,} relayed")
            last_report = time.perf_counter()
        await asyncio.sleep(0.2)
    else:
        return
    async with engine.connect() as conn:
        while time.perf_counter() < deadline + 30:
            left = (await conn.execute(text(f"SELECT count(*) FROM {TABLE}"))).scalar_one()
            await conn.commit()
            if not left:
                return
            await asyncio.sleep(0.5)
    raise TimeoutError(f"faststream-outbox relayed every row but left rows in {TABLE}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--budget", type=float, default=600.0, help="longest drain (s)")
    args = parser.parse_args(argv)
    try:
        result = asyncio.run(
            drain(args.dsn, args.nats_url, args.rows, args.workers, args.batch, args.budget)
        )
    except ImportError as exc:
        result = {"error": f"faststream-outbox not importable here: {exc}"}
    except Exception as exc:  # reported in the table, never a crash of the whole run
        traceback.print_exc()
        result = {"error": f"faststream-outbox failed: {type(exc).__name__}: {exc}"}
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
