"""Instructions per handler call, counted under valgrind: what tracing costs one hop,
without the VM's noise.

    python -m bench.instructions [--calls 1000] [--modes off,unsampled,sampled]

On the project's 2-core VM a timing moves by 2x from one minute to the next, so the
bench's one pair of drains (tracing on, then off) cannot see an effect of 5 %: single
pairs ranged from 0.79 to 1.31. A program run under valgrind's callgrind executes the
same instructions however busy the machine is (repeat runs agree within about 1 %). This
counts what one handler call costs, in one process over loopback:

- the consumer's side of a delivery: its ``process`` span, the decision's trace scope
  and log fields, the signed-off ``POST`` through :class:`HttpHandler` (with Ferry's
  CLIENT span wrapper), and the settle scope with its ``ack`` span (no NATS: the ack
  itself is the same in every mode);
- the handler's side: an aiohttp server with :func:`observe_app`, whose middleware opens
  the SERVER span and the log fields, answering 200;
- with tracing on, a batch span processor exporting to an exporter that encodes each
  batch as OTLP/HTTP would (Ferry's encoder) and drops the bytes;
- all of it on the loop and garbage-collector policy a role runs with
  (:func:`shared.runtime.loop.run`: uvloop where installed, what start-up and tracing's
  set-up left frozen out of collection, a young generation of 10,000). Until 2026-11-27
  the workload ran on asyncio's loop with Python's collector defaults, which counted
  collector passes over tracing's imports that no role makes.

Modes: ``off`` (no tracer provider), ``unsampled`` (tracing on, parent-based sampler,
every caller's traceparent has its sampled flag clear: what 90 % of messages cost at a
10 % ratio) and ``sampled`` (every caller sampled). Each mode runs twice, with ``calls``
and ``calls // 6`` calls; the difference over the extra calls removes start-up and
imports. The table gives instructions per call and each mode against ``off``; at 10 %
sampling a call costs 0.9 x unsampled + 0.1 x sampled, printed as its own row.
Instructions are not time (a cache miss costs more than an add), but on one machine and
one code path they move with it.

The workload alone, without valgrind: ``python -m bench.instructions --workload MODE N``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.runtime import loop

MODES = ("off", "unsampled", "sampled")
#: Calls in flight at once, as a consumer's batch would have them.
IN_FLIGHT = 16
#: Callgrind's summary line: ``==PID== Collected : N``.
_COLLECTED = re.compile(r"^==\d+== Collected : (\d+)\s*$", re.MULTILINE)
ROOT = Path(__file__).resolve().parent.parent


def parse_collected(stderr: str) -> int:
    """The instruction count callgrind reports for the whole run."""
    found = _COLLECTED.findall(stderr)
    if not found:
        tail = "\n".join(stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"no instruction count in valgrind's output: {tail}")
    return int(found[-1])


def per_call(small: int, large: int, small_calls: int, large_calls: int) -> float:
    """Instructions per call from two runs that differ only in their number of calls."""
    if large_calls <= small_calls:
        raise ValueError("the larger run must make more calls")
    return (large - small) / (large_calls - small_calls)


# --------------------------------------------------------------------------- workload


def _traceparent(index: int, sampled: bool) -> str:
    return f"00-{uuid.UUID(int=index + 1).hex}-{index + 1:016x}-{'01' if sampled else '00'}"


def _msg(index: int, data: bytes, traceparent: str | None) -> Any:
    from nats.aio.msg import Msg

    headers = {"Nats-Msg-Id": str(uuid.UUID(int=(1 << 64) + index))}
    if traceparent is not None:
        headers["traceparent"] = traceparent
    reply = f"$JS.ACK.SEA_EVENTS.bench.1.{index + 1}.{index + 1}.1700000000000000000.0"
    return Msg(_client=None, subject="vibespro.event.vibe_created.v1", reply=reply,  # type: ignore[arg-type]
               data=data, headers=headers)  # fmt: skip


def _envelope_bytes(index: int) -> bytes:
    from shared.domain.envelope import Envelope

    return Envelope(
        message_id=str(uuid.UUID(int=(1 << 64) + index)),
        subject="vibespro.event.vibe_created.v1",
        event_type="vibe_created",
        event_version=1,
        occurred_at=datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC),
        aggregate_type="vibe",
        aggregate_id=f"vibe-{index % 1000}",
        payload={"vibe_id": f"vibe-{index % 1000}", "mood": "calm", "score": index % 100},
        context="vibespro",
        correlation_id=str(uuid.UUID(int=(2 << 64) + index)),
    ).to_wire()


def _setup_tracing(mode: str, exported: dict[str, int]) -> Any:
    """Ferry's tracing as a role sets it up, exporting to an encode-and-drop exporter."""
    if mode == "off":
        return None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from shared import telemetry
    from shared.telemetry import otlp_wire
    from shared.telemetry.setup import build_sampler

    class EncodeOnly(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            otlp_wire.encode_request(spans)
            exported["spans"] += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=build_sampler("parentbased_traceidratio", 0.1))
    provider.add_span_processor(BatchSpanProcessor(EncodeOnly()))
    telemetry.use_tracer_provider(provider)
    telemetry.instrument(provider)
    return provider


async def workload(mode: str, calls: int) -> dict[str, int]:
    """``calls`` deliveries through the consumer's and the handler's trace scopes and one
    real HTTP call each; returns what happened (the caller checks it)."""
    from aiohttp import web

    from services.handlers.metrics import observe_app
    from services.inbox_consumer.deciding import headers as call_headers
    from services.inbox_consumer.delivery import parse_delivery
    from services.inbox_consumer.dispatch import HttpHandler
    from services.inbox_consumer.spans import log_fields, process_span, settling
    from shared import telemetry
    from shared.domain.ack import Ack
    from shared.domain.handler_call import request_body

    answered: dict[str, int] = {"calls": 0, "ok": 0, "spans": 0}
    provider = _setup_tracing(mode, answered)
    loop.freeze()  # as a role does once tracing is set up (shared.runtime.lifecycle)

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"status": "applied"})

    app = web.Application()
    observe_app(app, role="bench-instructions")
    app.router.add_post("/handle", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    handler = HttpHandler(f"http://127.0.0.1:{port}/handle", timeout=30, connections=64)
    deliveries = [
        parse_delivery(_msg(i, _envelope_bytes(i), _traceparent(i, mode == "sampled")))
        for i in range(calls)
    ]

    async def one(delivery: Any) -> None:
        delivery.span = process_span(delivery, durable="bench", stream="SEA_EVENTS")
        assert delivery.envelope is not None
        body = request_body(delivery.envelope, attempt=1, max_attempts=5,
                            stream_sequence=delivery.stream_seq, durable="bench")  # fmt: skip
        with telemetry.current(delivery.span), log_fields(delivery):
            outcome = await handler.handle(body, call_headers(delivery))
        # Settled as the consumer settles (its books are kept inside the settle scope);
        # the ack itself is left out: it is the same in every mode.
        with settling(delivery, Ack("applied"), durable="bench"):
            answered["calls"] += 1
            answered["ok"] += getattr(outcome, "status", 0) == 200

    try:
        for start in range(0, calls, IN_FLIGHT):
            await asyncio.gather(*(one(d) for d in deliveries[start : start + IN_FLIGHT]))
    finally:
        await handler.close()
        await runner.cleanup()
        if provider is not None:
            provider.shutdown()
            telemetry.uninstrument()
            telemetry.use_tracer_provider(None)
    return answered


# --------------------------------------------------------------------------- driver


def _count(valgrind: str, mode: str, calls: int) -> int:
    out = Path(tempfile.mkdtemp(prefix="ferry-callgrind-"))
    try:
        done = subprocess.run(
            [valgrind, "--tool=callgrind", f"--callgrind-out-file={out / 'cg.out'}",
             sys.executable, "-m", "bench.instructions", "--workload", mode, str(calls)],
            cwd=ROOT, capture_output=True, text=True, check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"},
        )  # fmt: skip
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} x {calls} failed under valgrind: {done.stderr[-2000:]}")
    check_workload(mode, calls, done.stdout)
    return parse_collected(done.stderr)


#: Spans of one sampled call: process, POST (CLIENT), POST /handle (SERVER), ack.
SPANS_PER_SAMPLED_CALL = 4


def check_workload(mode: str, calls: int, stdout: str) -> None:
    """The workload did what it claims: every call answered 200, and spans exported for
    every sampled call and for no other."""
    found = re.search(r"calls=(\d+) ok=(\d+) spans=(\d+)", stdout)
    if found is None:
        raise RuntimeError(f"{mode} x {calls}: no summary line in {stdout!r}")
    made, ok, spans = (int(v) for v in found.groups())
    if made != calls or ok != calls:
        raise RuntimeError(f"{mode} x {calls}: {ok} of {made} calls answered 200")
    expected = SPANS_PER_SAMPLED_CALL * calls if mode == "sampled" else 0
    if spans != expected:
        raise RuntimeError(f"{mode} x {calls}: {spans} spans exported, expected {expected}")


def table(counts: dict[str, float]) -> str:
    """The instructions per call by mode, against ``off``, and the 10 % mix."""
    rows = dict(counts)
    if "unsampled" in rows and "sampled" in rows:
        rows["at 10 % sampling"] = 0.9 * rows["unsampled"] + 0.1 * rows["sampled"]
    off = rows.get("off")
    lines = [f"{'tracing':<18} {'instructions per call':>22} {'÷ off':>7}", "-" * 49]
    for name, value in rows.items():
        ratio = f"{value / off:.3f}" if off else "n/m"
        lines.append(f"{name:<18} {value:>22,.0f} {ratio:>7}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=(
        "Instructions per handler call by tracing mode, counted under valgrind."))  # fmt: skip
    parser.add_argument("--calls", type=int, default=1200, help="calls of the larger run (1200)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated (all)")
    parser.add_argument("--workload", nargs=2, metavar=("MODE", "CALLS"),
                        help="run the workload alone (what valgrind runs)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.workload:
        mode, calls = args.workload[0], int(args.workload[1])
        if mode not in MODES:
            parser.error(f"--workload: mode {mode!r} is not one of {', '.join(MODES)}")
        # On the loop and garbage-collector policy a role runs with (shared.runtime.loop):
        # uvloop where installed, start-up frozen out of collection, young generation 10,000.
        answered = loop.run(workload(mode, calls))
        print(f"calls={answered['calls']} ok={answered['ok']} spans={answered['spans']}")
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"--modes: use some of {', '.join(MODES)}")
    if args.calls < 60:
        parser.error("--calls must be at least 60")
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    small_calls = args.calls // 6
    jobs = [(m, n) for m in modes for n in (small_calls, args.calls)]
    print(f"counting {len(jobs)} runs under callgrind ({small_calls:,} and {args.calls:,} "
          "calls per mode), two at a time; about a minute each", flush=True)  # fmt: skip
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            counted = dict(zip(jobs, pool.map(lambda job: _count(valgrind, *job), jobs),
                               strict=True))  # fmt: skip
    except RuntimeError as exc:
        print(f"bench.instructions: {exc}", file=sys.stderr)
        return 1
    counts = {m: per_call(counted[(m, small_calls)], counted[(m, args.calls)], small_calls,
                          args.calls) for m in modes}  # fmt: skip
    print(table(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
