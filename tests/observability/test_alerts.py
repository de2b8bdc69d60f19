"""The INFRA-005 §6 alert rules, evaluated by Prometheus's own rule engine (promtool).

Each rule is run against recorded series — minute by minute, a day and more of history
where the rule needs a baseline — and must fire when its condition holds for its ``for``
duration, and stay silent on a shorter spike, on the baseline, on too little traffic, and
on the boundary value. promtool comes with Debian's ``prometheus`` package (``./dev``
installs it); a missing promtool fails these tests, it does not skip them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT

RULES = ROOT / "k8s" / "base" / "alerts" / "ferry-alerts.rules.yaml"
P0 = {"severity": "critical", "priority": "P0"}
NS = "ferry"


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool not found: install Debian's prometheus package (./dev setup does)"
    return found


def run_tests(tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    doc = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / "alerts.test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def case(
    series: dict[str, str], checks: list[tuple[str, str, list[dict[str, Any]]]]
) -> dict[str, Any]:
    """One promtool test: input series, and per (eval time, alert) the alerts expected."""
    return {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "alert_rule_test": [
            {"eval_time": at, "alertname": name, "exp_alerts": alerts}
            for at, name, alerts in checks
        ],
    }


def alert(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return {"exp_labels": {**P0, "namespace": NS, **labels}, "exp_annotations": annotations}


def test_rules_file_is_valid_prometheus() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def lag_alert(durable: str, value: str) -> dict[str, Any]:
    return alert(
        {"durable": durable},
        {
            "summary": f"Durable {durable} is more than 5 minutes behind",
            "description": (
                f"The oldest message {durable} has not yet delivered is {value} old and has "
                "been over 5 minutes for 5 minutes. Scale the consumer first (INFRA-005 §7), "
                "then look at the handler."
            ),
        },
    )


def test_consumer_lag_fires_only_when_over_five_minutes_for_five_minutes(tmp_path: Path) -> None:
    lag = 'ferry_consumer_lag_seconds{{namespace="{ns}", durable="{d}", pod="{p}"}}'
    run_tests(
        tmp_path,
        [
            case(
                {
                    # Sustained: 400 s behind from minute 1 on (two replicas, max wins).
                    lag.format(ns=NS, d="slow", p="a"): "0 400x20",
                    lag.format(ns=NS, d="slow", p="b"): "0 100x20",
                    # A spike of 4 minutes, then caught up.
                    lag.format(ns=NS, d="spiky", p="a"): "0 900x3 0x16",
                    # Exactly the bound, for ever: not above it.
                    lag.format(ns=NS, d="edge", p="a"): "300x20",
                },
                [
                    ("4m", "FerryConsumerLagHigh", []),  # pending, not firing yet
                    ("10m", "FerryConsumerLagHigh", [lag_alert("slow", "6m 40s")]),
                ],
            )
        ],
    )


def test_a_paused_durable_does_not_page_for_lag_but_a_long_pause_is_flagged(
    tmp_path: Path,
) -> None:
    """An operator's pause makes lag grow on purpose: no FerryConsumerLagHigh while it
    lasts (the lag alert fires again once resumed and still behind); four hours of pause
    raise FerryDurablePausedLong (a warning: was it forgotten?)."""
    lag = 'ferry_consumer_lag_seconds{{namespace="{ns}", durable="{d}", pod="{p}"}}'
    paused = 'ferry_consumer_paused{{namespace="{ns}", durable="{d}", pod="{p}"}}'
    long_pause = {
        "exp_labels": {
            "severity": "warning",
            "priority": "P2",
            "namespace": NS,
            "durable": "held",
        },
        "exp_annotations": {
            "summary": "Durable held has been paused for 4 hours",
            "description": (
                "Nothing has been delivered to held for 4 hours: an operator paused it "
                "(ferry durable pause --status shows who and why). Its events wait in the "
                "stream, within the stream's retention. Resume it with ferry durable resume, "
                "or say in the pause's reason why it must last."
            ),
        },
    }
    run_tests(
        tmp_path,
        [
            case(
                {
                    # Paused for 5 hours, 1,000 s behind and growing; then resumed, still behind.
                    lag.format(ns=NS, d="held", p="a"): "1000+60x300 20000x20",
                    paused.format(ns=NS, d="held", p="a"): "1x300 0x20",
                },
                [
                    ("20m", "FerryConsumerLagHigh", []),
                    ("3h", "FerryDurablePausedLong", []),
                    ("4h10m", "FerryDurablePausedLong", [long_pause]),
                    ("4h10m", "FerryConsumerLagHigh", []),
                    ("5h10m", "FerryConsumerLagHigh", [lag_alert("held", "5h 33m 20s")]),
                ],
            )
        ],
    )


def test_outbox_lag_fires_when_events_wait_over_five_minutes(tmp_path: Path) -> None:
    oldest = 'ferry_outbox_oldest_age_seconds{{namespace="{ns}", context="{c}"}}'
    expected = alert(
        {"context": "sea"},
        {
            "summary": "Outbox of sea holds events older than 5 minutes",
            "description": (
                "The oldest unpublished event of sea is 12m 0s old: is the outbox-publisher "
                "running and is JetStream accepting writes?"
            ),
        },
    )
    run_tests(
        tmp_path,
        [
            case(
                {
                    oldest.format(ns=NS, c="sea"): "0+60x15",  # nothing published for 15 min
                    oldest.format(ns=NS, c="vibespro"): "0 1x15",  # drained every second
                },
                [("10m", "FerryOutboxLagHigh", []), ("12m", "FerryOutboxLagHigh", [expected])],
            )
        ],
    )


def spike_alert(durable: str, value: str) -> dict[str, Any]:
    return alert(
        {"durable": durable},
        {
            "summary": f"Dead letters of {durable} above 3x their daily baseline",
            "description": (
                f"{durable} dead-letters at {value}/s. Inspect the records (`ferry dlq list "
                f"--durable {durable}`, reason codes) before any replay."
            ),
        },
    )


def test_dead_letter_spike_against_a_daily_baseline(tmp_path: Path) -> None:
    dl = 'ferry_dead_letters_total{{namespace="{ns}", durable="{d}", reason="{r}", source="{s}"}}'
    day = 1440
    run_tests(
        tmp_path,
        [
            case(
                {
                    # One an hour for a day, then 2 a minute (split over two sources).
                    dl.format(ns=NS, d="spiking", r="HANDLER_REJECTED", s="consumer"):
                        f"0+0.0166666667x{day} 24+1x20",
                    dl.format(ns=NS, d="spiking", r="MAX_DELIVERIES_EXCEEDED",
                              s="advisory:max_deliveries"): f"0x{day} 0+1x20",
                    # Two a minute all along: that is its baseline, not a spike.
                    dl.format(ns=NS, d="steady", r="HANDLER_REJECTED", s="consumer"):
                        f"0+2x{day + 20}",
                    # A new durable: no history, then 2 a minute.
                    dl.format(ns=NS, d="new", r="SCHEMA_INVALID", s="consumer"):
                        f"_x{day} 0+2x20",
                    # A new durable whose first dead letters are too few to page.
                    dl.format(ns=NS, d="quiet", r="SCHEMA_INVALID", s="consumer"):
                        f"_x{day} 0 1 2 3 3x16",
                },
                [
                    (f"{day + 3}m", "FerryDeadLetterSpike", []),  # pending
                    (
                        f"{day + 20}m",
                        "FerryDeadLetterSpike",
                        [spike_alert("new", "33.33m"), spike_alert("spiking", "33.33m")],
                    ),
                ],
            )
        ],
    )  # fmt: skip


def ratio_alert(durable: str, value: str) -> dict[str, Any]:
    return alert(
        {"durable": durable},
        {
            "summary": f"Success ratio of {durable} below 95 %",
            "description": (
                f"Only {value} of the deliveries of {durable} ended processed over the last "
                "10 minutes (see ferry_consumer_retries_total for the reasons)."
            ),
        },
    )


def test_success_ratio_below_threshold_with_enough_traffic(tmp_path: Path) -> None:
    msgs = 'ferry_consumer_messages_total{{namespace="{ns}", durable="{d}", outcome="{o}"}}'
    per_minute = {
        "failing": {"processed": 85, "duplicate": 5, "retried": 6, "dead_lettered": 3,
                    "exhausted": 1},
        "healthy": {"processed": 99, "retried": 1},
        "low_traffic": {"processed": 1, "dead_lettered": 1},  # 50 %, 20 in 10 min
        "contended": {"processed": 60, "contended": 40},  # contention is no failure
    }  # fmt: skip
    series = {
        msgs.format(ns=NS, d=durable, o=outcome): f"0+{n}x40"
        for durable, counts in per_minute.items()
        for outcome, n in counts.items()
    }
    run_tests(
        tmp_path,
        [
            case(
                series,
                [
                    ("8m", "FerrySuccessRatioLow", []),  # below since minute 1: pending for 10m
                    ("30m", "FerrySuccessRatioLow", [ratio_alert("failing", "90%")]),
                ],
            )
        ],
    )


def circuit_alert(durable: str) -> dict[str, Any]:
    return alert(
        {"durable": durable, "severity": "warning", "priority": "P1"},
        {
            "summary": f"Handler of {durable} down: the circuit breaker holds its lane",
            "description": (
                f"{durable}'s consumer stopped calling its handler after calls in a row "
                "failed; messages wait (no delivery spent) and a probe goes out every few "
                "seconds. Check the handler service; the lane resumes on its own when a probe "
                "succeeds (ferry_consumer_circuit_total shows opens and probes)."
            ),
        },
    )


def test_an_open_circuit_breaker_pages_after_two_minutes_not_a_blip(tmp_path: Path) -> None:
    state = 'ferry_consumer_circuit_state{{namespace="{ns}", durable="{d}", pod="{p}"}}'
    run_tests(
        tmp_path,
        [
            case(
                {
                    # Open from minute 1 on in one of two replicas (max wins); half-open counts.
                    state.format(ns=NS, d="down", p="a"): "0 1x3 2 1x10",
                    state.format(ns=NS, d="down", p="b"): "0x14",
                    # Open for one minute, then closed: a blip the handler got over.
                    state.format(ns=NS, d="blip", p="a"): "0 1 0x12",
                },
                [
                    ("2m", "FerryHandlerCircuitOpen", []),  # pending
                    ("5m", "FerryHandlerCircuitOpen", [circuit_alert("down")]),
                ],
            )
        ],
    )


def gaps_alert(durable: str) -> dict[str, Any]:
    return alert(
        {"durable": durable, "severity": "warning", "priority": "P1"},
        {
            "summary": f"Deliveries to {durable} keep getting lost in transit",
            "description": (
                "Three times or more in 30 minutes, deliveries nats-server sent to a consumer "
                f"of {durable} never arrived: its connection dropped as they were sent. "
                "Nothing is lost and each key's order holds, but the partition stalls for "
                "ack_wait each time. Check the consumer's path to NATS (its nats_disconnected "
                "log events, proxies and load balancers' idle timeouts, "
                "ferry_consumer_delivery_gaps_total per pod)."
            ),
        },
    )


def test_deliveries_lost_in_transit_are_flagged_when_they_keep_happening(tmp_path: Path) -> None:
    gaps = 'ferry_consumer_delivery_gaps_total{{namespace="{ns}", durable="{d}", pod="{p}"}}'
    run_tests(
        tmp_path,
        [
            case(
                {
                    # A flapping link: gaps at minutes 5, 11 and 15, over two replicas.
                    gaps.format(ns=NS, d="flapping", p="a"): "0x4 1x5 2x35",
                    gaps.format(ns=NS, d="flapping", p="b"): "0x14 1x30",
                    # Two gaps in half an hour (a reconnect or two): no alert.
                    gaps.format(ns=NS, d="steady", p="a"): "0x4 1x5 2x35",
                },
                [
                    ("12m", "FerryDeliveriesLostInTransit", []),  # two so far
                    ("16m", "FerryDeliveriesLostInTransit", [gaps_alert("flapping")]),
                    ("33m", "FerryDeliveriesLostInTransit", [gaps_alert("flapping")]),
                    # Half an hour after the third gap, the first has left the window.
                    ("39m", "FerryDeliveriesLostInTransit", []),
                ],
            )
        ],
    )
