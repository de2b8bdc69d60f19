"""The ordered drain's verdict: events applied after a later event of their key are counted.

:func:`bench.sections.count_order_violations` decides whether the benchmark's ordered drain
kept every key's order, so it must find a broken order wherever there is one and none
where there is none, whatever the keys, their interleaving and their sizes.
"""

from __future__ import annotations

import random
import uuid

from hypothesis import given
from hypothesis import strategies as st

from bench.sections import count_order_violations

#: Keys of a few events each: the commit order is the index in the list.
commits = st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=40)


def _book(keys: list[str]) -> tuple[dict[uuid.UUID, tuple[str, int]], list[uuid.UUID]]:
    ids = [uuid.uuid4() for _ in keys]
    return {mid: (key, seq) for seq, (mid, key) in enumerate(zip(ids, keys, strict=True))}, ids


@given(commits, st.randoms(use_true_random=False))
def test_an_interleaving_that_keeps_each_keys_order_has_no_violation(
    keys: list[str], rnd: random.Random
) -> None:
    place, ids = _book(keys)
    # Interleave the keys' queues at random, each queue kept in commit order.
    queues: dict[str, list[uuid.UUID]] = {}
    for mid in ids:
        queues.setdefault(place[mid][0], []).append(mid)
    applied: list[uuid.UUID] = []
    while queues:
        key = rnd.choice(sorted(queues))
        applied.append(queues[key].pop(0))
        if not queues[key]:
            del queues[key]
    result = count_order_violations(place, applied)
    assert result == {"keys": len(set(keys)), "order_checked": len(keys),
                      "order_violations": 0, "order_unknown": 0}  # fmt: skip


@given(commits, st.data())
def test_two_events_of_a_key_swapped_are_a_violation(keys: list[str], data: st.DataObject) -> None:
    place, ids = _book([*keys, "z", "z"])  # at least one key with two events
    pairs = [(i, j) for i in range(len(ids)) for j in range(i + 1, len(ids))
             if place[ids[i]][0] == place[ids[j]][0]]  # fmt: skip
    i, j = data.draw(st.sampled_from(pairs))
    applied = list(ids)
    applied[i], applied[j] = applied[j], applied[i]
    assert count_order_violations(place, applied)["order_violations"] >= 1


def test_each_event_applied_behind_a_later_one_counts_once() -> None:
    place, ids = _book(["k", "k", "k", "k"])
    # 3 first, then 0, 1, 2 all behind it: three violations, the key's latest stays 3.
    result = count_order_violations(place, [ids[3], ids[0], ids[1], ids[2]])
    assert result["order_violations"] == 3


def test_an_applied_event_the_outbox_does_not_know_is_counted_apart() -> None:
    place, ids = _book(["k"])
    result = count_order_violations(place, [uuid.uuid4(), ids[0]])
    assert (result["order_unknown"], result["order_checked"], result["order_violations"]) == (
        1, 1, 0,
    )  # fmt: skip
