"""Every rendered manifest is valid: built-in kinds against the Kubernetes schemas
(kubernetes-validate --strict, offline: the schemas ship in its wheel), custom resources
against the fields their operators require."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv

from .conftest import Doc, by_kind
from .crds import CUSTOM_RESOURCES, check_custom_resource

#: Oldest Kubernetes release the manifests support, and the newest the schemas know.
VERSIONS = ("1.30", kv.latest_version())


def _builtin(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if (d["apiVersion"], d["kind"]) not in CUSTOM_RESOURCES]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["dev", "prod", "cnpg"])
def test_builtin_kinds_validate_strictly(
    rendered: dict[str, list[Doc]], name: str, version: str
) -> None:
    errors = []
    for doc in _builtin(rendered[name]):
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        try:
            kv.validate(doc, version, strict=True)
        except kv.SchemaNotFoundError:
            errors.append(f"{where}: no schema for {doc['apiVersion']} in {version}")
        except kv.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{where}: {path}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_the_kubernetes_validate_command_accepts_every_builtin_manifest(
    rendered: dict[str, list[Doc]], tmp_path: Path
) -> None:
    """What an operator runs by hand: kubernetes-validate --strict on the rendered files."""
    files = []
    for name, docs in rendered.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(_builtin(docs), sort_keys=False))
        files.append(str(path))
    cli = Path(sys.executable).with_name("kubernetes-validate")
    proc = subprocess.run(
        [str(cli), "--strict", "--quiet", "-k", VERSIONS[0], *files],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ERROR" not in proc.stdout and "WARN" not in proc.stdout, proc.stdout


def test_a_broken_manifest_is_caught(rendered: dict[str, list[Doc]]) -> None:
    """The validation above can fail: a misspelt field in a Deployment is rejected."""
    deployment: dict[str, Any] = yaml.safe_load(
        yaml.safe_dump(by_kind(rendered["prod"], "Deployment")[0])
    )
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, VERSIONS[0], strict=True)


@pytest.mark.parametrize("name", ["dev", "prod", "cnpg"])
def test_custom_resources_carry_what_their_operators_require(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    docs = rendered[name]
    errors = []
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_RESOURCES:
            errors += check_custom_resource(doc, docs)
    assert not errors, "\n".join(errors)


def test_dev_needs_no_operator(rendered: dict[str, list[Doc]]) -> None:
    """The dev overlay applies to a bare cluster (kind, minikube): no custom resource."""
    custom = [
        d["kind"] for d in rendered["dev"] if (d["apiVersion"], d["kind"]) in CUSTOM_RESOURCES
    ]
    assert custom == []


def test_prod_carries_every_operator_resource(rendered: dict[str, list[Doc]]) -> None:
    kinds = {d["kind"] for d in rendered["prod"]}
    assert {"ScaledObject", "PodMonitor", "PrometheusRule", "ScheduledSparkApplication"} <= kinds
    assert "Certificate" in kinds  # k8s/components/tls
    assert {d["kind"] for d in rendered["cnpg"]} == {"Cluster", "Database"}
