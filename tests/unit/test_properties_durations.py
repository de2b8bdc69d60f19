"""Durations and sizes (topology files, settings, CLI flags): any value gives a finite,
non-negative number within the limits, or :class:`MalformedInput` naming the value."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.domain.durations import MAX_DURATION, MAX_SIZE, parse_duration, parse_size
from shared.domain.errors import ConfigurationError, FerryError, MalformedInput
from shared.runtime.settings import CommonSettings
from tests.unit.hostile_values import hostile_text

PROPERTY = settings(max_examples=200, deadline=None)
anything = st.one_of(
    hostile_text,
    st.integers(),
    st.floats(),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.from_regex(
        r"\s*[0-9]{1,40}(\.[0-9]{1,40})?\s*(ms|s|m|h|d|B|KB|MiB|TiB|tb)?\s*", fullmatch=True
    ),
)


@pytest.mark.parametrize(
    "value",
    ["9" * 400, "9" * 400 + "d", "1" * 5000 + ".5s", 10**400, float("inf"), float("nan"), "101y"],
)
def test_durations_that_would_be_infinite_or_overflow_are_refused(value: object) -> None:
    with pytest.raises(MalformedInput):
        parse_duration(value)


@pytest.mark.parametrize("value", ["9" * 5000, "9" * 30 + "TiB", -1, 2**64])
def test_sizes_past_int64_or_negative_are_refused(value: object) -> None:
    with pytest.raises(MalformedInput):
        parse_size(value)


def test_a_refusal_is_a_ferry_error_and_a_value_error_naming_the_value() -> None:
    with pytest.raises(MalformedInput) as refused:
        parse_size("lots")
    assert isinstance(refused.value, FerryError) and isinstance(refused.value, ValueError)
    assert "'lots'" in str(refused.value)


@PROPERTY
@given(value=anything)
def test_any_duration_is_finite_bounded_or_refused(value: object) -> None:
    try:
        seconds = parse_duration(value)
    except MalformedInput as exc:
        assert len(str(exc)) < 200
    else:
        assert math.isfinite(seconds) and 0 <= seconds <= MAX_DURATION


@PROPERTY
@given(value=anything)
def test_any_size_is_bounded_or_refused(value: object) -> None:
    try:
        size = parse_size(value)
    except MalformedInput as exc:
        assert len(str(exc)) < 200
    else:
        assert isinstance(size, int) and 0 <= size <= MAX_SIZE


_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_UNIT_BYTES = {"B": 1, "KB": 1000, "MB": 10**6, "GB": 10**9, "KiB": 1024, "MiB": 2**20}


@PROPERTY
@given(amount=st.integers(min_value=0, max_value=36_000), unit=st.sampled_from(list(_UNIT_SECONDS)))
def test_a_written_duration_parses_to_its_seconds(amount: int, unit: str) -> None:
    assert parse_duration(f"{amount}{unit}") == pytest.approx(amount * _UNIT_SECONDS[unit])


@PROPERTY
@given(amount=st.integers(min_value=0, max_value=10**9), unit=st.sampled_from(list(_UNIT_BYTES)))
def test_a_written_size_parses_to_its_bytes(amount: int, unit: str) -> None:
    assert parse_size(f"{amount}{unit}") == amount * _UNIT_BYTES[unit]
    assert parse_size(f" {amount} {unit.lower()} ") == amount * _UNIT_BYTES[unit]


@pytest.mark.parametrize("value", ["9" * 5000, "lots", "-1GB", "1e9"])
def test_a_bad_stream_size_setting_is_a_configuration_error_naming_it(value: str) -> None:
    with pytest.raises(ConfigurationError, match="FERRY_MAX_STREAM_BYTES: "):
        CommonSettings(max_stream_bytes=value).stream_caps()
