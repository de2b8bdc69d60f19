"""``--until`` of ``ferry durable pause`` (shared/domain/pause.py): a time with its zone
or a duration ahead; refused, naming why, when past, zoneless, too far or not a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.errors import MalformedInput
from shared.domain.pause import (
    INDEFINITE,
    describe_until,
    parse_server_time,
    parse_until,
    rfc3339,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_durations_and_times_with_a_zone() -> None:
    assert parse_until("30m", NOW) == NOW + timedelta(minutes=30)
    assert parse_until(" 2h ", NOW) == NOW + timedelta(hours=2)
    assert parse_until("2026-11-29T17:00:00Z", NOW) == datetime(2026, 11, 29, 17, tzinfo=UTC)
    assert parse_until("2026-11-29T18:00:00+01:00", NOW) == datetime(2026, 11, 29, 17, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("2026-11-29T11:00:00Z", "not in the future"),
        ("2026-11-29T17:00:00", "no timezone"),
        ("2026-13-01T00:00:00Z", "not an ISO-8601 time"),
        ("0s", "would end at once"),
        ("soon", "neither an ISO-8601 time"),
        ("", "ISO-8601"),
        ("2300-01-01T00:00:00Z", "too far"),
        ("99999d", "longer than 100 years"),
    ],
)
def test_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(MalformedInput, match=why):
        parse_until(text, NOW)


@given(st.text(max_size=40))
def test_any_text_is_a_future_time_or_a_clear_refusal(text: str) -> None:
    try:
        moment = parse_until(text, NOW)
    except MalformedInput as exc:
        assert str(exc)
    else:
        assert NOW < moment < INDEFINITE and moment.tzinfo is not None


@given(st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2199, 1, 1)))
def test_what_we_send_the_server_reads_back(moment: datetime) -> None:
    moment = moment.replace(tzinfo=UTC)
    assert parse_server_time(rfc3339(moment)) == moment


def test_server_times_with_nanoseconds_and_what_is_shown() -> None:
    assert parse_server_time("2030-01-01T00:00:00.123456789Z") == datetime(
        2030, 1, 1, 0, 0, 0, 123456, tzinfo=UTC
    )
    assert parse_server_time("garbage") is None and parse_server_time(None) is None
    assert describe_until(INDEFINITE) == "until resumed"
    assert describe_until(datetime(2030, 1, 1, tzinfo=UTC)) == "until 2030-01-01 00:00:00 UTC"
