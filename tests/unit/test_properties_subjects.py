"""Subjects: any text parses to an EventSubject or raises INVALID_SUBJECT, and a subject
built from valid parts parses back to those parts (and prints back to itself)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.domain.errors import OutboxValidationError
from shared.domain.subjects import (
    MAX_EVENT_VERSION,
    EventSubject,
    event_subject,
    parse_subject,
    validate_event_type,
    validate_event_version,
)
from tests.unit.hostile_values import hostile_text

PROPERTY = settings(max_examples=200, deadline=None)
namespaces = st.from_regex(r"[a-z][a-z0-9_]{0,10}(\.[a-z][a-z0-9_]{0,10}){0,3}", fullmatch=True)
event_types = st.from_regex(r"[a-z][a-z0-9]{0,10}(_[a-z0-9]{1,10}){0,3}", fullmatch=True)
versions = st.integers(min_value=1, max_value=MAX_EVENT_VERSION)


@pytest.mark.parametrize(
    "subject",
    [
        "sea.event.model_published.v1\n",
        "sea.event\n.model_published.v1",
        "sea.event.model_published\n.v1",
        "sea.event.model_published.v" + "9" * 5000,
        "sea.event.model_published.v1001",
        "sea.event.model_published.v٣",
        "sea.event..v1",  # was INVALID_OUTBOX (empty event type), not INVALID_SUBJECT
        ".event.model_published.v1",
    ],
)
def test_trailing_newlines_huge_and_foreign_versions_are_refused(subject: str) -> None:
    with pytest.raises(OutboxValidationError) as refused:
        parse_subject(subject)
    assert refused.value.code == "INVALID_SUBJECT" and len(str(refused.value)) < 300


def test_an_event_type_with_a_trailing_newline_is_not_snake_case() -> None:
    with pytest.raises(OutboxValidationError, match="snake_case"):
        validate_event_type("model_published\n")


def test_a_huge_version_is_refused_without_printing_it() -> None:
    with pytest.raises(OutboxValidationError, match=r"huge number is outside 1\.\.1000"):
        validate_event_version(10**5000)


@PROPERTY
@given(namespace=namespaces, event_type=event_types, version=versions)
def test_build_then_parse_is_identity(namespace: str, event_type: str, version: int) -> None:
    built = event_subject(namespace, event_type, version)
    assert parse_subject(str(built)) == built == EventSubject(namespace, event_type, version)


@PROPERTY
@given(subject=st.one_of(hostile_text, st.lists(hostile_text, max_size=6).map(".".join)))
def test_any_text_parses_or_is_invalid_subject(subject: str) -> None:
    try:
        parsed = parse_subject(subject)
    except OutboxValidationError as exc:
        assert exc.code == "INVALID_SUBJECT"
    else:
        assert str(parsed) == subject


@PROPERTY
@given(
    namespace=namespaces,
    event_type=st.one_of(event_types, hostile_text),
    version=st.one_of(versions, st.integers(), st.text(max_size=8)),
    suffix=st.sampled_from(["", "\n", " ", ".", "\x00"]),
)
def test_near_valid_subjects_parse_back_to_themselves_or_are_refused(
    namespace: str, event_type: str, version: object, suffix: str
) -> None:
    subject = f"{namespace}.{event_type}.v{version}{suffix}"
    try:
        parsed = parse_subject(subject)
    except OutboxValidationError as exc:
        assert exc.code == "INVALID_SUBJECT"
    else:
        assert str(parsed) == subject and 1 <= parsed.version <= MAX_EVENT_VERSION


@PROPERTY
@given(value=st.one_of(hostile_text, st.integers(), st.none(), st.booleans(), st.floats()))
def test_event_type_and_version_checks_raise_only_the_projects_error(value: object) -> None:
    for check in (validate_event_type, validate_event_version):
        try:
            check(value)
        except OutboxValidationError as exc:
            assert exc.field in ("event_type", "event_version")
