"""The bench's row for issue 29's tracing target: the one-consumer drain with tracing on
at the run's ratio over the same drain off, judged against 0.9x."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench import finish, run, world
from bench.report import Results, Row, table


def _results(on: float | None, off: float | None, modes: tuple[str, ...]) -> Results:
    results = Results({})
    drain = results.row("ferry.e2e_drain_1", "end-to-end backlog drain, 1 consumer", "msg/s")
    for mode, value in zip(("on", "off"), (on, off), strict=True):
        if mode in modes:
            drain.set(mode, value)
    return results


@pytest.fixture(autouse=True)
def _ratio_restored() -> Iterator[None]:
    before = world.traces_ratio()
    yield None
    world.set_traces_ratio(float(before))


def _row(results: Results) -> Row | None:
    return next((r for r in results.rows if r.key == "ferry.tracing_cost"), None)


def _the_row(results: Results) -> Row:
    row = _row(results)
    assert row is not None
    return row


@pytest.mark.parametrize(
    ("on", "off", "verdict"), [(950.0, 1000.0, "met"), (810.0, 1000.0, "MISSED")]
)
def test_the_ratio_of_the_two_drains_is_judged_against_09(
    on: float, off: float, verdict: str
) -> None:
    world.set_traces_ratio(0.1)
    results = _results(on, off, ("on", "off"))
    finish.finish_tracing_ratio(results)
    row = _the_row(results)
    assert row.values["on"] == pytest.approx(on / off)
    assert row.verdict() == verdict
    assert "drain with tracing on (10 %) ÷ off" in table(results)


def test_the_label_names_the_runs_ratio() -> None:
    world.set_traces_ratio(1.0)
    results = _results(500.0, 1000.0, ("on", "off"))
    finish.finish_tracing_ratio(results)
    assert "(100 %)" in _the_row(results).label


def test_one_mode_only_says_it_needs_both() -> None:
    results = _results(900.0, None, ("on",))
    finish.finish_tracing_ratio(results)
    row = _the_row(results)
    assert row.verdict() == "n/m"
    assert "needs --tracing both" in row.notes[0]


def test_no_drain_makes_no_row_here() -> None:
    # bench.ratios.finish makes it, naming the skipped section.
    results = Results({})
    finish.finish_tracing_ratio(results)
    assert _row(results) is None


def test_a_missing_drain_is_not_measured() -> None:
    results = _results(None, 1000.0, ("on", "off"))
    finish.finish_tracing_ratio(results)
    assert _the_row(results).verdict() == "n/m"


@pytest.mark.parametrize("ratio", ["-0.1", "1.5"])
def test_a_ratio_outside_0_1_is_refused(ratio: str) -> None:
    with pytest.raises(SystemExit):
        run.options_from(run.parse_args(["--trace-ratio", ratio]))


def test_a_note_gives_the_same_comparison_in_cpu_per_message() -> None:
    world.set_traces_ratio(0.1)
    results = _results(900.0, 1000.0, ("on", "off"))
    label = results.rows[0].label
    spent = {"on": {"consumer-x-1": 0.5, "handler-x": 0.4, "producer": 9.0},
             "off": {"consumer-x-1": 0.45, "handler-x": 0.35, "producer": 9.0}}  # fmt: skip
    for mode, cpu in spent.items():
        results.book_cpu(label, mode, 1000, 1.0, cpu)
    finish.finish_tracing_ratio(results)
    # Ferry's processes only: the producer is the application's.
    assert _the_row(results).notes == [
        "the same in CPU per message (roles, NATS, PostgreSQL): off ÷ on 0.89 = 800 ÷ 900 µs"
    ]
