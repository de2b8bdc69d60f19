"""FerryParkedKeyStuck, evaluated by promtool against recorded series (see test_alerts.py
for the harness)."""

from __future__ import annotations

from pathlib import Path

from tests.observability.test_alerts import NS, case, run_tests


def test_a_key_parked_for_over_a_quarter_hour_fires_and_clears(tmp_path: Path) -> None:
    gauge = 'ferry_parked_oldest_age_seconds{{namespace="{ns}", durable="{d}", instance="{i}"}}'
    expected = {
        "exp_labels": {
            "severity": "warning",
            "priority": "P1",
            "namespace": NS,
            "durable": "cg_g_archive",
        },
        "exp_annotations": {
            "summary": "Durable cg_g_archive has a key parked for over 15 minutes",
            "description": (
                "The oldest parked message of cg_g_archive is 22m 0s old: its key's later "
                "events wait behind a failing or held head. See which with `ferry parked list "
                "--durable cg_g_archive`; replay the head's dead letter (`ferry dlq replay`) or "
                "discard it (`ferry parked discard`)."
            ),
        },
    }
    # One sample a minute: parked at 0, over 15 minutes old from 16m, released at 25m.
    ages = " ".join(str(60 * m) for m in range(25)) + " 0 0 0"
    run_tests(
        tmp_path,
        [
            case(
                {
                    gauge.format(ns=NS, d="cg_g_archive", i="a"): ages,
                    gauge.format(ns=NS, d="cg_h_publish", i="a"): "0x27",  # never parked
                },
                [
                    ("14m", "FerryParkedKeyStuck", []),
                    ("19m", "FerryParkedKeyStuck", []),  # over 15 min, not yet for 5
                    ("22m", "FerryParkedKeyStuck", [expected]),
                    ("27m", "FerryParkedKeyStuck", []),  # released
                ],
            )
        ],
    )
