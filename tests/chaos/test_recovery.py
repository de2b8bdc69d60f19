"""The recovery measure (:mod:`chaos.engine.recovery`) and its table
(:mod:`chaos.engine.recovery_table`), on hand-built intents and fault records: no server."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from chaos.engine.faults import FaultRecord
from chaos.engine.recovery import Processed, baseline_latency, recovery_times
from chaos.engine.recovery_table import (
    TARGET_SECONDS,
    kind_recovery,
    recovery_doc,
    recovery_table,
    render_recovery,
)
from chaos.engine.workload import Intent

A, B = "a__from_x", "b__from_y"


def intent(n: int, durable: str, committed: float, klass: str = "normal") -> Intent:
    """A committed event of ``durable`` (id ``durable-n``)."""
    return Intent(
        id=f"{durable}-{n}", context="x", durable=durable, event_type="t", version=1,
        klass=klass, aggregate_id="k", payload={}, due=0.0, status="committed",
        committed_at=committed,
    )  # fmt: skip


def fault(kind: str, started: float, affects: frozenset[str], restored: float = 0.0) -> FaultRecord:
    """An injected fault (``restored``: when the run took its cause away)."""
    return FaultRecord(kind, "", 0.0, started, started + 1, affects=affects, restored=restored)


def test_a_held_message_counts_its_stall_though_the_first_one_after_is_quick() -> None:
    # A consumer of A killed at 100: the message it held (committed at 99) waits for the
    # takeover at 125, while an event committed after the kill came through in 0.2 s.
    intents = [intent(1, A, 99.0), intent(2, A, 101.0)]
    processed: Processed = {A: {"a__from_x-1": 125.0, "a__from_x-2": 101.2}, B: {}}
    kill = fault("kill_consumer", 100.0, frozenset({A}))
    assert recovery_times([kill], processed, intents) == [25.0]


def test_an_outage_counts_from_the_moment_the_network_is_back() -> None:
    intents = [intent(1, A, 99.0), intent(2, A, 105.0)]
    processed: Processed = {A: {"a__from_x-1": 112.0, "a__from_x-2": 113.0}}
    cut = fault("link_down", 100.0, frozenset({A}), restored=110.0)
    assert recovery_times([cut], processed, intents) == [3.0]


def test_the_window_ends_where_the_next_fault_begins() -> None:
    intents = [intent(1, A, 101.0), intent(2, A, 131.0)]
    processed: Processed = {A: {"a__from_x-1": 102.0, "a__from_x-2": 160.0}}
    first, second = fault("kill_nats", 100.0, frozenset()), fault("kill_nats", 130.0, frozenset())
    assert recovery_times([first, second], processed, intents) == [1.0, 29.0]


def test_a_fault_on_another_lane_does_not_end_the_window() -> None:
    # A's consumer killed at 100, B's at 102: an A event committed at 103 waited on A's
    # kill till 120 (B's kill cannot have held it back); a third fault on A at 130 ends it.
    intents = [intent(1, A, 103.0), intent(2, A, 131.0)]
    processed: Processed = {A: {"a__from_x-1": 120.0, "a__from_x-2": 150.0}, B: {}}
    faults = [
        fault("kill_consumer", 100.0, frozenset({A})),
        fault("kill_consumer", 102.0, frozenset({B})),
        fault("kill_consumer", 130.0, frozenset({A})),
    ]
    assert recovery_times(faults, processed, intents) == [17.0, None, 19.0]


def test_only_normal_events_of_the_lanes_a_fault_touches_count() -> None:
    intents = [intent(1, A, 99.0, "transient"), intent(2, B, 99.0), intent(3, A, 99.0)]
    processed: Processed = {
        A: {"a__from_x-1": 190.0, "a__from_x-3": 101.0},
        B: {"b__from_y-2": 180.0},
    }
    assert recovery_times([fault("kill_consumer", 100.0, frozenset({A}))], processed, intents) == [
        1.0
    ]
    # NATS names no durable among those whose calls it can make redundant: it holds all back.
    assert recovery_times([fault("kill_nats", 100.0, frozenset())], processed, intents) == [80.0]


def test_a_failed_fault_or_one_nothing_came_through_after_has_no_figure() -> None:
    intents = [intent(1, A, 99.0)]
    processed: Processed = {A: {"a__from_x-1": 99.5}}
    failed = fault("kill_consumer", 100.0, frozenset({A}))
    failed.ok = False
    quiet = fault("kill_consumer", 100.0, frozenset({A}))
    assert recovery_times([failed, quiet], processed, intents) == [None, None]


def test_the_baseline_is_the_median_latency_before_the_first_fault() -> None:
    intents = [intent(n, A, 10.0 * n) for n in range(1, 4)] + [intent(9, A, 200.0)]
    processed: Processed = {A: {f"a__from_x-{n}": 10.0 * n + n for n in (1, 2, 3, 9)}}
    assert baseline_latency(processed, intents, [fault("k", 100.0, frozenset({A}))]) == 2.0
    assert baseline_latency(processed, [], []) is None


#: Drawn events of one lane: (committed at, seconds to processed, class).
events = st.lists(
    st.tuples(st.floats(0, 200), st.floats(0, 60), st.sampled_from(["normal", "slow"])),
    max_size=25,
)


def lane(
    durable: str, drawn: list[tuple[float, float, str]]
) -> tuple[list[Intent], dict[str, float]]:
    """The drawn events as intents of ``durable``, and when each was processed."""
    intents = [intent(n, durable, at, klass) for n, (at, _, klass) in enumerate(drawn)]
    done = {f"{durable}-{n}": at + took for n, (at, took, _) in enumerate(drawn)}
    return intents, done


@given(events, events, st.floats(0, 200), st.floats(0, 30), st.one_of(st.none(), st.floats(0, 100)))
def test_recovery_is_bounded_and_blind_to_lanes_the_fault_does_not_touch(
    mine: list[tuple[float, float, str]],
    others: list[tuple[float, float, str]],
    started: float,
    lasted: float,
    next_in: float | None,
) -> None:
    restored = started + lasted if lasted else 0.0
    records = [fault("link_down", started, frozenset({A}), restored=restored)]
    if next_in is not None:
        records.append(fault("kill_consumer", started + next_in + 0.001, frozenset({B})))
    intents, done = lane(A, mine)
    alone = recovery_times(records, {A: done}, intents)[0]

    other_intents, other_done = lane(B, others)
    both = recovery_times(records, {A: done, B: other_done}, intents + other_intents)[0]
    assert both == alone

    if alone is not None:
        worst = max(
            done[i.id] - (restored or started)
            for i in intents
            if i.klass == "normal" and done[i.id] > started
        )
        assert 0 <= alone <= max(worst, 0.0)


def test_the_table_gives_each_kind_its_rounds_p50_and_max() -> None:
    kinds = ["kill_consumer", "kill_consumer", "kill_consumer", "kill_nats", "pg_latency"]
    records = [fault(k, 100.0 + n, frozenset()) for n, k in enumerate(kinds)]
    records.append(fault("crash_postgres", 200.0, frozenset()))
    records[-1].ok = False  # not injected: not in the table
    table = recovery_table(records, [3.04, 20.0, 1.0, 2.26, None, None])
    assert list(table) == ["kill_consumer", "kill_nats", "pg_latency"]
    assert (table["kill_consumer"].p50, table["kill_consumer"].max) == (3.0, 20.0)
    assert table["kill_consumer"].rounds == 3 and table["kill_consumer"].within_target is False
    assert table["kill_nats"].p50 == table["kill_nats"].max == 2.3
    assert table["pg_latency"] == kind_recovery([None])
    assert table["pg_latency"].within_target is None
    doc = json.loads(json.dumps(recovery_doc(table)))
    assert doc["kill_nats"] == {
        "rounds": 1, "measured": 1, "p50": 2.3, "max": 2.3, "within target": True,
    }  # fmt: skip
    text = "\n".join(render_recovery(table))
    assert f"OVER {TARGET_SECONDS:.0f} s" in text and "20.0s" in text
    assert "no event came through" in text
    assert "no fault" in "\n".join(render_recovery({}))


@given(st.lists(st.floats(0, 1000), min_size=1, max_size=40))
def test_p50_is_a_measured_value_between_the_least_and_the_max(values: list[float]) -> None:
    line = kind_recovery(values)
    assert line.p50 is not None and line.max is not None
    assert round(min(values), 1) <= line.p50 <= line.max == round(max(values), 1)
    assert line.rounds == line.measured == len(values)
