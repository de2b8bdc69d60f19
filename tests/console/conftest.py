"""The console's world: the real stack of sea-vibespro (NATS, PostgreSQL, the example
handler, publisher, consumer and dlq-replayer as processes, each with its own login) and
the console itself as a process with its own login, accounts and token; a workload that
produces dead letters of two kinds."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from nats.aio.client import Client as NATS

from devstack.ports import free_port
from services.console.auth import hash_password
from shared.access.streams import provision
from shared.adapters.producer import record_event
from tests.conftest import CAPS, ROOT, Env
from tests.helpers import eventually

DURABLE = "sea__from_vibespro"
#: The topology's other durable: no consumer runs for it in the stack.
OTHER = "vibespro__from_sea"
PASSWORDS = {"ops": "ops-password-1", "viewer": "viewer-password-1"}
TOKEN = "t0ken-" + uuid.uuid4().hex
#: Seconds the "bug" of the fixable events lasts: dead-lettered now, replayable after.
FIX_AFTER = 6.0
#: Where the browser tests leave their screenshots (git ignores .var/).
SCREENSHOTS = ROOT / ".var" / "screenshots"


@dataclass
class Stack:
    """The running stack, the console's address and the events the workload recorded."""

    env: Env
    url: str
    port: int
    procs: dict[str, subprocess.Popen[bytes]]
    logs: Path
    fixable: list[str] = field(default_factory=list)
    poison: list[str] = field(default_factory=list)
    fine: list[str] = field(default_factory=list)
    fixed_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    kpi_run: str = ""
    correlation: uuid.UUID = field(default_factory=uuid.uuid4)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")


def _start(env: Env, name: str, args: list[str], logs: Path, **extra: str) -> Any:
    role = extra.pop("role", None)
    command = [sys.executable, "-m", *args]
    environment = (
        env.settings_env(role=role, **extra) if role else env.settings_env(command=command, **extra)
    )
    with open(logs / f"{name}.log", "ab") as out:
        return subprocess.Popen(command, cwd=ROOT, env=environment, stdout=out, stderr=out)


async def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.to_thread(proc.wait, 20)
    except subprocess.TimeoutExpired:
        proc.kill()


async def record(
    env: Env, faults: dict[str, Any] | None = None, *, correlation: uuid.UUID | None = None
) -> str:
    """One vibe_created event in vibespro's outbox (a sampled trace of its own)."""
    vibe = f"v-{uuid.uuid4().hex[:8]}"
    payload: dict[str, Any] = {"vibe_id": vibe, "title": f"vibe {vibe}"}
    if faults:
        payload["_ferry_test"] = faults
    conn = await asyncpg.connect(env.dsn("vibespro"))
    try:
        async with conn.transaction():
            event_id = await record_event(
                conn,
                aggregate_type="vibe",
                aggregate_id=vibe,
                event_type="vibe_created",
                payload=payload,
                traceparent=f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01",
                correlation_id=correlation,
                context="vibespro",
            )
    finally:
        await conn.close()
    return str(event_id)


async def dead_letter_statuses(env: Env) -> dict[str, str]:
    """message id → status of every dead letter of the durable."""
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        rows = await conn.fetch("SELECT message_id, status FROM dead_letters")
    finally:
        await conn.close()
    return {str(r["message_id"]): r["status"] for r in rows}


async def write_kpi_report(env: Env, base: Path) -> str:
    """A KPI run as the job records it: its report files (spark/report.py's own writer,
    plots included) under ``base/<topology>/<run>`` and its row in ``kpi_runs``; the run."""
    from spark.report import Report, write_report
    from spark.verdicts import AlertRules, Finding, Targets

    now = datetime.now(UTC)
    run_id = uuid.uuid4()
    finding = Finding("alert", "dlq_spike", "window", now - timedelta(minutes=5), "sea",
                      DURABLE, "vibespro.event.vibe_created.v1", 7.0, 3.0)  # fmt: skip
    report = Report(
        run_id=str(run_id), topology=env.topology.name, as_of=now,
        start=now - timedelta(hours=1), end=now, incremental=False, window_seconds=60,
        grace_seconds=30.0, kpi_database="sea", gate="slo", targets=Targets(),
        rules=AlertRules(), exit_code=5, verdict="alert", events=15, alerts=[finding],
    )  # fmt: skip
    name = now.strftime("%Y%m%dT%H%M%SZ")
    await asyncio.to_thread(write_report, report, base / env.topology.name / name, keep=3)
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        await conn.execute(
            "INSERT INTO kpi_runs (run_id, topology, window_seconds, range_start, range_end, "
            "as_of, incremental, windows, events, verdict, exit_code, report_dir, started_at) "
            "VALUES ($1, $2, 60, $3, $4, $4, false, 60, 15, 'alert', 5, $5, $4)",
            run_id, env.topology.name, now - timedelta(hours=1), now, str(base),
        )  # fmt: skip
    finally:
        await conn.close()
    return name


async def wait_ready(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    async with aiohttp.ClientSession() as session:

        async def ready() -> bool:
            assert proc.poll() is None, f"{what} exited with {proc.returncode}"
            try:
                async with session.get(url) as resp:
                    return resp.status == 200
            except (aiohttp.ClientError, OSError):
                return False

        await eventually(ready, timeout=40, what=f"{what} ready", interval=0.2)


@pytest.fixture
async def stack(env: Env, nc: NATS, tmp_path: Path) -> AsyncIterator[Stack]:
    """sea-vibespro with operator-only replays, the roles and the console, and a workload:
    fine events, events rejected until FIX_AFTER seconds from now (one failure group) and
    poison events (another)."""
    handler_port, console_port = free_port(), free_port()
    # The consumer's /healthz, and one of a role that is not running (nothing listens).
    consumer_health, nobody = free_port(), free_port()
    durable = env.doc["durables"][DURABLE]
    durable.update(
        ack_wait="3s",
        max_deliver=4,
        backoff=["200ms", "200ms", "200ms"],
        handler={"url": f"http://127.0.0.1:{handler_port}/handle", "timeout": "2s"},
        replay="operator",  # replays are the operator's (the console's) to start
        # Open long enough for a page to show it (tests/console/test_browser.py).
        circuit_breaker={"failures": 5, "window": "10s", "probe_every": "10s"},
    )
    env.write()
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    accounts = tmp_path / "accounts.json"
    accounts.write_text(
        json.dumps(
            {
                "ops": {"role": "operator", "password": hash_password(PASSWORDS["ops"])},
                "viewer": {"role": "read-only", "password": hash_password(PASSWORDS["viewer"])},
            }
        )
    )
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "traces").mkdir()
    kpi_run = await write_kpi_report(env, tmp_path / "kpi")
    logs = tmp_path / "logs"
    logs.mkdir()
    tracing = {
        "FERRY_TRACES_EXPORTER": "file",
        "FERRY_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    procs = {
        "handler-sea": _start(
            env,
            "handler-sea",
            ["services.handlers", "--service", "sea", "--port", str(handler_port)],
            logs,
            FERRY_HANDLER_FAULT_INJECTION="true",
        ),
        "outbox-publisher": _start(
            env,
            "outbox-publisher",
            ["services.outbox_publisher", "--context", "vibespro"],
            logs,
            FERRY_TRACES_FILE=str(tmp_path / "traces" / "publisher.jsonl"),
            **tracing,
        ),
        "inbox-consumer": _start(
            env,
            "inbox-consumer",
            ["services.inbox_consumer", "--durable", DURABLE],
            logs,
            FERRY_HEALTH_PORT=str(consumer_health),
            FERRY_TRACES_FILE=str(tmp_path / "traces" / "consumer.jsonl"),
            **tracing,
        ),
        "dlq-replayer": _start(env, "dlq-replayer", ["services.dlq_replayer"], logs),
        "console": _start(
            env,
            "console",
            ["services.console"],
            logs,
            role=f"console-{env.topology.name}",
            FERRY_CONSOLE_PORT=str(console_port),
            FERRY_CONSOLE_ACCOUNTS_FILE=str(accounts),
            FERRY_CONSOLE_TOKEN_FILE=str(tmp_path / "token"),
            FERRY_CONSOLE_SAMPLE_INTERVAL="2",
            FERRY_CONSOLE_JAEGER_URL="http://jaeger.example:16686",
            FERRY_TRACE_URL="http://traces.example/ui/trace/{trace_id}?from=console",
            FERRY_CONSOLE_ROLE_HEALTH=json.dumps(
                {
                    f"inbox-consumer-{DURABLE}": f"http://127.0.0.1:{consumer_health}/healthz",
                    f"inbox-consumer-{OTHER}": f"http://127.0.0.1:{nobody}/healthz",
                }
            ),
            FERRY_CONSOLE_SPANS_GLOB=str(tmp_path / "traces" / "*.jsonl"),
            FERRY_KPI_REPORT_DIR=str(tmp_path / "kpi"),
        ),
    }
    url = f"http://127.0.0.1:{console_port}"
    world = Stack(env, url, console_port, procs, logs, kpi_run=kpi_run)
    try:
        await wait_ready(f"{url}/readyz", procs["console"], "console")
        world.fixed_at = datetime.now(UTC) + timedelta(seconds=FIX_AFTER)
        until = world.fixed_at.isoformat()
        world.fine = [await record(env, correlation=world.correlation) for _ in range(8)]
        world.fixable = [await record(env, {"reject_until": until}) for _ in range(5)]
        world.poison = [await record(env, {"poison": True}) for _ in range(2)]

        async def dead_lettered() -> bool:
            return len(await dead_letter_statuses(env)) == 7

        await eventually(dead_lettered, timeout=60, what="7 dead letters", interval=0.3)
        yield world
    finally:
        for proc in procs.values():
            await _stop(proc)
