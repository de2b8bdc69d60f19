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


def test_ordered_durables_scale_up_to_their_partitions() -> None:
    for durable in ("cg_g_archive", "cg_h_publish"):
        spec = _scaled(durable)["spec"]
        partitions = MEDIATION.stream_of(durable).partitions
        assert spec["maxReplicaCount"] == partitions
        assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
        assert [t["metadata"]["consumer"] for t in spec["triggers"]] == [
            f"{durable}_p{k}" for k in range(partitions)
        ]
    unordered = _scaled("cg_f_ingest")["spec"]
    assert unordered["maxReplicaCount"] == pods.MAX_REPLICAS
    assert [t["metadata"]["consumer"] for t in unordered["triggers"]] == ["cg_f_ingest"]


def test_an_ordered_durable_on_one_partition_runs_one_replica(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "topologies/mediation.yaml").read_text())
    doc["contexts"]["module_h"]["stream"]["partitions"] = 1
    path = tmp_path / "mediation.yaml"
    path.write_text(yaml.safe_dump(doc))
    spec = _scaled("cg_h_publish", load_topology(path))["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 1)
    assert [t["metadata"]["consumer"] for t in spec["triggers"]] == ["cg_h_publish"]


def test_the_committed_scaled_objects_respect_partitions() -> None:
    docs = list(
        yaml.safe_load_all((K8S / "generated/mediation/keda/scaledobjects.yaml").read_text())
    )
    for doc in docs:
        durable = doc["metadata"]["labels"]["ferry/durable"]
        if MEDIATION.durable(durable).ordering == "key":
            assert doc["spec"]["maxReplicaCount"] <= MEDIATION.consumer_partitions(durable)
