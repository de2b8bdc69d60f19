"""Subjects, durations, envelopes and topology files: clear errors for bad input."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared.contracts.loading import load_topology
from shared.contracts.topology import subject_matches
from shared.domain.durations import parse_duration, parse_size
from shared.domain.envelope import Envelope, payload_digest
from shared.domain.errors import ConfigurationError, OutboxValidationError, PoisonError
from shared.domain.subjects import event_subject, parse_subject

ROOT = Path(__file__).resolve().parents[2]


def test_subject_rule_round_trip() -> None:
    subject = event_subject("vibespro.event", "vibe_created", 2)
    assert str(subject) == "vibespro.event.vibe_created.v2"
    assert parse_subject("mediation.e_to_f.events.opportunity_scored.v1").namespace == (
        "mediation.e_to_f.events"
    )


@pytest.mark.parametrize(
    "subject",
    [
        "vibe_created.v1",
        "sea.event.VibeCreated.v1",
        "sea.event.vibe_created.1",
        "sea.event.vibe_created.v0",
        "sea.event.vibe-created.v1",
        "Sea.event.x.v1",
    ],
)
def test_bad_subjects_are_refused(subject: str) -> None:
    with pytest.raises(OutboxValidationError, match="INVALID_SUBJECT"):
        parse_subject(subject)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("120s", 120), ("2m", 120), ("7d", 604800), (3, 3.0), ("1.5", 1.5)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-1s", "5 years", True])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_sizes() -> None:
    assert parse_size("10GB") == 10 * 1000**3 and parse_size("1GiB") == 1024**3
    with pytest.raises(ValueError):
        parse_size("lots")


def _envelope() -> Envelope:
    return Envelope(
        message_id="550e8400-e29b-41d4-a716-446655440000",
        subject="vibespro.event.vibe_created.v1",
        event_type="vibe_created",
        event_version=1,
        occurred_at=datetime(2025, 12, 28, 22, 0, tzinfo=UTC),
        aggregate_type="vibe",
        aggregate_id="v1",
        payload={"vibe_id": "v1", "title": "t"},
    )


def test_envelope_round_trip_keeps_every_field() -> None:
    original = _envelope()
    parsed = Envelope.from_wire(original.to_wire(), nats_subject=original.subject)
    assert parsed.to_dict() == original.to_dict()
    assert parsed.payload_digest == payload_digest(original.payload)


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda d: d.pop("aggregate_id"), "MISSING_FIELD"),
        (lambda d: d.update(message_id="nope"), "INVALID_FIELD"),
        (lambda d: d.update(event_version="1"), "INVALID_FIELD"),
        (lambda d: d.update(occurred_at="2025-12-28T22:00:00"), "INVALID_FIELD"),
        (lambda d: d.update(payload=[1]), "INVALID_FIELD"),
        (lambda d: d.update(event_version=2), "SUBJECT_MISMATCH"),
        (lambda d: d.update(payload_digest="sha256:00"), "DIGEST_MISMATCH"),
    ],
)
def test_envelope_defects_are_named(mutate, code: str) -> None:  # type: ignore[no-untyped-def]
    doc = _envelope().to_dict()
    mutate(doc)
    with pytest.raises(PoisonError) as caught:
        Envelope.from_dict(doc)
    assert caught.value.reason_code == code


def test_envelope_delivered_on_another_subject_is_refused() -> None:
    with pytest.raises(PoisonError, match="SUBJECT_MISMATCH"):
        Envelope.from_wire(_envelope().to_wire(), nats_subject="vibespro.event.other.v1")


@pytest.mark.parametrize("name", ["sea-vibespro.yaml", "mediation.yaml"])
def test_shipped_topologies_load(name: str) -> None:
    topology = load_topology(ROOT / "topologies" / name)
    assert topology.durables and topology.dead_letter_streams


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "name: x\ncontexts: {}\ndurables: {}\nbogus: 1\n",
            "bogus: Extra inputs are not permitted",
        ),
        ("name: x\ncontexts: [1]\ndurables: {}\n", "contexts: Input should be a valid dictionary"),
        ("[unclosed", "not valid YAML"),
        ("- a list", "the top level must be a mapping"),
    ],
)
def test_broken_topology_names_file_field_and_reason(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ConfigurationError) as caught:
        load_topology(path)
    assert str(path) in str(caught.value) and message in str(caught.value)


def test_durable_field_error_names_the_durable(tmp_path: Path) -> None:
    text = (
        (ROOT / "topologies/sea-vibespro.yaml")
        .read_text()
        .replace("max_deliver: 20", "max_deliver: 0", 1)
    )
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=r"durables\.sea__from_vibespro\.max_deliver"):
        load_topology(path)


def test_missing_topology_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read topology"):
        load_topology(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("sea.event.>", "sea.event.a.v1", True),
        ("sea.event.>", "sea.event", False),
        ("sea.*.a.v1", "sea.event.a.v1", True),
        ("sea.event.a.v1", "sea.event.a.v2", False),
    ],
)
def test_subject_matching(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches
