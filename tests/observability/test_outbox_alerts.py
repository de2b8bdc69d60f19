"""FerryOutboxRowsSetAside, evaluated by promtool against recorded series (see
test_alerts.py for the harness)."""

from __future__ import annotations

from pathlib import Path

from tests.observability.test_alerts import NS, alert, case, run_tests


def test_set_aside_rows_fire_after_a_minute_and_clear_when_republished(tmp_path: Path) -> None:
    gauge = 'ferry_outbox_set_aside{{namespace="{ns}", context="{c}", instance="{i}"}}'
    expected = alert(
        {"context": "sea"},
        {
            "summary": "Outbox of sea has rows set aside",
            "description": (
                "2 outbox row(s) of sea cannot be published, and the later events of their "
                "aggregates wait behind them. See why with `ferry outbox list --context sea "
                "--failed`; fix the row (or the limit), then `ferry outbox republish "
                "--context sea --id ID --reason WHY`."
            ),
        },
    )
    run_tests(
        tmp_path,
        [
            case(
                {
                    # Two replicas of sea's publisher report the same database count.
                    gauge.format(ns=NS, c="sea", i="a"): "0 0 2 2 2 2 2 0 0",
                    gauge.format(ns=NS, c="sea", i="b"): "0 0 2 2 2 2 2 0 0",
                    gauge.format(ns=NS, c="vibespro", i="a"): "0x8",  # never any
                },
                [
                    ("2m", "FerryOutboxRowsSetAside", []),  # just set aside: pending
                    ("4m", "FerryOutboxRowsSetAside", [expected]),
                    ("8m", "FerryOutboxRowsSetAside", []),  # republished
                ],
            )
        ],
    )
