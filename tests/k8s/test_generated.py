"""The generated manifests are fresh, stable, and the generator refuses what cannot deploy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from k8s import generate, pods
from shared.domain.errors import ConfigurationError
from shared.domain.ordering import durable_of_consumer

from .conftest import K8S, ROOT, TOPOLOGIES

GENERATED = K8S / "generated"


def test_committed_manifests_are_what_the_generator_makes(tmp_path: Path) -> None:
    """CI's staleness check: regenerate into a temp dir, compare every file byte for byte."""
    out = tmp_path / "generated"
    assert generate.main(["--out", str(out)]) == 0
    fresh = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    committed = sorted(
        p.relative_to(GENERATED).as_posix() for p in GENERATED.rglob("*") if p.is_file()
    )
    assert committed == fresh, "run: python -m k8s.generate"
    stale = [p for p in fresh if (out / p).read_bytes() != (GENERATED / p).read_bytes()]
    assert not stale, f"stale generated files {stale}: run python -m k8s.generate"


def test_output_is_stable_across_runs() -> None:
    assert generate.generate(list(TOPOLOGIES.values())) == generate.generate(
        list(TOPOLOGIES.values())
    )


def test_check_command_passes_when_fresh_and_names_each_stale_file(tmp_path: Path) -> None:
    out = tmp_path / "generated"
    shutil.copytree(GENERATED, out)
    check = [sys.executable, "-m", "k8s.generate", "--check", "--out", str(out)]
    fresh = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, check=False)
    assert fresh.returncode == 0, fresh.stderr

    edited = out / "sea-vibespro" / "inbox-consumer-sea--from-vibespro.yaml"
    edited.write_text(edited.read_text().replace("'15'", "'99'"))
    (out / "mediation" / "provision.yaml").unlink()
    (out / "mediation" / "inbox-consumer-cg-gone.yaml").write_text("kind: Deployment\n")
    stale = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, check=False)
    assert stale.returncode == 1
    assert "differs: sea-vibespro/inbox-consumer-sea--from-vibespro.yaml" in stale.stderr
    assert "missing: mediation/provision.yaml" in stale.stderr
    assert "extra: mediation/inbox-consumer-cg-gone.yaml" in stale.stderr


def test_writing_removes_files_of_durables_that_are_gone(tmp_path: Path) -> None:
    out = tmp_path / "generated"
    shutil.copytree(GENERATED, out)
    (out / "mediation" / "inbox-consumer-cg-gone.yaml").write_text("kind: Deployment\n")
    assert generate.main(["--out", str(out)]) == 0
    assert not (out / "mediation" / "inbox-consumer-cg-gone.yaml").exists()
    assert generate.stale_files(generate.generate(list(TOPOLOGIES.values())), out) == []


def test_every_context_and_durable_gets_its_deployment() -> None:
    """Counted against the topology files themselves, read without the generator."""
    files = generate.generate(list(TOPOLOGIES.values()))
    for name, path in TOPOLOGIES.items():
        raw = yaml.safe_load(path.read_text())
        kust = yaml.safe_load(files[f"{name}/kustomization.yaml"])
        expected = {
            f"outbox-publisher-{c.replace('_', '-')}.yaml"
            for c, spec in raw["contexts"].items()
            if spec.get("stream")
        }
        expected |= {f"inbox-consumer-{d.replace('_', '-')}.yaml" for d in raw["durables"]}
        expected |= {f"dlq-router-{name}.yaml", f"dlq-replayer-{name}.yaml", "provision.yaml",
                     f"retention-{name}.yaml", f"console-{name}.yaml"}  # fmt: skip
        assert set(kust["resources"]) == expected
        scaled = list(yaml.safe_load_all(files[f"{name}/keda/scaledobjects.yaml"]))
        # Each durable's first consumer: itself, or its partition 0 ({durable}_p0).
        firsts = [s["spec"]["triggers"][0]["metadata"]["consumer"] for s in scaled]
        assert sorted(durable_of_consumer(c, raw["durables"]) for c in firsts) == sorted(
            raw["durables"]
        )


def test_a_name_kubernetes_cannot_take_is_refused_naming_where_it_comes_from() -> None:
    long_name = "sea__from_vibespro" + "_x" * 30
    with pytest.raises(ConfigurationError) as err:
        pods.dns_name(long_name, "topologies/x.yaml: durable")
    assert "topologies/x.yaml: durable" in str(err.value)
    assert long_name in str(err.value)
    assert "DNS-1123" in str(err.value)
    assert pods.dns_name("sea__from_vibespro", "-") == "sea--from-vibespro"


def test_two_topologies_with_the_same_kubernetes_names_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="collides"):
        generate.generate([TOPOLOGIES["mediation"], TOPOLOGIES["mediation"]])


def test_generator_command_reports_configuration_errors_with_exit_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\ncontexts: {}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "k8s.generate", "--out", str(tmp_path / "out"), str(broken)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "broken.yaml" in proc.stderr
    assert not (tmp_path / "out").exists()
