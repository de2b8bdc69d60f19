"""The podman overlay: the dev overlay, as rendered by kustomize, made runnable by
``podman play kube`` (podman 4.3, no registry, no kubelet, no CRD).

Nothing here is a kept copy: :func:`podman_plan` takes the dev overlay's rendered documents
and the Secrets ``k8s.secrets`` renders, and rewrites only what podman cannot run as
Kubernetes would. Every rewrite is one of :data:`REWRITES`, and everything left out is
returned with the reason (``Plan.left_out``) so ``./dev kube`` can list it:

- one ``podman play kube`` file per workload; a Service becomes a DNS alias on the pod
  network (``--network ferry-kube:alias=<service>``), since podman has no Services;
- every ``emptyDir`` becomes a host folder of its own pod (podman 4.3 shares one named
  volume between every pod that names an emptyDir alike);
- StatefulSets become Deployments; their volume claim templates become host folders
  owned by the pod's user;
- Jobs become Pods restarted on failure (podman has no Job); CronJobs are left out;
- Secrets and ConfigMaps become files on the host, mounted read-only, and literal
  ``env`` values: podman 4.3 neither projects volumes nor reads Secrets from a file;
- ``$(VAR)`` references in ``env`` and ``args`` are expanded as the kubelet would
  (podman passes them through unexpanded);
- probes are taken out of the pod and run by ``k8s.podman.probes`` from the host (podman
  runs health checks only through systemd timers, which this machine lacks);
- images: ``ferry`` is the locally built ``localhost/ferry:dev``, the ``nats`` and
  ``postgres`` images are replaced by ``localhost/ferry-dev-servers:dev`` (the
  Dockerfile's dev-servers stage), every pull policy is ``Never``;
- container ports are taken out: podman 4.3 publishes every ``containerPort`` on the
  host (all the roles' 8080 collide); pods reach each other on the pod network anyway;
- init containers run once per pod start (podman's ``always`` type: its ``once`` type
  races its own clean-up in 4.3 and fails the pod);
- a Deployment's pod restarts on failure (``restartPolicy: OnFailure``): podman 4.3
  gives the pod's ``Always`` to its init containers too (podman issue 16343), so each
  one restarted in a loop for as long as the pod ran and ``podman play kube`` waited
  some 20 s for it to settle, per workload. A container that is killed or fails still
  comes back; one that exits 0 stays down (a role exits 0 only when told to stop).
"""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Doc = dict[str, Any]

ROLES_IMAGE = "localhost/ferry:dev"
SERVERS_IMAGE = "localhost/ferry-dev-servers:dev"
NETWORK = "ferry-kube"
#: The pod network's subnet (a /24): each workload gets a fixed address in it.
SUBNET = "10.89.233.0/24"

#: Kinds podman cannot run and what stands in for them (shown by ``./dev kube``).
LEFT_OUT_KINDS = {
    "CronJob": "podman has no CronJob: run the KPI job by hand",
    "PodDisruptionBudget": "no evictions on one host",
    "ServiceAccount": "no API server to talk to",
    "Namespace": "podman has no namespaces: the pods share the network ferry-kube",
    "ScaledObject": "KEDA is a CRD: each consumer runs its manifest's replicas",
    "Cluster": "CloudNativePG is a CRD: the dev overlay's PostgreSQL pod stands in",
    "Database": "CloudNativePG is a CRD: the provisioning Job creates the databases",
    "ScheduledSparkApplication": "the Spark operator is a CRD: the KPI job runs from the host",
    "PodMonitor": "no Prometheus operator",
    "PrometheusRule": "no Prometheus operator (the rules are tested by promtool in CI)",
}
#: Workloads whose image no registry here serves, and what the user loses.
LEFT_OUT_WORKLOADS = {
    "jaeger": "its image is on a registry this machine cannot reach: traces are off "
    "(OTEL_TRACES_EXPORTER=none)",
}
SETTINGS_OVERRIDES = {"OTEL_TRACES_EXPORTER": "none"}

REWRITES = (
    "Service → DNS alias of its pods on the network ferry-kube",
    "StatefulSet → Deployment, volumeClaimTemplates → a host folder owned by the pod's user",
    "emptyDir → a host folder per pod (podman 4.3 shares one volume per volume name)",
    "Job → Pod, restartPolicy OnFailure",
    "Secret, ConfigMap → files on the host (read-only mounts) and literal env values",
    "$(VAR) in env and args → expanded",
    "probes → run from the host by k8s.podman.probes",
    "nats, postgres images → localhost/ferry-dev-servers:dev",
    "init containers → podman's `always` type (run at each pod start)",
    "Deployment → restartPolicy OnFailure (podman 4.3 would restart its init containers)",
    "containerPort → not published on the host (podman 4.3 would publish every one)",
)


@dataclass(frozen=True)
class Probe:
    container: str
    kind: str  # startup | liveness | readiness
    http: tuple[str, int] | None  # (path, port) for httpGet
    command: tuple[str, ...] | None  # for exec
    period: float
    failures: int


@dataclass
class Workload:
    """One ``podman play kube`` file: a Deployment or a Pod, with where its files go."""

    name: str
    kind: str  # Deployment | Pod (from a Job)
    doc: Doc
    aliases: list[str]
    probes: list[Probe]
    #: host files to write before playing: {(volume dir, file name): (text, mode, uid)}
    files: dict[tuple[str, str], tuple[str, int, int]]
    component: str
    ports: dict[str, int] = field(default_factory=dict)
    #: its address on :data:`NETWORK`, given to ``podman play kube --ip``
    ip: str = ""

    def doc_containers(self) -> list[str]:
        """Names of the pod's (main) containers."""
        spec = self.doc["spec"] if self.kind == "Pod" else self.doc["spec"]["template"]["spec"]
        return [c["name"] for c in spec["containers"]]

    @property
    def pod(self) -> str:
        """The pod podman makes: a Deployment's first replica, or the Pod itself."""
        return f"{self.name}-pod-0" if self.kind == "Deployment" else self.name


@dataclass
class Plan:
    servers: list[Workload]
    jobs: list[Workload]
    roles: list[Workload]
    left_out: list[tuple[str, str, str]]  # (kind, name, why)

    @property
    def workloads(self) -> list[Workload]:
        return [*self.servers, *self.jobs, *self.roles]


class OverlayError(ValueError):
    """The rendered documents name something that is not there (a Secret, a ConfigMap)."""


def _index(docs: Iterable[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == kind}


def secret_data(secret: Doc) -> dict[str, str]:
    data = {k: str(v) for k, v in (secret.get("stringData") or {}).items()}
    for k, v in (secret.get("data") or {}).items():
        data[k] = base64.b64decode(v).decode()
    return data


_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand(text: str, env: dict[str, str]) -> str:
    """``$(VAR)`` as the kubelet expands it: known names only, the rest left as written."""
    return _REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)


class _Converter:
    def __init__(self, docs: list[Doc], secrets: list[Doc], root: str) -> None:
        self.configmaps = _index(docs, "ConfigMap")
        self.secrets = {n: secret_data(d) for n, d in _index(secrets, "Secret").items()}
        self.root = root.rstrip("/")

    def _configmap(self, name: str, optional: bool, where: str) -> dict[str, str]:
        if name in self.configmaps:
            data = dict(self.configmaps[name].get("data") or {})
            if name.startswith("ferry-settings"):
                data.update(SETTINGS_OVERRIDES)
            return data
        if optional:
            return {}
        raise OverlayError(f"{where}: ConfigMap {name!r} is not in the rendered overlay")

    def _secret(self, name: str, optional: bool, where: str) -> dict[str, str]:
        if name in self.secrets:
            return self.secrets[name]
        if optional:
            return {}
        raise OverlayError(
            f"{where}: Secret {name!r} is missing (render them: python -m k8s.secrets --dev)"
        )

    def env_of(self, container: Doc, pod: str, where: str) -> list[Doc]:
        """The container's environment as literal values, in the kubelet's order."""
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            if "configMapRef" in source:
                ref = source["configMapRef"]
                env.update(self._configmap(ref["name"], bool(ref.get("optional")), where))
            elif "secretRef" in source:
                ref = source["secretRef"]
                env.update(self._secret(ref["name"], bool(ref.get("optional")), where))
        for item in container.get("env") or []:
            env[item["name"]] = self._env_value(item, env, pod, where)
        return [{"name": k, "value": v} for k, v in env.items()]

    def _env_value(self, item: Doc, env: dict[str, str], pod: str, where: str) -> str:
        """One ``env`` entry's value: literal (``$(VAR)`` expanded), field, Secret or
        ConfigMap key."""
        name = item["name"]
        if "value" in item:
            return _expand(str(item["value"]), env)
        source = item.get("valueFrom") or {}
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path != "metadata.name":
                raise OverlayError(f"{where}: env {name} reads {path}, not supported here")
            return pod
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            data = self._secret(ref["name"], bool(ref.get("optional")), where)
            if ref["key"] not in data:
                raise OverlayError(f"{where}: Secret {ref['name']!r} has no key {ref['key']!r}")
            return data[ref["key"]]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return self._configmap(ref["name"], False, where)[ref["key"]]
        raise OverlayError(f"{where}: env {name} has no value this overlay can give")

    def volume(
        self, workload: str, volume: Doc, uid: int, files: dict[tuple[str, str], Any], where: str
    ) -> Doc:
        """A Secret, ConfigMap or projected volume becomes a host folder of files."""
        name = volume["name"]
        sources: list[tuple[str, Doc]] = []
        if "secret" in volume:
            sources = [("secret", volume["secret"])]
        elif "configMap" in volume:
            sources = [("configMap", volume["configMap"])]
        elif "projected" in volume:
            sources = [(k, v) for s in volume["projected"]["sources"] for k, v in s.items()]
        elif "emptyDir" in volume:
            # podman 4.3 makes an emptyDir a named volume called after the volume: every
            # pod's `private` was one volume, and the pods overwrote each other's pgpass.
            # It also fills it from the image's folder, owner included. The kubelet gives
            # each pod its own empty folder, writable by all (0777): so does a host folder
            # per pod (a Memory one is the pod user's alone, 0700: it holds credentials).
            folder = f"{self.root}/{workload}/{name}"
            memory = volume["emptyDir"].get("medium") == "Memory"
            files[(folder, "")] = ("", 0o700 if memory else 0o1777, uid if memory else 0)
            return {"name": name, "hostPath": {"path": folder, "type": "Directory"}}
        else:
            return volume
        folder = f"{self.root}/{workload}/{name}"
        mode = int(volume.get("secret", {}).get("defaultMode", 0o444))
        for kind, ref in sources:
            ref_name = str(ref.get("secretName") or ref.get("name"))
            optional = bool(ref.get("optional"))
            data = (
                self._secret(ref_name, optional, where)
                if kind == "secret"
                else self._configmap(ref_name, optional, where)
            )
            if ref.get("items"):
                data = {i["path"]: data[i["key"]] for i in ref["items"] if i["key"] in data}
            for key, text in data.items():
                files[(folder, key)] = (text, mode if kind == "secret" else 0o444, uid)
        files.setdefault((folder, ""), ("", 0o555, uid))  # the folder itself
        return {"name": name, "hostPath": {"path": folder, "type": "Directory"}}


def _probes(container: Doc) -> list[Probe]:
    ports = {p["name"]: int(p["containerPort"]) for p in container.get("ports") or []}
    found = []
    for kind in ("startup", "liveness", "readiness"):
        spec = container.pop(f"{kind}Probe", None)
        if not spec:
            continue
        http = None
        command = None
        if "httpGet" in spec:
            port = spec["httpGet"]["port"]
            number = ports[port] if isinstance(port, str) else int(port)
            http = (str(spec["httpGet"].get("path", "/")), number)
        elif "exec" in spec:
            command = tuple(spec["exec"]["command"])
        found.append(
            Probe(
                container=container["name"],
                kind=kind,
                http=http,
                command=command,
                period=float(spec.get("periodSeconds", 10)),
                failures=int(spec.get("failureThreshold", 3)),
            )
        )
    return found


def _image(container: Doc) -> None:
    image = str(container.get("image", ""))
    base = image.split(":", 1)[0]
    if base == "ferry":
        container["image"] = ROLES_IMAGE
    elif base == "nats":
        container["image"] = SERVERS_IMAGE
        container["command"] = ["nats-server"]
    elif base == "postgres":
        container["image"] = SERVERS_IMAGE
        container["command"] = ["postgres-dev"]
    container["imagePullPolicy"] = "Never"


def _aliases(services: dict[str, Doc], labels: dict[str, str]) -> list[str]:
    return sorted(
        name
        for name, svc in services.items()
        if svc["spec"].get("selector")
        and all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    )


def podman_plan(
    docs: list[Doc],
    secrets: list[Doc],
    root: str,
    *,
    topologies: Iterable[str] | None = None,
    subnet: str = SUBNET,
) -> Plan:
    """Rewrite the rendered dev overlay for podman; files go under ``root`` on the host.
    ``topologies``: only the workloads of these (by their ``ferry/topology`` label; the
    servers always), for a smaller stack."""
    if not subnet.endswith(".0/24"):
        raise OverlayError(f"subnet {subnet!r}: a /24 ending in .0 is expected")
    wanted = set(topologies) if topologies is not None else None
    conv = _Converter(docs, secrets, root)
    services = _index(docs, "Service")
    plan = Plan(servers=[], jobs=[], roles=[], left_out=[])
    for doc in docs:
        kind, name = doc.get("kind", ""), doc.get("metadata", {}).get("name", "")
        if kind in LEFT_OUT_KINDS:
            plan.left_out.append((kind, name, LEFT_OUT_KINDS[kind]))
            continue
        if kind not in ("Deployment", "StatefulSet", "Job"):
            continue  # ConfigMaps and Services are folded into the workloads
        labels = doc.get("metadata", {}).get("labels") or {}
        topology = labels.get("ferry/topology")
        if wanted is not None and topology is not None and topology not in wanted:
            continue
        if name in LEFT_OUT_WORKLOADS:
            plan.left_out.append((kind, name, LEFT_OUT_WORKLOADS[name]))
            continue
        plan_list, workload = _workload(conv, services, doc)
        getattr(plan, plan_list).append(workload)
    prefix = subnet.rsplit(".", 1)[0]
    for number, workload in enumerate(plan.workloads, start=10):
        workload.ip = f"{prefix}.{number}"
    return plan


def _workload(conv: _Converter, services: dict[str, Doc], doc: Doc) -> tuple[str, Workload]:
    doc = copy.deepcopy(doc)
    kind, name = doc["kind"], doc["metadata"]["name"]
    template = doc["spec"]["template"]
    spec = template["spec"]
    labels = dict(template["metadata"].get("labels") or {})
    component = labels.get("app.kubernetes.io/component", "")
    pod_kind = "Pod" if kind == "Job" else "Deployment"
    pod_name = name if pod_kind == "Pod" else f"{name}-pod-0"
    where = f"{kind} {name}"
    uid = int((spec.get("securityContext") or {}).get("runAsUser", 0))
    files: dict[tuple[str, str], Any] = {}
    claims = [c["metadata"]["name"] for c in doc["spec"].get("volumeClaimTemplates") or []]
    spec["volumes"] = [conv.volume(name, v, uid, files, where) for v in spec.get("volumes") or []]
    for claim in claims:  # a folder on the host, owned by the pod's user, kept until `down`
        folder = f"{conv.root}/{name}/{claim}"
        files[(folder, "")] = ("", 0o700, uid)
        spec["volumes"].append({"name": claim, "hostPath": {"path": folder, "type": "Directory"}})
    probes: list[Probe] = []
    ports: dict[str, int] = {}
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or []:
            _image(container)
            env = conv.env_of(container, pod_name, f"{where} container {container['name']}")
            container["env"] = env
            container.pop("envFrom", None)
            values = {e["name"]: e["value"] for e in env}
            for key in ("args", "command"):
                if key in container:
                    container[key] = [_expand(str(a), values) for a in container[key]]
            probes += _probes(container)
            container.pop("lifecycle", None)  # preStop: podman 4.3 ignores it anyway
            for port in container.pop("ports", None) or []:
                ports[port.get("name", str(port["containerPort"]))] = int(port["containerPort"])
    spec.pop("serviceAccountName", None)
    spec.pop("topologySpreadConstraints", None)
    annotations = dict(template["metadata"].get("annotations") or {})
    annotations["io.podman.annotations.init.container.type"] = "always"
    meta = {"name": pod_name if pod_kind == "Pod" else name, "labels": labels}
    if pod_kind == "Deployment":  # podman 4.3 reads a Deployment's own annotations
        meta["annotations"] = {"io.podman.annotations.init.container.type": "always"}
    if pod_kind == "Pod":
        spec["restartPolicy"] = "OnFailure"
        out: Doc = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**meta, "annotations": annotations},
            "spec": spec,
        }
    else:
        spec["restartPolicy"] = "OnFailure"  # not Always: podman 4.3 loops the init containers
        template["metadata"]["annotations"] = annotations
        out = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": int(doc["spec"].get("replicas") or 1),
                "selector": doc["spec"]["selector"],
                "template": template,
            },
        }
    workload = Workload(
        name=name,
        kind=pod_kind,
        doc=out,
        aliases=_aliases(services, labels),
        probes=probes,
        files=files,
        component=component,
        ports=ports,
    )
    servers = component in ("database", "messaging")
    return ("servers" if servers else "jobs" if kind == "Job" else "roles"), workload
