"""The tutorial "Bring your own context" (docs/tutorial/own-context.md), end to end.

The team's files are examples/tutorial/ — a topology, manifests, a schema lock and a
registry outside Ferry's packages, and a FastAPI handler service written on the SDK. This
test runs the page's steps with real servers and real processes: the registry and the
generated models are up to date, ``ferry migrate`` and ``ferry provision`` on the team's
topology, the handler under uvicorn, the shop's outbox-publisher and billing's
inbox-consumer; an order placed from Python and one from plain SQL are invoiced; an
order of a blocked customer is rejected (422), dead-lettered, and replayed by an
operator once the customer is unblocked; ``ferry handler-check`` is green.

As on the dev stack in the tutorial, the team's processes run as the NATS admin and the
database superuser (the tutorial's laptop shortcut; the shipped topologies' roles each
have their own identity).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncpg
import pytest
import yaml

from devstack.nats import NatsServer
from devstack.ports import free_port
from devstack.postgres import PostgresServer, install_dir
from shared.access.identities import NATS_ADMIN
from tests.conftest import NATS_ACCESS, ROOT
from tests.helpers import eventually

pytestmark = pytest.mark.integration

TEAM = ROOT / "examples" / "tutorial"
DURABLE = "billing__from_shop"
SECRET = "tutorial-secret"
#: Every wait for the pipeline (publish, deliver, handle) is bounded by this.
PIPELINE_TIMEOUT = 30.0


@dataclass
class Team:
    """The tutorial team's world: its topology (databases renamed), its environment."""

    tmp: Path
    pg: PostgresServer
    topology: Path
    databases: dict[str, str]
    env: dict[str, str]

    def dsn(self, context: str) -> str:
        return self.databases[context]

    async def ferry(self, *args: str, check: bool = True) -> tuple[int, str]:
        """Run ``ferry ARGS`` in the team's directory; exit code and standard output."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "shared.cli", *args,
            cwd=TEAM, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert proc.returncode is not None
        if check:
            assert proc.returncode == 0, (
                f"ferry {' '.join(args)} exited {proc.returncode}:\n{out.decode()}{err.decode()}"
            )
        return proc.returncode, out.decode()


@pytest.fixture
async def team(tmp_path: Path, pg_server: PostgresServer, nats_server: NatsServer) -> Team:
    doc = yaml.safe_load((TEAM / "topologies/orders.yaml").read_text())
    prefix = "tut" + uuid.uuid4().hex[:8]
    databases = {}
    for name, ctx in doc["contexts"].items():
        ctx["database"] = f"{prefix}_{ctx['database']}"
        databases[name] = pg_server.dsn(ctx["database"])
    topology = tmp_path / "orders.yaml"
    topology.write_text(yaml.safe_dump(doc))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(NATS_ACCESS[nats_server.url].env(NATS_ADMIN))
    env.update(
        PYTHONPATH=f"{ROOT}{os.pathsep}{TEAM}",
        FERRY_NATS_URL=nats_server.url,
        FERRY_TOPOLOGY=str(topology),
        FERRY_REGISTRY=str(TEAM / "registry.json"),
        FERRY_DSN_TEMPLATE=pg_server.dsn("{database}"),
        FERRY_MAX_STREAM_REPLICAS="1",
        FERRY_MAX_STREAM_BYTES="64MB",
        FERRY_HANDLER_SECRET=SECRET,  # the consumer signs with it (and handler-check)
        FERRY_HANDLER_SECRETS=json.dumps({DURABLE: SECRET}),  # the handler verifies
        FERRY_FETCH_TIMEOUT="0.2",
        FERRY_INTERVAL="0.2",  # the dlq-replayer's scans (it settles replays as replayed)
        SHOP_DSN=databases["shop"],
        BILLING_DSN=databases["billing"],
    )
    return Team(tmp_path, pg_server, topology, databases, env)


@contextmanager
def processes(team: Team, commands: dict[str, list[str]]) -> Iterator[None]:
    """Start each command (in the team's directory), stop them all with SIGTERM."""
    procs = []
    try:
        for name, argv in commands.items():
            with open(team.tmp / f"{name}.log", "ab") as log:  # the child keeps its copy
                procs.append(subprocess.Popen(argv, cwd=TEAM, env=team.env, stdout=log, stderr=log))
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@asynccontextmanager
async def billing_db(team: Team) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(team.dsn("billing"))
    try:
        yield conn
    finally:
        await conn.close()


async def invoiced(conn: asyncpg.Connection, event_id: str) -> None:
    async def found() -> bool:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM invoices WHERE message_id = $1", uuid.UUID(event_id)
            )
        )

    await eventually(found, timeout=PIPELINE_TIMEOUT, what=f"the invoice of event {event_id}")


async def run(team: Team, *argv: str) -> str:
    """Run a command in the team's directory; its standard output."""
    done = await asyncio.to_thread(
        subprocess.run, list(argv), cwd=TEAM, env=team.env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"{argv} exited {done.returncode}: {done.stderr}"
    return done.stdout.strip()


async def test_a_team_brings_its_own_context_and_handler(team: Team) -> None:
    # 1. The team's registry and generated models are what its manifests say.
    await team.ferry(
        "registry", "check", "--manifests", "manifests", "--registry", "registry.json",
        "--topology", str(team.topology),
    )  # fmt: skip
    await team.ferry("handler-models", "billing", "--out", "billing/payloads.py", "--check")
    # 2. Its databases and streams, from its own topology and registry.
    await team.ferry("migrate")
    await team.ferry("provision")
    port = free_port()
    url = f"http://127.0.0.1:{port}/handle"
    team.env["FERRY_HANDLER_URL"] = url  # the topology says port 8300; the test's is free
    python = sys.executable
    with processes(
        team,
        {
            "billing-handler": [python, "-m", "uvicorn", "billing.app:app", "--port", str(port)],
            "publisher": [python, "-m", "services.outbox_publisher", "--context", "shop"],
            "consumer": [python, "-m", "services.inbox_consumer", "--durable", DURABLE],
            "dlq-router": [python, "-m", "services.dlq_router"],
            "dlq-replayer": [python, "-m", "services.dlq_replayer"],
        },
    ):
        await _wait_ready(team, port)
        async with billing_db(team) as billing:
            # 3. An order from Python, one from plain SQL: both invoiced once.
            from_python = await run(team, python, "produce.py", "c-1", "1200")
            psql = str(install_dir() / "bin" / "psql")
            from_sql = await run(
                team, psql, "-X", "-qtA", "-v", "ON_ERROR_STOP=1", "-v", "customer=c-2",
                "-v", "amount=1500", "-d", team.dsn("shop"), "-f", "produce.sql",
            )  # fmt: skip
            uuid.UUID(from_sql)
            await invoiced(billing, from_python)
            await invoiced(billing, from_sql)
            # The team's own FastAPI route beside /handle.
            order = await billing.fetchval(
                "SELECT order_id FROM invoices WHERE message_id = $1", uuid.UUID(from_sql)
            )
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}/invoices/{order}") as resp,
            ):
                assert resp.status == 200
                assert (await resp.json())["customer"] == "c-2"
            # 4. A blocked customer's order: 422, dead-lettered, replayed once unblocked.
            await billing.execute("INSERT INTO blocked_customers VALUES ('c-blocked')")
            poison = await run(team, python, "produce.py", "c-blocked", "900")
            await _dead_lettered(team, poison)
            _, listed = await team.ferry("dlq", "list", "--durable", DURABLE)
            line = next(row for row in listed.splitlines() if poison in row)
            assert "held" in line and "HANDLER_REJECTED" in line, listed  # replay: operator
            await billing.execute("DELETE FROM blocked_customers")
            await team.ferry("dlq", "replay", DURABLE, poison, "--reason", "customer unblocked")
            await invoiced(billing, poison)
            await _replayed(team, poison)
            assert await billing.fetchval("SELECT count(*) FROM invoices") == 3
        # 5. The handler keeps the contract.
        code, report = await team.ferry(
            "handler-check", url, "--durable", DURABLE,
            "--effect-sql", "SELECT count(*) FROM invoices", check=False,
        )  # fmt: skip
        print(report)  # shown with -s: the report the tutorial page quotes
        assert code == 0, report
        assert " 0 breach the contract, 0 unverified" in report


async def _wait_ready(team: Team, port: int) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:

        async def ready() -> bool:
            try:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        try:
            await eventually(ready, timeout=30, what="the billing handler ready")
        except AssertionError:
            raise AssertionError((team.tmp / "billing-handler.log").read_text()) from None


async def _dead_lettered(team: Team, event_id: str) -> None:
    async def listed() -> bool:
        _, out = await team.ferry("dlq", "list", "--durable", DURABLE, "--json", check=False)
        try:
            rows = json.loads(out)
        except ValueError:
            return False
        return any(
            row.get("message_id") == event_id and row.get("reason_code") == "HANDLER_REJECTED"
            for row in rows
        )

    await eventually(
        listed, timeout=PIPELINE_TIMEOUT, what=f"{event_id} dead-lettered", interval=0.5
    )


async def _replayed(team: Team, event_id: str) -> None:
    """``ferry where`` shows the replayed dead letter and the processed inbox row."""
    seen: list[str] = []

    async def settled() -> bool:
        _, out = await team.ferry("where", event_id, "--json")
        seen[:] = [out]
        (durable,) = json.loads(out)["durables"]
        return bool(
            durable["inbox"]["status"] == "processed"
            and durable["dead_letter"]["status"] == "replayed"
        )

    try:
        await eventually(settled, timeout=PIPELINE_TIMEOUT, what="the replay settled", interval=0.5)
    except AssertionError:
        raise AssertionError(seen) from None
