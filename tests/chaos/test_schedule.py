"""Schedules are plans fixed by their seed; the redundant-call check needs a matching fault."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from chaos.engine.accounting import explained
from chaos.engine.faults import FaultRecord
from chaos.engine.schedule import (
    FAULT_KINDS,
    FaultSpecError,
    Targets,
    ci_schedule,
    parse_fault,
    soak_schedule,
)

TARGETS = Targets(
    publishers=("sea", "vibespro"),
    consumers=("sea__from_vibespro", "vibespro__from_sea"),
    nats_roles=("publisher-sea", "consumer-sea__from_vibespro"),
    pg_roles=("publisher-sea", "handler-sea"),
    links=("publisher-sea_nats", "handler-sea_pg"),
)


@pytest.mark.parametrize("seed", [1, 2, 3, 20261121, 987654321])
def test_ci_schedule_has_what_the_issue_asks_for(seed: int) -> None:
    schedule = ci_schedule(seed, TARGETS)
    kinds = Counter(f.kind for f in schedule.faults)
    assert (schedule.seconds, schedule.events, schedule.drain_timeout) == (60.0, 2000, 180.0)
    assert kinds["kill_nats"] == 2 and kinds["crash_postgres"] == 1
    assert kinds["nats_reset_peer"] == kinds["handler_latency"] == kinds["handler_blackhole"] == 1
    assert kinds["kill_publisher_in_window"] == kinds["kill_consumer_in_window"] == 1
    for kind in ("kill_publisher", "kill_consumer"):
        moments = sorted(f.at for f in schedule.faults if f.kind.startswith(kind))
        gaps = [b - a for a, b in itertools.pairwise(moments)]
        assert len(moments) >= 4 and all(5 <= g <= 15 for g in gaps), moments
    assert all(0 <= f.at < schedule.seconds for f in schedule.faults)
    assert ci_schedule(seed, TARGETS) == schedule, "the same seed gives the same plan"


def test_soak_schedule_is_a_fault_every_period_with_a_quarter_quiet() -> None:
    schedule = soak_schedule(5, TARGETS)
    assert (schedule.seconds, schedule.events, schedule.periods) == (600.0, 50_000, 120)
    assert schedule.quiet_periods == 30 and len(schedule.faults) == 90
    periods = [int(f.at // 5) for f in schedule.faults]
    assert len(set(periods)) == 90, "one fault per busy period"
    assert set(Counter(f.kind for f in schedule.faults)) <= set(FAULT_KINDS)
    assert soak_schedule(6, TARGETS) != schedule


def test_custom_faults_are_checked_and_named() -> None:
    fault = parse_fault("10:link_down:handler-sea_pg:40", TARGETS, 60)
    assert (fault.at, fault.kind, fault.target, fault.duration) == (
        10,
        "link_down",
        "handler-sea_pg",
        40,
    )
    assert parse_fault("3:kill_nats", TARGETS, 60).target == ""
    bad = {
        "10": "expected AT:KIND",
        "x:kill_nats": "AT and DURATION are seconds",
        "1:explode": "unknown kind 'explode'",
        "99:kill_nats": "within the 60s fault phase",
        "1:kill_consumer:nobody": "needs a target among sea__from_vibespro",
        "1:kill_nats:sea": "takes no target",
    }
    for text, message in bad.items():
        with pytest.raises(FaultSpecError, match=message):
            parse_fault(text, TARGETS, 60)


def _fault(kind: str, start: float, end: float, affects: set[str]) -> FaultRecord:
    return FaultRecord(kind, "", 0, start, end, affects=frozenset(affects))


def test_a_redundant_call_needs_a_fault_that_could_lose_the_answer() -> None:
    kill = _fault("kill_consumer", 100.0, 101.0, {"d1"})
    assert explained("d1", applied_at=99.5, call_at=108.0, faults=[kill])
    assert not explained("d2", applied_at=99.5, call_at=108.0, faults=[kill]), "other durable"
    assert not explained("d1", applied_at=120.0, call_at=125.0, faults=[kill]), "long before"
    assert not explained("d1", applied_at=90.0, call_at=95.0, faults=[kill]), "after the call"
    crash = _fault("crash_postgres", 100.0, 102.0, {"*"})
    assert explained("d2", applied_at=101.0, call_at=110.0, faults=[crash])
    failed = FaultRecord("kill_consumer", "", 0, 100.0, 101.0, ok=False, affects=frozenset({"d1"}))
    assert not explained("d1", applied_at=99.5, call_at=108.0, faults=[failed])
    # A handler fault: the breaker it opened holds messages until its next probe, so a
    # copy's call a few seconds after it is still its doing; not a quarter minute after.
    blackhole = _fault("handler_blackhole", 100.0, 106.0, {"d1"})
    assert explained("d1", applied_at=111.6, call_at=111.8, faults=[blackhole])
    assert not explained("d1", applied_at=111.6, call_at=111.8, faults=[kill])
    assert not explained("d1", applied_at=121.0, call_at=121.2, faults=[blackhole])
