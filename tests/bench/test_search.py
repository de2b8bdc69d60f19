"""The sustained-rate search (bench/search.py) against scripted machines: no servers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.search import Search, Step, search_sustained


def machine(
    holds_up_to: int, *, flaky: set[int] | None = None, short_above: int | None = None
) -> tuple[Step, list[int]]:
    """A step function: holds up to ``holds_up_to``; above ``short_above`` the producer
    falls behind; a rate in ``flaky`` fails on latency the first time only."""
    runs: list[int] = []
    flaked: set[int] = set()

    async def step(rate: int) -> str:
        runs.append(rate)
        if short_above is not None and rate > short_above:
            return f"producer achieved {short_above} msg/s"
        if flaky and rate in flaky and rate not in flaked:
            flaked.add(rate)
            return "p99 2,036 ms"
        return "" if rate <= holds_up_to else "p99 3,345 ms"

    return step, runs


async def _search(step: Step, **kw: int) -> Search:
    options = {"start": 1200, "increment": 300, "ceiling": 4000, **kw}
    return await search_sustained(step, **options)


async def test_one_unlucky_step_does_not_decide_the_figure() -> None:
    # The full run of 2026-11-26: 900 failed once on p99 although 1,000 held minutes before.
    step, runs = machine(1000, flaky={900}, short_above=1100)
    found = await _search(step)
    assert found.passed is not None and 900 <= found.passed <= 1000
    assert runs.count(900) == 2  # failed on latency: run once more before it counts
    assert found.failed is not None and found.failed[0] > 1000


async def test_a_producer_shortfall_is_not_run_twice() -> None:
    step, runs = machine(4000, short_above=880)
    found = await _search(step)
    assert found.failed is not None and "producer achieved" in found.failed[1]
    assert runs.count(1200) == 1 and runs.count(900) == 1
    assert found.passed is not None and 750 <= found.passed <= 880


async def test_bisection_goes_on_until_an_eighth_apart() -> None:
    step, _ = machine(1000, short_above=5000)
    found = await _search(step)
    assert found.passed is not None and found.failed is not None
    assert found.passed <= 1000 < found.failed[0]
    assert found.failed[0] - found.passed <= max(found.passed // 8, 50)


async def test_nothing_holds() -> None:
    step, _ = machine(50)
    found = await _search(step)
    assert found.passed is None
    assert found.failed is not None and found.failed[0] < 200  # halved to the floor


async def test_the_ceiling_ends_an_upward_search() -> None:
    step, _ = machine(10_000)
    found = await _search(step, ceiling=1800)
    assert found.passed == 1800 and found.failed is None


@given(
    holds=st.integers(min_value=0, max_value=5000),
    start=st.sampled_from([300, 600, 1200]),
    increment=st.sampled_from([100, 300]),
)
async def test_the_figure_held_and_is_within_an_eighth_of_the_truth(
    holds: int, start: int, increment: int
) -> None:
    step, _ = machine(holds)
    found = await _search(step, start=start, increment=increment)
    if found.passed is None:
        assert found.failed is not None and holds < found.failed[0]
        return
    assert found.passed <= holds  # never a rate that failed
    if found.failed is not None:
        assert found.failed[0] > holds
        assert found.failed[0] - found.passed <= max(found.passed // 8, 50) or (
            found.failed[0] - found.passed < 100
        )


@pytest.mark.parametrize("first", [1200, 600])
async def test_steps_are_recorded_in_order(first: int) -> None:
    step, runs = machine(700)
    found = await _search(step, start=first)
    assert [rate for rate, _ in found.steps] == runs
