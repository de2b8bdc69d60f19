"""``handler.batch`` in the topology: its bounds, and the lint rule that keeps ordered
durables on per-message calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.domain.errors import ConfigurationError

from .conftest import MEDIATION, lint_doc, load_doc, shipped

M = MEDIATION


def test_batch_defaults_to_per_message_calls(tmp_path: Path) -> None:
    topology = load_doc(tmp_path, shipped(MEDIATION))
    assert {d.handler.batch for d in topology.durables.values()} == {1}


def test_an_unordered_durable_may_batch(tmp_path: Path) -> None:
    doc = shipped(MEDIATION)
    doc["durables"]["cg_f_ingest"]["handler"]["batch"] = 50
    assert load_doc(tmp_path, doc).durable("cg_f_ingest").handler.batch == 50
    assert lint_doc(tmp_path, doc, M) == []


def test_an_ordered_durable_may_not_batch(tmp_path: Path) -> None:
    doc = shipped(MEDIATION)
    doc["durables"]["cg_g_archive"]["handler"]["batch"] = 10
    assert lint_doc(tmp_path, doc, M) == [
        f"{M}: durables.cg_g_archive.handler.batch: batch: 10 cannot be used with ordering: "
        "key: a key's events reach the handler one at a time, in their key's turn, and a "
        "failed one parks the events behind it; keep batch: 1 (per-message calls) on an "
        "ordered durable [ordering-batch]"
    ]


@pytest.mark.parametrize("size", [0, -1, 1001, "many"])
def test_a_batch_size_out_of_bounds_is_refused(tmp_path: Path, size: object) -> None:
    doc = shipped(MEDIATION)
    doc["durables"]["cg_f_ingest"]["handler"]["batch"] = size
    with pytest.raises(ConfigurationError, match="batch"):
        load_doc(tmp_path, doc)
