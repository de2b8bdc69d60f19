"""How ``ferry handler-check`` judges answers, and what it builds and signs (no server)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.cli.handler_check import read_payloads
from shared.contracts.events import accepted_events
from shared.contracts.topology import Topology
from shared.domain.envelope import Envelope
from shared.domain.errors import ConfigurationError
from shared.domain.signing import SignatureError, verify
from shared.ops.handler_check_calls import AUTH_CHECKS, Probe, plan_for, signed_request
from shared.ops.handler_check_judge import EXPECTED, Answer, consumer_action, judge
from shared.ops.handler_check_send import _answer
from shared.runtime.settings import CommonSettings

CHECKS = sorted(EXPECTED)
SECRET = b"s3cret"


def topology() -> Topology:
    return CommonSettings(topology="topologies/sea-vibespro.yaml").load_topology()


def conforming(check: str, status: int, effect: bool | None) -> bool:
    """The contract, written out independently of the judge."""
    if effect and check != "normal":
        return False
    if check in AUTH_CHECKS:
        return status in (401, 403)
    if check == "normal":
        return 200 <= status < 300
    if check == "duplicate":
        return status == 409 or (200 <= status < 300 and effect is False)
    return status == 422


@given(st.sampled_from(CHECKS), st.integers(100, 599), st.sampled_from([None, True, False]))
def test_only_the_contracts_answer_conforms(check: str, status: int, effect: bool | None) -> None:
    verdict, why = judge(check, Answer(status), effect)
    if conforming(check, status, effect):
        assert verdict == "conforms" or (check == "normal" and effect is False), (verdict, why)
    elif check == "duplicate" and 200 <= status < 300 and effect is None:
        assert verdict == "unverified" and "--effect-sql" in why
    else:
        assert verdict == "breach" and why


@given(st.sampled_from(CHECKS), st.sampled_from(["timeout", "unreachable"]))
def test_no_answer_is_a_breach(check: str, failure: str) -> None:
    verdict, why = judge(check, Answer(None, "x", failure), None)
    assert verdict == "breach" and "max_deliver" in why


def test_the_consumers_action_is_named() -> None:
    durable = topology().durable("sea__from_vibespro")
    assert consumer_action(Answer(200), durable) == "ack it (processed)"
    assert consumer_action(Answer(409), durable) == "ack it (already_processed)"
    assert consumer_action(Answer(422), durable) == "dead-letter it as HANDLER_REJECTED"
    assert consumer_action(Answer(400), durable) == "dead-letter it as HANDLER_BAD_REQUEST"
    assert consumer_action(Answer(401), durable).startswith("hold the message")
    assert consumer_action(Answer(503), durable).startswith("retry it in 1s")
    assert consumer_action(Answer(None, "", "timeout"), durable).startswith("retry it")


def test_the_calls_are_built_as_the_consumer_builds_them() -> None:
    world = topology()
    plan = plan_for(world, "sea__from_vibespro")
    probes = [p for p in plan.probes() if isinstance(p, Probe)]
    assert [p.check for p in probes[:4]] == list(AUTH_CHECKS)
    accepted = accepted_events(world, "sea__from_vibespro")
    assert accepted is not None
    for probe in probes:
        envelope = Envelope.from_dict(probe.body)  # the consumer's own parser accepts it
        key = (envelope.event_type, envelope.event_version)
        assert probe.body["delivery"]["durable"] == "sea__from_vibespro"
        assert probe.body["messageId"] == probe.body["message_id"]
        valid = key in accepted and accepted.payload_error(key, envelope.payload) is None
        assert valid == (probe.check not in ("poison", "unknown-version", "unknown-type"))
    normal = next(p for p in probes if p.check == "normal")
    duplicate = probes[probes.index(normal) + 1]
    assert duplicate.check == "duplicate"
    assert duplicate.body["message_id"] == normal.body["message_id"]
    assert duplicate.body["delivery"]["attempt"] == 2
    ids = [p.body["message_id"] for p in probes if p.check != "duplicate"]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    ("signing", "error"),
    [
        ("valid", None),
        ("none", "unsigned"),
        ("wrong-secret", "does not match"),
        ("altered", "does not match"),
        ("expired", "stale"),
    ],
)
def test_each_signing_fails_verification_as_meant(signing: str, error: str | None) -> None:
    plan = plan_for(topology(), "sea__from_vibespro")
    normal = next(p for p in plan.probes() if isinstance(p, Probe) and p.check == "normal")
    probe = Probe("x", normal.event, normal.body, signing)  # type: ignore[arg-type]
    now = time.time()
    data, headers = signed_request(probe, SECRET, now, 3600)
    assert headers["Idempotency-Key"] == probe.body["message_id"]
    if error is None:
        assert (
            verify({"sea__from_vibespro": SECRET}, headers, data, now=now) == "sea__from_vibespro"
        )
        assert json.loads(data) == probe.body
        return
    with pytest.raises(SignatureError, match=error):
        verify({"sea__from_vibespro": SECRET}, headers, data, now=now)


def test_usage_errors_name_what_is_wrong(tmp_path: Path) -> None:
    world = topology()
    with pytest.raises(ConfigurationError, match="no durable 'nope'"):
        plan_for(world, "nope")
    with pytest.raises(ConfigurationError, match=r"does not accept model_published\.v1"):
        plan_for(world, "sea__from_vibespro", only=["model_published.v1"])
    with pytest.raises(ConfigurationError, match="schema refuses it"):
        plan_for(world, "sea__from_vibespro", payloads={"vibe_created.v1": {"title": "t"}})
    good = tmp_path / "p.json"
    good.write_text('{"vibe_id": "v", "title": "t"}')
    payloads = read_payloads([f"vibe_created.v1={good}"])
    plan = plan_for(world, "sea__from_vibespro", only=["vibe_created.v1"], payloads=payloads)
    normal = next(p for p in plan.probes() if isinstance(p, Probe) and p.check == "normal")
    assert normal.body["payload"] == {"vibe_id": "v", "title": "t"}
    for bad in ("vibe_created.v1", f"vibe_created.v1={tmp_path / 'missing.json'}"):
        with pytest.raises(ConfigurationError, match="--payload"):
            read_payloads([bad])


def test_answers_are_read_as_the_consumer_reads_them() -> None:
    durable = topology().durable("sea__from_vibespro")
    final = _answer(500, b'{"error": "bug", "retryable": false}', None)
    assert final.retryable is False
    action = consumer_action(final, durable)
    assert action == "dead-letter it as HANDLER_NOT_RETRYABLE"
    verdict, why = judge("poison", final, None, action)
    assert verdict == "breach" and "422" in why and "HANDLER_NOT_RETRYABLE" in why
    later = _answer(503, b"busy", "90")
    assert later.retry_after == 90 and later.retryable is None
    assert consumer_action(later, durable).startswith("retry it in 90s")
    assert _answer(200, b'{"retryable": false}', None).retryable is None  # only on 4xx/5xx
