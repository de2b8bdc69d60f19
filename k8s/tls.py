"""TLS on every hop from cert-manager (issue 47): the ``tls/`` Component of each topology.

Switched on by including ``k8s/components/tls`` (the prod overlay does), which includes the
generated ``k8s/generated/<topology>/tls`` of each topology and sets the shared settings.
Per topology this module generates:

* one cert-manager ``Certificate`` per workload (Secret ``<instance>-tls``: ``tls.crt``,
  ``tls.key`` and the issuing CA's ``ca.crt``), its common name the workload's identity;
  usable as a client certificate (NATS mutual TLS, the consumer's handler calls) and,
  for the console and each handler service, as a server certificate for its Service's
  names (short, namespace-qualified, ``.svc``, ``.svc.cluster.local``);
* JSON patches mounting into each workload its own certificate Secret at
  :data:`CERT_DIR` and the PostgreSQL CA (``ca.crt`` of CloudNativePG's ``<cluster>-ca``,
  never its ``ca.key``) at :data:`PG_CA_DIR`, both whole directories, read-only, and
  adding the settings of the hop the role serves or authenticates on;
* the handler URLs as ``https://``.

Rotation: cert-manager renews a Secret in place and the kubelet updates a Secret volume
(its ``..data`` symlink) within a minute; every role reloads its certificate files when
they change (``shared/runtime/tls.py``) and libpq reads ``sslrootcert`` on each
connection. A ``subPath`` mount is never updated after the pod starts, so none is used
here (tests/k8s/test_tls.py fails on one).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import yaml

from k8s.demo import demo_handler
from k8s.jobs import provision_job
from k8s.kpi import kpi_cronjob, scheduled_spark_application
from k8s.pods import CNPG_CLUSTER, SECRET_MODE, Doc, dns_name, role_docs, tname
from k8s.roles import console_role, handler_url, retention_role, watched_roles
from shared.access.identities import NATS_ADMIN, Identity
from shared.contracts.replay_jobs import replay_workers
from shared.contracts.topology import Topology

#: Where a pod mounts its own certificate Secret: tls.crt, tls.key and the CA's ca.crt.
CERT_DIR = "/etc/ferry/certs"
#: Where a pod mounts the PostgreSQL server's CA (``ca.crt`` only).
PG_CA_DIR = "/etc/ferry/postgres-ca"
#: CloudNativePG's CA Secret of the example cluster (``ca.crt``, ``ca.key``).
PG_CA_SECRET = f"{CNPG_CLUSTER}-ca"
#: The issuer of every certificate; an overlay may patch ``/spec/issuerRef`` of kind
#: Certificate to use another (the CA must be the one nats-server and the handlers trust).
ISSUER: Doc = {"name": "ferry-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
#: The namespace the Services' qualified names are issued for (the prod overlay's).
NAMESPACE = "ferry"
#: Certificate lifetime and renewal, cert-manager durations.
DURATION = "2160h"
RENEW_BEFORE = "720h"
#: Volume names the patches add.
CERT_VOLUME = "tls-certificate"
PG_CA_VOLUME = "postgres-ca"


class Literal(str):
    """Text written as a YAML literal block (``|``): a patch stays readable."""


def tls_secret(instance: str) -> str:
    """The certificate Secret (and Certificate) of workload ``instance``."""
    return f"{instance}-tls"


def service_names(service: str, namespace: str = NAMESPACE) -> list[str]:
    """The DNS names a Service is reached by, for a server certificate's SANs."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def certificate(instance: str, common_name: str, topology: Topology, server: bool) -> Doc:
    """The Certificate of workload ``instance``: a client certificate named after its
    identity, also a server certificate for Service ``instance`` when ``server``."""
    usages = ["digital signature", "key encipherment", "client auth"]
    spec: Doc = {
        "secretName": tls_secret(instance),
        "secretTemplate": {
            "labels": {"app.kubernetes.io/part-of": "ferry", "ferry/topology": topology.name}
        },
        "commonName": common_name,
    }
    if server:
        spec["dnsNames"] = service_names(instance)
        usages.insert(2, "server auth")
    spec.update(
        {
            "duration": DURATION,
            "renewBefore": RENEW_BEFORE,
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            "usages": usages,
            "issuerRef": dict(ISSUER),
        }
    )
    return {
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {
            "name": tls_secret(instance),
            "labels": {
                "app.kubernetes.io/part-of": "ferry",
                "app.kubernetes.io/instance": instance,
                "ferry/topology": topology.name,
            },
        },
        "spec": spec,
    }


# ---------------------------------------------------------------- the workloads


def _files(names: dict[str, str]) -> list[Doc]:
    return [{"name": name, "value": f"{CERT_DIR}/{file}"} for name, file in names.items()]


#: Settings by the kind of workload (app.kubernetes.io/name), all inside CERT_DIR. The
#: NATS ones (FERRY_NATS_TLS_CA/_CERT/_KEY) are in ferry-settings: every pod has them.
ROLE_ENV: dict[str, list[Doc]] = {
    # The consumer verifies its handler service and shows its own certificate to it.
    "inbox-consumer": _files(
        {
            "FERRY_HANDLER_TLS_CA": "ca.crt",
            "FERRY_HANDLER_TLS_CERT": "tls.crt",
            "FERRY_HANDLER_TLS_KEY": "tls.key",
        }
    ),
    # The console serves HTTPS on its one port.
    "console": _files({"FERRY_CONSOLE_TLS_CERT": "tls.crt", "FERRY_CONSOLE_TLS_KEY": "tls.key"}),
    # A handler service serves HTTPS and requires a consumer's certificate from the CA.
    "handler": _files(
        {
            "FERRY_HANDLER_TLS_CERT": "tls.crt",
            "FERRY_HANDLER_TLS_KEY": "tls.key",
            "FERRY_HANDLER_TLS_CLIENT_CA": "ca.crt",
        }
    ),
}


def _workloads(topology: Topology) -> Iterator[tuple[Doc, str, bool]]:
    """(workload, the identity its certificate names, whether it serves a Service)."""
    for role in [*watched_roles(topology), retention_role(topology)]:
        yield role_docs(role, topology)[0], role.identity.name, False
    console = console_role(topology)
    yield role_docs(console, topology)[0], console.identity.name, True
    yield provision_job(topology), NATS_ADMIN, False
    # The two ways to run the KPI job share a name, and so one certificate.
    kpi = Identity("kpi-spark-job", topology.name).name
    yield kpi_cronjob(topology), kpi, False
    yield scheduled_spark_application(topology), kpi, False
    replaying = replay_workers(topology)
    for context in sorted({d.target for d in topology.durables.values()}):
        identity = Identity("handler", context, nats=context in replaying)
        yield _handler_deployment(topology, context), identity.name, True


def _handler_deployment(topology: Topology, context: str) -> Doc:
    """The demo handler's Deployment (dev overlay), or, for a context without an example
    service, a stand-in with its name and no spec: the certificate is for the operator's
    own handler Service ``handler-<context>``, and no patch is made for it."""
    from services.handlers.specs import SERVICES

    if context in SERVICES:
        return demo_handler(topology, context)[0]
    name = f"handler-{dns_name(context, f'context {context}')}"
    return {"kind": "Deployment", "metadata": {"name": name}, "spec": {}}


def _pod_path(doc: Doc) -> str:
    kind = doc["kind"]
    if kind == "CronJob":
        return "/spec/jobTemplate/spec/template/spec"
    return "/spec/template/spec"


def _volumes(secret: str | None) -> list[Doc]:
    volumes = []
    if secret is not None:
        volumes.append(
            {"name": CERT_VOLUME, "secret": {"secretName": secret, "defaultMode": SECRET_MODE}}
        )
    # ca.crt alone: CloudNativePG keeps the CA's private key in the same Secret.
    volumes.append(
        {
            "name": PG_CA_VOLUME,
            "secret": {
                "secretName": PG_CA_SECRET,
                "defaultMode": 0o444,
                "items": [{"key": "ca.crt", "path": "ca.crt"}],
            },
        }
    )
    return volumes


def _mounts(cert: bool) -> list[Doc]:
    # Whole directories, never subPath: a subPath mount keeps the file the pod started
    # with, so a certificate cert-manager renews would never reach the process.
    mounts = [{"name": PG_CA_VOLUME, "mountPath": PG_CA_DIR, "readOnly": True}]
    if cert:
        mounts.insert(0, {"name": CERT_VOLUME, "mountPath": CERT_DIR, "readOnly": True})
    return mounts


def _add(path: str, value: Any) -> Doc:
    return {"op": "add", "path": path, "value": value}


def _ferry_containers(spec: Doc) -> Iterator[tuple[str, Doc]]:
    """(kind, container) of every container that reads ferry-settings (not the pgpass copy)."""
    for kind in ("initContainers", "containers"):
        for k, container in enumerate(spec.get(kind, [])):
            if container.get("envFrom"):
                yield f"{kind}/{k}", container


def _spark_ops(doc: Doc, secret: str) -> list[Doc]:
    """The KPI job on the Spark operator: the driver gets its certificate and the CA, the
    executors (no credentials) the PostgreSQL CA only: their JDBC reads verify the server."""
    ops = [_add("/spec/template/volumes/-", v) for v in _volumes(secret)]
    ops += [_add("/spec/template/driver/volumeMounts/-", m) for m in _mounts(True)]
    ops += [_add("/spec/template/executor/volumeMounts/-", m) for m in _mounts(False)]
    return ops


def _probe_ops(container_path: str, container: Doc, kind: str) -> list[Doc]:
    ops = []
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        if probe not in container:
            continue
        port = container[probe]["httpGet"]["port"]
        if kind == "console":  # the kubelet does not verify the certificate
            ops.append(_add(f"{container_path}/{probe}/httpGet/scheme", "HTTPS"))
        else:  # a handler requires a client certificate the kubelet cannot show
            ops.append({"op": "remove", "path": f"{container_path}/{probe}/httpGet"})
            ops.append(_add(f"{container_path}/{probe}/tcpSocket", {"port": port}))
    return ops


def workload_ops(doc: Doc, secret: str) -> list[Doc]:
    """The JSON patch giving workload ``doc`` its certificate, the CA and its settings."""
    if doc["kind"] == "ScheduledSparkApplication":
        return _spark_ops(doc, secret)
    base = _pod_path(doc)
    spec = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"] if doc["kind"] == "CronJob" \
        else doc["spec"]["template"]["spec"]  # fmt: skip
    kind = doc["metadata"]["labels"]["app.kubernetes.io/name"]
    ops = [_add(f"{base}/volumes/-", v) for v in _volumes(secret)]
    for where, container in _ferry_containers(spec):
        path = f"{base}/{where}"
        ops += [_add(f"{path}/volumeMounts/-", m) for m in _mounts(True)]
        ops += [_add(f"{path}/env/-", e) for e in ROLE_ENV.get(kind, [])]
        if kind in ("console", "handler"):
            ops += _probe_ops(path, container, kind)
    if kind == "console":
        # The metrics on the console's port are HTTPS now.
        ops.append(_add("/spec/template/metadata/annotations/prometheus.io~1scheme", "https"))
    return ops


def _patch(doc: Doc, ops: list[Doc]) -> Doc:
    target = {"kind": doc["kind"], "name": doc["metadata"]["name"]}
    text = yaml.safe_dump(ops, sort_keys=False, default_flow_style=False, width=100)
    return {"target": target, "patch": Literal(text)}


def console_service_patch(topology: Topology) -> Doc:
    """The console's Service: port 443, named https."""
    name = console_role(topology).instance
    port = {"name": "https", "port": 443, "targetPort": "health", "protocol": "TCP"}
    return _patch({"kind": "Service", "metadata": {"name": name}},
                  [{"op": "replace", "path": "/spec/ports/0", "value": port}])  # fmt: skip


def https_handler_url(url: str) -> str:
    """The handler URL with TLS: ``https://``, same host, port and path."""
    parts = urlsplit(url)
    return parts._replace(scheme="https").geturl()


def certificates(topology: Topology) -> list[Doc]:
    """Every Certificate of the topology, one per workload."""
    seen: dict[str, Doc] = {}
    for doc, identity, server in _workloads(topology):
        name = doc["metadata"]["name"]
        if name not in seen:
            seen[name] = certificate(name, identity, topology, server)
    return list(seen.values())


def patches(topology: Topology) -> list[Doc]:
    """The kustomize patches of the topology's workloads (a patch whose workload is not in
    the render, a demo handler's in production, changes nothing)."""
    out = [_patch(doc, workload_ops(doc, tls_secret(doc["metadata"]["name"])))
           for doc, _identity, _server in _workloads(topology) if doc["spec"]]  # fmt: skip
    out.append(console_service_patch(topology))
    return out


def handler_literals(topology: Topology) -> list[str]:
    """The ``ferry-handlers-<topology>`` entries with TLS: each durable's URL, https."""
    return [f"{d}={https_handler_url(handler_url(topology, d))}" for d in topology.durables]


def component(topology: Topology) -> Doc:
    """The fields of the topology's ``tls/`` Component (resources, generator, patches)."""
    return {
        "resources": ["certificates.yaml"],
        "configMapGenerator": [
            {
                "name": f"ferry-handlers-{tname(topology)}",
                "behavior": "merge",
                "literals": handler_literals(topology),
            }
        ],
        "patches": patches(topology),
    }
