"""The console's liveness per role in Kubernetes (issue 45), as rendered: each console's
FERRY_CONSOLE_ROLE_HEALTH names every role its overview expects (the names supervisord.conf
gives the local consoles, counted again from the topology files), each at the /healthz of
a Service that selects exactly that role's pods on their health port, plain HTTP also in
production with TLS on.

Each check returns its findings, so that :func:`test_the_check_catches_broken_manifests`
can show it failing on a broken render.
"""

from __future__ import annotations

import configparser
import copy
import json
import re
from urllib.parse import urlsplit

import pytest
import yaml

from .conftest import ROOT, TOPOLOGIES, Doc, by_kind, pod_labels, pod_spec
from .crds import _selects
from .test_credentials import _role_of, _settings


def _supervisord_role_health() -> dict[str, set[str]]:
    """Per topology, the role names of its console's FERRY_CONSOLE_ROLE_HEALTH in
    supervisord.conf (the names the overview is given locally)."""
    parser = configparser.RawConfigParser()
    parser.read(ROOT / "supervisord.conf")
    found = {}
    for section in parser.sections():
        environment = parser.get(section, "environment", fallback="")
        match = re.search(r"FERRY_CONSOLE_ROLE_HEALTH='([^']*)'", environment)
        if match is None:
            continue
        topology = re.search(r'FERRY_TOPOLOGY="topologies/([^"/]+)\.yaml"', environment)
        assert topology is not None, section
        ports = re.sub(r"%\(ENV_\w+\)s", "1", match.group(1))  # the ports, as numbers
        found[topology.group(1)] = set(json.loads(ports))
    return found


def _topology_roles() -> dict[str, set[str]]:
    """Per topology, its publisher, consumer and dlq roles by identity name (README
    "Security": the supervisord program names), read from the files without the generator."""
    roles = {}
    for name, path in TOPOLOGIES.items():
        raw = yaml.safe_load(path.read_text())
        names = {
            f"outbox-publisher-{c}" for c, spec in raw["contexts"].items() if spec.get("stream")
        }
        names |= {f"inbox-consumer-{d}" for d in raw["durables"]}
        names |= {f"dlq-router-{name}", f"dlq-replayer-{name}"}
        roles[name] = names
    return roles


def test_supervisord_gives_each_console_every_role_of_its_topology() -> None:
    """The names the test below expects in Kubernetes are the local stack's, and those are
    every long-running role of the topology but retention (which the console is not told of)."""
    assert _supervisord_role_health() == _topology_roles()


def role_health(docs: list[Doc]) -> list[str]:
    """Every console's FERRY_CONSOLE_ROLE_HEALTH: exactly the roles of its topology, each
    at ``http://<Service>:<port>/healthz`` of a ClusterIP Service of the console's namespace
    that selects exactly that role's pods, on the container port named ``health`` (the
    FERRY_HEALTH_PORT their liveness probe calls /healthz on, over plain HTTP)."""
    errors = []
    expected = _topology_roles()
    port = int(_settings(docs)["FERRY_HEALTH_PORT"])
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    deployments = by_kind(docs, "Deployment")
    consoles = [
        d for d in deployments if d["metadata"]["labels"]["app.kubernetes.io/name"] == "console"
    ]
    if len(consoles) != len(TOPOLOGIES):
        errors.append(f"{len(consoles)} consoles in the render, not {len(TOPOLOGIES)}")
    for console in consoles:
        where = f"Deployment/{console['metadata']['name']}"
        topology = console["metadata"]["labels"]["ferry/topology"]
        [container] = pod_spec(console)["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        if "FERRY_CONSOLE_ROLE_HEALTH" not in env:
            errors.append(f"{where}: FERRY_CONSOLE_ROLE_HEALTH is not set")
            continue
        urls: dict[str, str] = json.loads(env["FERRY_CONSOLE_ROLE_HEALTH"])
        if set(urls) != expected[topology]:
            errors.append(f"{where}: roles {sorted(set(urls) ^ expected[topology])} are "
                          "missing or not of its topology")  # fmt: skip
        for role, url in urls.items():
            found = _url_errors(url, role, console, services, deployments, port)
            errors += [f"{where}: {role} {url}: {e}" for e in found]
    return errors


def _url_errors(
    url: str, role: str, console: Doc, services: dict[str, Doc], deployments: list[Doc], port: int
) -> list[str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.path != "/healthz" or parts.query:
        return ["not http://<host>:<port>/healthz (health stays plain HTTP)"]
    service = services.get(parts.hostname or "")
    if service is None:
        return [f"no Service {parts.hostname} in the render"]
    errors = []
    if service["metadata"].get("namespace") != console["metadata"].get("namespace"):
        errors.append("the Service is not in the console's namespace")
    spec = service["spec"]
    if spec.get("type", "ClusterIP") != "ClusterIP" or spec.get("clusterIP") == "None":
        errors.append("not a ClusterIP Service (one address routing to the ready pods)")
    selected = [d for d in deployments if spec.get("selector")
                and _selects({"matchLabels": spec["selector"]}, pod_labels(d))]  # fmt: skip
    runs = {_role_of(d, pod_spec(d)["containers"][0]) for d in selected}
    if runs != {role}:
        errors.append(f"the Service selects the pods of {sorted(map(str, runs))}")
        return errors
    ports = [p for p in spec["ports"] if p["port"] == (parts.port or 80)]
    if len(ports) != 1:
        return [*errors, f"the Service has no port {parts.port}"]
    target = ports[0].get("targetPort", ports[0]["port"])
    return errors + [e for d in selected for e in _pod_errors(d, target, port)]


def _pod_errors(deployment: Doc, target: str | int, port: int) -> list[str]:
    """The Service's target port is the pods' health port, where their liveness probe
    calls /healthz over plain HTTP."""
    errors = []
    [container] = pod_spec(deployment)["containers"]
    named = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    number = named.get(target) if isinstance(target, str) else target
    if number != port or named.get("health") != port:
        errors.append(f"target port {target!r} is not the pods' health port {port}")
    probe = container.get("livenessProbe", {}).get("httpGet", {})
    if probe.get("path") != "/healthz" or named.get(probe.get("port")) != number:
        errors.append("the pods' liveness probe is not /healthz on that port")
    if probe.get("scheme", "HTTP") != "HTTP":
        errors.append("the pods serve /healthz over HTTPS")
    return errors


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_the_console_is_told_every_roles_health_service(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    errors = role_health(rendered[name])
    assert not errors, "\n".join(errors)


def _edit(docs: list[Doc], kind: str, prefix: str) -> Doc:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(prefix))


def test_the_check_catches_broken_manifests(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["prod"]

    def broken(edit: str) -> list[Doc]:
        copied = copy.deepcopy(docs)
        service = _edit(copied, "Service", "outbox-publisher-")
        console = pod_spec(_edit(copied, "Deployment", "console-"))["containers"][0]
        [entry] = [e for e in console["env"] if e["name"] == "FERRY_CONSOLE_ROLE_HEALTH"]
        urls = json.loads(entry["value"])
        if edit == "selector":  # selects another role's pods
            service["spec"]["selector"]["app.kubernetes.io/name"] = "dlq-router"
        elif edit == "port":
            service["spec"]["ports"][0]["targetPort"] = 9999
        elif edit == "missing":
            urls.pop(next(iter(urls)))
        elif edit == "https":
            urls = {k: v.replace("http://", "https://") for k, v in urls.items()}
        entry["value"] = json.dumps(urls)
        return copied

    for edit in ("selector", "port", "missing", "https"):
        assert role_health(broken(edit)), edit
