"""Fixtures of the Kubernetes manifest tests: overlays rendered by the real kustomize.

``kubectl kustomize`` (kustomize built into kubectl) or a standalone ``kustomize`` renders
every overlay and example exactly as ``kubectl apply -k`` would. Neither on PATH is a
failure, not a skip: install kubectl (Debian/Ubuntu: the Kubernetes apt repository) or a
kustomize release binary.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
#: Every kustomization a user applies, by short name.
KUSTOMIZATIONS = {
    "dev": K8S / "overlays" / "dev",
    "prod": K8S / "overlays" / "prod",
    "cnpg": K8S / "examples" / "cnpg",
    # cert-manager: the NATS servers' certificates and the example CA issuer.
    "nats-tls": K8S / "nats" / "tls",
    "cert-manager-ca": K8S / "examples" / "cert-manager-ca",
}
TOPOLOGIES = {
    "sea-vibespro": ROOT / "topologies" / "sea-vibespro.yaml",
    "mediation": ROOT / "topologies" / "mediation.yaml",
}

Doc = dict[str, Any]


def kustomize_command() -> list[str]:
    """The command that renders a kustomization directory given as its last argument."""
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    pytest.fail("neither `kustomize` nor `kubectl` is on PATH: the overlays cannot be rendered")


def render(path: Path) -> list[Doc]:
    """Every object of the kustomization at ``path``."""
    proc = subprocess.run(
        [*kustomize_command(), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"kustomize failed on {path}:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[Doc]]:
    """Each kustomization of KUSTOMIZATIONS, rendered."""
    return {name: render(path) for name, path in KUSTOMIZATIONS.items()}


@pytest.fixture(scope="session")
def secret_docs(tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    """The Secrets an operator renders before applying (``python -m k8s.secrets --dev
    --cnpg``), from fresh random passwords: no secret lives in the repository."""
    from k8s.secrets import render as render_secrets
    from shared.contracts.loading import load_topology

    topologies = [load_topology(path) for path in TOPOLOGIES.values()]
    var = tmp_path_factory.mktemp("k8s-secrets")
    return render_secrets(topologies, var, dev=True, cnpg=True)


def by_kind(docs: list[Doc], kind: str) -> list[Doc]:
    """The objects of ``kind``."""
    return [d for d in docs if d["kind"] == kind]


def pod_spec(doc: Doc) -> Doc:
    """The pod spec inside a workload (Deployment, StatefulSet, Job, CronJob)."""
    template = _template(doc)
    spec: Doc = template["spec"]
    return spec


def pod_labels(doc: Doc) -> dict[str, str]:
    """The labels of the pods a workload makes."""
    labels: dict[str, str] = _template(doc)["metadata"]["labels"]
    return labels


def _template(doc: Doc) -> Doc:
    spec = doc["spec"]["jobTemplate"]["spec"] if doc["kind"] == "CronJob" else doc["spec"]
    template: Doc = spec["template"]
    return template


WORKLOADS = ("Deployment", "StatefulSet", "Job", "CronJob")


def tls_secrets(docs: list[Doc]) -> set[str]:
    """The TLS Secrets of a render (k8s/components/tls): each one a Certificate of the render
    makes, and CloudNativePG's CA. They hold certificates, not credentials: the tests of
    the roles' own Secrets leave them to tests/k8s/test_tls.py."""
    from k8s.tls import PG_CA_SECRET

    made = {d["spec"]["secretName"] for d in by_kind(docs, "Certificate")}
    return made | {PG_CA_SECRET} if made else set()
