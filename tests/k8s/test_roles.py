"""What a user relies on when the rendered overlays run: the same commands as supervisord,
probes where the roles serve them, grace beyond every drain, budgets, limits, non-root,
labels, references that resolve, KEDA on the right consumer, NATS as the design needs."""

from __future__ import annotations

import configparser
import re
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

import shared.runtime.settings
from k8s.roles import RETENTION_EVERY
from services.handlers import settings as handler_settings
from shared.domain.durations import parse_duration

from .conftest import K8S, ROOT, TOPOLOGIES, WORKLOADS, Doc, by_kind, pod_labels, pod_spec
from .crds import _selects

ROLE_COMPONENTS = ("publisher", "consumer", "dlq", "retention")


def _env(container: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _settings_map(docs: list[Doc]) -> dict[str, str]:
    [settings] = [
        d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].startswith("ferry-settings")
    ]
    data: dict[str, str] = settings["data"]
    return data


def _roles(docs: list[Doc]) -> list[Doc]:
    return [
        d
        for d in by_kind(docs, "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") in ROLE_COMPONENTS
    ]


def _supervisord_commands() -> dict[str, list[str]]:
    """Every role program of supervisord.conf: its command after the python interpreter."""
    parser = configparser.RawConfigParser()
    parser.read(ROOT / "supervisord.conf")
    commands = {}
    for section in parser.sections():
        command = parser.get(section, "command", fallback="")
        if " -m services." not in command:
            continue
        args = command.split()[1:]
        if "--port" in args:  # ports differ per deployment; handlers serve the topology's
            at = args.index("--port")
            del args[at : at + 2]
        commands[section.removeprefix("program:")] = args
    return commands


def test_every_supervisord_role_runs_with_the_same_command_in_dev(
    rendered: dict[str, list[Doc]],
) -> None:
    commands = _supervisord_commands()
    assert commands, "supervisord.conf lists no role"
    deployed = [
        c["args"] for d in by_kind(rendered["dev"], "Deployment") for c in pod_spec(d)["containers"]
    ]
    missing = {name: args for name, args in commands.items() if args not in deployed}
    assert not missing, (
        f"supervisord programs with no Deployment running the same command: {missing}"
    )


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_each_role_reads_the_topology_file_it_runs_under_supervisord(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    """The ConfigMap a pod mounts holds, byte for byte, the topology of its role."""
    docs = rendered[name]
    maps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    for deployment in _roles(docs):
        topology = deployment["metadata"]["labels"]["ferry/topology"]
        spec = pod_spec(deployment)
        [volume] = [v for v in spec["volumes"] if v["name"] == "topology"]
        [container] = spec["containers"]
        [mount] = [m for m in container["volumeMounts"] if m["name"] == "topology"]
        assert _env(container)["FERRY_TOPOLOGY"] == f"{mount['mountPath']}/topology.yaml"
        content = maps[volume["configMap"]["name"]]["data"]["topology.yaml"]
        assert content == TOPOLOGIES[topology].read_text()


def test_every_durable_context_and_topology_has_its_role_in_prod(
    rendered: dict[str, list[Doc]],
) -> None:
    """Counted against the topology files, read here without the generator."""
    args = sorted(tuple(pod_spec(d)["containers"][0]["args"]) for d in _roles(rendered["prod"]))
    expected = []
    for path in TOPOLOGIES.values():
        raw = yaml.safe_load(path.read_text())
        expected += [
            ("-m", "services.outbox_publisher", "--context", c)
            for c, spec in raw["contexts"].items()
            if spec.get("stream")
        ]
        expected += [("-m", "services.inbox_consumer", "--durable", d) for d in raw["durables"]]
        expected += [("-m", "services.dlq_router"), ("-m", "services.dlq_replayer")]
        expected += [("-m", "shared.cli", "purge", "--every", RETENTION_EVERY)]
    assert args == sorted(expected)
    assert not [
        d for d in by_kind(rendered["prod"], "Deployment") if "handler" in d["metadata"]["name"]
    ]


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_probes_hit_the_health_endpoint_the_roles_serve(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    settings = _settings_map(rendered[name])
    assert settings["FERRY_HEALTH_HOST"] == "0.0.0.0", "the kubelet probes from outside the pod"
    port = int(settings["FERRY_HEALTH_PORT"])
    for deployment in _roles(rendered[name]):
        [container] = pod_spec(deployment)["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe, path in (
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ):
            get = container[probe]["httpGet"]
            assert get["path"] == path, (deployment["metadata"]["name"], probe)
            assert ports[get["port"]] == port, (deployment["metadata"]["name"], probe)


def _durable_timeouts() -> dict[str, float]:
    from shared.contracts.loading import load_topology

    return {
        name: durable.handler.timeout
        for path in TOPOLOGIES.values()
        for name, durable in load_topology(path).durables.items()
    }


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_termination_grace_exceeds_each_roles_drain(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    timeouts = _durable_timeouts()
    for deployment in _roles(rendered[name]):
        spec = pod_spec(deployment)
        env = _env(spec["containers"][0])
        where = deployment["metadata"]["name"]
        if deployment["metadata"]["labels"]["app.kubernetes.io/component"] == "retention":
            # `ferry purge --every` has no drain setting: SIGTERM ends the loop once the
            # run in hand is done; the grace lets its current batch (one DELETE) finish.
            assert "FERRY_DRAIN_DEADLINE" not in env, where
            assert spec["terminationGracePeriodSeconds"] >= 10, where
            continue
        drain = float(env["FERRY_DRAIN_DEADLINE"]) + float(env.get("FERRY_FETCH_TIMEOUT", 0))
        assert spec["terminationGracePeriodSeconds"] > drain, where
        durable = deployment["metadata"]["labels"].get("ferry/durable")
        if durable:  # a handler call just started may run its whole timeout
            assert float(env["FERRY_DRAIN_DEADLINE"]) >= timeouts[durable], where


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_every_deployment_has_exactly_one_disruption_budget(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    budgets = by_kind(rendered[name], "PodDisruptionBudget")
    for deployment in by_kind(rendered[name], "Deployment"):
        if deployment["metadata"]["name"] == "jaeger":
            continue  # one replica on one volume: nothing to keep available
        matching = [b for b in budgets if _selects(b["spec"]["selector"], pod_labels(deployment))]
        assert len(matching) == 1, deployment["metadata"]["name"]
        assert matching[0]["spec"].get("maxUnavailable") == 1


@pytest.mark.parametrize("name", ["dev", "prod", "cnpg"])
def test_every_container_is_bounded_and_unprivileged(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    for workload in (d for d in rendered[name] if d["kind"] in WORKLOADS):
        spec = pod_spec(workload)
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"]["runAsUser"] > 0, where
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        for container in spec["containers"] + spec.get("initContainers", []):
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][kind]), (where, kind)
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["capabilities"]["drop"] == ["ALL"], where
            assert security["readOnlyRootFilesystem"] is True, where


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_workloads_carry_the_recommended_labels(rendered: dict[str, list[Doc]], name: str) -> None:
    keys = {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/component",
        "app.kubernetes.io/part-of",
    }
    for workload in (d for d in rendered[name] if d["kind"] in WORKLOADS):
        where = workload["metadata"]["name"]
        assert keys <= set(workload["metadata"]["labels"]), where
        assert keys <= set(pod_labels(workload)), where
        assert pod_labels(workload)["app.kubernetes.io/part-of"] == "ferry", where


def _references(node: Any) -> list[tuple[str, str, str | None]]:
    """(kind, name, key) of every ConfigMap/Secret/ServiceAccount reference below ``node``."""
    found: list[tuple[str, str, str | None]] = []
    if isinstance(node, dict):
        for field, kind in (
            ("configMapRef", "ConfigMap"),
            ("configMapKeyRef", "ConfigMap"),
            ("configMap", "ConfigMap"),
            ("secretRef", "Secret"),
            ("secretKeyRef", "Secret"),
            ("passwordSecret", "Secret"),
        ):
            if isinstance(node.get(field), dict) and "name" in node[field]:
                found.append((kind, node[field]["name"], node[field].get("key")))
        secret = node.get("secret")
        if isinstance(secret, dict) and ("secretName" in secret or "name" in secret):
            found.append(("Secret", secret.get("secretName", secret.get("name")), None))
        for field in ("serviceAccountName", "serviceAccount"):
            if isinstance(node.get(field), str):
                found.append(("ServiceAccount", node[field], None))
        for value in node.values():
            found += _references(value)
    elif isinstance(node, list):
        for value in node:
            found += _references(value)
    return found


#: Objects an operator creates before applying besides the Secrets `python -m k8s.secrets`
#: renders (README "Deploy to Kubernetes"): the CA certificates (optional ConfigMap
#: ferry-tls), and with TLS from cert-manager CloudNativePG's CA (k8s/examples/cnpg).
EXTERNAL = {
    "dev": {("ConfigMap", "ferry-tls")},
    "prod": {("ConfigMap", "ferry-tls"), ("Secret", "ferry-pg-ca")},
    "cnpg": set(),
}


@pytest.mark.parametrize("name", ["dev", "prod", "cnpg"])
def test_every_reference_resolves_in_the_render(
    rendered: dict[str, list[Doc]], secret_docs: list[Doc], name: str
) -> None:
    """Hashed generator names reach every workload, custom resources included; every
    Secret a workload names is one the operator renders."""
    docs = rendered[name] + secret_docs
    objects = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    # A cert-manager Certificate of the render makes its Secret.
    for cert in by_kind(rendered[name], "Certificate"):
        objects[("Secret", cert["spec"]["secretName"])] = {"data": {}}
    unresolved = set()
    for doc in docs:
        for kind, ref, key in _references(doc.get("spec", {})):
            target = objects.get((kind, ref))
            if target is None:
                unresolved.add((kind, ref))
            elif key is not None:
                assert key in target.get("data", {}), f"{kind}/{ref} has no key {key}"
    assert unresolved == EXTERNAL[name]


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_every_ferry_image_is_pinned_by_the_overlay(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    images = set()
    for doc in rendered[name]:
        text = yaml.safe_dump(doc)
        images |= set(re.findall(r"image: (\S+)", text))
    ferry = {i for i in images if i.split(":")[0] in ("ferry", "ferry-kpi")}
    assert ferry and all(re.fullmatch(r"ferry(-kpi)?:[\w.]+", i) for i in ferry), ferry
    assert all(":" in i for i in images), images


def test_settings_named_in_manifests_exist(rendered: dict[str, list[Doc]]) -> None:
    """A misspelt FERRY_* variable is silently ignored by pydantic-settings: catch it here."""
    from spark import settings as kpi_settings  # the KPI job's FERRY_KPI_* settings

    fields = set()
    from services.console import settings as console_settings

    for module in (shared.runtime.settings, handler_settings, kpi_settings, console_settings):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseSettings):
                fields |= {f"FERRY_{f.upper()}" for f in value.model_fields}
    named = set()
    for docs in rendered.values():
        for doc in docs:
            if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].startswith("ferry-settings"):
                named |= set(doc["data"])
            if doc["kind"] in WORKLOADS:
                for container in pod_spec(doc)["containers"]:
                    named |= set(_env(container))
    unknown = {n for n in named if n.startswith("FERRY_")} - fields
    assert not unknown, unknown


def test_keda_scales_each_consumer_on_its_own_durable(rendered: dict[str, list[Doc]]) -> None:
    from shared.contracts.loading import load_topology
    from shared.domain.ordering import durable_of_consumer

    durables = {
        name: spec
        for path in TOPOLOGIES.values()
        for name, spec in load_topology(path).durables.items()
    }
    values = yaml.safe_load((K8S / "nats" / "values.yaml").read_text())
    monitor_port = values["config"]["monitor"]["port"]
    deployments = {d["metadata"]["name"]: d for d in by_kind(rendered["prod"], "Deployment")}
    scaled = by_kind(rendered["prod"], "ScaledObject")
    consumers = [d for d in deployments.values() if d["metadata"]["labels"].get("ferry/durable")]
    assert sorted(s["spec"]["scaleTargetRef"]["name"] for s in scaled) == sorted(
        d["metadata"]["name"] for d in consumers
    )
    for obj in scaled:
        target = deployments[obj["spec"]["scaleTargetRef"]["name"]]
        durable = target["metadata"]["labels"]["ferry/durable"]
        assert pod_spec(target)["containers"][0]["args"][-1] == durable
        # One trigger per JetStream consumer of the durable (each partition's when ordered).
        lags = [t for t in obj["spec"]["triggers"] if t["type"] == "nats-jetstream"]
        for meta in (t["metadata"] for t in lags):
            assert durable_of_consumer(meta["consumer"], {durable}) == durable
            assert meta["stream"] == durables[durable].stream
            assert meta["natsServerMonitoringEndpoint"].endswith(f":{monitor_port}")
        # Replicas beyond max_ack_pending / 10 would idle at JetStream's ack-pending cap.
        assert obj["spec"]["maxReplicaCount"] <= max(2, durables[durable].max_ack_pending // 10)


def test_nats_values_give_the_cluster_the_design_needs() -> None:
    from shared.contracts.loading import load_topology
    from shared.domain.durations import parse_size

    values = yaml.safe_load((K8S / "nats" / "values.yaml").read_text())
    config = values["config"]
    replicas = max(
        s.replicas
        for path in TOPOLOGIES.values()
        for s in load_topology(path).streams_by_name().values()
    )
    assert config["cluster"]["enabled"] is True
    assert config["cluster"]["replicas"] >= replicas >= 3
    store = config["jetstream"]["fileStore"]
    assert config["jetstream"]["enabled"] and store["enabled"] and store["pvc"]["enabled"]
    assert config["jetstream"]["memoryStore"]["enabled"] is False
    assert config["jetstream"]["merge"]["sync_interval"] == "always"
    assert config["monitor"]["enabled"] is True
    assert parse_size(store["maxSize"].replace("Gi", "GiB")) < parse_size(
        store["pvc"]["size"].replace("Gi", "GiB")
    )
    grace = values["podTemplate"]["merge"]["spec"]["terminationGracePeriodSeconds"]
    lame = sum(int(config[k].rstrip("s")) for k in ("lameDuckGracePeriod", "lameDuckDuration"))
    assert grace >= lame + 20


def test_prometheus_rule_is_the_rules_file(rendered: dict[str, list[Doc]]) -> None:
    rules = yaml.safe_load((K8S / "base" / "alerts" / "ferry-alerts.rules.yaml").read_text())
    [rule] = by_kind(rendered["prod"], "PrometheusRule")
    # The rules file, then the alerts of the criticality: high durables (k8s.generate).
    *plain, critical = rule["spec"]["groups"]
    assert plain == rules["groups"]
    assert critical["name"] == "ferry.critical"
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    # INFRA-005 §6 P0: lag > 5 min sustained, dead-letter spike, success ratio drop.
    assert {"FerryConsumerLagHigh", "FerryDeadLetterSpike", "FerrySuccessRatioLow"} <= alerts
    lag = next(
        r for g in rules["groups"] for r in g["rules"] if r["alert"] == "FerryConsumerLagHigh"
    )
    assert "> 300" in lag["expr"] and lag["for"] == "5m"


def test_publishers_and_dlq_roles_run_two_replicas_in_prod(
    rendered: dict[str, list[Doc]],
) -> None:
    for deployment in _roles(rendered["prod"]):
        component = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
        if component == "consumer":
            assert "replicas" not in deployment["spec"]  # KEDA's
        elif component == "retention":  # test_retention_runs_as_a_role_as_under_supervisord
            assert deployment["spec"]["replicas"] == 1
        else:
            assert deployment["spec"]["replicas"] == 2, deployment["metadata"]["name"]


def _purges(docs: list[Doc]) -> list[Doc]:
    """The workloads of a render that run ``ferry purge``."""
    return [
        d
        for d in docs
        if d["kind"] in WORKLOADS
        and any(c.get("args", [])[:3] == ["-m", "shared.cli", "purge"]
                for c in pod_spec(d)["containers"])
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_retention_runs_as_a_role_as_under_supervisord(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    """Issue 48: per topology one Deployment runs `ferry purge --every` (as supervisord's
    retention programs do), one pod at a time, serving its metrics on the health port the
    PodMonitor scrapes; no CronJob runs a purge any more."""
    docs = rendered[name]
    parser = configparser.RawConfigParser()
    parser.read(ROOT / "supervisord.conf")
    local = [parser.get(s, "command").split()[1:] for s in parser.sections()
             if s.startswith("program:retention-")]  # fmt: skip
    assert len(local) == len(TOPOLOGIES) and all(
        args[:5] == ["-m", "shared.cli", "purge", "--every", args[4]] for args in local
    ), local
    purges = _purges(docs)
    assert {d["kind"] for d in purges} == {"Deployment"}
    assert sorted(d["metadata"]["labels"]["ferry/topology"] for d in purges) == sorted(TOPOLOGIES)
    port = int(_settings_map(docs)["FERRY_HEALTH_PORT"])
    for deployment in purges:
        where = deployment["metadata"]["name"]
        [container] = pod_spec(deployment)["containers"]
        args = container["args"]
        assert args[:4] == ["-m", "shared.cli", "purge", "--every"] and len(args) == 5, where
        assert 60 <= parse_duration(args[4]) <= 3600, (where, "purge at least hourly")
        assert deployment["spec"]["replicas"] == 1, where
        strategy = deployment["spec"]["strategy"]
        assert strategy["type"] == "Recreate" or (strategy["rollingUpdate"]["maxSurge"] == 0), (
            where,
            "never two pods at once on an update",
        )
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"health": port}
        assert pod_labels(deployment)["app.kubernetes.io/component"] == "retention"


def test_the_pod_monitor_scrapes_every_role_that_serves_metrics(
    rendered: dict[str, list[Doc]],
) -> None:
    """Production: every role's pods (retention's included, whose ferry_retention_* series
    FerryTableOutgrowsPolicy reads) are selected by the PodMonitor, on their health port."""
    docs = rendered["prod"]
    [monitor] = by_kind(docs, "PodMonitor")
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    roles = _roles(docs)
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in roles} == set(
        ROLE_COMPONENTS
    )
    for deployment in roles:
        where = deployment["metadata"]["name"]
        assert _selects(monitor["spec"]["selector"], pod_labels(deployment)), where
        [container] = pod_spec(deployment)["containers"]
        assert endpoint["port"] in {p["name"] for p in container["ports"]}, where
    assert endpoint["path"] == "/metrics"
