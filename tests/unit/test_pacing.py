"""The linger decision: wait for more work only when more is due within the linger."""

from __future__ import annotations

import pytest

from shared.domain.pacing import ArrivalGap


def test_no_estimate_before_two_arrivals() -> None:
    gap = ArrivalGap()
    assert not gap.expects_within(1.0)
    gap.arrived(now=10.0)
    assert not gap.expects_within(1.0)
    gap.arrived(now=10.002)
    assert gap.seconds == pytest.approx(0.002)
    assert gap.expects_within(0.005)


def test_follows_the_rate_down_and_up() -> None:
    gap = ArrivalGap()
    now = 0.0
    for _ in range(50):  # 600 msg/s: a message every 1.7 ms
        now += 1 / 600
        gap.arrived(now=now)
    assert gap.expects_within(0.005)
    for _ in range(20):  # then 100 msg/s: lingering 5 ms would only add latency
        now += 0.01
        gap.arrived(now=now)
    assert not gap.expects_within(0.005)
    assert gap.seconds == pytest.approx(0.01, rel=0.05)
    for _ in range(20):  # and back up
        now += 0.001
        gap.arrived(now=now)
    assert gap.expects_within(0.005)


def test_one_long_pause_does_not_erase_a_steady_rate() -> None:
    gap = ArrivalGap()
    now = 0.0
    for _ in range(50):
        now += 0.001
        gap.arrived(now=now)
    now += 0.5  # a hiccup
    gap.arrived(now=now)
    assert not gap.expects_within(0.005)  # one arrival's gap of 0.5 s lifts the mean
    for _ in range(15):
        now += 0.001
        gap.arrived(now=now)
    assert gap.expects_within(0.005)


def test_a_clock_going_backwards_counts_as_no_gap() -> None:
    gap = ArrivalGap()
    gap.arrived(now=5.0)
    gap.arrived(now=4.0)
    assert gap.seconds == 0.0


def test_weight_is_checked() -> None:
    with pytest.raises(ValueError, match="weight must be in"):
        ArrivalGap(weight=0)
