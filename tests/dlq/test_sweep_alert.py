"""The alert on exhaustions only the sweep found, evaluated by promtool (like every rule)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.observability.test_alerts import NS, alert, case, run_tests

SERIES = 'ferry_dead_letters_total{{namespace="{ns}", durable="{d}", reason="{r}", source="{s}"}}'


def unreported_alert(durable: str) -> dict[str, Any]:
    return alert(
        {"durable": durable},
        {
            "summary": f"Exhaustions of {durable} found by the sweep, not by advisory",
            "description": (
                f"The dlq-router's sweep dead-lettered messages of {durable} whose "
                "MAX_DELIVERIES advisory never arrived. Check the advisory stream and the "
                "router's ferry_dlq_router_advisories_total; see the records with `ferry dlq "
                f"list --durable {durable} --reason-code DELIVERY_EXHAUSTED_UNREPORTED`."
            ),
        },
    )


def test_one_unreported_exhaustion_fires_and_other_dead_letters_do_not(tmp_path: Path) -> None:
    run_tests(
        tmp_path,
        [
            case(
                {
                    # The sweep records one dead letter at minute 10.
                    SERIES.format(ns=NS, d="swept", r="DELIVERY_EXHAUSTED_UNREPORTED", s="sweep"):
                        "0x10 1x60",
                    # Many dead letters, all reported by advisory or the consumer.
                    SERIES.format(ns=NS, d="busy", r="MAX_DELIVERIES_EXCEEDED",
                                  s="advisory:max_deliveries"): "0+5x70",
                },
                [
                    ("5m", "FerryExhaustionUnreported", []),
                    ("15m", "FerryExhaustionUnreported", [unreported_alert("swept")]),
                    ("60m", "FerryExhaustionUnreported", []),  # 30 minutes without another
                ],
            )
        ],
    )  # fmt: skip
