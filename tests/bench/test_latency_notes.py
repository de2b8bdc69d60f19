"""The latency rows say when the producer itself fell behind: latency counts from each
event's due instant, so a stall in the producer's own commits is in the headline p99,
and a reader must be able to tell it from the pipeline's. Pure: no servers."""

from __future__ import annotations

from bench.sections.latency import LAG_NOTED_MS, producer_lag_note


def _lane(p99: float, most: float) -> dict[str, object]:
    return {"name": "sea", "commit_lag_ms": {"p50": 3.7, "p99": p99, "max": most}}


def test_a_producer_stall_is_named_beside_the_pipelines_own_latency() -> None:
    # The 600 msg/s step of 2026-11-28 (tracing off): p99 1,383 ms end to end, of which the
    # producer's commits lagged p99 1,295 ms; from the outbox insert, p99 about 156 ms.
    from_insert = [20.0] * 980 + [156.0] * 19 + [1413.0]
    note = producer_lag_note([_lane(1295.3, 2401.1)], from_insert)
    assert "p99 1,295 ms (max 2,401 ms)" in note
    assert "from the outbox insert to processed, p99 156 ms" in note


def test_the_worst_lane_is_the_one_named() -> None:
    note = producer_lag_note([_lane(20.0, 40.0), _lane(640.0, 900.0)], [])
    assert "p99 640 ms (max 900 ms)" in note
    assert "outbox insert" not in note  # no from-insert latencies (the bare-bones pipeline)


def test_a_producer_on_schedule_adds_nothing() -> None:
    assert producer_lag_note([_lane(LAG_NOTED_MS - 1, 400.0)], [30.0]) == ""
    assert producer_lag_note([{"name": "sea"}], [30.0]) == ""
    assert producer_lag_note([], []) == ""
