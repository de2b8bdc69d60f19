"""Helpers for the registry, gate and lint tests: a copy of the project's declarations.

Build-time tests work on a copy of ``topologies/``, ``manifests/`` and the registry
file under a temporary root, so they can break and regenerate them freely.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.contracts.codegen import LOCK, MANIFESTS, REGISTRY, TOPOLOGIES
from shared.contracts.lint import Problem, lint_topology
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology
from tests.conftest import ROOT

SEA_VIBESPRO = "topologies/sea-vibespro.yaml"
MEDIATION = "topologies/mediation.yaml"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A root holding copies of the topologies, manifests, lock and registry file."""
    root = tmp_path / "project"
    shutil.copytree(ROOT / TOPOLOGIES, root / TOPOLOGIES)
    shutil.copytree(ROOT / MANIFESTS, root / MANIFESTS)
    (root / REGISTRY).parent.mkdir(parents=True)
    shutil.copy(ROOT / REGISTRY, root / REGISTRY)
    assert (root / LOCK).exists()
    return root


def read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def edit_yaml(path: Path, change: Callable[[Any], None]) -> None:
    """Load ``path``, let ``change`` mutate it, write it back."""
    doc = read_yaml(path)
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def shipped(relative: str) -> dict[str, Any]:
    """A shipped topology file as a mutable document."""
    doc: dict[str, Any] = read_yaml(ROOT / relative)
    return doc


def lint_doc(tmp_path: Path, doc: dict[str, Any], label: str = SEA_VIBESPRO) -> list[str]:
    """Write ``doc``, load it as a role would (events from the registry), lint it.

    Findings are reported against ``label`` so messages read as for the shipped file.
    """
    return [str(p) for p in lint_loaded(load_doc(tmp_path, doc), label)]


def load_doc(tmp_path: Path, doc: dict[str, Any]) -> Topology:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_topology(path)


def lint_loaded(topology: Topology, label: str = SEA_VIBESPRO, **kw: Any) -> list[Problem]:
    return lint_topology(topology, source=label, **kw)


def rules(problems: list[Problem]) -> set[str]:
    return {p.rule for p in problems}
