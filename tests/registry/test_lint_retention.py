"""Rule ``claims-retention``: a handler's claims must outlast every way a copy can arrive,
refused with the file, the context, the durable and both durations; the defaults pass."""

from __future__ import annotations

from pathlib import Path

from shared.contracts.topology_specs import ContextSpec

from .conftest import MEDIATION, SEA_VIBESPRO, lint_doc, shipped

F = SEA_VIBESPRO


def test_claims_retention_shorter_than_the_replay_horizon(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["contexts"]["sea"]["claims_retention"] = "8d"
    assert lint_doc(tmp_path, doc) == [
        f"{F}: contexts.sea.claims_retention: 8d is shorter than the replay horizon of "
        "durable sea__from_vibespro (30d 6h 25m 12s): a copy arriving after its "
        "handler_applied claim is purged would be applied twice by context sea's handler "
        "[claims-retention]"
    ]


def test_claims_retention_shorter_than_the_stream_max_age(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    for stream in doc["dead_letter_streams"]:
        stream["max_age"] = "1d"
    doc["contexts"]["sea"]["claims_retention"] = "6d"
    assert lint_doc(tmp_path, doc) == [
        f"{F}: contexts.sea.claims_retention: 6d is shorter than the max_age of stream "
        "VIBESPRO_EVENTS read by durable sea__from_vibespro (7d): a copy arriving after its "
        "handler_applied claim is purged would be applied twice by context sea's handler "
        "[claims-retention]"
    ]
    doc["contexts"]["sea"]["claims_retention"] = "7d"
    assert lint_doc(tmp_path, doc) == []


def test_shipped_topologies_keep_the_safe_defaults(tmp_path: Path) -> None:
    """Defaults: claims as long as the inbox (35 days), audit rows 400 days; both shipped
    topologies pass with them."""
    defaults = ContextSpec.model_fields
    assert defaults["claims_retention"].default == 35 * 86400.0
    assert defaults["claims_retention"].default == defaults["inbox_retention"].default
    assert defaults["audit_retention"].default == 400 * 86400.0
    for relative in (SEA_VIBESPRO, MEDIATION):
        assert lint_doc(tmp_path, shipped(relative)) == []


def test_audit_retention_is_a_duration(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["contexts"]["sea"]["audit_retention"] = "90d"
    assert lint_doc(tmp_path, doc) == []
