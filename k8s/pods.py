"""The pieces every generated workload is built from (:mod:`k8s.generate` assembles them).

Names (DNS-1123 labels, the recommended ``app.kubernetes.io`` labels), the images, ports,
mount points and drain timings every role shares, the security contexts and resources, the
credentials of each pod (its own Secret ``ferry-role-<role>``, the keys it holds, the
settings that point at them: README "Security"), and a role's Deployment with its
PodDisruptionBudget.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.access.identities import DB_OWNER, Identity, identities
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError

#: Image name every workload uses; the overlays pin registry and tag with ``images:``.
IMAGE = "ferry"
#: Port of /healthz, /readyz and /metrics in every role (FERRY_HEALTH_PORT in ferry-settings).
HEALTH_PORT = 8080
#: Where the topology ConfigMap is mounted; FERRY_TOPOLOGY points at the file inside.
TOPOLOGY_DIR = "/etc/ferry/topology"
#: Seconds the pod gets beyond the role's drain: closing pools and connections, SIGKILL slack.
GRACE_MARGIN = 10
#: The drain deadline of roles whose work in hand is short (publisher, dlq roles).
DEFAULT_DRAIN = 8
#: A consumer drains for its handler's timeout plus this, so a call just started can finish.
CONSUMER_DRAIN_SLACK = 5
#: Seconds one consumer or dlq-router fetch waits (FERRY_FETCH_TIMEOUT); adds to the drain.
FETCH_TIMEOUT = 1
#: Seconds a demo handler's pod waits after SIGTERM before stopping (endpoints update first).
PRESTOP_SLEEP = 5
#: Seconds a demo handler allows calls in flight (its FERRY_DRAIN_DEADLINE default).
HANDLER_SHUTDOWN = 8
#: KEDA: the floor in production (one replica can drain while the other works).
MIN_REPLICAS = 2
#: KEDA: the ceiling whatever the durable allows.
MAX_REPLICAS = 10
#: KEDA: a replica is worth adding only while it can hold this many messages of the
#: durable's max_ack_pending (JetStream shares that window among all replicas).
MIN_INFLIGHT_PER_REPLICA = 10
#: The NATS monitoring endpoint KEDA reads. It must be the chart's *headless* Service: in a
#: cluster the scaler asks the consumer's leader at ``<server-name>.<endpoint>``.
NATS_MONITORING_ENDPOINT = "nats-headless.nats.svc.cluster.local:8222"
#: The Prometheus KEDA asks whether a durable is paused (``ferry_consumer_paused``, summed
#: over its replicas): the Prometheus Operator's default Service for a Prometheus named
#: ``prometheus`` in namespace ``monitoring``. Change it in an overlay (a JSON patch of the
#: ScaledObjects' ``serverAddress``) for another.
PROMETHEUS_ADDRESS = "http://prometheus-operated.monitoring.svc.cluster.local:9090"
#: CloudNativePG example: the cluster and the role that own every context database (the
#: owner ``ferry migrate`` runs as, so it can create the tables in schema public).
CNPG_CLUSTER = "ferry-pg"
CNPG_OWNER = DB_OWNER

# Credentials. Each pod mounts its own role's Secret and nothing else; the role reads the
# files through *_FILE settings and its DSN's ?passfile= (README "Security").
#: Where a role's own Secret is mounted (read-only, mode 0400): one file per key.
CREDENTIALS_DIR = "/etc/ferry/credentials"
#: Where the provisioning Job mounts the administrative Secret.
ADMIN_DIR = "/etc/ferry/admin"
#: Memory-backed emptyDir holding the 0600 copy of the pgpass (``shared.access.secret_copy``):
#: libpq and asyncpg ignore a group-readable password file, which a Secret volume is
#: under the pod's fsGroup.
PRIVATE_DIR = "/run/ferry"
#: CA certificates from ConfigMap ``ferry-tls`` (optional; production needs it:
#: ``nats-ca.crt`` for FERRY_NATS_TLS_CA, ``postgres-ca.crt`` for sslrootcert).
TLS_DIR = "/etc/ferry/tls"
TLS_CONFIGMAP = "ferry-tls"
#: File mode of every mounted Secret key (the kubelet adds group read under fsGroup).
SECRET_MODE = 0o400
#: The Secret only the provisioning Job mounts: NATS admin, PostgreSQL owner and admin.
ADMIN_SECRET = "ferry-admin"
#: The Secret nats-server reads its users' passwords from ($FERRY_NATS_PASSWORD_<USER>).
NATS_USERS_SECRET = "ferry-nats-users"
#: Keys of a role's Secret: its libpq password file, NATS password and handler secret(s).
PGPASS = "pgpass"
NATS_PASSWORD = "nats-password"
HANDLER_SECRET = "handler-secret"
HANDLER_SECRETS = "handler-secrets.json"
#: Keys of the console's Secret: its operator accounts (scrypt hashes, ``{}`` until an
#: operator adds some), the bearer token of automation (read-only) and its session key.
CONSOLE_ACCOUNTS = "console-accounts.json"
CONSOLE_TOKEN = "console-token"
CONSOLE_SESSION_KEY = "console-session-key"
#: Keys of ConfigMap ferry-settings every DSN is built from (Kubernetes expands $(NAME)):
#: the server's host:port, the libpq parameters (TLS) and the administrative login.
PG_HOSTPORT = "PG_HOSTPORT"
PG_PARAMS = "PG_PARAMS"
PG_ADMIN_USER = "PG_ADMIN_USER"

#: Update strategies of a role's Deployment: the rolling default (a new pod ready before an
#: old one stops: no gap), and one at a time (the old pod gone before the new one starts,
#: for a single-replica role whose two copies at once would only duplicate the work).
ROLLING: dict[str, Any] = {
    "type": "RollingUpdate",
    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
}
REPLACE: dict[str, Any] = {"type": "Recreate"}

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Doc = dict[str, Any]


@dataclass(frozen=True)
class Role:
    """One Deployment: a role process with its command, settings and drain."""

    name: str  # app.kubernetes.io/name, also the container name
    instance: str  # Deployment name, app.kubernetes.io/instance
    identity: Identity  # whose credentials the pod gets (shared.access.identities)
    component: str
    args: list[str]
    env: list[Doc]
    drain: float  # seconds the process may spend after SIGTERM
    resources: Doc
    labels: dict[str, str] = field(default_factory=dict)
    replicas: int | None = 1
    #: The Deployment's update strategy: a new pod ready before an old one goes
    #: (:data:`ROLLING`), or the old one gone first (:data:`REPLACE`).
    strategy: Doc = field(default_factory=lambda: ROLLING)


# ---------------------------------------------------------------- naming


def dns_name(value: str, where: str) -> str:
    """``value`` as a DNS-1123 label (``_`` becomes ``-``), or a ConfigurationError."""
    name = value.replace("_", "-").lower()
    if not _DNS_LABEL.match(name) or len(name) > 63:
        raise ConfigurationError(
            f"{where}: {value!r} gives the Kubernetes name {name!r}, which is not a DNS-1123 "
            "label (lower-case letters, digits and '-', at most 63 characters)"
        )
    return name


def tname(topology: Topology) -> str:
    """The topology's name as used in Kubernetes names (checked by ``generate._check_unique``)."""
    return dns_name(topology.name, f"topology {topology.name}")


def as_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def workload_labels(
    name: str, instance: str, component: str, extra: dict[str, str]
) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "ferry",
        **extra,
    }


def selector_labels(name: str, instance: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": instance}


# ---------------------------------------------------------------- pod pieces

POD_SECURITY: Doc = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY: Doc = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
SMALL = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"cpu": "1", "memory": "256Mi"},
}
CONSUMER = {
    "requests": {"cpu": "200m", "memory": "192Mi"},
    "limits": {"cpu": "1", "memory": "384Mi"},
}


TINY = {
    "requests": {"cpu": "20m", "memory": "32Mi"},
    "limits": {"cpu": "500m", "memory": "64Mi"},
}


# ---------------------------------------------------------------- credentials


def role_secret(identity: Identity) -> str:
    """The Secret holding ``identity``'s credentials (and no one else's)."""
    return f"ferry-role-{dns_name(identity.name, f'role {identity.name}')}"


def secret_keys(identity: Identity) -> tuple[str, ...]:
    """The keys of ``identity``'s Secret: what its process reads."""
    keys = [PGPASS]
    if identity.uses_nats:
        keys.append(NATS_PASSWORD)
    if identity.kind == "inbox-consumer":
        keys.append(HANDLER_SECRET)
    if identity.kind == "handler":
        keys.append(HANDLER_SECRETS)
    if identity.kind == "console":
        keys += [CONSOLE_ACCOUNTS, CONSOLE_TOKEN, CONSOLE_SESSION_KEY]
    return tuple(keys)


def admin_password_key(name: str) -> str:
    """Key of the admin Secret holding login ``name``'s password: the file name that
    ``ferry db-roles --passwords-dir`` reads (``shared.access.identities.SecretsDir``)."""
    return f"pg-password-{name}"


def admin_secret_keys(topologies: Sequence[Topology]) -> tuple[str, ...]:
    """The keys of the admin Secret: NATS admin password, the owner's and the admin's
    pgpass, and every login's password (``ferry db-roles`` sets them)."""
    names = sorted({i.name for t in topologies for i in identities(t)})
    return (NATS_PASSWORD, PGPASS, *(admin_password_key(n) for n in [DB_OWNER, *names]))


def dsn_template(login: str) -> str:
    """FERRY_DSN_TEMPLATE of ``login``: no password, only the path of its private pgpass;
    server and TLS parameters from ferry-settings."""
    return (
        f"postgresql://{login}@$({PG_HOSTPORT})/{{database}}"
        f"?passfile={PRIVATE_DIR}/{PGPASS}&$({PG_PARAMS})"
    )


def credential_env(identity: Identity) -> list[Doc]:
    """The settings naming ``identity``'s login, NATS user and the files of its secrets."""
    env: list[Doc] = [{"name": "FERRY_DSN_TEMPLATE", "value": dsn_template(identity.pg_role)}]
    if identity.uses_nats:
        env += [
            {"name": "FERRY_NATS_USER", "value": identity.name},
            {"name": "FERRY_NATS_PASSWORD_FILE", "value": f"{CREDENTIALS_DIR}/{NATS_PASSWORD}"},
        ]
    if identity.kind == "inbox-consumer":
        env.append(
            {"name": "FERRY_HANDLER_SECRET_FILE", "value": f"{CREDENTIALS_DIR}/{HANDLER_SECRET}"}
        )
    if identity.kind == "handler":
        env.append(
            {"name": "FERRY_HANDLER_SECRETS_FILE", "value": f"{CREDENTIALS_DIR}/{HANDLER_SECRETS}"}
        )
    if identity.kind == "console":
        env += [
            {"name": f"FERRY_CONSOLE_{name}_FILE", "value": f"{CREDENTIALS_DIR}/{key}"}
            for name, key in (
                ("ACCOUNTS", CONSOLE_ACCOUNTS),
                ("TOKEN", CONSOLE_TOKEN),
                ("SESSION_KEY", CONSOLE_SESSION_KEY),
            )
        ]
    return env


def _secret_volume(secret: str) -> Doc:
    return {"name": "credentials", "secret": {"secretName": secret, "defaultMode": SECRET_MODE}}


def _topology_volume(topology: Topology) -> Doc:
    return {"name": "topology", "configMap": {"name": f"ferry-topology-{tname(topology)}"}}


def pod_volumes(topology: Topology, secret: str, tmp_size: str = "64Mi") -> list[Doc]:
    return [
        _topology_volume(topology),
        {"name": "tmp", "emptyDir": {"sizeLimit": tmp_size}},
        _secret_volume(secret),
        {"name": "private", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "tls", "configMap": {"name": TLS_CONFIGMAP, "optional": True}},
    ]


def pod_mounts(credentials: str = CREDENTIALS_DIR, *, secrets: bool = True) -> list[Doc]:
    mounts: list[Doc] = [
        {"name": "topology", "mountPath": TOPOLOGY_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if secrets:
        mounts += [
            {"name": "credentials", "mountPath": credentials, "readOnly": True},
            {"name": "private", "mountPath": PRIVATE_DIR, "readOnly": True},
            {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
        ]
    return mounts


def copy_pgpass(credentials: str = CREDENTIALS_DIR) -> Doc:
    """Init container: the pgpass of the mounted Secret, copied private (0600)."""
    return {
        "name": "pgpass",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "-m",
            "shared.access.secret_copy",
            f"{credentials}/{PGPASS}",
            f"{PRIVATE_DIR}/{PGPASS}",
        ],
        "resources": TINY,
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [
            {"name": "credentials", "mountPath": credentials, "readOnly": True},
            {"name": "private", "mountPath": PRIVATE_DIR},
        ],
    }


def settings_env_from() -> list[Doc]:
    return [{"configMapRef": {"name": "ferry-settings"}}]


def common_env(role: str, topology: Topology, attributes: dict[str, str]) -> list[Doc]:
    resource = ",".join(
        ["service.instance.id=$(POD_NAME)", f"ferry.topology={topology.name}"]
        + [f"{k}={v}" for k, v in attributes.items()]
    )
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "FERRY_TOPOLOGY", "value": f"{TOPOLOGY_DIR}/topology.yaml"},
        {"name": "OTEL_SERVICE_NAME", "value": role},
        {"name": "OTEL_RESOURCE_ATTRIBUTES", "value": resource},
    ]


def _probe(path: str, port: str, period: int, failures: int) -> Doc:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def health_probes(port: str) -> Doc:
    return {
        # A role serves /healthz once PostgreSQL and NATS answered: allow 5 minutes for
        # them to come up before liveness may restart it.
        "startupProbe": _probe("/healthz", port, 5, 60),
        "livenessProbe": _probe("/healthz", port, 10, 3),
        "readinessProbe": _probe("/readyz", port, 5, 2),
    }


def _spread(selector: dict[str, str]) -> list[Doc]:
    return [
        {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector},
        }
        for key in ("topology.kubernetes.io/zone", "kubernetes.io/hostname")
    ]


def container(
    name: str,
    args: list[str],
    env: list[Doc],
    resources: Doc,
    *,
    image: str = IMAGE,
    mounts: list[Doc] | None = None,
    **extra: Any,
) -> Doc:
    """A container of a Ferry image: ``ferry-settings`` and ``env``, hardened, the pod's
    volumes mounted; ``extra`` (ports, probes) goes before the resources."""
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "envFrom": settings_env_from(),
        "env": env,
        **extra,
        "resources": resources,
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": pod_mounts() if mounts is None else mounts,
    }


def deployment(role: Role, topology: Topology) -> Doc:
    """The Deployment of ``role``: probes, grace, security, spread, resources."""
    labels = workload_labels(role.name, role.instance, role.component, role.labels)
    selector = selector_labels(role.name, role.instance)
    main = container(
        role.name,
        role.args,
        role.env + credential_env(role.identity),
        role.resources,
        ports=[{"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"}],
        **health_probes("health"),
    )
    spec: Doc = {}
    if role.replicas is not None:
        spec["replicas"] = role.replicas
    spec.update(
        {
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": selector},
            "strategy": role.strategy,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(HEALTH_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "serviceAccountName": "ferry",
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": math.ceil(role.drain) + GRACE_MARGIN,
                    "securityContext": POD_SECURITY,
                    "topologySpreadConstraints": _spread(selector),
                    "initContainers": [copy_pgpass()],
                    "containers": [main],
                    "volumes": pod_volumes(topology, role_secret(role.identity)),
                },
            },
        }
    )
    return {
        **header("apps/v1", "Deployment", role.instance, labels),
        "spec": spec,
    }


def header(api_version: str, kind: str, name: str, labels: dict[str, str]) -> Doc:
    """The first keys of every object: its type, then its name and labels."""
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "labels": labels}}


def disruption_budget(name: str, instance: str, labels: dict[str, str]) -> Doc:
    """At most one pod of the Deployment down by choice (drains, upgrades) at a time."""
    return {
        **header("policy/v1", "PodDisruptionBudget", instance, labels),
        "spec": {
            "maxUnavailable": 1,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
            "selector": {"matchLabels": selector_labels(name, instance)},
        },
    }


def role_docs(role: Role, topology: Topology) -> list[Doc]:
    """Deployment and PodDisruptionBudget of ``role``."""
    labels = workload_labels(role.name, role.instance, role.component, role.labels)
    return [deployment(role, topology), disruption_budget(role.name, role.instance, labels)]
