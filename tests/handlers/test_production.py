"""Fault injection and production: the prod overlay marks production and never turns the
``_ferry_test`` directives on, and a handler given both refuses to start."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from services.handlers.settings import HandlerSettings
from shared.domain.errors import ConfigurationError
from shared.runtime.lifecycle import EXIT_CONFIG
from tests.conftest import ROOT
from tests.k8s.conftest import KUSTOMIZATIONS, WORKLOADS, pod_spec, render

SETTING = "FERRY_HANDLER_FAULT_INJECTION"
#: What pydantic reads as false for a bool setting (anything else is on, or invalid).
FALSE = {"0", "false", "f", "no", "n", "off"}


@pytest.fixture(scope="module")
def prod() -> list[dict[str, Any]]:
    """The prod overlay, rendered by kustomize as ``kubectl apply -k`` would."""
    return render(KUSTOMIZATIONS["prod"])


def _settings_map(docs: list[dict[str, Any]]) -> dict[str, str]:
    (config,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("ferry-settings")
    ]
    data: dict[str, str] = config["data"]
    return data


def _values_of(docs: list[dict[str, Any]], name: str) -> list[str]:
    """Every value ``name`` gets anywhere in ``docs``: ConfigMap data and container env."""
    values = [
        d["data"][name] for d in docs if d["kind"] == "ConfigMap" and name in d.get("data", {})
    ]
    for doc in docs:
        if doc["kind"] not in WORKLOADS:
            continue
        spec = pod_spec(doc)
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            values += [str(e.get("value")) for e in container.get("env", []) if e["name"] == name]
    return values


def test_the_prod_overlay_marks_production(prod: list[dict[str, Any]]) -> None:
    settings = _settings_map(prod)
    assert settings.get("FERRY_ENVIRONMENT") == "production"
    assert HandlerSettings(environment=settings["FERRY_ENVIRONMENT"]).is_production()


def test_the_prod_overlay_never_enables_fault_injection(prod: list[dict[str, Any]]) -> None:
    enabled = [v for v in _values_of(prod, SETTING) if v.strip().lower() not in FALSE]
    assert enabled == [], f"{SETTING} is turned on in the prod overlay: {enabled}"


def test_the_dev_overlay_does_not_mark_production() -> None:
    dev = render(KUSTOMIZATIONS["dev"])
    assert _settings_map(dev).get("FERRY_ENVIRONMENT", "development") != "production"


@pytest.mark.parametrize("name", ["production", "Production", " prod "])
def test_both_settings_are_refused(name: str) -> None:
    settings = HandlerSettings(handler_fault_injection=True, environment=name)
    with pytest.raises(ConfigurationError, match=SETTING):
        settings.check_fault_injection()
    HandlerSettings(handler_fault_injection=False, environment=name).check_fault_injection()
    HandlerSettings(handler_fault_injection=True, environment="dev").check_fault_injection()


def test_a_handler_with_the_prod_settings_and_fault_injection_refuses_to_start(
    prod: list[dict[str, Any]],
) -> None:
    # The prod ConfigMap as a pod gets it (envFrom), plus the setting an operator might add.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(
        {k: v for k, v in _settings_map(prod).items() if k.startswith("FERRY_")},
        FERRY_TOPOLOGY=str(ROOT / "topologies" / "mediation.yaml"),
        PYTHONPATH=str(ROOT),
        **{SETTING: "true"},
    )
    result = subprocess.run(
        [sys.executable, "-m", "services.handlers", "--service", "module_h"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == EXIT_CONFIG, result.stderr
    assert b"FERRY_HANDLER_FAULT_INJECTION=true is refused when FERRY_ENVIRONMENT" in (
        result.stderr
    )
    assert b"serving on" not in result.stderr
