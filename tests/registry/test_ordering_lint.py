"""Ordering in the topology: what the model refuses on a partitioned stream, the ordering lint
rules with their exact messages, and ``ordering_key`` carried from manifests to the registry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.contracts.codegen import check, generate
from shared.contracts.events import declared_events
from shared.contracts.lint import lint_topology, ordering_key_defect
from shared.contracts.loading import load_topology
from shared.domain.errors import ConfigurationError
from tests.conftest import ROOT

from .conftest import MEDIATION, edit_yaml, lint_doc, load_doc, read_yaml, shipped

M = MEDIATION
ARCHIVE_NS = "mediation.f_to_g.archive"


def _archive(doc: dict[str, Any]) -> dict[str, Any]:
    durable: dict[str, Any] = doc["durables"]["cg_g_archive"]
    return durable


# --- the shipped mediation topology ----------------------------------------------------


def test_mediation_declares_its_ordered_lanes() -> None:
    topology = load_topology(ROOT / MEDIATION)
    archive, publish = topology.durable("cg_g_archive"), topology.durable("cg_h_publish")
    assert (archive.ordering, archive.on_dead_letter) == ("key", "hold")
    assert (publish.ordering, publish.on_dead_letter) == ("key", "hold")
    assert topology.stream_of("cg_g_archive").partitions == 4
    assert topology.stream_of("cg_h_publish").partitions == 2
    assert [c.name for c in topology.consumers("cg_g_archive")] == [
        f"cg_g_archive_p{k}" for k in range(4)
    ]
    first = topology.consumers("cg_g_archive")[1]
    assert first.filters == (
        f"{ARCHIVE_NS}.*.*.1",
        "ferry.replay.MEDIATION_F_TO_G_ARCHIVE.cg_g_archive.1",
    )
    # Unordered durables keep one consumer with their own filters.
    assert [(c.name, c.partition) for c in topology.consumers("cg_f_ingest")] == [
        ("cg_f_ingest", None)
    ]
    # The registry carries H's ordering key (a payload field), none for the aggregate-keyed.
    events = {e.type: e for e in topology.events}
    assert events["config_publish_requested"].ordering_key == "config_id"
    assert events["opportunity_archived"].ordering_key is None
    assert events["opportunity_archived"].handled_by == ["cg_g_archive"]


# --- the model: filters on a partitioned stream -----------------------------------------


def test_an_unordered_durable_must_read_every_partition(tmp_path: Path) -> None:
    doc = shipped(MEDIATION)
    _archive(doc)["ordering"] = "none"
    del _archive(doc)["on_dead_letter"]
    _archive(doc)["filter_subjects"] = [f"{ARCHIVE_NS}.opportunity_archived.v1"]
    with pytest.raises(ConfigurationError) as caught:
        load_doc(tmp_path, doc)
    assert (
        f"durables.cg_g_archive.filter_subjects[0]: '{ARCHIVE_NS}.opportunity_archived.v1' "
        "matches no message: stream MEDIATION_F_TO_G_ARCHIVE has partitions: 4, so every "
        "subject ends in a partition token; an unordered durable reads every partition with "
        f"'{ARCHIVE_NS}.opportunity_archived.v1.*'" in str(caught.value)
    )
    _archive(doc)["filter_subjects"] = [f"{ARCHIVE_NS}.opportunity_archived.v1.*"]
    topology = load_doc(tmp_path, doc)
    assert [c.name for c in topology.consumers("cg_g_archive")] == ["cg_g_archive"]
    # ...and it still receives the event (coverage gates, handled_by) and passes the lint.
    assert topology.delivers("cg_g_archive", f"{ARCHIVE_NS}.opportunity_archived.v1")
    assert lint_topology(topology, source=M) == []


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        (f"{ARCHIVE_NS}.opportunity_archived.v1.2", "names a partition itself"),
        (f"{ARCHIVE_NS}.opportunity_archived", "cannot be read per partition"),
    ],
)
def test_an_ordered_durable_filter_must_narrow_per_partition(
    tmp_path: Path, pattern: str, says: str
) -> None:
    doc = shipped(MEDIATION)
    _archive(doc)["filter_subjects"] = [pattern]
    with pytest.raises(ConfigurationError, match=says) as caught:
        load_doc(tmp_path, doc)
    assert "durables.cg_g_archive.filter_subjects[0]" in str(caught.value)
    assert "(stream MEDIATION_F_TO_G_ARCHIVE has partitions: 4)" in str(caught.value)


def test_an_ordered_durable_may_write_either_form(tmp_path: Path) -> None:
    for pattern in (f"{ARCHIVE_NS}.opportunity_archived.v1", f"{ARCHIVE_NS}.*.v1.*"):
        doc = shipped(MEDIATION)
        _archive(doc)["filter_subjects"] = [pattern]
        topology = load_doc(tmp_path, doc)
        assert topology.consumers("cg_g_archive")[3].filters[0].endswith(".v1.3")
        assert lint_topology(topology, source=M) == []


def test_a_partitioned_stream_must_capture_the_token(tmp_path: Path) -> None:
    doc = shipped(MEDIATION)
    stream = doc["contexts"]["module_f"]["stream"]
    stream["subjects"] = [f"{ARCHIVE_NS}.>", f"{ARCHIVE_NS}.extra.v1"]
    with pytest.raises(ConfigurationError) as caught:
        load_doc(tmp_path, doc)
    assert (
        f"stream.subjects[1]: '{ARCHIVE_NS}.extra.v1' does not capture the partition token "
        "that stream MEDIATION_F_TO_G_ARCHIVE (partitions: 4) adds to every subject: write "
        f"'{ARCHIVE_NS}.extra.v1.*' or {ARCHIVE_NS}.>" in str(caught.value)
    )


# --- lint rules ---------------------------------------------------------------------------


def test_skip_with_automatic_replay_breaks_order_twice(tmp_path: Path) -> None:
    doc = shipped(MEDIATION)
    _archive(doc).update(on_dead_letter="skip", replay="automatic")
    assert lint_doc(tmp_path, doc, M) == [
        f"{M}: durables.cg_g_archive.on_dead_letter: skip with replay: automatic cannot keep "
        "the key's order: its later events go on past the dead letter, and the automatic "
        "replay of it then arrives after them (order broken twice); use on_dead_letter: "
        "hold, whose key waits for the replay, or replay: operator [ordering-replay]"
    ]
    _archive(doc)["replay"] = "operator"
    assert lint_doc(tmp_path, doc, M) == []
    _archive(doc).update(on_dead_letter="hold", replay="automatic")
    assert lint_doc(tmp_path, doc, M) == []


def test_an_ordered_handler_may_outlast_ack_wait_while_heartbeats_keep_it(
    tmp_path: Path,
) -> None:
    """A key's order across a takeover rests on the partition lease and the handler's
    claim (services/inbox_consumer/partitions.py), not on the timeout: an ordered durable
    runs a short ack_wait and heartbeats keep its long calls alive."""
    doc = shipped(MEDIATION)
    _archive(doc)["handler"]["timeout"] = "60s"
    assert lint_doc(tmp_path, doc, M) == []
    _archive(doc)["heartbeats"] = False
    found = lint_doc(tmp_path, doc, M)
    assert len(found) == 1 and found[0].startswith(f"{M}: durables.cg_g_archive.handler.timeout")
    assert found[0].endswith("[handler-timeout]")


def test_on_dead_letter_without_ordering_has_no_effect(tmp_path: Path) -> None:
    doc = shipped(MEDIATION)
    doc["durables"]["cg_f_ingest"]["on_dead_letter"] = "skip"
    assert lint_doc(tmp_path, doc, M) == [
        f"{M}: durables.cg_f_ingest.on_dead_letter: skip has no effect with ordering: none: "
        "nothing waits behind a dead letter of an unordered durable; declare ordering: key "
        "or drop on_dead_letter [ordering-unused]"
    ]


SCHEMA = {
    "type": "object",
    "required": ["config_id", "target", "n"],
    "properties": {
        "config_id": {"type": "string"},
        "n": {"type": "number"},
        "either": {"type": ["string", "integer"]},
        "target": {
            "type": "object",
            "required": ["id"],
            "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
        },
    },
}


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("config_id", None),
        ("target.id", None),
        ("missing", "is not a property of the schema (no 'missing' in the payload)"),
        ("either", "is not required by the schema ('either' is optional in the payload)"),
        ("target.name", "is not required by the schema ('name' is optional in target)"),
        ("n", "is typed 'number' in the schema, not string or integer"),
        ("target", "is typed 'object' in the schema, not string or integer"),
        ("config_id.x", "is not a property of the schema (no 'x' in config_id)"),
    ],
)
def test_ordering_key_defects(path: str, reason: str | None) -> None:
    assert ordering_key_defect(SCHEMA, path) == reason


def test_an_ordering_key_field_the_schema_does_not_require(project: Path) -> None:
    manifest = project / "manifests/mediation/module_h.yaml"
    edit_yaml(
        manifest,
        lambda doc: doc["publishes"][0].update(ordering_key="revision_note"),
    )
    generate(project)  # ordering_key is no schema constraint: the lock does not change
    found = [str(p) for p in check(project) if p.rule == "ordering-key-field"]
    assert found == [
        "manifests/mediation/module_h.yaml: publishes.config_publish_requested.v1."
        "ordering_key: 'revision_note' is not a property of the schema (no 'revision_note' "
        "in the payload): a valid payload could lack its ordering key or carry one that is "
        "not a string or an integer [ordering-key-field]"
    ]


def test_ordering_key_is_carried_into_the_registry_not_the_lock(project: Path) -> None:
    lock_before = (project / "manifests/schemas.lock").read_text()
    manifest = project / "manifests/mediation/module_h.yaml"
    edit_yaml(manifest, lambda doc: doc["publishes"][0].pop("ordering_key"))
    assert [p.rule for p in check(project)] == ["stale-registry"]
    generate(project)
    assert check(project) == []
    assert (project / "manifests/schemas.lock").read_text() == lock_before
    assert "ordering_key" not in (project / "shared/contracts/registry.json").read_text()
    assert read_yaml(manifest)["publishes"][0].get("ordering_key") is None


def test_the_shipped_registry_holds_the_ordering_key() -> None:
    events = {e.type: e for e in declared_events("mediation")}
    assert events["config_publish_requested"].ordering_key == "config_id"


def test_a_malformed_ordering_key_is_refused_on_load(project: Path) -> None:
    manifest = project / "manifests/mediation/module_h.yaml"
    edit_yaml(manifest, lambda doc: doc["publishes"][0].update(ordering_key="config id"))
    with pytest.raises(ConfigurationError, match="ordering_key 'config id' must be a payload"):
        check(project)


# --- replay subjects ------------------------------------------------------------------------


def test_a_replay_goes_back_through_its_keys_partition() -> None:
    from shared.domain.ordering import OrderingKeyError, partition_of

    topology = load_topology(ROOT / MEDIATION)
    archived = {
        "event_type": "opportunity_archived",
        "event_version": 1,
        "aggregate_type": "opportunity",
        "aggregate_id": "o-9",
        "payload": {"opportunity_key": "o-9"},
    }
    k = partition_of("opportunity/o-9", 4)
    assert (
        topology.replay_subject_for("cg_g_archive", archived)
        == f"ferry.replay.MEDIATION_F_TO_G_ARCHIVE.cg_g_archive.{k}"
    )
    config = {
        "event_type": "config_publish_requested",
        "event_version": 1,
        "aggregate_type": "config",
        "aggregate_id": "whatever",
        "payload": {"config_id": "cfg-3", "revision": 2},
    }
    k = partition_of("cfg-3", 2)  # the manifest's ordering_key, not the aggregate
    assert (
        topology.replay_subject_for("cg_h_publish", config)
        == f"ferry.replay.MEDIATION_H_PUBLISH_JOBS.cg_h_publish.{k}"
    )
    assert (
        topology.replay_subject_for("cg_f_ingest", {})
        == "ferry.replay.MEDIATION_E_TO_F_EVENTS.cg_f_ingest"
    )
    with pytest.raises(OrderingKeyError):
        topology.replay_subject_for("cg_h_publish", {**config, "payload": {"revision": 2}})
