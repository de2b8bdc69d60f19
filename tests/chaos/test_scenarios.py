"""The three ISSUE 22 scenarios at CI size: real servers, every role as a process.

Each runs its world (:mod:`chaos.engine.scenario`), then counts every committed event against
the intent ledger and the handlers' effects ledger. The invariants, for all three:
every committed event processed, dead-lettered with a reason code or set aside by the
publisher (and its aggregate's later rows held behind it) — none stuck, none lost;
0 effects applied twice; 0 unexpected exits of Ferry's roles; the drain finishes.

The seed fixes each plan (``FERRY_CHAOS_SEED`` overrides it); a failure prints the
results table, and ``python -m chaos.run --scenario NAME --seed S`` runs it again by hand
(``--schedule soak`` for the long version).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from chaos.engine.config import RunConfig
from chaos.engine.scenario_result import ScenarioResult
from chaos.scenarios.hostile_handler.front import RETRY_AFTER_KINDS, STATUSES
from tests.chaos.conftest import run_as

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("FERRY_CHAOS_SEED", "20261125"))


async def _run(tmp_path: Path, scenario: str) -> tuple[ScenarioResult, str]:
    progress: list[str] = []
    config = RunConfig(seed=SEED, run_dir=tmp_path / "run", echo=progress.append)
    result = await run_as(config, scenario, ScenarioResult)
    story = (
        f"\nseed {SEED} (re-run: python -m chaos.run --scenario {scenario} --seed {SEED})\n\n"
        + result.render()
        + "\n\nProgress\n"
        + "\n".join(progress)
    )
    table = json.loads((tmp_path / "run" / "scenario.json").read_text())
    assert table["events committed"] == result.settled.committed, story
    return result, story


def _assert_invariants(result: ScenarioResult, story: str) -> None:
    settled = result.settled
    assert result.drained, story
    assert settled.stuck == [] and settled.lost == [], story
    assert settled.no_reason == [] and settled.conflicting == [], story
    assert settled.effects_twice == [], story
    assert result.unexpected_exits == [], story
    assert result.violations == [], story
    fates = (
        settled.processed
        + sum(settled.dead_lettered.values())
        + sum(settled.set_aside.values())
        + settled.held_behind
    )
    assert fates == settled.committed, story


async def test_long_outage_passes_every_attempt_cap_and_settles_every_event(
    tmp_path: Path,
) -> None:
    result, story = await _run(tmp_path, "long-outage")

    # The outages happened: NATS gone for every role, then one handler gone.
    assert result.faults["nats_outage"] == 1 and result.faults["handler_outage"] == 1, story
    assert result.faults["rows fast-forwarded"] > 0, story  # rows were failing at the time
    assert result.settled.committed >= 0.95 * 240, story
    # Messages arriving while the handler was gone spent every delivery.
    assert result.settled.dead_lettered["MAX_DELIVERIES_EXCEEDED"] > 0, story
    _assert_invariants(result, story)


async def test_hostile_handler_cannot_wedge_a_consumer_or_apply_twice(tmp_path: Path) -> None:
    result, story = await _run(tmp_path, "hostile-handler")

    # The hostile fronts answered every status and every kind of Retry-After and body.
    for status, _ in STATUSES:
        assert result.faults[f"answered {status}"] > 0, story
    for kind in RETRY_AFTER_KINDS:
        assert result.faults[f"Retry-After {kind}"] > 0, story
    for body in ("non_utf8", "huge"):
        assert result.faults[f"body {body}"] > 0, story
    for action in ("replaced", "trickle", "reset"):
        assert result.faults[f"{action} (after the real handler answered)"] > 0, story
    assert result.settled.committed >= 0.95 * 300, story
    _assert_invariants(result, story)


async def test_hostile_payloads_are_refused_at_the_source_or_settled(tmp_path: Path) -> None:
    result, story = await _run(tmp_path, "hostile-payloads")

    # What PostgreSQL cannot store was never committed: refused at the source.
    refused = set(result.settled.refused)
    must_refuse = {
        "nul-in-json",
        "nul-in-aggregate",
        "lone-surrogate-escaped",
        "lone-surrogate-raw",
        "low-surrogate-first",
    }
    assert must_refuse <= refused, story
    assert refused - must_refuse <= {"nested-20000"}, story  # PostgreSQL's stack depth
    # Every other case was committed; valid ones within every limit were processed
    # (checked in the invariants), the rest dead-lettered or set aside with a reason.
    assert result.settled.committed >= 0.95 * 120 + 100, story
    _assert_invariants(result, story)
