"""Edit-and-retry's pure part (shared/domain/dead_letter_edit.py): the operator's payload
text parsed or refused in words, the edited envelope keeping everything but its payload
(and a digest that matches it), and what changed named by path."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.dead_letter_edit import (
    changed_paths,
    edited_envelope,
    parse_edited_payload,
    payload_diff,
)
from shared.domain.envelope import Envelope, payload_digest
from shared.domain.errors import MalformedInput
from tests.unit.hostile_values import clean_json, clean_text, hostile_text

objects = st.dictionaries(clean_text, clean_json, max_size=5)


def _envelope(payload: dict[str, Any]) -> dict[str, Any]:
    return Envelope(
        message_id="6f1c1b8e-2a56-4c55-9d0e-6f3c2a0b7c11",
        subject="vibespro.event.vibe_created.v1",
        context="vibespro",
        event_type="vibe_created",
        event_version=1,
        occurred_at=datetime(2026, 11, 29, 10, 0, tzinfo=UTC),
        aggregate_type="vibe",
        aggregate_id="v1",
        payload=payload,
    ).to_dict()


@given(objects)
def test_any_json_object_is_read_back_as_it_was(payload: dict[str, Any]) -> None:
    assert parse_edited_payload(json.dumps(payload)) == payload


@given(st.one_of(st.lists(clean_json, max_size=3), st.integers(), clean_text, st.none()))
def test_json_that_is_not_an_object_is_refused_in_words(value: Any) -> None:
    with pytest.raises(MalformedInput, match="must be a JSON object"):
        parse_edited_payload(json.dumps(value))


@given(hostile_text)
def test_any_text_is_a_payload_or_a_refusal_never_a_crash(text: str) -> None:
    try:
        assert isinstance(parse_edited_payload(text), dict)
    except MalformedInput as exc:
        assert str(exc)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "is not JSON"),
        ('{"a": NaN}', "is not JSON"),
        ('{"a": "\\ud800"}', "surrogate"),
        ("[" * 100_000 + "]" * 100_000, "nested"),
    ],
)
def test_what_cannot_be_a_payload_is_named(text: str, words: str) -> None:
    with pytest.raises(MalformedInput, match=words):
        parse_edited_payload(text)


@given(objects, objects)
def test_the_edited_envelope_changes_its_payload_and_digest_only(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    original = _envelope(before)
    edited = edited_envelope(original, after)
    assert edited["payload"] == after and edited["payload_digest"] == payload_digest(after)
    assert {k: v for k, v in edited.items() if k not in ("payload", "payload_digest")} == {
        k: v for k, v in original.items() if k not in ("payload", "payload_digest")
    }
    # The consumer's checks pass: same message id, a digest that matches the payload.
    parsed = Envelope.from_wire(json.dumps(edited).encode())
    assert parsed.message_id == original["message_id"] and parsed.payload == after


@given(objects)
def test_nothing_changed_names_no_path(payload: dict[str, Any]) -> None:
    assert changed_paths(payload, json.loads(json.dumps(payload))) == []
    assert payload_diff(payload, payload) == []


@given(objects, clean_text, clean_json)
def test_a_changed_field_is_named_by_its_path(
    payload: dict[str, Any], name: str, value: Any
) -> None:
    edited = {**payload, name: [payload.get(name), value]}  # a list: compared as a whole
    assert changed_paths(payload, edited) == [f"payload.{name}"]
    removed = {k: v for k, v in payload.items() if k != name}
    assert changed_paths(payload, removed) == ([f"payload.{name}"] if name in payload else [])


def test_paths_nest_and_json_numbers_compare_as_json_does() -> None:
    before = {"title": "bad", "owner": {"id": 1, "tags": ["a"]}, "n": 1, "flag": True}
    after = {"title": "good", "owner": {"id": 1.0, "tags": ["a", "b"]}, "n": 1, "flag": 1}
    assert changed_paths(before, after) == ["payload.flag", "payload.owner.tags", "payload.title"]
    diff = payload_diff(before, after)
    assert '-  "title": "bad"' in diff and '+  "title": "good"' in diff
