"""The benchmark's plan: each measurement in both tracing modes back to back, the first
mode alternating, so a machine that slows down during a run weighs on both alike."""

from __future__ import annotations

from types import SimpleNamespace

from bench import run


def _names(*argv: str) -> list[str]:
    options = run.options_from(run.parse_args(list(argv)))
    bench = SimpleNamespace(options=options)
    return [name for name, _ in run._plan(bench)]  # type: ignore[arg-type]


def test_both_modes_of_a_measurement_run_side_by_side_first_mode_alternating() -> None:
    names = _names("--skip", "soak")
    assert names[:3] == ["baselines", "prototype", "peer"]
    steps = [
        "publisher", "drain x1", "drain x1, pair 2", "drain batch x1", "drain x2",
        "drain ordered", "latency", "mediation",
    ]  # fmt: skip
    expected = []
    for index, step in enumerate(steps):
        modes = ["on", "off"] if index % 2 == 0 else ["off", "on"]
        expected += [f"{step} [{mode}]" for mode in modes]
    # The TLS section once, in tracing off (TLS on ÷ off is its figure); two baselines
    # again at the very end: how far the machine drifted over the run.
    assert names[3:] == [*expected, "tls [off]", "baselines again"]


def test_baselines_are_measured_again_only_after_other_sections() -> None:
    assert _names("--sections", "baselines") == ["baselines"]
    assert _names("--sections", "baselines,publisher", "--tracing", "off") == [
        "baselines", "publisher [off]", "baselines again",
    ]  # fmt: skip


def test_one_mode_runs_each_measurement_once() -> None:
    assert _names("--sections", "drain,mediation", "--tracing", "off") == [
        "drain x1 [off]", "drain batch x1 [off]", "drain x2 [off]", "drain ordered [off]",
        "mediation [off]",
    ]  # fmt: skip


def test_the_tls_section_runs_once_in_tracing_off_or_the_only_mode() -> None:
    assert _names("--sections", "tls") == ["tls [off]"]
    assert _names("--sections", "tls,soak", "--tracing", "on") == ["tls [on]", "soak [on]"]


def test_the_soak_comes_last_in_the_first_mode() -> None:
    names = _names("--sections", "publisher,soak")
    assert names == ["publisher [on]", "publisher [off]", "soak [on]"]


def test_the_one_consumer_drain_runs_in_pairs_of_alternating_order() -> None:
    names = _names("--sections", "drain", "--drain-pairs", "3")
    assert names[:6] == [
        "drain x1 [on]", "drain x1 [off]",
        "drain x1, pair 2 [off]", "drain x1, pair 2 [on]",
        "drain x1, pair 3 [on]", "drain x1, pair 3 [off]",
    ]  # fmt: skip
    assert _names("--sections", "drain", "--drain-pairs", "1")[:3] == [
        "drain x1 [on]", "drain x1 [off]", "drain batch x1 [off]",
    ]  # fmt: skip
    # One mode: nothing to pair with.
    assert _names("--sections", "drain", "--tracing", "on")[:2] == [
        "drain x1 [on]", "drain batch x1 [on]",
    ]  # fmt: skip
