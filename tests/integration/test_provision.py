"""Provisioning is idempotent, detects drift, applies what it may and refuses the rest loudly."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NATS

from shared.access.streams import is_clean, provision
from tests.conftest import CAPS, Env

pytestmark = pytest.mark.integration


def _actions(changes: list) -> dict[str, str]:  # type: ignore[type-arg]
    return {c.name: c.action for c in changes}


async def test_first_run_creates_second_is_a_no_op(env: Env, nc: NATS) -> None:
    js = nc.jetstream()
    first = await provision(js, env.topology, caps=CAPS)
    assert set(_actions(first).values()) == {"created"}
    assert set(_actions(first)) == {
        "SEA_EVENTS",
        "VIBESPRO_EVENTS",
        "SEA_DLQ",
        "VIBESPRO_DLQ",
        "sea__from_vibespro",
        "vibespro__from_sea",
        "SEA_VIBESPRO_ADVISORIES",
        "dlq_router",
    }
    second = await provision(js, env.topology, caps=CAPS)
    assert set(_actions(second).values()) == {"unchanged"}
    info = await js.stream_info("SEA_EVENTS")
    assert info.config.max_age == pytest.approx(7 * 86400)
    assert info.config.duplicate_window == pytest.approx(120)
    consumer = await js.consumer_info("VIBESPRO_EVENTS", "sea__from_vibespro")
    declared = env.topology.durables["sea__from_vibespro"]
    assert declared.max_ack_pending == 400  # as topologies/sea-vibespro.yaml ships it
    assert (
        consumer.config.ack_wait,
        consumer.config.max_deliver,
        consumer.config.max_ack_pending,
    ) == (pytest.approx(120), 20, declared.max_ack_pending)
    # Replays reach only the durable that failed: its own subject, inside its stream.
    assert (
        "ferry.replay.VIBESPRO_EVENTS.*"
        in (await js.stream_info("VIBESPRO_EVENTS")).config.subjects
    )
    assert consumer.config.filter_subjects == [
        "vibespro.event.>",
        "ferry.replay.VIBESPRO_EVENTS.sea__from_vibespro",
    ]
    advisories = await js.stream_info("SEA_VIBESPRO_ADVISORIES")
    assert "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.SEA_EVENTS.vibespro__from_sea" in (
        advisories.config.subjects
    )
    dlq = await js.stream_info("SEA_DLQ")
    assert str(getattr(dlq.config.retention, "value", dlq.config.retention)) == "limits"
    assert dlq.config.duplicate_window == pytest.approx(86400)


async def test_changed_consumer_is_reported_then_applied(env: Env, nc: NATS) -> None:
    js = nc.jetstream()
    await provision(js, env.topology, caps=CAPS)
    env.doc["durables"]["sea__from_vibespro"]["ack_wait"] = "90s"
    env.doc["durables"]["sea__from_vibespro"]["max_deliver"] = 7
    env.write()
    check = await provision(js, env.topology, apply=False, caps=CAPS)
    drift = next(c for c in check if c.name == "sea__from_vibespro")
    assert drift.action == "drift"
    assert drift.diffs["ack_wait"] == (120.0, 90.0) and drift.diffs["max_deliver"] == (20, 7)
    assert not is_clean(check)
    applied = await provision(js, env.topology, caps=CAPS)
    assert _actions(applied)["sea__from_vibespro"] == "updated"
    consumer = await js.consumer_info("VIBESPRO_EVENTS", "sea__from_vibespro")
    assert consumer.config.max_deliver == 7
    assert is_clean(await provision(js, env.topology, apply=False, caps=CAPS))


async def test_immutable_change_is_refused_not_ignored(env: Env, nc: NATS) -> None:
    js = nc.jetstream()
    await provision(js, env.topology, caps=CAPS)
    env.doc["contexts"]["sea"]["stream"]["storage"] = "memory"
    env.write()
    changes = await provision(js, env.topology, caps=CAPS)
    refused = next(c for c in changes if c.name == "SEA_EVENTS")
    assert refused.action == "refused" and "storage" in (refused.error or "")
    assert not is_clean(changes)
    assert (await js.stream_info("SEA_EVENTS")).config.storage == "file"


async def test_changed_stream_limit_is_applied(env: Env, nc: NATS) -> None:
    js = nc.jetstream()
    await provision(js, env.topology, caps=CAPS)
    env.doc["contexts"]["sea"]["stream"]["max_age"] = "3d"
    env.write()
    changes = await provision(js, env.topology, caps=CAPS)
    assert _actions(changes)["SEA_EVENTS"] == "updated"
    assert (await js.stream_info("SEA_EVENTS")).config.max_age == pytest.approx(3 * 86400)
