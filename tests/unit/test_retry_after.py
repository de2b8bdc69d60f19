"""Retry-After as RFC 9110 defines it: delay-seconds or an HTTP-date, nothing else.

Whatever a handler sends, the parser returns a finite number of seconds ≥ 0 or None; it
never raises (a ``nan`` once crash-looped the consumer in ``nak``).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.retry_after import LONGEST, parse_retry_after

NOW = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("0", 0.0), ("7", 7.0), (" 120 ", 120.0), ("007", 7.0), ("9" * 60, LONGEST)],
)
def test_delay_seconds_are_whole_digits(value: str, seconds: float) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


@pytest.mark.parametrize(
    "value",
    [
        "nan",
        "NaN",
        "inf",
        "-inf",
        "Infinity",
        "-1",
        "+5",
        "1.5",
        "1e400",
        "1e3",
        "0x10",
        "",
        "   ",
        "soon",
        "\uff15",
        "1 2",
        "9" * 5000,
        "\u0661\u0662",
        "Sun, 06 Nov 1994 08:49:37 UTC",
        "Sun, 31 Feb 2027 08:49:37 GMT",
        "Sun, 06 Nov 1994 25:49:37 GMT",
        "\x00",
        "\ud800",
    ],
)
def test_anything_else_is_ignored(value: str) -> None:
    assert parse_retry_after(value, now=NOW) is None


def test_absent_is_none() -> None:
    assert parse_retry_after(None, now=NOW) is None


@pytest.mark.parametrize(
    "value",
    [
        "Wed, 25 Nov 2026 12:01:30 GMT",  # IMF-fixdate
        "Wednesday, 25-Nov-26 12:01:30 GMT",  # RFC 850
        "Wed Nov 25 12:01:30 2026",  # asctime
    ],
)
def test_the_three_date_forms_give_the_seconds_until_then(value: str) -> None:
    assert parse_retry_after(value, now=NOW) == 90.0


def test_asctime_pads_a_one_digit_day_with_a_space() -> None:
    assert parse_retry_after("Tue Dec  1 12:00:00 2026", now=NOW) == 6 * 86400.0


def test_a_date_in_the_past_means_now() -> None:
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now=NOW) == 0.0


def test_an_rfc850_year_more_than_50_years_ahead_is_last_century() -> None:
    assert parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now=NOW) == 0.0


@given(st.text(max_size=200))
def test_any_text_gives_finite_seconds_or_none(value: str) -> None:
    seconds = parse_retry_after(value, now=NOW)
    assert seconds is None or (math.isfinite(seconds) and 0.0 <= seconds <= LONGEST * 2)


@given(st.from_regex(r"\A[0-9]{1,64}\Z"))
def test_any_digits_are_a_delay(value: str) -> None:
    assert parse_retry_after(value, now=NOW) == min(float(int(value)), LONGEST)


@given(st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: not f.is_integer()))
def test_no_float_spelling_is_accepted_unless_it_is_digits(number: float) -> None:
    assert parse_retry_after(repr(number), now=NOW) is None


@given(
    st.datetimes(
        min_value=datetime(1900, 1, 1), max_value=datetime(9999, 1, 1), timezones=st.just(UTC)
    )
)
def test_any_imf_fixdate_round_trips(when: datetime) -> None:
    when = when.replace(microsecond=0)
    value = format_datetime(when, usegmt=True)
    expected = max((when - NOW).total_seconds(), 0.0)
    assert parse_retry_after(value, now=NOW) == expected
    assert parse_retry_after(value, now=when - timedelta(seconds=5)) == 5.0
