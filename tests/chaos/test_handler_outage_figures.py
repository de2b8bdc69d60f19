"""The handler outage's figures (issue 45) on a small synthetic dump, and its options.

The dump (:class:`~chaos.scenarios.handler_outage.figures.Dump`) is what the run reads back:
commits from the intent ledger, the lane's inbox rows with the times of their failed
calls, the effects ledger, the dead letters and the consumer's breaker lines. The outage
here runs from t=100 to t=200.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from chaos.engine.config import RunConfig
from chaos.run import main
from chaos.scenarios.handler_outage.figures import (
    Dump,
    InboxRow,
    breaker_lines,
    failure_times,
    outage_figures,
)
from chaos.scenarios.handler_outage.plan import LADDER_TOP, SIZES, outage_size

DOWN, BACK = 100.0, 200.0


def _dump() -> Dump:
    committed: dict[str, float | None] = {
        "early": 50.0,  # applied before the outage
        "opener": 99.0,  # its call failed as the outage began, then held: 2 deliveries
        "held": 150.0,  # arrived during the outage, held by the breaker: 1 delivery
        "probed": 160.0,  # carried by two failed probes, then one more failure: 4 deliveries
        "spent": 170.0,  # three failures, none a probe: 4 deliveries (past its 2nd)
        "dead": 180.0,  # dead-lettered
        "lost": 190.0,  # no final outcome
        "late": 210.0,  # after the return
        "resolved": None,  # an uncertain commit found in the outbox afterwards
    }
    inbox = {
        "early": InboxRow("processed", 1),
        "opener": InboxRow("processed", 2, (100.5,)),
        "held": InboxRow("processed", 1),
        "probed": InboxRow("processed", 4, (105.2, 110.3, 130.0)),
        "spent": InboxRow("processed", 4, (101.0, 102.0, 140.0)),
        "dead": InboxRow("failed", 3, (101.5, 141.0)),
        "lost": InboxRow("received", 1),
        "late": InboxRow("processed", 1),
        "resolved": InboxRow("processed", 1),
    }
    applied = {
        "early": 50.1,
        "opener": 201.0,
        "held": 202.0,
        "probed": 203.0,
        "spent": 230.0,
        "late": 210.1,
        "resolved": 205.0,
    }
    breaker = [
        (100.8, "opened"),
        (105.0, "probe"),
        (105.3, "probe_failed"),
        (110.0, "probe"),
        (110.2, "probe_failed"),
        (200.9, "probe"),
        (201.0, "closed"),
    ]
    return Dump(
        committed=committed,
        inbox=inbox,
        applied=applied,
        ok_calls=Counter({i: 1 for i in applied} | {"held": 2}),
        dead={"dead": "MAX_DELIVERIES_EXCEEDED"},
        breaker=breaker,
        down=DOWN,
        back=BACK,
    )


def test_figures_count_the_outage_against_the_ledger() -> None:
    f = outage_figures(_dump())

    assert f.outage_seconds == 100.0
    assert f.events == 9 and f.committed_during_outage == 5
    assert (f.lost, f.applied_twice, f.dead_letters) == (1, 1, 1)
    assert f.dead_letters_by_reason == {"MAX_DELIVERIES_EXCEEDED": 1}
    assert f.deliveries == {1: 5, 2: 1, 3: 1, 4: 2}
    assert f.beyond_first == 1 + 2 + 3 + 3 and f.max_deliveries == 4
    # Failed calls inside a probe's window (half-open line to its verdict, 1 s either side)
    # were the probes'; the rest by when they settled.
    assert f.failed_calls == {
        "during the outage, not a probe": 7,
        "a probe": 2,
    }
    assert f.past_second == 3  # probed, spent, dead
    assert f.past_second_without_probes == 2  # spent, dead: probed's two are the probes'
    assert (f.probes, f.probes_that_carried_events) == (3, 2)
    assert (f.breaker_opened, f.breaker_closed) == (1, 1)
    assert f.breaker_closed_after_return == pytest.approx(1.0)
    assert f.resume == pytest.approx(1.0)  # opener, applied at 201
    # Committed before the return, not applied by then: all but early and late; "resolved"
    # has no commit time and is left out of the timing.
    assert f.backlog == 6 and f.backlog_unapplied == 2  # dead, lost
    assert f.drain == pytest.approx(30.0)
    assert f.backlog_delay == {"p50": 3.0, "p90": 30.0, "p99": 30.0}
    doc = f.doc()
    assert doc["deliveries per event"] == {"1": 5, "2": 1, "3": 1, "4": 2}
    assert json.loads(json.dumps(doc)) == doc


def test_figures_of_an_outage_nothing_came_back_from() -> None:
    dump = _dump()
    dump.applied = {i: t for i, t in dump.applied.items() if t < BACK}
    dump.breaker = dump.breaker[:5]
    f = outage_figures(dump)

    assert f.resume is None and f.drain is None and f.backlog_delay == {}
    assert f.breaker_closed_after_return is None
    # Lost counts outcomes (the inbox's), not effects: only the row that has none.
    assert f.lost == 1


def test_breaker_lines_and_failure_times_are_read_as_the_consumer_writes_them() -> None:
    def line(at: str, message: str) -> str:
        return json.dumps({"time": at, "level": "info", "message": message})

    log = [
        "--- start #1 at 1795952700.000",
        line(
            "2026-11-29T11:46:42.274Z",
            "vibespro__from_sea: circuit breaker open (5 calls"
            " in a row failed): holding messages, probing every 5s",
        ),
        line(
            "2026-11-29T11:46:47.274Z",
            "vibespro__from_sea: circuit breaker half-open: probing the handler",
        ),
        line(
            "2026-11-29T11:46:47.275Z",
            "vibespro__from_sea: circuit breaker open (the probe"
            " failed): holding messages, probing every 5s",
        ),
        line("2026-11-29T11:49:42.500Z", "consuming vibespro__from_sea"),
        line(
            "2026-11-29T11:49:42.600Z",
            "vibespro__from_sea: circuit breaker closed: the handler answers again",
        ),
    ]
    lines = breaker_lines(log)
    assert [kind for _, kind in lines] == ["opened", "probe", "probe_failed", "closed"]
    assert lines[1][0] - lines[0][0] == pytest.approx(5.0)

    history = json.dumps([{"at": "2026-11-29T11:46:47.276000Z", "attempt": 1}])
    assert failure_times(history)[0] - lines[1][0] == pytest.approx(0.002, abs=1e-4)
    assert failure_times(None) == ()


def test_sizes_take_the_command_line_and_refuse_an_outage_past_the_play() -> None:
    size = outage_size(RunConfig(seconds=240, events=4800, outage_at=20, outage=180), "ci")
    assert (size.seconds, size.events, size.outage_at, size.outage) == (240, 4800, 20, 180)
    assert size.breaker is True
    off = outage_size(RunConfig(breaker=False), "ci")
    # Breaker off, the drain waits out the ladder's longest step too.
    assert off.drain_timeout == SIZES["ci"].drain_timeout + LADDER_TOP
    assert outage_size(RunConfig(breaker=False, drain_timeout=50), "ci").drain_timeout == 50
    with pytest.raises(ValueError, match="within"):
        outage_size(RunConfig(seconds=30, outage_at=20, outage=20), "ci")


def test_outage_options_go_with_the_scenario_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["--scenario", "ordering", "--breaker", "off", "--out", str(tmp_path)])
    assert "go with --scenario handler-outage" in capsys.readouterr().err
