"""The circuit breaker's states (services/inbox_consumer/breaker.py), on a fake clock."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.inbox_consumer.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, failed
from shared.contracts.topology import BreakerSpec
from shared.domain.ack import HandlerFailure, HandlerResponse

DOWN = HandlerFailure("unreachable", "connection refused")
OK = HandlerResponse(200)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def breaker(clock: Clock, **spec: object) -> CircuitBreaker:
    defaults: dict[str, object] = {"failures": 3, "window": 10.0, "probe_every": 5.0}
    return CircuitBreaker(
        BreakerSpec(**{**defaults, **spec}), durable="d", clock=clock, recheck=0.01
    )


def test_what_counts_as_the_handler_being_down() -> None:
    assert failed(DOWN) and failed(HandlerFailure("timeout"))
    assert failed(HandlerResponse(503)) and failed(HandlerResponse(500))
    assert failed(HandlerResponse(429))
    for status in (200, 409, 422, 400, 401, 403, 404, 413):
        assert not failed(HandlerResponse(status))


def test_failures_in_a_row_within_the_window_open_it_and_a_success_in_between_does_not() -> None:
    clock = Clock()
    b = breaker(clock)
    for outcome in (DOWN, DOWN, OK, DOWN, DOWN):
        b.record(outcome)
    assert b.state == CLOSED
    b.record(DOWN)
    assert b.state == OPEN and b.opened == 1


def test_failures_spread_wider_than_the_window_do_not_open_it() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(6):
        b.record(DOWN)
        clock.now += 6.0  # two failures are never within 10 s of a third
    assert b.state == CLOSED


async def test_while_open_one_probe_per_interval_and_its_success_lets_everyone_through() -> None:
    clock = Clock()
    b = breaker(clock, probe_every=5.0)
    for _ in range(3):
        b.record(DOWN)
    stop = asyncio.Event()
    waiters = [asyncio.create_task(b.admit(stop)) for _ in range(4)]
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiters) and b.held == 4
    clock.now += 5.0  # the probe's time: exactly one goes through
    await asyncio.sleep(0.1)
    assert [w.done() for w in waiters].count(True) == 1 and b.state == HALF_OPEN
    b.record(DOWN)  # the probe failed: open again, the next probe in 5 s
    assert b.state == OPEN
    clock.now += 4.0
    await asyncio.sleep(0.1)
    assert [w.done() for w in waiters].count(True) == 1
    clock.now += 1.0
    await asyncio.sleep(0.1)
    assert [w.done() for w in waiters].count(True) == 2 and b.probes == 2
    b.record(OK)  # the probe succeeded: closed, everyone through
    assert b.state == CLOSED
    assert await asyncio.wait_for(asyncio.gather(*waiters), timeout=2) == [True] * 4


async def test_a_stop_ends_every_wait_without_a_call() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.record(DOWN)
    stop = asyncio.Event()
    waiting = asyncio.create_task(b.admit(stop))
    await asyncio.sleep(0.05)
    stop.set()
    assert await asyncio.wait_for(waiting, timeout=2) is False


async def test_a_disabled_breaker_never_holds() -> None:
    b = breaker(Clock(), enabled=False)
    for _ in range(100):
        b.record(DOWN)
    assert b.state == CLOSED and await b.admit(asyncio.Event()) is True


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["down", "ok", "tick", "admit"]), max_size=60))
def test_never_more_than_one_probe_in_flight(steps: list[str]) -> None:
    async def play() -> None:
        clock = Clock()
        b = breaker(clock, failures=2, probe_every=1.0)
        stop = asyncio.Event()
        in_flight = 0
        for step in steps:
            if step == "tick":
                clock.now += 1.0
            elif step in ("down", "ok") and in_flight:
                in_flight -= 1
                b.record(DOWN if step == "down" else OK)
            elif step in ("down", "ok"):
                b.record(DOWN if step == "down" else OK)
            elif b.state != CLOSED:
                try:
                    admitted = await asyncio.wait_for(b.admit(stop), timeout=0.01)
                except TimeoutError:
                    admitted = False
                if admitted and b.state == HALF_OPEN:
                    in_flight += 1
            # Half-open means exactly one probe is out; no second one is ever let through.
            assert (b.state == HALF_OPEN) == (in_flight == 1)

    asyncio.run(play())


@pytest.mark.parametrize("outcome", [OK, HandlerResponse(422), HandlerResponse(409)])
def test_a_late_success_while_open_closes_it(outcome: HandlerResponse) -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(3):
        b.record(DOWN)
    assert b.state == OPEN
    b.record(outcome)  # a call admitted before it opened answers now: the handler is back
    assert b.state == CLOSED


def test_a_failure_while_not_closed_keeps_its_messages_in_hand() -> None:
    """Closed, a failed call is settled (nak'ed with its back-off); once the breaker is
    open — the failure that opened it, a failed probe, a late failure — it is kept in hand
    for the next probe; an answer about the event (a 422) is never kept."""
    clock = Clock()
    b = breaker(clock)
    b.record(DOWN)
    assert not b.holds(DOWN)  # closed: settle it
    b.record(DOWN)
    b.record(DOWN)  # the third opens it
    assert b.state == OPEN and b.holds(DOWN)
    assert not b.holds(HandlerResponse(422)) and not b.holds(OK)
    clock.now += 5.0
    b.state = HALF_OPEN  # the probe is out
    b.record(HandlerResponse(503))  # and fails: open again
    assert b.state == OPEN and b.holds(HandlerResponse(503))
    assert b.kept == 2
    disabled = breaker(clock, enabled=False)
    disabled.state = OPEN
    assert not disabled.holds(DOWN)


def _guard(b: CircuitBreaker) -> object:
    """What Decider.guarded needs of its decider: the breaker and the stop event."""
    from types import SimpleNamespace

    return SimpleNamespace(breaker=b, stop=asyncio.Event())


async def test_a_lone_failing_call_is_kept_at_most_keep_at_most_times_then_settled() -> None:
    from services.inbox_consumer.breaker import KEEP_AT_MOST
    from services.inbox_consumer.deciding import Decider

    b = CircuitBreaker(
        BreakerSpec(failures=1, window=10.0, probe_every=0.01), durable="d", recheck=0.01
    )
    calls = 0

    async def down() -> HandlerFailure:
        nonlocal calls
        calls += 1
        return DOWN

    outcome = await asyncio.wait_for(Decider.guarded(_guard(b), down), timeout=10)  # type: ignore[arg-type]
    assert outcome == DOWN and calls == KEEP_AT_MOST + 1 and b.kept == KEEP_AT_MOST
    assert b.waiting == 0


async def test_with_others_waiting_a_failed_call_is_kept_until_the_handler_answers() -> None:
    from services.inbox_consumer.breaker import KEEP_AT_MOST
    from services.inbox_consumer.deciding import Decider

    b = CircuitBreaker(
        BreakerSpec(failures=1, window=10.0, probe_every=0.01), durable="d", recheck=0.01
    )
    b.waiting = 1  # another caller holds its messages at the breaker meanwhile
    calls = 0

    async def down_then_back() -> HandlerResponse | HandlerFailure:
        nonlocal calls
        calls += 1
        return OK if calls > KEEP_AT_MOST + 5 else DOWN

    outcome = await asyncio.wait_for(Decider.guarded(_guard(b), down_then_back), timeout=10)  # type: ignore[arg-type]
    assert outcome == OK and calls == KEEP_AT_MOST + 6 and b.state == CLOSED
    assert b.waiting == 1  # its own waits counted and uncounted


async def test_with_others_waiting_a_failed_call_is_kept_no_longer_than_keep_for() -> None:
    """Events the handler fails on by their content, with no other traffic, wait on each
    other at the breaker (none is ever alone): each is still settled after keep_for, so
    it climbs its ladder to a dead letter instead of holding the lane for good."""
    from services.inbox_consumer.deciding import Decider

    class Ticking(Clock):  # time passes while the breaker waits for its next probe
        def __call__(self) -> float:
            self.now += 0.001
            return self.now

    clock = Ticking()
    b = CircuitBreaker(
        BreakerSpec(failures=1, window=10.0, probe_every=0.01),
        durable="d",
        recheck=0.01,
        clock=clock,
        keep_for=60.0,
    )
    b.waiting = 1  # another failing event waits at the breaker the whole time
    calls = 0

    async def down_for_good() -> HandlerFailure:
        nonlocal calls
        calls += 1
        clock.now += 7.0  # each probe comes a probe interval (and a call) later
        return DOWN

    outcome = await asyncio.wait_for(Decider.guarded(_guard(b), down_for_good), timeout=10)  # type: ignore[arg-type]
    # Kept at the 1st call (t=7), then settled on the first failure 60 s after that.
    assert outcome == DOWN and calls == 10, calls
    assert b.kept == 9
