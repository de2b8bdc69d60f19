"""One validator: the handler refuses exactly the payloads the inbox-consumer dead-letters,
with the same reason code (``SCHEMA_INVALID``) and the same words, for every keyword of
JSON Schema 2020-12 the manifests may use (not a subset)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.handlers.service import HandlerService, build_service
from services.handlers.specs import service_spec
from shared.contracts.events import AcceptedEvents, accepted_events
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology
from shared.domain.errors import PoisonError
from tests.conftest import ROOT

KEY = ("vibe_created", 1)
DURABLE = "sea__from_vibespro"
#: vibe_created.v1 as a team might tighten it: every keyword the old subset refused.
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["vibe_id", "title"],
    "additionalProperties": False,
    "properties": {
        "vibe_id": {"type": "string", "format": "uuid"},
        "title": {"type": "string", "enum": ["first", "second"]},
        "rank": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
        "when": {"type": "string", "format": "date-time"},
    },
}


def _topology() -> Topology:
    topology = load_topology(ROOT / "topologies" / "sea-vibespro.yaml")
    events = [
        e.model_copy(update={"payload_schema": SCHEMA}) if (e.type, e.version) == KEY else e
        for e in topology.events
    ]
    return topology.model_copy(update={"events": events})


TOPOLOGY = _topology()
#: The consumer's view (what services.inbox_consumer checks before calling the handler).
CONSUMER = accepted_events(TOPOLOGY, DURABLE)
#: The handler's (no call reaches the database here, so no pool is needed).
HANDLER: HandlerService = build_service(
    service_spec("sea"), pool=cast(Any, None), topology=TOPOLOGY
)


def handler_verdict(payload: object) -> str | None:
    """None if the handler accepts ``payload``, else its reason code and detail."""
    try:
        HANDLER.check_payload(KEY, payload)
    except PoisonError as exc:
        return f"{exc.reason_code}: {exc.detail}"
    return None


def consumer_verdict(payload: object) -> str | None:
    """None if the consumer accepts ``payload``, else the dead letter's reason and detail
    (the reason is services/inbox_consumer/deciding.py's for a failing payload)."""
    assert isinstance(CONSUMER, AcceptedEvents)
    problem = CONSUMER.payload_error(KEY, payload)
    return None if problem is None else f"SCHEMA_INVALID: {problem}"


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"vibe_id": "v", "title": "third"}, "payload.title"),  # enum
        ({"vibe_id": "v", "title": "first", "rank": -1}, "payload.rank"),  # minimum
        ({"vibe_id": "v", "title": "first", "tags": ["a", 2]}, "payload.tags[1]"),  # items
        ({"vibe_id": "v", "title": "first", "colour": "red"}, "colour"),  # additionalProperties
        ({"title": "first"}, "payload.vibe_id: required property is missing"),
    ],
)
def test_keywords_the_old_subset_refused_are_enforced_like_the_consumer(
    payload: dict[str, Any], where: str
) -> None:
    verdict = handler_verdict(payload)
    assert verdict is not None and verdict.startswith("SCHEMA_INVALID: vibe_created.v1: ")
    assert where in verdict
    assert verdict == consumer_verdict(payload)


def test_format_is_an_annotation_on_both_sides() -> None:
    # Draft 2020-12 does not assert "format" by default; neither side does, so a payload
    # the consumer passes on is never refused by the handler for its format.
    payload = {"vibe_id": "not-a-uuid", "title": "first", "when": "yesterday"}
    assert handler_verdict(payload) is None and consumer_verdict(payload) is None


def test_a_valid_payload_passes_both() -> None:
    payload = {"vibe_id": "v", "title": "second", "rank": 0, "tags": [], "when": "2026-01-01"}
    assert handler_verdict(payload) is None and consumer_verdict(payload) is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
FIELDS = {
    "vibe_id": st.text(max_size=6) | JSON,
    "title": st.sampled_from(["first", "second", "third"]) | JSON,
    "rank": st.integers(-2, 2) | st.floats(-1, 1) | JSON,
    "tags": st.lists(st.text(max_size=3) | JSON, max_size=3) | JSON,
    "when": st.sampled_from(["2026-11-26T10:00:00Z", "tomorrow"]) | JSON,
    "colour": JSON,
}
PAYLOADS = st.fixed_dictionaries({}, optional=FIELDS) | JSON


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(PAYLOADS)
def test_handler_and_consumer_agree_on_every_payload(payload: object) -> None:
    assert handler_verdict(payload) == consumer_verdict(payload)
