"""``/metrics`` of every role, as real processes, after a known workload.

Every value is counted against an independent record: the outbox, inbox and dead-letter
tables, the handler service's own call ledger (``handler_calls``), and JetStream's view
of the durable. The workload (vibespro → sea, real handler service with its fault
directives): plain events, events answered 503 once, poison (422), one event that fails
every delivery (→ dlq-router), and one duplicate delivery.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterable
from typing import Any

import aiohttp
import asyncpg
import pytest
import yaml
from nats.aio.client import Client as NATS
from prometheus_client.parser import text_string_to_metric_families

from devstack.ports import free_port
from services.inbox_consumer.consumer import build_consumer
from services.inbox_consumer.dispatch import HttpHandler
from services.inbox_consumer.metrics import ConsumerMetrics
from services.outbox_publisher.metrics import PublisherMetrics
from shared.access.streams import provision
from shared.adapters import inbox, outbox
from shared.adapters.producer import record_event
from shared.domain.ack import RetryPolicy
from shared.runtime.metrics import RoleMetrics
from tests.conftest import CAPS, ROOT, Env
from tests.consumer.conftest import DURABLE, STREAM
from tests.helpers import eventually, stream_messages

from .conftest import Roles, get, metric_value, wait_ready

pytestmark = pytest.mark.integration

ALERT_RULES = ROOT / "k8s" / "base" / "alerts" / "ferry-alerts.rules.yaml"
PLAIN, RETRIED, POISON = 12, 3, 2
EXHAUSTED = 1
TOTAL = PLAIN + RETRIED + POISON + EXHAUSTED


async def _record(conn: asyncpg.Connection, faults: dict[str, Any] | None) -> str:
    payload: dict[str, Any] = {"vibe_id": f"v-{uuid.uuid4().hex[:6]}", "title": "t"}
    if faults:
        payload["_ferry_test"] = faults
    async with conn.transaction():
        event_id = await record_event(
            conn,
            aggregate_type="vibe",
            aggregate_id=payload["vibe_id"],
            event_type="vibe_created",
            payload=payload,
            context="vibespro",
        )
    return str(event_id)


async def workload(env: Env) -> None:
    conn = await asyncpg.connect(env.dsn("vibespro"))
    try:
        for faults in (
            [None] * PLAIN
            + [{"fail_attempts": 1}] * RETRIED
            + [{"poison": True}] * POISON
            + [{"fail_attempts": 99}] * EXHAUSTED
        ):
            await _record(conn, faults)
    finally:
        await conn.close()


async def scrape(session: aiohttp.ClientSession, port: int) -> str:
    status, text = await get(session, f"http://127.0.0.1:{port}/metrics")
    assert status == 200, f"/metrics on {port}: {status}"
    return text


async def fetchval(dsn: str, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


@pytest.fixture
async def world(env: Env, nc: NATS) -> Env:
    """sea__from_vibespro on test clocks, calling the real sea handler, operator replays."""
    env.handler_port = free_port()  # type: ignore[attr-defined]
    env.doc["durables"][DURABLE].update(
        # Generous clocks: a slow machine must not turn an answer into a timeout.
        ack_wait="30s",
        max_deliver=4,
        backoff=["200ms", "200ms", "200ms"],
        handler={"url": f"http://127.0.0.1:{env.handler_port}/handle", "timeout": "10s"},  # type: ignore[attr-defined]
        replay="operator",  # nothing replays on its own while the test counts
    )
    env.write()
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    return env


async def test_every_role_exposes_its_series_with_the_values_of_a_known_workload(
    world: Env, nc: NATS, roles: Roles
) -> None:
    env = world
    ports = {
        name: free_port() for name in ("publisher", "consumer", "router", "replayer", "retention")
    }
    fast = {"FERRY_METRICS_REFRESH_INTERVAL": "0", "FERRY_FETCH_TIMEOUT": "0.2"}
    handler_port = env.handler_port  # type: ignore[attr-defined]
    procs = {
        "handler": roles.start(
            "handler", ["services.handlers", "--service", "sea", "--port", str(handler_port)],
            FERRY_HANDLER_FAULT_INJECTION="true",  # the workload's _ferry_test directives
        ),
        "publisher": roles.start(
            "publisher", ["services.outbox_publisher", "--context", "vibespro"],
            FERRY_HEALTH_PORT=str(ports["publisher"]), **fast,
        ),
        "consumer": roles.start(
            "consumer", ["services.inbox_consumer", "--durable", DURABLE],
            FERRY_HEALTH_PORT=str(ports["consumer"]), **fast,
        ),
        "router": roles.start(
            "router", ["services.dlq_router"], FERRY_HEALTH_PORT=str(ports["router"]), **fast
        ),
        "replayer": roles.start(
            "replayer", ["services.dlq_replayer"], FERRY_HEALTH_PORT=str(ports["replayer"]),
            FERRY_INTERVAL="0.2", **fast,
        ),
        # Purging every 2 s: its figures describe the tables as the workload left them.
        "retention": roles.start(
            "retention", ["shared.cli", "purge", "--every", "2s"],
            FERRY_HEALTH_PORT=str(ports["retention"]), **fast,
        ),
    }  # fmt: skip
    sea, vibespro = env.dsn("sea"), env.dsn("vibespro")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for name, port in {**ports, "handler": handler_port}.items():
            await wait_ready(session, port, procs[name], name)
        await workload(env)

        async def settled() -> bool:
            done = await fetchval(
                sea,
                "SELECT count(*) FROM inbox_messages WHERE durable = $1"
                " AND status IN ('processed', 'failed')",
                DURABLE,
            )
            return bool(done == TOTAL)

        await eventually(settled, timeout=60, what=f"{TOTAL} messages settled")
        # One duplicate delivery: a processed message again, under another Nats-Msg-Id.
        first = (await stream_messages(nc.jetstream(), STREAM))[0]
        await nc.jetstream().publish(
            first.subject, json_bytes(first.body), headers={"Nats-Msg-Id": "dup-1"}
        )

        async def quiet() -> bool:
            info = await nc.jetstream().consumer_info(STREAM, DURABLE)
            dups = await fetchval(sea, "SELECT sum(duplicates) FROM inbox_messages")
            return bool(info.num_pending == 0 and info.num_ack_pending == 0 and dups == 1)

        await eventually(quiet, timeout=30, what="the durable drained")
        claims = {"table": "handler_applied", "database": env.topology.contexts["sea"].database}

        async def measured() -> bool:  # a retention run since the handler claimed events
            text = await scrape(session, ports["retention"])
            return metric_value(text, "ferry_retention_oldest_row_age_seconds", **claims) > 0

        await eventually(measured, timeout=30, what="the retention role measured the claims")
        texts = {name: await scrape(session, port) for name, port in ports.items()}
        handler_text = await scrape(session, handler_port)

    await check_publisher(texts["publisher"], vibespro)
    await check_consumer(texts["consumer"], sea, nc)
    await check_dlq_roles(texts["router"], texts["replayer"], sea)
    calls = await fetchval(sea, "SELECT count(*) FROM handler_calls")
    assert metric_value(handler_text, "http_server_request_duration_seconds_count",
                        http_route="/handle", http_request_method="POST") == calls  # fmt: skip
    for text in (*texts.values(), handler_text):
        assert metric_value(text, "process_resident_memory_bytes") > 0
        assert metric_value(text, "ferry_role_info") == 1
    # The retention role measured the claims the workload left, against their policy.
    retention = texts["retention"]
    assert metric_value(retention, "ferry_retention_seconds", **claims) == 35 * 86400
    assert metric_value(retention, "ferry_retention_table_bytes", **claims) > 0
    check_alert_series(texts.values())


def check_alert_series(texts: Iterable[str]) -> None:
    """Every series the alert rules read is exposed, with the labels they group by."""
    exposed: dict[str, set[str]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                exposed.setdefault(sample.name, set()).update(sample.labels)
    rules = yaml.safe_load(ALERT_RULES.read_text())
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        names = set(re.findall(r"\b(ferry_[a-z_]+)\b", rule["expr"]))
        assert names, rule["alert"]
        grouped = {
            label.strip()
            for by in re.findall(r"by \(([^)]*)\)", rule["expr"])
            for label in by.split(",")
        } - {"namespace"}  # the scrape target's label
        for name in names:
            assert name in exposed, f"{rule['alert']} reads {name}, which no role exposes"
            assert grouped <= exposed[name], f"{rule['alert']}: {name} lacks {grouped}"


def json_bytes(body: dict[str, Any]) -> bytes:
    import json

    return json.dumps(body).encode()


async def check_publisher(text: str, dsn: str) -> None:
    published = await fetchval(
        dsn, "SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL"
    )
    assert published == TOTAL
    assert metric_value(text, "ferry_outbox_events_published_total",
                        context="vibespro", event_type="vibe_created") == published  # fmt: skip
    sent = {"messaging_system": "nats", "messaging_destination_name": STREAM}
    assert (
        metric_value(text, "messaging_client_sent_messages_total", error_type="", **sent)
        == published
    )
    assert (
        metric_value(text, "messaging_client_operation_duration_seconds_count", **sent) == published
    )
    # Every row was claimed in exactly one batch (none failed, none was claimed twice).
    batches = metric_value(text, "ferry_outbox_batch_rows_count", context="vibespro")
    assert metric_value(text, "ferry_outbox_batch_rows_sum", context="vibespro") == published
    assert 1 <= batches <= published
    assert metric_value(text, "ferry_outbox_backlog", context="vibespro") == 0
    assert metric_value(text, "ferry_outbox_oldest_age_seconds", context="vibespro") == 0
    assert metric_value(text, "ferry_ready", check="nats") == 1
    assert metric_value(text, "ferry_ready", check="postgres") == 1


async def check_consumer(text: str, dsn: str, nc: NATS) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        by_status = dict(await conn.fetch(
            "SELECT status, count(*) FROM inbox_messages WHERE durable = $1 GROUP BY status",
            DURABLE,
        ))  # fmt: skip
        calls = dict(await conn.fetch("SELECT status, count(*) FROM handler_calls GROUP BY status"))
        duplicates = await conn.fetchval("SELECT sum(duplicates) FROM inbox_messages")
        direct = await conn.fetchval("SELECT count(*) FROM dead_letters WHERE source = 'consumer'")
        backlog = await inbox.backlog(conn, DURABLE)
    finally:
        await conn.close()
    info = await nc.jetstream().consumer_info(STREAM, DURABLE)
    d = {"durable": DURABLE}

    def outcome(name: str) -> float:
        return metric_value(text, "ferry_consumer_messages_total", outcome=name, **d)

    assert outcome("processed") == by_status["processed"] == PLAIN + RETRIED
    assert outcome("duplicate") == duplicates == 1
    assert outcome("dead_lettered") == direct == POISON
    assert outcome("exhausted") == EXHAUSTED
    # Every 503 was a retry except the last delivery of the exhausted one.
    assert outcome("retried") == calls[503] - EXHAUSTED
    assert (
        metric_value(text, "ferry_consumer_retries_total", reason="HTTP_503", **d)
        == calls[503] - EXHAUSTED
    )
    for status, count in calls.items():
        assert metric_value(text, "ferry_handler_responses_total", status=str(status), **d) == count
    assert metric_value(text, "messaging_process_duration_seconds_count",
                        messaging_consumer_group_name=DURABLE) == sum(calls.values())  # fmt: skip
    assert (
        metric_value(text, "ferry_end_to_end_latency_seconds_count", **d) == by_status["processed"]
    )
    assert metric_value(text, "ferry_dead_letters_total", reason="HANDLER_REJECTED",
                        source="consumer", **d) == POISON  # fmt: skip
    consumed = metric_value(
        text, "messaging_client_consumed_messages_total", messaging_consumer_group_name=DURABLE
    )
    assert consumed == info.delivered.consumer_seq
    # Each delivery was handed over in exactly one batch.
    assert metric_value(text, "ferry_consumer_batch_messages_sum", **d) == consumed
    assert 1 <= metric_value(text, "ferry_consumer_batch_messages_count", **d) <= consumed
    # QRY-051, split by state; the lag is JetStream's pending + ack pending.
    assert metric_value(text, "ferry_inbox_backlog", **d) == backlog["count"] == POISON + EXHAUSTED
    assert metric_value(text, "ferry_inbox_backlog", state="failed", **d) == backlog["failed"]
    assert metric_value(text, "ferry_consumer_lag_messages", **d) == 0
    assert metric_value(text, "ferry_consumer_lag_seconds", **d) == 0
    assert metric_value(text, "ferry_consumer_bound", **d) == 1
    ratio = (outcome("processed") + outcome("duplicate")) / sum(
        outcome(o) for o in ("processed", "duplicate", "retried", "dead_lettered", "exhausted")
    )
    assert 0 < ratio < 1


async def check_dlq_roles(router: str, replayer: str, dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT source, reason_code, status FROM dead_letters")
    finally:
        await conn.close()
    advisory = [r for r in rows if r["source"] == "advisory:max_deliveries"]
    assert len(advisory) == EXHAUSTED
    assert metric_value(router, "ferry_dead_letters_total", durable=DURABLE,
                        reason="MAX_DELIVERIES_EXCEEDED",
                        source="advisory:max_deliveries") == len(advisory)  # fmt: skip
    assert metric_value(router, "ferry_dlq_router_advisories_total", outcome="recorded") == 1
    # The poison messages were terminated: their advisories find the record already there.
    assert metric_value(router, "ferry_dlq_router_advisories_total", outcome="already") == POISON
    held = sum(1 for r in rows if r["status"] == "held")
    assert held == len(rows) == POISON + EXHAUSTED
    assert (
        metric_value(replayer, "ferry_dead_letters_current", durable=DURABLE, status="held") == held
    )
    assert metric_value(replayer, "ferry_dead_letters_oldest_age_seconds", durable=DURABLE) > 0
    assert metric_value(replayer, "ferry_dlq_replayer_events_total", kind="scan") > 0


async def test_backlog_and_lag_gauges_follow_the_outbox_and_the_stream(
    world: Env, nc: NATS
) -> None:
    """Nothing publishing or consuming: QRY-050 and the durable's lag show the waiting work."""
    env = world
    conn = await asyncpg.connect(env.dsn("vibespro"))
    pool = await asyncpg.create_pool(env.dsn("vibespro"), min_size=1, max_size=2)
    sea_pool = await asyncpg.create_pool(env.dsn("sea"), min_size=1, max_size=2)
    try:
        for _ in range(3):
            await _record(conn, None)
        role = RoleMetrics("outbox-publisher", refresh_interval=0)
        PublisherMetrics(role, context="vibespro", stream=STREAM).watch_outbox(pool)
        text = (await role.render())[0].decode()
        expected = await outbox.backlog(conn)
        assert (
            metric_value(text, "ferry_outbox_backlog", context="vibespro") == expected["count"] == 3
        )
        assert metric_value(text, "ferry_outbox_oldest_age_seconds", context="vibespro") > 0
        # Five events in the stream, none consumed yet.
        for _ in range(5):
            await nc.jetstream().publish("vibespro.event.vibe_created.v1", b"{}")
        await asyncio.sleep(0.05)
        spec = env.topology.durables[DURABLE]
        http = HttpHandler(spec.handler.url, timeout=1.0, connections=1)
        role = RoleMetrics("inbox-consumer", refresh_interval=0)
        build_consumer(
            pool=sea_pool, js=nc.jetstream(), durable=DURABLE, spec=spec, handler=http,
            owner="test", concurrency=1, lease_seconds=5, policy=RetryPolicy((0.2,), 4, 5.0),
            accepted=None, metrics=ConsumerMetrics(role, durable=DURABLE, stream=STREAM),
        )  # fmt: skip
        text = (await role.render())[0].decode()
        await http.close()
        info = await nc.jetstream().consumer_info(STREAM, DURABLE)
        lag = info.num_pending + info.num_ack_pending
        assert metric_value(text, "ferry_consumer_lag_messages", durable=DURABLE) == lag == 5
        assert metric_value(text, "ferry_consumer_pending_messages", durable=DURABLE,
                            state="pending") == info.num_pending  # fmt: skip
        assert metric_value(text, "ferry_consumer_lag_seconds", durable=DURABLE) > 0
        assert metric_value(text, "ferry_metrics_refresh_errors_total") == 0
    finally:
        await conn.close()
        await pool.close()
        await sea_pool.close()
