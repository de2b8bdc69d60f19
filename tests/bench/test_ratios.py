"""Issue 29's table in the bench: every figure a ratio to a baseline of the same run, with
its verdict per tracing mode, and a row that says why when a side was not measured.

Pure: a :class:`Results` filled by hand, finished the way ``python -m bench`` finishes a
run (:func:`bench.finish.finish`); no servers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from bench import finish, ratios, run, world
from bench import sections as s
from bench.report import Results, Row, Target, table
from bench.sections import steps

DRAIN_LABEL = "end-to-end backlog drain, 1,000 events, 1 consumer, per-message calls"
ALL = "baselines,prototype,peer,publisher,drain,latency,sustained,mediation"
#: CPU seconds per process of one measurement: what the ratio counts and what it leaves out.
ROLES = {"publisher-sea": 0.1, "consumer-vibespro__from_sea-1": 0.2, "handler-vibespro": 0.3}
SERVERS = {"nats-server": 0.1, "postgres": 0.3}
LEFT_OUT = {"producer": 5.0, "producer-pg": 1.0, "otlp-sink": 2.0}


@pytest.fixture(autouse=True)
def _ratio_restored() -> Iterator[None]:
    before = world.traces_ratio()
    yield None
    world.set_traces_ratio(float(before))


def _set(results: Results, key: str, unit: str, values: dict[str, float], **kw: Any) -> Row:
    row = results.row(key, key, unit, **kw)
    for mode, value in values.items():
        row.set(mode, value)
    return row


def _cpu(results: Results, label: str, mode: str, messages: int, scale: float) -> None:
    spent = {name: cpu * scale for name, cpu in {**ROLES, **SERVERS, **LEFT_OUT}.items()}
    results.book_cpu(label, mode, messages, 10.0, spent)


def _measured(modes: tuple[str, ...] = ("on", "off")) -> Results:
    """A run in which every section measured what issue 29's table needs."""
    results = Results({})
    raw = {"raw.http": 2900.0, "raw.js_publish": 5000.0, "raw.js_consume": 20000.0,
           "raw.pg_txn": 2700.0, "raw.proto_600": 50.0, ratios.PROTO_SUSTAINED_KEY: 1000.0,
           "peer.faststream_outbox": 2500.0}  # fmt: skip
    for key, value in raw.items():
        _set(results, key, "msg/s", {"raw": value})
    pick = {"on": 0, "off": 1}

    def per_mode(on: float, off: float) -> dict[str, float]:
        return {m: (on, off)[pick[m]] for m in modes}

    _set(results, "ferry.publisher_drain", "msg/s", per_mode(4000, 3500),
         target=ratios.PUBLISHER_TARGET)  # fmt: skip
    results.row("ferry.vs_peer", "publisher / peer", "x", target=ratios.PEER_TARGET)
    drain = results.row("ferry.e2e_drain_1", DRAIN_LABEL, "msg/s", target=ratios.DRAIN_TARGET)
    for mode, value in per_mode(2000, 2400).items():
        drain.set(mode, value)
    _set(results, "ferry.e2e_drain_batch", "msg/s", per_mode(4500, 4000),
         target=ratios.BATCH_TARGET)  # fmt: skip
    _set(results, "ferry.latency_600", "ms", per_mode(70, 55), target=ratios.LATENCY_TARGET)
    _set(results, "ferry.latency_1000", "ms", per_mode(900, 800))
    _set(results, "ferry.sustained", "msg/s", per_mode(1200, 1500),
         target=ratios.SUSTAINED_TARGET)  # fmt: skip
    _set(results, "ferry.mediation_e_to_f", "ms", per_mode(600, 499),
         target=ratios.MEDIATION_TARGET)  # fmt: skip
    _set(results, "ferry.mediation_f_to_g", "ms", per_mode(500, 120),
         target=ratios.MEDIATION_TARGET)  # fmt: skip
    for mode in modes:
        # 1,000 µs per message counted at 600 msg/s; 500 (on) and 800 (off) in the drain.
        _cpu(results, ratios.latency_book(600), mode, 1000, 1.0)
        _cpu(results, DRAIN_LABEL, mode, 1000, 0.5 if mode == "on" else 0.8)
    return results


def _finished(
    results: Results, sections: str = ALL, tracing: str = "both", ratio: float = 0.1
) -> dict[str, Row]:
    argv = ["--sections", sections, "--tracing", tracing, "--trace-ratio", str(ratio)]
    options = run.options_from(run.parse_args(argv))
    bench = s.Bench(cast(Any, None), options, results, None, tracing_available={"on": True})
    finish.finish(bench)
    return {row.key: row for row in results.rows}


def test_every_figure_of_the_issue_is_judged_per_mode() -> None:
    results = _measured()
    rows = _finished(results)
    text = table(results)
    for figure in ratios.FIGURES:
        row = rows[figure.key]
        assert row.target == figure.target, figure.key
        # The tracing ratio is one figure (on ÷ off); every other is judged in each mode.
        modes = {"on"} if figure.key == "ferry.tracing_cost" else {"on", "off"}
        assert set(row.verdicts()) == modes, figure.key
        assert "n/m" not in row.verdicts().values(), figure.key
        assert row.label in text, figure.key


def test_the_drains_are_judged_against_the_raw_post_handle() -> None:
    rows = _finished(_measured())
    drain, batch = rows["ferry.e2e_drain_1"], rows["ferry.e2e_drain_batch"]
    assert drain.baseline == batch.baseline == 2900.0
    assert drain.ratio("on") == pytest.approx(2000 / 2900)
    assert drain.verdicts() == {"on": "MISSED", "off": "met"}  # 0.69 and 0.83 against 0.8
    assert drain.verdict() == "on MISSED, off met"
    assert drain.ratios_shown() == "0.69/0.83"
    assert batch.verdicts() == {"on": "met", "off": "MISSED"}  # 1.55 and 1.38 against 1.5


def test_latency_at_600_is_judged_against_the_bare_bones_p99() -> None:
    rows = _finished(_measured())
    p99 = rows["ferry.latency_600"]
    assert p99.baseline == 50.0
    assert p99.verdicts() == {"on": "MISSED", "off": "met"}  # 1.4 and 1.1 against 1.2
    # The other loads print their ratio to the bare-bones pipeline, without a target.
    other = rows["ferry.latency_1000"]
    assert other.target is None and other.verdict() == ""


def _searched(*steps: tuple[int, float]) -> dict[str, Any]:
    return {"raw": {"steps": [{"rate": rate, "p99_ms": p99} for rate, p99 in steps]}}


def test_latency_is_judged_against_the_bare_bones_best_p99_at_that_load() -> None:
    """The bare-bones search stepped through 600 msg/s faster than its latency step: that
    lower p99 is the yardstick, and the note gives both."""
    results = _measured()
    results.sections["sustained"] = _searched((1200, 9000.0), (600, 40.0), (900, 150.0))
    rows = _finished(results)
    p99 = rows["ferry.latency_600"]
    assert p99.baseline == 40.0
    assert p99.verdicts() == {"on": "MISSED", "off": "MISSED"}  # 1.75 and 1.38 against 1.2
    assert any("50 ms (its latency step), 40 ms (its sustained search's step 2)" in note
               and "judged against its sustained search's step 2" in note
               for note in p99.notes)  # fmt: skip


def test_a_slower_bare_bones_search_step_leaves_the_latency_steps_p99_the_yardstick() -> None:
    results = _measured()
    results.sections["sustained"] = _searched((600, 4000.0), (600, float("nan")), (300, 10.0))
    rows = _finished(results)
    p99 = rows["ferry.latency_600"]
    assert p99.baseline == 50.0
    assert any("judged against its latency step" in note for note in p99.notes)


def test_without_a_latency_step_the_search_gives_the_yardstick() -> None:
    results = _measured()
    results.rows = [r for r in results.rows if r.key != "raw.proto_600"]
    results.sections["sustained"] = _searched((600, 60.0))
    p99 = _finished(results)["ferry.latency_600"]
    assert p99.baseline == 60.0
    assert p99.verdicts() == {"on": "met", "off": "met"}  # 1.17 and 0.92 against 1.2


def test_sustained_is_judged_against_the_bare_bones_search() -> None:
    results = _measured()
    results.rows[[r.key for r in results.rows].index(ratios.PROTO_SUSTAINED_KEY)].notes.append(
        "the search stopped at its ceiling --sustain-max"
    )
    rows = _finished(results)
    sustained = rows["ferry.sustained"]
    assert sustained.baseline == 1000.0
    assert sustained.verdicts() == {"on": "MISSED", "off": "met"}  # 1.2 and 1.5 against 1.3
    assert any("upper bound" in note for note in sustained.notes)


def test_the_cpu_at_600_is_also_set_beside_the_bare_bones_pipelines() -> None:
    results = _measured()
    _cpu(results, ratios.proto_book(600), "raw", 1000, 2.0)  # twice Ferry's 1,000 µs
    row = _finished(results)[ratios.CPU_KEY]
    for mode in ("on", "off"):
        note = f"tracing {mode}: 0.50 x the bare-bones pipeline's 2,000 µs at 600 msg/s"
        assert any(n.startswith(note) for n in row.notes), row.notes
    # The target and verdict stay those of the issue: over the drain making the same calls.
    assert row.target == ratios.CPU_TARGET and row.values["off"] == pytest.approx(1000 / 800)


def test_the_per_message_drain_is_set_beside_the_bare_bones_drain() -> None:
    results = _measured()
    _set(results, ratios.PROTO_DRAIN_KEY, "msg/s", {"raw": 2500.0})
    rows = _finished(results)
    floor = rows["ferry.e2e_drain_vs_proto"]
    assert floor.values == {"on": pytest.approx(0.8), "off": pytest.approx(0.96)}
    assert floor.target is None  # information beside the target, not a verdict
    assert any("2,500 msg/s" in note for note in floor.notes)
    # Without the bare-bones drain (section prototype skipped) there is no such row.
    assert "ferry.e2e_drain_vs_proto" not in _finished(_measured())


def test_cpu_counts_roles_and_servers_not_the_producer_nor_the_sink() -> None:
    rows = _finished(_measured())
    cpu = rows[ratios.CPU_KEY]
    # 1,000 µs counted per message at 600 msg/s; the producer's (its process and its
    # PostgreSQL sessions) and the sink's 8,000 left out.
    assert cpu.values["on"] == pytest.approx(2.0)
    assert cpu.values["off"] == pytest.approx(1.25)
    assert cpu.shown["on"] == "2.00 = 1,000 ÷ 500 µs"
    assert cpu.verdicts() == {"on": "MISSED", "off": "met"}
    assert any("not counted: the producer" in note for note in cpu.notes)


def test_the_producers_sessions_are_taken_out_of_postgres() -> None:
    cpu = {"postgres": 3.0, "nats-server": 1.0}
    producer = {"cpu_s": 2.5, "sessions_cpu_s": 1.2}
    split = steps.split_producer_sessions(cpu, producer)
    assert split == {"postgres": 1.8, "nats-server": 1.0, "producer": 2.5, "producer-pg": 1.2}
    assert cpu == {"postgres": 3.0, "nats-server": 1.0}  # the book read is left as it was


def test_unreadable_sessions_leave_postgres_whole() -> None:
    split = steps.split_producer_sessions({"postgres": 3.0}, {"cpu_s": 2.5, "sessions_cpu_s": None})
    assert split == {"postgres": 3.0, "producer": 2.5}
    # An older producer's report has no such field: the same.
    assert steps.split_producer_sessions({"postgres": 3.0}, {"cpu_s": 2.5}) == split


def test_cpu_of_a_batch_calling_latency_lane_is_compared_with_the_batch_call_drain() -> None:
    results = _measured()
    results.meta["latency_handler_batch"] = 50  # the shipped topology batches its calls
    batch_label = results.row("ferry.e2e_drain_batch", "", "").label
    for mode in ("on", "off"):
        _cpu(results, batch_label, mode, 1000, 0.25)  # 250 µs counted per message
    cpu = _finished(results)[ratios.CPU_KEY]
    # 1,000 ÷ 250, not ÷ the per-message drain's 500 / 800: like with like.
    assert cpu.values == {"on": pytest.approx(4.0), "off": pytest.approx(4.0)}
    assert cpu.verdicts() == {"on": "MISSED", "off": "MISSED"}
    assert any("batch-call drain" in note for note in cpu.notes)
    # The measure the issue started from is kept beside it: ÷ the per-message drain.
    assert any(n.startswith("tracing off: 1.25 x the per-message drain") for n in cpu.notes)


def test_mediation_lanes_are_judged_against_the_seeds_500_ms() -> None:
    rows = _finished(_measured())
    assert rows["ferry.mediation_e_to_f"].verdicts() == {"on": "MISSED", "off": "met"}
    assert rows["ferry.mediation_f_to_g"].verdicts() == {"on": "MISSED", "off": "met"}


def test_publisher_rows_keep_their_targets() -> None:
    rows = _finished(_measured())
    assert rows["ferry.publisher_drain"].verdicts() == {"on": "met", "off": "MISSED"}  # 0.8/0.7
    assert rows["ferry.vs_peer"].values == {"on": 1.6, "off": 1.4}
    assert rows["ferry.vs_peer"].verdict() == "on met, off MISSED"


def test_tracing_cost_shows_both_drains() -> None:
    rows = _finished(_measured())
    assert rows["ferry.tracing_cost"].shown["on"] == "0.83 = 2,000 ÷ 2,400 msg/s"
    assert rows["ferry.tracing_cost"].verdict() == "MISSED"


def test_a_skipped_baseline_section_is_said_not_silent() -> None:
    results = _measured()
    results.rows = [r for r in results.rows if not r.key.startswith(("raw.", "peer."))]
    rows = _finished(results, sections="publisher,drain,latency,sustained,mediation")
    for key, section in (("ferry.latency_600", "prototype"), ("ferry.sustained", "prototype"),
                         ("ferry.e2e_drain_1", "baselines"), ("ferry.publisher_drain",
                                                              "baselines")):  # fmt: skip
        row = rows[key]
        assert row.verdict() == "n/m", key
        assert f"baseline not measured: section {section} skipped" in row.notes, key
    assert "not measured: section peer skipped" in rows["ferry.vs_peer"].notes


def test_a_skipped_measured_section_still_has_its_row() -> None:
    results = _measured(("off",))
    keep = ("raw.", "ferry.latency_", "ferry.sustained")
    results.rows = [r for r in results.rows if r.key.startswith(keep)]
    results.cpu = [e for e in results.cpu if e["label"] != DRAIN_LABEL]
    rows = _finished(results, sections="baselines,prototype,latency,sustained", tracing="off")
    for figure in ratios.FIGURES:
        row = rows[figure.key]
        assert row.verdict() in ("n/m", "met", "MISSED"), figure.key
    for key, section in (("ferry.e2e_drain_1", "drain"), ("ferry.e2e_drain_batch", "drain"),
                         (ratios.CPU_KEY, "drain"), ("ferry.mediation_e_to_f", "mediation"),
                         ("ferry.tracing_cost", "drain"),
                         ("ferry.publisher_drain", "publisher")):  # fmt: skip
        assert rows[key].values == {"off": None}, key
        assert rows[key].verdict() == "n/m", key
        assert f"not measured: section {section} skipped" in rows[key].notes, key
    text = table(results)
    assert "not measured: section drain skipped" in text


def test_one_tracing_mode_says_the_tracing_ratio_needs_both() -> None:
    rows = _finished(_measured(("off",)), tracing="off")
    row = rows["ferry.tracing_cost"]
    assert row.values == {"off": None}
    assert "needs --tracing both" in row.notes[0]
    assert rows[ratios.CPU_KEY].verdict() == "met"


def test_the_json_carries_the_rows_and_their_verdicts() -> None:
    results = _measured()
    _finished(results)
    doc = {row["key"]: row for row in results.to_json()["table"]}
    drain = doc["ferry.e2e_drain_1"]
    assert drain["verdicts"] == {"on": "MISSED", "off": "met"}
    assert drain["ratio"] == {"on": 0.69, "off": 0.83}
    assert drain["target"]["limit"] == 0.8
    assert doc[ratios.CPU_KEY]["values"]["on"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("value", "verdict"), [(499.9, "met"), (500.0, "MISSED"), (float("nan"), "n/m")]
)
def test_strictly_below_is_strict(value: float, verdict: str) -> None:
    row = Row("k", "k", "ms", target=Target("<", 500.0, "p99 < 500 ms"))
    row.set("off", value)
    assert row.verdict() == verdict


def test_a_drain_run_again_is_every_event_over_all_its_time() -> None:
    from bench.sections.drains import combine_runs, note_runs

    first = {"rows": 100, "processed": 100, "seconds": 1.0, "msg_s": 100.0,
             "spans_exported": 10, "order_violations": 0}  # fmt: skip
    second = {"rows": 100, "processed": 100, "seconds": 4.0, "msg_s": 25.0,
              "spans_exported": 12, "order_violations": 0}  # fmt: skip
    assert combine_runs([first]) is first
    both = combine_runs([first, second])
    # 200 events in 5 s: 40 msg/s (not the mean of the rates, 62.5)
    assert both["msg_s"] == 40.0
    assert both["processed"] == 200 and both["spans_exported"] == 22
    assert both["runs"] == [first, second]
    row = Row("ferry.e2e_drain_1", "drain", "msg/s")
    note_runs(row, "on", [first, second])
    note_runs(row, "on", [first, second, second])  # replaces its own note
    assert row.notes == [
        "tracing on: 3 drains (100, 25, 25 msg/s), their order alternating with the other "
        "mode's; the figure is every event over all their time"
    ]
    results = Results({})
    results.book_cpu("drain", "on", 100, 1.0, {"consumer": 0.1})
    results.book_cpu("drain", "on", 300, 3.0, {"consumer": 0.2, "nats": 0.1}, merge=True)
    results.book_cpu("step", "on", 10, 1.0, {"consumer": 0.1})
    results.book_cpu("step", "on", 10, 1.0, {"consumer": 0.1})  # not merged: two entries
    (drain,) = [e for e in results.cpu if e["label"] == "drain"]
    assert drain["messages"] == 400 and drain["seconds"] == 4.0
    assert drain["cpu_s"] == {"consumer": pytest.approx(0.3), "nats": 0.1}
    assert len([e for e in results.cpu if e["label"] == "step"]) == 2
