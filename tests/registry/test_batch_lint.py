"""``handler.batch`` in the topology: its bounds, the shipped lanes that batch, and no lint
rule against batching an ordered durable."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.domain.errors import ConfigurationError

from .conftest import MEDIATION, lint_doc, load_doc, shipped

M = MEDIATION


def test_batch_defaults_to_per_message_calls(tmp_path: Path) -> None:
    doc = shipped(MEDIATION)
    for durable in doc["durables"].values():
        durable["handler"].pop("batch", None)
    topology = load_doc(tmp_path, doc)
    assert {d.handler.batch for d in topology.durables.values()} == {1}


def test_the_mediation_lanes_batch_their_handler_calls(tmp_path: Path) -> None:
    topology = load_doc(tmp_path, shipped(MEDIATION))
    batching = {
        name: d.handler.batch for name, d in topology.durables.items() if d.handler.batch > 1
    }
    assert batching == {"cg_f_ingest": 50, "cg_g_archive": 50}
    assert topology.durable("cg_g_archive").ordering == "key"


def test_an_unordered_durable_may_batch(tmp_path: Path) -> None:
    doc = shipped(MEDIATION)
    doc["durables"]["cg_f_ingest"]["handler"]["batch"] = 50
    assert load_doc(tmp_path, doc).durable("cg_f_ingest").handler.batch == 50
    assert lint_doc(tmp_path, doc, M) == []


def test_an_ordered_durable_may_batch(tmp_path: Path) -> None:
    # A key's events still go one at a time (the sequencer's gatherer puts only different
    # keys' events in one call): nothing for the lint to refuse.
    doc = shipped(MEDIATION)
    doc["durables"]["cg_g_archive"]["handler"]["batch"] = 10
    assert load_doc(tmp_path, doc).durable("cg_g_archive").handler.batch == 10
    assert lint_doc(tmp_path, doc, M) == []


@pytest.mark.parametrize("size", [0, -1, 1001, "many"])
def test_a_batch_size_out_of_bounds_is_refused(tmp_path: Path, size: object) -> None:
    doc = shipped(MEDIATION)
    doc["durables"]["cg_f_ingest"]["handler"]["batch"] = size
    with pytest.raises(ConfigurationError, match="batch"):
        load_doc(tmp_path, doc)
