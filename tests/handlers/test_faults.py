"""The fault directives (``_ferry_test``), without any server: parsing, precedence, bounds."""

from __future__ import annotations

from typing import Any

import pytest

from services.handlers.faults import MAX_SLOW_MS, Faults, parse_faults
from shared.domain.errors import PoisonError


def test_no_directive_means_no_fault() -> None:
    faults = parse_faults({"a": 1})
    assert faults == Faults()
    assert faults.forced(1) is None


def test_fail_attempts_stop_after_n() -> None:
    faults = parse_faults({"_ferry_test": {"fail_attempts": 2, "retry_after": 3}})
    assert [getattr(faults.forced(n), "status", None) for n in (1, 2, 3)] == [503, 503, None]
    forced = faults.forced(1)
    assert forced is not None and forced.headers == {"Retry-After": "3"}


def test_status_wins_over_fail_attempts() -> None:
    faults = parse_faults({"_ferry_test": {"status": 404, "fail_attempts": 1}})
    assert [getattr(faults.forced(n), "status", None) for n in (1, 2)] == [404, 404]


def test_the_longest_sleep_is_obeyed_and_one_more_millisecond_is_refused() -> None:
    assert parse_faults({"_ferry_test": {"slow_ms": MAX_SLOW_MS}}).slow_ms == MAX_SLOW_MS
    with pytest.raises(PoisonError, match="INVALID_TEST_DIRECTIVE") as caught:
        parse_faults({"_ferry_test": {"slow_ms": MAX_SLOW_MS + 1}})
    assert f"slow_ms: must be at most {MAX_SLOW_MS}" in caught.value.detail


@pytest.mark.parametrize(
    ("directive", "message"),
    [
        ("yes", "must be an object"),
        ({"poison": "true"}, "poison: must be true or false"),
        ({"status": 99}, "status: must be an HTTP status"),
        ({"status": True}, "status: must be an HTTP status"),
        ({"fail_attempts": -1}, "fail_attempts: must be a non-negative integer"),
        ({"slow_ms": 1.5}, "slow_ms: must be a non-negative integer"),
        ({"slow_ms": 10**12}, "slow_ms: must be at most"),
        ({"retry_after": "5"}, "retry_after: must be a non-negative number"),
    ],
)
def test_malformed_directives_are_poison(directive: Any, message: str) -> None:
    with pytest.raises(PoisonError, match="INVALID_TEST_DIRECTIVE") as caught:
        parse_faults({"_ferry_test": directive})
    assert message in caught.value.detail
