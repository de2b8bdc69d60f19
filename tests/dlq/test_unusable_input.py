"""No advisory or dead-letter row, however odd, ends the dlq-router or the dlq-replayer.

Advisory.parse is a boundary that parses: for any bytes it returns an Advisory or raises
InvalidAdvisory (property-based). On real servers, the router meets unusable advisories
beside a real one — it terminates and counts each unusable one and records the real
dead letter; the replayer meets a dead letter with nothing to replay and parks it for an
operator instead of retrying it on every scan.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS

from services.dlq_router.advisory import (
    MAX_DELIVER_TYPE,
    TERMINATED_TYPE,
    Advisory,
    InvalidAdvisory,
)
from tests.conftest import Env
from tests.consumer.conftest import DURABLE, STREAM, RunningConsumer, ScriptedHandler, envelope
from tests.consumer.conftest import publish as publish_event
from tests.dlq.support import Roles, dead_letter_rows, rows, status_of, true
from tests.helpers import eventually

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from([MAX_DELIVER_TYPE, TERMINATED_TYPE]) | json_values,
        "stream": st.text() | json_values,
        "consumer": st.text() | json_values,
        "stream_seq": st.integers() | json_values,
        "deliveries": st.integers() | json_values,
        "reason": json_values,
    },
)


def _parse(data: bytes) -> None:
    try:
        advisory = Advisory.parse(data)
    except InvalidAdvisory as exc:
        assert str(exc)  # says what is wrong
        return
    assert advisory.stream and advisory.durable and advisory.stream_seq >= 1
    assert advisory.kind in ("max_deliveries", "terminated") and advisory.deliveries >= 0


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_parse_or_raise_invalid_advisory(data: bytes) -> None:
    _parse(data)


@settings(max_examples=400, deadline=None)
@given(fields)
def test_any_advisory_shaped_json_parses_or_raises_invalid_advisory(doc: dict[str, Any]) -> None:
    _parse(json.dumps(doc).encode())


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 100_000,  # nested past the parser's recursion limit
        b'{"type": "' + MAX_DELIVER_TYPE.encode() + b'", "stream_seq": ' + b"9" * 5000 + b"}",
        b'{"type": "' + MAX_DELIVER_TYPE.encode() + b'", "stream": "S", "consumer": "d", '
        b'"stream_seq": 1e999}',
        b'{"type": "' + TERMINATED_TYPE.encode() + b'", "stream": "S", "consumer": "d", '
        b'"stream_seq": 0}',
        b"\xff\xfe",
    ],
    ids=["deep", "huge-int", "inf", "zero-seq", "not-utf8"],
)
def test_known_hostile_advisories_raise_invalid_advisory(data: bytes) -> None:
    with pytest.raises(InvalidAdvisory):
        Advisory.parse(data)


def test_a_well_formed_advisory_parses() -> None:
    doc = {
        "type": MAX_DELIVER_TYPE,
        "stream": STREAM,
        "consumer": DURABLE,
        "stream_seq": 7,
        "deliveries": 4,
    }
    advisory = Advisory.parse(json.dumps(doc).encode())
    assert (advisory.kind, advisory.stream, advisory.durable) == ("max_deliveries", STREAM, DURABLE)
    assert (advisory.stream_seq, advisory.deliveries) == (7, 4)


def _advisory_subject(kind: str, durable: str) -> str:
    return f"$JS.EVENT.ADVISORY.CONSUMER.{kind}.{STREAM}.{durable}"


@pytest.mark.integration
async def test_router_terminates_unusable_advisories_and_records_the_real_one(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    js = nc.jetstream()
    hostile = [
        b"not json",
        b"[" * 100_000,
        json.dumps(
            {
                "type": MAX_DELIVER_TYPE,
                "stream": STREAM,
                "consumer": "no_such_durable",
                "stream_seq": 1,
                "deliveries": 4,
            }
        ).encode(),
    ]
    for body in hostile:
        await js.publish(_advisory_subject("MAX_DELIVERIES", DURABLE), body)
    # An advisory for a sequence the stream never held (gone, or never there).
    gone = {
        "type": MAX_DELIVER_TYPE,
        "stream": STREAM,
        "consumer": DURABLE,
        "stream_seq": 999_999,
        "deliveries": 4,
    }
    await js.publish(_advisory_subject("MAX_DELIVERIES", DURABLE), json.dumps(gone).encode())
    event = envelope()
    handler.scripts[event.message_id] = [500] * 4
    async with RunningConsumer(world, nc, handler.url), Roles(world, js) as roles:
        router = roles.router()
        await publish_event(nc, event)
        await eventually(
            lambda: _status_is(world, event.message_id, "dead"), timeout=30, what="recorded"
        )
        await eventually(lambda: true(router.stats.invalid == 3), timeout=30, what="invalid")
        assert roles.alive()
    assert router.stats.recorded == 2  # the real failure, and the gone one (by surrogate id)
    stored = {str(r["message_id"]): r for r in await dead_letter_rows(world)}
    assert stored[event.message_id]["reason_code"] == "MAX_DELIVERIES_EXCEEDED"
    [gone_row] = [r for m, r in stored.items() if m != event.message_id]
    assert gone_row["stream_seq"] == 999_999 and "no longer in the stream" in gone_row["last_error"]
    info = await js.consumer_info(world.topology.advisory_stream, "dlq_router")
    assert info.num_ack_pending == 0 and info.num_pending == 0  # every advisory settled


@pytest.mark.integration
async def test_replayer_parks_a_dead_letter_with_nothing_to_replay(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    # The router recorded the gone message (no payload), under the automatic policy.
    js = nc.jetstream()
    gone = {
        "type": MAX_DELIVER_TYPE,
        "stream": STREAM,
        "consumer": DURABLE,
        "stream_seq": 424_242,
        "deliveries": 4,
    }
    await js.publish(_advisory_subject("MAX_DELIVERIES", DURABLE), json.dumps(gone).encode())
    async with Roles(world, js) as roles:
        router = roles.router()
        await eventually(lambda: true(router.stats.recorded == 1), timeout=30, what="recorded")
        [row] = await dead_letter_rows(world)
        assert row["status"] == "dead"
        await rows(world, "UPDATE dead_letters SET next_replay_at = now()")
        replayer = roles.replayer()
        await eventually(
            lambda: _status_is(world, str(row["message_id"]), "parked"), timeout=30, what="parked"
        )
        scans = replayer.stats.scans
        await eventually(lambda: true(replayer.stats.scans >= scans + 3), timeout=30, what="scans")
        assert roles.alive()
    assert replayer.stats.replayed == 0 and replayer.stats.parked == 1
    [action] = await rows(
        world,
        "SELECT action, actor FROM dead_letter_actions WHERE message_id = $1",
        uuid.UUID(str(row["message_id"])),
    )
    assert (action["action"], action["actor"]) == ("park", "dlq-replayer")


async def _status_is(env: Env, message_id: str, status: str) -> bool:
    return await status_of(env, message_id) == status
