"""FERRY_GC_THRESHOLD: the garbage-collector policy every Ferry process starts with."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.errors import ConfigurationError
from shared.runtime import loop
from shared.runtime.settings import CommonSettings
from tests.conftest import ROOT

#: A fresh interpreter that runs a coroutine through loop.run and reports the collector's
#: thresholds and how many objects it froze, as the roles' entry points do.
PROBE = (
    "import gc, json, sys\n"
    "from shared.runtime import loop\n"
    "before = gc.get_threshold()\n"
    "async def main():\n"
    "    return gc.get_threshold(), gc.get_freeze_count()\n"
    "policy = int(sys.argv[1]) if len(sys.argv) > 1 else None\n"
    "threshold, frozen = loop.run(main(), gc_policy=policy)\n"
    "print(json.dumps({'before': before, 'threshold': threshold, 'frozen': frozen}))\n"
)


def _probe(*args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k != loop.GC_VARIABLE}
    environ.update(env or {})
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True, text=True, check=True, cwd=ROOT, env=environ,
    ).stdout  # fmt: skip
    result: dict[str, object] = json.loads(out)
    return result


def test_a_process_starts_with_the_default_threshold_and_start_up_frozen() -> None:
    found = _probe()
    assert found["before"] == [700, 10, 10]  # Python's own
    assert found["threshold"] == [loop.DEFAULT_GC_THRESHOLD, 10, 10]
    assert isinstance(found["frozen"], int) and found["frozen"] > 1_000  # the imported modules


def test_the_variable_and_the_setting_choose_the_threshold() -> None:
    assert _probe(env={"FERRY_GC_THRESHOLD": "700"})["threshold"] == [700, 10, 10]
    assert _probe("50000", env={"FERRY_GC_THRESHOLD": "700"})["threshold"] == [50_000, 10, 10]


def test_freeze_moves_what_the_process_built_since_out_of_collection() -> None:
    import gc

    before = gc.get_freeze_count()
    kept = [{"n": i} for i in range(5_000)]  # containers the collector tracks
    loop.freeze()
    assert gc.get_freeze_count() >= before + len(kept)
    assert not any(obj is kept[0] for obj in gc.get_objects())  # no pass walks it now


def test_gc_threshold_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FERRY_GC_THRESHOLD", raising=False)
    assert loop.gc_threshold() == loop.DEFAULT_GC_THRESHOLD
    monkeypatch.setenv("FERRY_GC_THRESHOLD", " 2000 ")
    assert loop.gc_threshold() == 2000
    monkeypatch.setenv("FERRY_GC_THRESHOLD", "")
    assert loop.gc_threshold() == loop.DEFAULT_GC_THRESHOLD
    assert loop.gc_threshold(123) == 123  # an explicit value wins


@pytest.mark.parametrize("bad", ["0", "99", "1000001", "-5", "lots", "1e4", "10000.0"])
def test_a_bad_threshold_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"FERRY_GC_THRESHOLD='{bad}' is not a whole"):
        loop.gc_threshold(bad)


def test_loop_run_refuses_a_bad_threshold_before_running_anything() -> None:
    ran: list[bool] = []

    async def main() -> None:
        ran.append(True)

    with pytest.raises(ConfigurationError, match="FERRY_GC_THRESHOLD=5"):
        loop.run(main(), gc_policy=5)
    assert ran == []


@given(st.text(max_size=12))
def test_any_value_is_a_threshold_in_range_or_a_clear_refusal(raw: str) -> None:
    try:
        value = loop.gc_threshold(raw)
    except ConfigurationError as exc:
        assert "FERRY_GC_THRESHOLD" in str(exc)
        return
    low, high = loop.GC_THRESHOLD_RANGE
    assert low <= value <= high


def test_the_setting_is_validated_with_the_other_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_GC_THRESHOLD", "20000")
    assert CommonSettings().gc_threshold == 20_000
    monkeypatch.setenv("FERRY_GC_THRESHOLD", "50")
    with pytest.raises(ValueError, match="FERRY_GC_THRESHOLD"):
        CommonSettings()
