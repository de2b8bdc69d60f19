"""Versions and payload validation end to end, on real servers with the real role processes.

vibe_created v1 and v2 travel side by side through outbox → publisher → JetStream →
consumer → SEA's handler service, each applied by its own route. A payload failing its
schema is refused by the producer API (nothing written); one that reaches the stream
anyway (written by a producer in another language) is dead-lettered by the consumer with
the validation error, without calling the handler. Every role refuses to start on a lint
finding.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import aiohttp
import asyncpg
import pytest
import yaml
from nats.aio.client import Client as NATS

from devstack.ports import free_port
from shared.access.streams import provision
from shared.adapters.producer import record_event
from shared.domain.errors import OutboxValidationError
from tests.conftest import CAPS, ROOT, Env
from tests.helpers import eventually, stream_messages

from .conftest import SEA_VIBESPRO, shipped

pytestmark = pytest.mark.integration

DURABLE = "sea__from_vibespro"
PER_VERSION = 15
BAD_DETAIL = "vibe_created.v2: payload.owner_id: required property is missing"


@contextmanager
def _role(env: Env, name: str, args: list[str], **extra: str) -> Iterator[subprocess.Popen[bytes]]:
    with open(env.tmp_path / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(
            argv := [sys.executable, "-m", *args], cwd=ROOT,
            env=env.settings_env(command=argv, **extra),
            stdout=log, stderr=log,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@asynccontextmanager
async def _connect(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def _produce(vibespro: asyncpg.Connection) -> dict[str, int]:
    """Good v1 and v2 events through the producer API; id → version."""
    produced: dict[str, int] = {}
    for n in range(PER_VERSION):
        async with vibespro.transaction():
            v1 = await record_event(
                vibespro, aggregate_type="vibe", aggregate_id=f"a{n}", event_type="vibe_created",
                payload={"vibe_id": f"a{n}", "title": f"first {n}"},
            )  # fmt: skip
            v2 = await record_event(
                vibespro, aggregate_type="vibe", aggregate_id=f"b{n}", event_type="vibe_created",
                event_version=2, payload={"vibe_id": f"b{n}", "title": f"second {n}",
                                          "owner_id": f"u{n}"},
            )  # fmt: skip
        produced[str(v1)], produced[str(v2)] = 1, 2
    return produced


async def _producer_refuses(vibespro: asyncpg.Connection) -> None:
    await vibespro.execute("CREATE TABLE vibes (id TEXT PRIMARY KEY)")
    before = await vibespro.fetchval("SELECT count(*) FROM outbox_events")
    with pytest.raises(OutboxValidationError) as refused:
        async with vibespro.transaction():
            await vibespro.execute("INSERT INTO vibes VALUES ('c1')")
            await record_event(
                vibespro, aggregate_type="vibe", aggregate_id="c1", event_type="vibe_created",
                event_version=2, payload={"vibe_id": "c1", "title": "no owner"},
            )  # fmt: skip
    assert str(refused.value) == (
        "SCHEMA_INVALID: payload: vibe_created.v2 of context vibespro: payload.owner_id: "
        "required property is missing"
    )
    assert (refused.value.code, refused.value.field) == ("SCHEMA_INVALID", "payload")
    assert await vibespro.fetchval("SELECT count(*) FROM outbox_events") == before
    assert await vibespro.fetchval("SELECT count(*) FROM vibes") == 0, "the caller's txn aborts"


async def _insert_raw_invalid(vibespro: asyncpg.Connection) -> str:
    """What a producer in another language could write: v2 without owner_id."""
    bad = uuid.uuid4()
    await vibespro.execute(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version,"
        " payload) VALUES ($1, 'vibe', 'z1', 'vibe_created', 2, $2::jsonb)",
        bad,
        '{"vibe_id": "z1", "title": "raw"}',
    )
    return str(bad)


async def _wait_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:

        async def ready() -> bool:
            assert proc.poll() is None, f"handler exited with {proc.returncode}"
            try:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await eventually(ready, timeout=30, what="sea handler ready")


async def test_v1_and_v2_side_by_side_and_invalid_payloads_at_both_ends(env: Env, nc: NATS) -> None:
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    async with _connect(env.dsn("vibespro")) as vibespro, _connect(env.dsn("sea")) as sea:
        await _producer_refuses(vibespro)
        produced = await _produce(vibespro)
        bad = await _insert_raw_invalid(vibespro)
        port = free_port()
        handler = ["services.handlers", "--service", "sea", "--port", str(port)]
        with _role(env, "handler", handler) as h:
            await _wait_ready(port, h)
            consumer_env = {
                "FERRY_DURABLE": DURABLE, "FERRY_FETCH_TIMEOUT": "0.2",
                "FERRY_HANDLER_URL": f"http://127.0.0.1:{port}/handle",
            }  # fmt: skip
            with (
                _role(env, "consumer", ["services.inbox_consumer"], **consumer_env),
                _role(env, "publisher", ["services.outbox_publisher", "--context", "vibespro"],
                      FERRY_POLL_INTERVAL="0.2"),
            ):  # fmt: skip

                async def settled() -> bool:
                    done = await sea.fetchval(
                        "SELECT count(*) FROM inbox_messages WHERE durable = $1"
                        " AND status IN ('processed', 'failed')",
                        DURABLE,
                    )
                    return int(done) == len(produced) + 1

                await eventually(settled, timeout=90, what="every event settled in SEA's inbox")
        rows = {
            str(r["message_id"]): r
            for r in await sea.fetch("SELECT * FROM inbox_messages WHERE durable = $1", DURABLE)
        }
        vibes = {r["vibe_id"]: r for r in await sea.fetch("SELECT * FROM handler_sea_vibes")}
        calls = await sea.fetch("SELECT message_id, status FROM handler_calls")

    good = {mid: v for mid, v in produced.items()}
    assert {mid: (r["status"], r["event_version"]) for mid, r in rows.items() if mid != bad} == {
        mid: ("processed", version) for mid, version in good.items()
    }
    # Each version went to its own route: v1 stores no owner, v2 stores the owner.
    assert {k: (r["version"], r["owner_id"]) for k, r in vibes.items()} == {
        **{f"a{n}": (1, None) for n in range(PER_VERSION)},
        **{f"b{n}": (2, f"u{n}") for n in range(PER_VERSION)},
    }
    assert sorted(str(c["message_id"]) for c in calls if c["status"] == 200) == sorted(good)
    # The invalid payload: dead-lettered with the validation error, handler never called.
    failed = rows[bad]
    assert (failed["status"], failed["reason_code"]) == ("failed", "SCHEMA_INVALID")
    assert failed["last_error"] == BAD_DETAIL
    assert bad not in {str(c["message_id"]) for c in calls}
    records = [m.body for m in await stream_messages(nc.jetstream(), "SEA_DLQ")]
    assert [(r["message_id"], r["reasonCode"], r["lastError"]) for r in records] == [
        (bad, "SCHEMA_INVALID", BAD_DETAIL)
    ]
    assert records[0]["payload"]["payload"] == {"vibe_id": "z1", "title": "raw"}


ROLES = {
    "outbox-publisher": ["services.outbox_publisher", "--context", "sea"],
    "inbox-consumer": ["services.inbox_consumer", "--durable", DURABLE],
    "handler": ["services.handlers", "--service", "sea"],
    "dlq-router": ["services.dlq_router"],
    "dlq-replayer": ["services.dlq_replayer"],
}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_role_refuses_to_start_on_a_lint_finding(tmp_path: Path, role: str) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["contexts"]["sea"]["inbox_retention"] = "1d"
    path = tmp_path / "sea-vibespro.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(FERRY_TOPOLOGY=str(path), PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-m", *ROLES[role]], cwd=ROOT, env=env, capture_output=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    finding = (
        f"{path}: contexts.sea.inbox_retention: 1d is shorter than the replay horizon of "
        "durable sea__from_vibespro (30d 6h 25m 12s): a copy arriving after its inbox row is "
        "purged would be processed twice [inbox-retention]"
    )
    assert finding in result.stderr.decode()


@pytest.mark.parametrize(
    ("role", "started"),
    [
        ("dlq-router", "routing advisories of sea-vibespro"),
        ("dlq-replayer", "replaying dead letters of sea-vibespro"),
    ],
)
async def test_roles_start_on_a_clean_topology(env: Env, nc: NATS, role: str, started: str) -> None:
    """The passing case (the publisher, consumer and handler start in the test above)."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    log = env.tmp_path / f"{role}.log"
    with _role(env, role, ROLES[role]) as proc:

        async def running() -> bool:
            assert proc.poll() is None, log.read_text()
            return started in log.read_text()

        await eventually(running, timeout=30, what=f"{role} running")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0
