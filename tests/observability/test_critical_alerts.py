"""The alerts of ``criticality: high`` durables (INFRA-005 §7), as generated for Kubernetes
(``python -m k8s.generate``), evaluated by Prometheus's rule engine (promtool).

cg_h_publish (declared high in topologies/mediation.yaml) pages on its FIRST dead letter
— a counter series born at 1 included, which ``increase`` alone cannot see — and on a lag
over a minute for a minute; a normal durable's dead letter or lag does neither.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from k8s.generate import DEFAULT_TOPOLOGIES, critical_alert_group, generate
from shared.contracts.loading import load_topology
from tests.conftest import ROOT
from tests.observability.test_alerts import case, promtool

NS = "ferry"
HIGH = {"severity": "critical", "priority": "P0", "criticality": "high"}


def shipped_group() -> dict[str, Any]:
    group = critical_alert_group([load_topology(ROOT / p) for p in DEFAULT_TOPOLOGIES])
    assert group is not None
    return group


def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "critical.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [shipped_group()]}, sort_keys=False))
    return path


def run(tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    doc = {"rule_files": [str(rules_file(tmp_path))], "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / "critical.test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def fired(durable: str, lag: str = "") -> list[dict[str, Any]]:
    """The alert as it fires for ``durable`` (the lag alert with its value, humanized)."""
    if lag:
        annotations = {
            "summary": f"Critical durable {durable} is behind",
            "description": f"The oldest message {durable} has not yet delivered is {lag} old "
            "(criticality: high pages over 60s for 1m). Is the consumer running and bound "
            "(ferry_consumer_bound), is the handler answering? Scale the consumer first "
            "(INFRA-005 §7).",
        }
    else:
        annotations = {
            "summary": f"Critical durable {durable} dead-lettered a message",
            "description": f"{durable} is declared criticality: high: every dead letter "
            f"pages. See it with `ferry dlq list --durable {durable}`, fix the cause, then "
            "replay it (`ferry dlq replay`); a held key's later events wait for it (`ferry "
            "parked list`).",
        }
    labels = {**HIGH, "namespace": NS, "durable": durable}
    return [{"exp_labels": labels, "exp_annotations": annotations}]


def test_the_generated_rule_carries_the_critical_group_for_cg_h_publish_only() -> None:
    files = generate([ROOT / p for p in DEFAULT_TOPOLOGIES])
    rule = yaml.safe_load(files["monitoring/prometheusrule.yaml"].split("\n", 2)[2])
    groups = {g["name"]: g for g in rule["spec"]["groups"]}
    critical = groups["ferry.critical"]
    assert {r["alert"] for r in critical["rules"]} == {
        "FerryCriticalDeadLetter",
        "FerryCriticalLag",
    }
    exprs = " ".join(r["expr"] for r in critical["rules"])
    assert 'durable=~"cg_h_publish"' in exprs
    for normal in ("cg_f_ingest", "cg_g_archive", "cg_replay", "sea__from_vibespro"):
        assert normal not in exprs
    assert all(r["for"] in ("0m", "1m") for r in critical["rules"])
    # what is committed is what the generator makes (CI also checks the whole tree)
    committed = (ROOT / "k8s/generated/monitoring/prometheusrule.yaml").read_text()
    assert committed == files["monitoring/prometheusrule.yaml"]


def test_no_high_durable_no_group() -> None:
    assert critical_alert_group([load_topology(ROOT / "topologies/sea-vibespro.yaml")]) is None


def test_the_critical_rules_are_valid_prometheus(tmp_path: Path) -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(rules_file(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_first_dead_letter_of_a_critical_durable_pages_at_once(tmp_path: Path) -> None:
    first = f'ferry_dead_letters_total{{namespace="{NS}",durable="cg_h_publish",reason="HTTP_422",source="consumer"}}'  # noqa: E501
    normal = f'ferry_dead_letters_total{{namespace="{NS}",durable="cg_f_ingest",reason="HTTP_422",source="consumer"}}'  # noqa: E501
    again = f'ferry_dead_letters_total{{namespace="{NS}",durable="cg_h_publish",reason="HTTP_500",source="advisory"}}'  # noqa: E501
    run(
        tmp_path,
        [
            # A series born at 1 at minute 10 (the consumer's first dead letter).
            case(
                {first: "_x10 1x30", normal: "_x10 1x30"},
                [
                    ("9m", "FerryCriticalDeadLetter", []),
                    ("10m", "FerryCriticalDeadLetter", fired("cg_h_publish")),
                    ("13m", "FerryCriticalDeadLetter", fired("cg_h_publish")),
                    ("20m", "FerryCriticalDeadLetter", []),  # nothing new for 10 minutes
                ],
            ),
            # A series that exists (0 for a long while) and rises once.
            case(
                {again: "0x20 1x20"},
                [
                    ("19m", "FerryCriticalDeadLetter", []),
                    ("21m", "FerryCriticalDeadLetter", fired("cg_h_publish")),
                ],
            ),
        ],
    )


def test_lag_over_a_minute_pages_a_critical_durable_only(tmp_path: Path) -> None:
    high = f'ferry_consumer_lag_seconds{{namespace="{NS}",durable="cg_h_publish"}}'
    normal = f'ferry_consumer_lag_seconds{{namespace="{NS}",durable="cg_f_ingest"}}'
    run(
        tmp_path,
        [
            case(
                # 0 (minutes 0-5), 30 s (6-11: under the bound), then 90 s and growing.
                {high: "0x5 30x5 90+60x10", normal: "0x5 30x5 90+60x10"},
                [
                    ("11m", "FerryCriticalLag", []),
                    ("12m", "FerryCriticalLag", []),  # over the bound, not yet for a minute
                    ("13m", "FerryCriticalLag", fired("cg_h_publish", lag="2m 30s")),
                ],
            ),
            # Paused by an operator (ferry durable pause): no page while it lasts.
            case(
                {
                    high: "0x5 30x5 90+60x10",
                    f'ferry_consumer_paused{{namespace="{NS}",durable="cg_h_publish"}}': "1x20",
                },
                [("13m", "FerryCriticalLag", []), ("19m", "FerryCriticalLag", [])],
            ),
        ],
    )
