"""FerryTableOutgrowsPolicy, evaluated by promtool against recorded series (see
test_alerts.py for the harness)."""

from __future__ import annotations

from pathlib import Path

from tests.observability.test_alerts import NS, case, run_tests

DAY = 86400


def test_a_table_twice_its_retention_old_fires_after_half_an_hour(tmp_path: Path) -> None:
    labels = '{{namespace="{ns}", table="{t}", database="{d}", instance="{i}"}}'
    age = "ferry_retention_oldest_row_age_seconds" + labels
    policy = "ferry_retention_seconds" + labels
    claims = {"ns": NS, "t": "handler_applied", "d": "sea", "i": "a"}
    audit = {"ns": NS, "t": "dead_letter_actions", "d": "sea", "i": "a"}
    # Claims kept 35 days: the oldest row ages past 70 days and stays there (no purge);
    # the audit table's oldest row is old, but within twice its 400 days.
    old = " ".join(str(71 * DAY + 60 * m) for m in range(50))
    expected = {
        "exp_labels": {
            "severity": "warning",
            "priority": "P1",
            "namespace": NS,
            "table": "handler_applied",
            "database": "sea",
        },
        "exp_annotations": {
            "summary": "handler_applied in sea outgrows its retention",
            "description": (
                "The oldest row of handler_applied in sea is 71d 0h 35m 0s old, past twice "
                "its retention. Is the retention role running (`ferry purge --dry-run` "
                "shows what is due), and is its login granted the table (`ferry purge` "
                "reports a table it skipped, and why)?"
            ),
        },
    }
    run_tests(
        tmp_path,
        [
            case(
                {
                    age.format(**claims): old,
                    policy.format(**claims): f"{35 * DAY}x50",
                    age.format(**audit): f"{700 * DAY}x50",
                    policy.format(**audit): f"{400 * DAY}x50",
                },
                [
                    ("20m", "FerryTableOutgrowsPolicy", []),  # pending for 30 minutes
                    ("35m", "FerryTableOutgrowsPolicy", [expected]),
                ],
            )
        ],
    )
