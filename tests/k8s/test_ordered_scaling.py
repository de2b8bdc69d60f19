"""KEDA scaling of ordered durables: never more replicas than partitions (a replica beyond
them would own nothing), one lag trigger per partition consumer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from k8s import pods, roles
from shared.contracts.loading import load_topology

from .conftest import K8S, ROOT

MEDIATION = load_topology(ROOT / "topologies/mediation.yaml")


def _scaled(durable: str, topology: Any = MEDIATION) -> dict[str, Any]:
    doc: dict[str, Any] = roles.scaled_object(topology, durable)
    return doc


def _lag_consumers(spec: dict[str, Any]) -> list[str]:
    return [t["metadata"]["consumer"] for t in spec["triggers"] if t["type"] == "nats-jetstream"]


def test_ordered_durables_scale_up_to_their_partitions() -> None:
    for durable in ("cg_g_archive", "cg_h_publish"):
        spec = _scaled(durable)["spec"]
        partitions = MEDIATION.stream_of(durable).partitions
        assert spec["maxReplicaCount"] == partitions
        assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
        assert _lag_consumers(spec) == [f"{durable}_p{k}" for k in range(partitions)]
    unordered = _scaled("cg_f_ingest")["spec"]
    assert unordered["maxReplicaCount"] == pods.MAX_REPLICAS
    assert _lag_consumers(unordered) == ["cg_f_ingest"]


def test_an_ordered_durable_on_one_partition_runs_one_replica(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "topologies/mediation.yaml").read_text())
    doc["contexts"]["module_h"]["stream"]["partitions"] = 1
    path = tmp_path / "mediation.yaml"
    path.write_text(yaml.safe_dump(doc))
    spec = _scaled("cg_h_publish", load_topology(path))["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 1)
    assert _lag_consumers(spec) == ["cg_h_publish"]


def test_the_committed_scaled_objects_respect_partitions() -> None:
    docs = list(
        yaml.safe_load_all((K8S / "generated/mediation/keda/scaledobjects.yaml").read_text())
    )
    for doc in docs:
        durable = doc["metadata"]["labels"]["ferry/durable"]
        if MEDIATION.durable(durable).ordering == "key":
            assert doc["spec"]["maxReplicaCount"] <= MEDIATION.consumer_partitions(durable)


def test_a_paused_durable_is_held_at_its_replica_count() -> None:
    """KEDA scales on the largest partition's lag unless the durable is paused: then on
    ferry_consumer_paused summed over the replicas (their count) times the target, so the
    HPA keeps as many replicas as there are (issue 45)."""
    spec = _scaled("cg_g_archive")["spec"]
    threshold = MEDIATION.durables["cg_g_archive"].max_ack_pending
    names = [t["name"] for t in spec["triggers"]]
    assert names == ["lag_0", "lag_1", "lag_2", "lag_3", "paused"]
    modifiers = spec["advanced"]["scalingModifiers"]
    assert modifiers == {
        "formula": f"paused > 0 ? paused * {threshold} : max(lag_0, lag_1, lag_2, lag_3)",
        "target": str(threshold),
        "metricType": "AverageValue",
    }
    paused = spec["triggers"][-1]
    assert paused["type"] == "prometheus"
    assert paused["metadata"]["query"] == (
        'sum(ferry_consumer_paused{durable="cg_g_archive"}) or vector(0)'
    )
    single = _scaled("cg_f_ingest")["spec"]["advanced"]["scalingModifiers"]["formula"]
    assert single.endswith(": lag_0")
