"""``python -m bench.instructions``: its workload does what its table claims, and the
arithmetic and parsing around valgrind are right (valgrind itself is not run here)."""

from __future__ import annotations

import pytest

from bench import instructions
from shared import telemetry


@pytest.mark.parametrize(
    ("mode", "spans"),
    [("off", 0), ("unsampled", 0), ("sampled", instructions.SPANS_PER_SAMPLED_CALL * 24)],
)
async def test_the_workload_makes_every_call_and_traces_only_sampled_ones(
    mode: str, spans: int
) -> None:
    answered = await instructions.workload(mode, 24)
    assert answered == {"calls": 24, "ok": 24, "spans": spans}
    assert not telemetry.active()  # tracing is put back as it was


def test_the_workload_summary_is_checked() -> None:
    instructions.check_workload("sampled", 10, "calls=10 ok=10 spans=40\n")
    with pytest.raises(RuntimeError, match="9 of 10 calls answered 200"):
        instructions.check_workload("off", 10, "calls=10 ok=9 spans=0\n")
    with pytest.raises(RuntimeError, match="3 spans exported, expected 0"):
        instructions.check_workload("unsampled", 10, "calls=10 ok=10 spans=3\n")
    with pytest.raises(RuntimeError, match="no summary line"):
        instructions.check_workload("off", 10, "Traceback ...\n")


def test_callgrind_s_count_is_read_from_its_summary() -> None:
    stderr = (
        "==7128== Callgrind, a call-graph generating cache profiler\n"
        "==7128== Events    : Ir\n"
        "==7128== Collected : 1849620655\n"
        "==7128==\n"
        "==7128== I   refs:      1,849,620,655\n"
    )
    assert instructions.parse_collected(stderr) == 1_849_620_655
    with pytest.raises(RuntimeError, match="no instruction count"):
        instructions.parse_collected("valgrind: command not found\n")


def test_per_call_takes_the_difference_over_the_extra_calls() -> None:
    assert instructions.per_call(1_000_000, 3_000_000, 200, 1200) == 2_000
    with pytest.raises(ValueError, match="more calls"):
        instructions.per_call(1, 2, 200, 200)


def test_the_table_gives_each_mode_against_off_and_the_ten_percent_mix() -> None:
    text = instructions.table({"off": 1_000_000, "unsampled": 1_100_000, "sampled": 2_000_000})
    lines = {line.split("  ")[0].strip(): line for line in text.splitlines()[2:]}
    assert lines["unsampled"].endswith("1.100")
    assert lines["sampled"].endswith("2.000")
    # 0.9 x 1,100,000 + 0.1 x 2,000,000
    assert "1,190,000" in lines["at 10 % sampling"]
    assert lines["at 10 % sampling"].endswith("1.190")
