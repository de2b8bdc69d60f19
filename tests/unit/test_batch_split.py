"""How a batch durable cuts claimed events into calls (:func:`split_calls`): at most N
events and at most the byte budget a call, in order, every event once."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from services.inbox_consumer.batching import split_calls


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=3000), max_size=60),
    count=st.integers(min_value=1, max_value=12),
    budget=st.integers(min_value=1, max_value=5000),
)
def test_every_event_once_in_order_within_count_and_budget(
    sizes: list[int], count: int, budget: int
) -> None:
    calls = split_calls(sizes, count, budget)
    assert [at for call in calls for at in call] == list(range(len(sizes)))
    for call in calls:
        assert 1 <= len(call) <= count
        total = sum(sizes[at] for at in call)
        assert total <= budget or len(call) == 1  # only a lone event may exceed it
    for before, after in itertools.pairwise(calls):
        # A call was cut only because it was full or the next event did not fit.
        used = sum(sizes[at] for at in before)
        assert len(before) == count or used + sizes[after[0]] > budget


def test_a_fetch_of_small_events_is_cut_by_count_and_big_ones_by_bytes() -> None:
    assert split_calls([10] * 5, 2, 1000) == [[0, 1], [2, 3], [4]]
    assert split_calls([600, 600, 100, 2000, 10], 10, 1000) == [[0], [1, 2], [3], [4]]
    assert split_calls([], 5, 100) == []
