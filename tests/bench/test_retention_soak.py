"""The retention soak's arithmetic and its topology (issue 48); the soak itself runs by
hand (``python -m bench --sections retention-soak``: minutes at the least)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.run_options import parse_args
from bench.sections.retention_soak import (
    SHORTEST,
    _first_run,
    second_half_growth,
    settled_count,
    shorten,
)
from tests.registry.conftest import SEA_VIBESPRO, lint_doc, shipped


@pytest.mark.parametrize("keep", [SHORTEST, 600.0])
def test_the_shortened_topology_passes_the_lint_the_roles_run(tmp_path: Path, keep: float) -> None:
    doc = shipped(SEA_VIBESPRO)
    shorten(keep)(doc)
    assert lint_doc(tmp_path, doc) == []
    for ctx in doc["contexts"].values():
        assert ctx["inbox_retention"] == ctx["claims_retention"] == f"{keep:g}s"


def test_a_retention_below_what_the_lint_allows_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--soak-retention", str(SHORTEST - 1)])
    with pytest.raises(SystemExit):
        parse_args(["--soak-retention", "two minutes"])
    assert parse_args(["--soak-retention", "300"]).soak_retention == 300.0


def test_growth_is_the_last_sample_against_the_middle_one() -> None:
    series = [{"a": 10.0, "b": 5.0}, {"a": 100.0, "b": 50.0}, {"a": 150.0, "b": 50.0},
              {"a": 110.0, "b": 0.0}, {"a": 104.0}]  # fmt: skip
    assert second_half_growth(series) == {"a": -30.7}  # b left the last sample
    assert second_half_growth(series[:2]) == {}


def test_the_first_run_is_read_from_the_retention_roles_metrics() -> None:
    before = "# TYPE ferry_retention_last_run_timestamp_seconds gauge\n"
    assert _first_run(before) is None
    after = (
        "# TYPE ferry_retention_purged_rows counter\n"
        'ferry_retention_purged_rows_total{table="inbox_messages",database="d"} 300.0\n'
        'ferry_retention_purged_rows_total{table="outbox_events",database="s"} 200.0\n'
        "# TYPE ferry_retention_run_duration_seconds gauge\n"
        "ferry_retention_run_duration_seconds 2.5\n"
        "# TYPE ferry_retention_last_run_timestamp_seconds gauge\n"
        "ferry_retention_last_run_timestamp_seconds 1.7e9\n"
    )
    assert _first_run(after) == (500.0, 2.5, 1.7e9)


def test_the_consumer_s_own_count_settles_each_event_once() -> None:
    text = (
        "# TYPE ferry_consumer_messages counter\n"
        'ferry_consumer_messages_total{durable="d",outcome="processed"} 90.0\n'
        'ferry_consumer_messages_total{durable="d",outcome="duplicate"} 7.0\n'
        'ferry_consumer_messages_total{durable="d",outcome="retried"} 30.0\n'
        'ferry_consumer_messages_total{durable="d",outcome="dead_lettered"} 6.0\n'
        'ferry_consumer_messages_total{durable="d",outcome="exhausted"} 4.0\n'
    )
    assert settled_count(text) == 100
