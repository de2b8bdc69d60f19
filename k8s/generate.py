"""``python -m k8s.generate [--check] [--out DIR] [TOPOLOGY ...]``: manifests from the topologies.

Everything that repeats per context or per durable is generated here, never written by
hand: one outbox-publisher Deployment per context that owns a stream, one inbox-consumer
Deployment per durable, a dlq-router, a dlq-replayer and the operator console (with its
Service) per topology, the provisioning Job,
the retention CronJob (``ferry purge``), the KEDA ScaledObjects, the demo handler services
of the dev overlay, CloudNativePG ``Database`` objects for every context database, the
PrometheusRule built from ``k8s/base/alerts/ferry-alerts.rules.yaml``, and the NATS users
(``ferry nats-auth``) as a nats-server config file and as values for the NATS Helm chart.
The kustomize base and overlays include the result from ``k8s/generated/``.

Credentials (README "Security"): every pod mounts only its own role's Secret
``ferry-role-<role>`` (read-only, mode 0400) and reads it through ``*_FILE`` settings and
a ``?passfile=`` in its DSN, which names its own PostgreSQL login; the provisioning Job
alone mounts ``ferry-admin`` (the NATS admin, the PostgreSQL owner and administrator).
``python -m k8s.secrets`` renders all of these Secrets from random passwords; no secret
is ever written here.

Output is stable: the same inputs give the same bytes (keys in a fixed order, lists in
topology order, no timestamps), so ``--check`` (what CI runs, through
tests/k8s/test_generated.py) can compare byte for byte and name every stale file.
Exit codes: 0 written or fresh, 1 stale, 2 configuration error (the message names the
topology file and what is wrong).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from shared.access.identities import DB_OWNER, NATS_ADMIN, Identity, identities
from shared.access.nats_auth import (
    authorization_block,
    env_references,
    nats_users,
    password_variable,
)
from shared.contracts.loading import load_topology
from shared.contracts.replay_jobs import replay_workers
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOPOLOGIES = ("topologies/sea-vibespro.yaml", "topologies/mediation.yaml")
DEFAULT_OUT = ROOT / "k8s" / "generated"
ALERT_RULES = ROOT / "k8s" / "base" / "alerts" / "ferry-alerts.rules.yaml"

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
#: Seconds a demo handler allows calls in flight (services.handlers SHUTDOWN_TIMEOUT).
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

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HEADER = (
    "# Generated by `python -m k8s.generate` from {sources}.\n"
    "# Do not edit: change the source and run the generator again (CI fails when stale).\n"
)

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


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _labels(name: str, instance: str, component: str, extra: dict[str, str]) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "ferry",
        **extra,
    }


def _selector(name: str, instance: str) -> dict[str, str]:
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


def tname(topology: Topology) -> str:
    """The topology's name as used in Kubernetes names (checked by :func:`_check_unique`)."""
    return dns_name(topology.name, f"topology {topology.name}")


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


def _volumes(topology: Topology, secret: str, tmp_size: str = "64Mi") -> list[Doc]:
    return [
        _topology_volume(topology),
        {"name": "tmp", "emptyDir": {"sizeLimit": tmp_size}},
        _secret_volume(secret),
        {"name": "private", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "tls", "configMap": {"name": TLS_CONFIGMAP, "optional": True}},
    ]


def _mounts(credentials: str = CREDENTIALS_DIR, *, secrets: bool = True) -> list[Doc]:
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


def _copy_pgpass(credentials: str = CREDENTIALS_DIR) -> Doc:
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


def _env_from() -> list[Doc]:
    return [{"configMapRef": {"name": "ferry-settings"}}]


def _common_env(role: str, topology: Topology, attributes: dict[str, str]) -> list[Doc]:
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


def _health_probes(port: str) -> Doc:
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


def deployment(role: Role, topology: Topology) -> Doc:
    """The Deployment of ``role``: probes, grace, security, spread, resources."""
    labels = _labels(role.name, role.instance, role.component, role.labels)
    selector = _selector(role.name, role.instance)
    container: Doc = {
        "name": role.name,
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": role.args,
        "envFrom": _env_from(),
        "env": role.env + credential_env(role.identity),
        "ports": [{"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"}],
        **_health_probes("health"),
        "resources": role.resources,
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": _mounts(),
    }
    spec: Doc = {}
    if role.replicas is not None:
        spec["replicas"] = role.replicas
    spec.update(
        {
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": selector},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
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
                    "initContainers": [_copy_pgpass()],
                    "containers": [container],
                    "volumes": _volumes(topology, role_secret(role.identity)),
                },
            },
        }
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": role.instance, "labels": labels},
        "spec": spec,
    }


def disruption_budget(name: str, instance: str, labels: dict[str, str]) -> Doc:
    """At most one pod of the Deployment down by choice (drains, upgrades) at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": instance, "labels": labels},
        "spec": {
            "maxUnavailable": 1,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
            "selector": {"matchLabels": _selector(name, instance)},
        },
    }


def role_docs(role: Role, topology: Topology) -> list[Doc]:
    """Deployment and PodDisruptionBudget of ``role``."""
    labels = _labels(role.name, role.instance, role.component, role.labels)
    return [deployment(role, topology), disruption_budget(role.name, role.instance, labels)]


# ---------------------------------------------------------------- roles


def publishers(topology: Topology) -> list[Role]:
    """One outbox-publisher per context that owns a stream."""
    roles = []
    for context, spec in topology.contexts.items():
        if spec.stream is None:
            continue
        instance = f"outbox-publisher-{dns_name(context, f'context {context}')}"
        env = _common_env("outbox-publisher", topology, {"ferry.context": context})
        env.append({"name": "FERRY_DRAIN_DEADLINE", "value": _seconds(DEFAULT_DRAIN)})
        roles.append(
            Role(
                name="outbox-publisher",
                instance=instance,
                identity=Identity("outbox-publisher", context),
                component="publisher",
                args=["-m", "services.outbox_publisher", "--context", context],
                env=env,
                drain=DEFAULT_DRAIN,
                resources=SMALL,
                labels={"ferry/topology": topology.name, "ferry/context": context},
            )
        )
    return roles


def consumer_drain(topology: Topology, durable: str) -> int:
    """FERRY_DRAIN_DEADLINE of a durable's consumer: its handler timeout plus slack."""
    timeout = topology.durables[durable].handler.timeout
    return max(DEFAULT_DRAIN, math.ceil(timeout) + CONSUMER_DRAIN_SLACK)


def consumers(topology: Topology) -> list[Role]:
    """One inbox-consumer per durable; replicas left to KEDA (prod) or 1 (dev)."""
    roles = []
    for durable in topology.durables:
        instance = f"inbox-consumer-{dns_name(durable, f'durable {durable}')}"
        drain = consumer_drain(topology, durable)
        env = _common_env("inbox-consumer", topology, {"ferry.durable": durable})
        env += [
            {"name": "FERRY_DRAIN_DEADLINE", "value": _seconds(drain)},
            {"name": "FERRY_FETCH_TIMEOUT", "value": _seconds(FETCH_TIMEOUT)},
            {
                "name": "FERRY_HANDLER_URL",
                "valueFrom": {
                    "configMapKeyRef": {"name": f"ferry-handlers-{tname(topology)}", "key": durable}
                },
            },
        ]
        roles.append(
            Role(
                name="inbox-consumer",
                instance=instance,
                identity=Identity("inbox-consumer", durable),
                component="consumer",
                args=["-m", "services.inbox_consumer", "--durable", durable],
                env=env,
                drain=drain + FETCH_TIMEOUT,
                resources=CONSUMER,
                labels={"ferry/topology": topology.name, "ferry/durable": durable},
                replicas=None,
            )
        )
    return roles


def dlq_roles(topology: Topology) -> list[Role]:
    """dlq-router and dlq-replayer of the topology."""
    env = _common_env("dlq-router", topology, {})
    env += [
        {"name": "FERRY_DRAIN_DEADLINE", "value": _seconds(DEFAULT_DRAIN)},
        {"name": "FERRY_FETCH_TIMEOUT", "value": _seconds(FETCH_TIMEOUT)},
    ]
    replayer_env = _common_env("dlq-replayer", topology, {})
    replayer_env.append({"name": "FERRY_DRAIN_DEADLINE", "value": _seconds(DEFAULT_DRAIN)})
    labels = {"ferry/topology": topology.name}
    return [
        Role(
            name="dlq-router",
            instance=f"dlq-router-{tname(topology)}",
            identity=Identity("dlq-router", topology.name),
            component="dlq",
            args=["-m", "services.dlq_router"],
            env=env,
            drain=DEFAULT_DRAIN + FETCH_TIMEOUT,
            resources=SMALL,
            labels=labels,
        ),
        Role(
            name="dlq-replayer",
            instance=f"dlq-replayer-{tname(topology)}",
            identity=Identity("dlq-replayer", topology.name),
            component="dlq",
            args=["-m", "services.dlq_replayer"],
            env=replayer_env,
            drain=DEFAULT_DRAIN,
            resources=SMALL,
            labels=labels,
        ),
    ]


def console_role(topology: Topology) -> Role:
    """The operator console of the topology: its pages, /healthz, /readyz and /metrics on
    the health port (one port), behind a ClusterIP Service (:func:`console_service`)."""
    env = _common_env("console", topology, {})
    env += [
        {"name": "FERRY_CONSOLE_HOST", "value": "0.0.0.0"},
        {"name": "FERRY_CONSOLE_PORT", "value": str(HEALTH_PORT)},
        # Reached over TLS through an ingress or a port-forward; the cookie says so.
        {"name": "FERRY_CONSOLE_SECURE_COOKIE", "value": "true"},
        {"name": "FERRY_DRAIN_DEADLINE", "value": _seconds(DEFAULT_DRAIN)},
    ]
    return Role(
        name="console",
        instance=f"console-{tname(topology)}",
        identity=Identity("console", topology.name),
        component="console",
        args=["-m", "services.console"],
        env=env,
        drain=DEFAULT_DRAIN,
        resources=SMALL,
        labels={"ferry/topology": topology.name},
    )


def console_service(topology: Topology) -> Doc:
    """The console's Service (ClusterIP: an ingress with TLS, or ``kubectl port-forward``)."""
    role = console_role(topology)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": role.instance,
            "labels": _labels(role.name, role.instance, role.component, role.labels),
        },
        "spec": {
            "type": "ClusterIP",
            "selector": _selector(role.name, role.instance),
            "ports": [{"name": "http", "port": 80, "targetPort": "health", "protocol": "TCP"}],
        },
    }


def provision_job(topology: Topology) -> Doc:
    """The administrative steps for the topology, idempotent, retried, each with the one
    identity it needs (all from Secret ``ferry-admin``, which no other pod mounts):

    1. ``logins``: ``ferry db-roles --logins-only`` as the PostgreSQL administrator
       (``PG_ADMIN_USER``): every role's login and the owner, passwords from the Secret;
    2. ``migrate``: ``ferry migrate`` as the owner :data:`~shared.access.identities.DB_OWNER`;
    3. ``grants``: ``ferry db-roles``: each login gets exactly its access;
    4. ``provision``: ``ferry provision`` as the NATS admin.
    """
    name = f"ferry-provision-{tname(topology)}"
    labels = _labels("ferry-provision", name, "provisioning", {"ferry/topology": topology.name})
    admin_dsn = {"name": "FERRY_DSN_TEMPLATE", "value": dsn_template(f"$({PG_ADMIN_USER})")}
    owner_dsn = {"name": "FERRY_DSN_TEMPLATE", "value": dsn_template(DB_OWNER)}
    nats_admin = [
        {"name": "FERRY_NATS_USER", "value": NATS_ADMIN},
        {"name": "FERRY_NATS_PASSWORD_FILE", "value": f"{ADMIN_DIR}/{NATS_PASSWORD}"},
    ]
    passwords = ["--passwords-dir", ADMIN_DIR]

    def step(step_name: str, args: list[str], env: list[Doc]) -> Doc:
        return {
            "name": step_name,
            "image": IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "args": ["-m", "shared.ops.cli", *args],
            "envFrom": _env_from(),
            "env": _common_env("ferry-provision", topology, {}) + env,
            "resources": SMALL,
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": _mounts(ADMIN_DIR),
        }

    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 6,
            "activeDeadlineSeconds": 900,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": "ferry",
                    "automountServiceAccountToken": False,
                    "securityContext": POD_SECURITY,
                    "initContainers": [
                        _copy_pgpass(ADMIN_DIR),
                        step("logins", ["db-roles", "--logins-only", *passwords], [admin_dsn]),
                        step("migrate", ["migrate"], [owner_dsn]),
                        step("grants", ["db-roles", *passwords], [admin_dsn]),
                    ],
                    "containers": [step("provision", ["provision"], nats_admin)],
                    "volumes": _volumes(topology, ADMIN_SECRET),
                },
            },
        },
    }


#: ``ferry purge`` once a day, off the hour the KPI job starts at.
PURGE_SCHEDULE = "43 3 * * *"
#: Exit codes of ``ferry purge`` a retry cannot cure: configuration (2).
PURGE_FINAL_EXIT_CODES = [2]


def purge_cronjob(topology: Topology) -> Doc:
    """Retention: ``ferry purge`` daily as the topology's ``retention`` login (published
    outbox rows and processed inbox rows past the topology's retention; nothing else),
    never two at once, retried once on a connection failure."""
    identity = Identity("retention", topology.name)
    name = f"ferry-purge-{tname(topology)}"
    labels = _labels("ferry-purge", name, "retention", {"ferry/topology": topology.name})
    container: Doc = {
        "name": "purge",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": ["-m", "shared.ops.cli", "purge"],
        "envFrom": _env_from(),
        "env": _common_env("ferry-purge", topology, {}) + credential_env(identity),
        "resources": SMALL,
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": _mounts(),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedule": PURGE_SCHEDULE,
            "timeZone": "Etc/UTC",
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 3600,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": labels},
                "spec": {
                    "backoffLimit": 2,
                    "podFailurePolicy": {
                        "rules": [
                            {
                                "action": "FailJob",
                                "onExitCodes": {
                                    "containerName": "purge",
                                    "operator": "In",
                                    "values": PURGE_FINAL_EXIT_CODES,
                                },
                            },
                            {
                                "action": "Ignore",
                                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                            },
                        ]
                    },
                    "activeDeadlineSeconds": 3 * 3600,
                    "ttlSecondsAfterFinished": 86400,
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "restartPolicy": "Never",
                            "serviceAccountName": "ferry",
                            "automountServiceAccountToken": False,
                            "securityContext": POD_SECURITY,
                            "initContainers": [_copy_pgpass()],
                            "containers": [container],
                            "volumes": _volumes(topology, role_secret(identity)),
                        },
                    },
                },
            },
        },
    }


def handler_url(topology: Topology, durable: str) -> str:
    """In-cluster URL of a durable's handler: Service ``handler-<target>``, topology's port."""
    spec = topology.durables[durable]
    port = urlsplit(spec.handler.url).port or 80
    path = urlsplit(spec.handler.url).path or "/handle"
    return f"http://handler-{dns_name(spec.target, f'context {spec.target}')}:{port}{path}"


def scaled_object(topology: Topology, durable: str) -> Doc:
    """KEDA ScaledObject scaling a durable's consumer on its JetStream lag."""
    spec = topology.durables[durable]
    instance = f"inbox-consumer-{dns_name(durable, f'durable {durable}')}"
    ceiling = max(MIN_REPLICAS, min(MAX_REPLICAS, spec.max_ack_pending // MIN_INFLIGHT_PER_REPLICA))
    # An ordered durable runs each partition on one replica at a time: replicas beyond its
    # partitions would only wait (scaling moves partitions, it never splits a key).
    plans = topology.consumers(durable)
    if spec.ordering == "key":
        ceiling = min(ceiling, plans[0].partitions)
    floor = min(MIN_REPLICAS, ceiling)
    labels = _labels("inbox-consumer", instance, "consumer", {"ferry/durable": durable})
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": instance, "labels": labels},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": instance},
            "minReplicaCount": floor,
            "maxReplicaCount": ceiling,
            "pollingInterval": 15,
            "cooldownPeriod": 300,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        # Remove one replica a minute: each removal drains for up to its grace.
                        "scaleDown": {
                            "stabilizationWindowSeconds": 300,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                        }
                    }
                }
            },
            # One trigger per JetStream consumer (each partition's, for an ordered durable
            # on a partitioned stream): KEDA scales to the largest of them.
            "triggers": [
                {
                    "type": "nats-jetstream",
                    "metadata": {
                        "natsServerMonitoringEndpoint": NATS_MONITORING_ENDPOINT,
                        "account": "$G",
                        "stream": spec.stream,
                        "consumer": plan.name,
                        # One replica per window of max_ack_pending messages waiting.
                        "lagThreshold": str(spec.max_ack_pending),
                        "useHttps": "false",
                    },
                }
                for plan in plans
            ],
        },
    }


def demo_handler(topology: Topology, context: str) -> list[Doc]:
    """Dev overlay only: the example handler service of ``context`` and its Service."""
    instance = f"handler-{dns_name(context, f'context {context}')}"
    ports = sorted(
        {
            urlsplit(d.handler.url).port or 80
            for d in topology.durables.values()
            if d.target == context
        }
    )
    labels = _labels("handler", instance, "handler", {"ferry/topology": topology.name})
    selector = _selector("handler", instance)
    named: list[Doc] = [
        {"name": f"http-{port}", "containerPort": port, "protocol": "TCP"} for port in ports
    ]
    # The handler that runs the replay API's jobs has a NATS user and runs them.
    replaying = context in replay_workers(topology)
    identity = Identity("handler", context, nats=replaying)
    env = _common_env("handler", topology, {"ferry.context": context})
    env.append({"name": "FERRY_HOST", "value": "0.0.0.0"})
    if replaying:
        env.append({"name": "FERRY_HANDLER_REPLAY_JOBS", "value": "true"})
    env += credential_env(identity)
    container: Doc = {
        "name": "handler",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": ["-m", "services.handlers", "--service", context],
        "envFrom": _env_from(),
        "env": env,
        "ports": named,
        **_health_probes(named[0]["name"]),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP)]}}},
        "resources": SMALL,
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": _mounts(),
    }
    grace = PRESTOP_SLEEP + HANDLER_SHUTDOWN + GRACE_MARGIN
    deployment_doc: Doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": instance, "labels": labels},
        "spec": {
            "replicas": 1,
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": "ferry",
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": grace,
                    "securityContext": POD_SECURITY,
                    "initContainers": [_copy_pgpass()],
                    "containers": [container],
                    "volumes": _volumes(topology, role_secret(identity)),
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": instance, "labels": labels},
        "spec": {
            "selector": selector,
            "ports": [
                {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"]}
                for p in named
            ],
        },
    }
    return [deployment_doc, service, disruption_budget("handler", instance, labels)]


# ---------------------------------------------------------------- the KPI job

#: Image of the KPI job (Dockerfile target ``kpi``); the overlays pin its tag.
KPI_IMAGE = "ferry-kpi"
#: Spark the image carries (Dockerfile ARG PYSPARK_VERSION).
SPARK_VERSION = "4.3.0"
KPI_SCHEDULE = "17 * * * *"
KPI_FILE = "/app/spark/kpi_job.py"
JDBC_JAR = "/usr/share/java/postgresql.jar"
#: Where the KPI reports go (an emptyDir: the job prints its summary and keeps its results
#: in the KPI tables; mount a volume here to keep the JSON/HTML/PNG reports).
KPI_REPORT_DIR = "/tmp/kpi-reports"
#: Exit codes of spark.kpi_job that a retry cannot change: a verdict (1 target missed,
#: 4 alert fired), bad configuration (2), no Java/driver (10, 11), schema (12), another run
#: holds the lock (14). Only 3 (cannot connect) and 13 (Spark failed) are retried.
KPI_FINAL_EXIT_CODES = [1, 2, 4, 10, 11, 12, 14]
KPI_RESOURCES = {
    "requests": {"cpu": "1", "memory": "1536Mi"},
    "limits": {"cpu": "2", "memory": "2Gi"},
}


def _kpi_identity(topology: Topology) -> Identity:
    return Identity("kpi-spark-job", topology.name)


def _kpi_env(topology: Topology) -> list[Doc]:
    env = _common_env("kpi-spark-job", topology, {})
    env.append({"name": "FERRY_KPI_REPORT_DIR", "value": KPI_REPORT_DIR})
    return env


def _kpi_volumes(topology: Topology) -> list[Doc]:
    return _volumes(topology, role_secret(_kpi_identity(topology)), tmp_size="4Gi")


def kpi_cronjob(topology: Topology) -> Doc:
    """The KPI job of the topology: spark-submit in local mode, hourly, never overlapping."""
    name = f"kpi-spark-job-{tname(topology)}"
    labels = _labels("kpi-spark-job", name, "kpi", {"ferry/topology": topology.name})
    container: Doc = {
        "name": "kpi-spark-job",
        "image": KPI_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "spark-submit",
            "--master",
            "local[2]",
            "--driver-memory",
            "1g",
            "--jars",
            JDBC_JAR,
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.local.dir=/tmp/spark",
            KPI_FILE,
        ],
        "envFrom": _env_from(),
        "env": _kpi_env(topology) + credential_env(_kpi_identity(topology)),
        "resources": KPI_RESOURCES,
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": _mounts(),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedule": KPI_SCHEDULE,
            "timeZone": "Etc/UTC",
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 600,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": labels},
                "spec": {
                    "backoffLimit": 1,
                    "podFailurePolicy": {
                        "rules": [
                            {
                                "action": "FailJob",
                                "onExitCodes": {
                                    "containerName": "kpi-spark-job",
                                    "operator": "In",
                                    "values": KPI_FINAL_EXIT_CODES,
                                },
                            },
                            {
                                "action": "Ignore",
                                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                            },
                        ]
                    },
                    "activeDeadlineSeconds": 3000,
                    "ttlSecondsAfterFinished": 86400,
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "restartPolicy": "Never",
                            "serviceAccountName": "ferry",
                            "automountServiceAccountToken": False,
                            "securityContext": POD_SECURITY,
                            "initContainers": [_copy_pgpass()],
                            "containers": [container],
                            "volumes": _kpi_volumes(topology),
                        },
                    },
                },
            },
        },
    }


def spark_application_spec(topology: Topology) -> Doc:
    """SparkApplication spec of the KPI job for the Spark operator (cluster mode)."""
    labels = {
        "app.kubernetes.io/name": "kpi-spark-job",
        "app.kubernetes.io/instance": f"kpi-spark-job-{tname(topology)}",
        "app.kubernetes.io/component": "kpi",
        "app.kubernetes.io/part-of": "ferry",
        "ferry/topology": topology.name,
    }
    security = {**CONTAINER_SECURITY, "runAsNonRoot": True, "runAsUser": 10001}
    pod = {
        "cores": 1,
        "memory": "1g",
        "labels": labels,
        "envFrom": _env_from(),
        "env": _kpi_env(topology),
        "securityContext": security,
        # Executors get no credentials: the driver reads the databases' passwords and
        # hands Spark's JDBC reads what they need.
        "volumeMounts": _mounts(secrets=False),
    }
    driver = {
        **pod,
        "env": _kpi_env(topology) + credential_env(_kpi_identity(topology)),
        "volumeMounts": _mounts(),
        "initContainers": [_copy_pgpass()],
        "coreLimit": "1",
        "serviceAccount": "ferry-spark",
    }
    return {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": KPI_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "mainApplicationFile": f"local://{KPI_FILE}",
        "sparkVersion": SPARK_VERSION,
        "deps": {"jars": [f"local://{JDBC_JAR}"]},
        "sparkConf": {"spark.local.dir": "/tmp/spark"},
        "restartPolicy": {"type": "Never"},
        "timeToLiveSeconds": 86400,
        "volumes": _kpi_volumes(topology),
        "driver": driver,
        "executor": {**pod, "instances": 2},
    }


def scheduled_spark_application(topology: Topology) -> Doc:
    """The KPI job for the Spark operator: same schedule as the CronJob, never overlapping."""
    name = f"kpi-spark-job-{tname(topology)}"
    labels = _labels("kpi-spark-job", name, "kpi", {"ferry/topology": topology.name})
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "ScheduledSparkApplication",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedule": KPI_SCHEDULE,
            "concurrencyPolicy": "Forbid",
            "successfulRunHistoryLimit": 3,
            "failedRunHistoryLimit": 3,
            "template": spark_application_spec(topology),
        },
    }


def kpi_files(topology: Topology, label: str) -> dict[str, str]:
    """The two ways to run the KPI job, each a kustomize Component."""
    base = tname(topology)
    return {
        f"{base}/kpi-cronjob/cronjob.yaml": _dump([kpi_cronjob(topology)], label),
        f"{base}/kpi-cronjob/kustomization.yaml": _kustomization(
            "Component", label, resources=["cronjob.yaml"]
        ),
        f"{base}/kpi-spark-operator/scheduledsparkapplication.yaml": _dump(
            [scheduled_spark_application(topology)], label
        ),
        f"{base}/kpi-spark-operator/kustomization.yaml": _kustomization(
            "Component", label, resources=["scheduledsparkapplication.yaml"]
        ),
    }


# ---------------------------------------------------------------- files


class _Dumper(yaml.SafeDumper):
    """Safe dumper that writes shared sub-documents out in full (no ``&id001`` anchors)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(docs: Sequence[Doc], sources: str) -> str:
    body = yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
    return _HEADER.format(sources=sources) + body


def _kustomization(kind: str, sources: str, **fields: Any) -> str:
    api = "v1alpha1" if kind == "Component" else "v1beta1"
    doc = {"apiVersion": f"kustomize.config.k8s.io/{api}", "kind": kind, **fields}
    return _dump([doc], sources)


def topology_files(topology: Topology, source: Path, label: str) -> dict[str, str]:
    """Every generated file of one topology, keyed by path under the output directory."""
    base = tname(topology)
    files: dict[str, str] = {}
    resources = []
    for role in publishers(topology) + consumers(topology) + dlq_roles(topology):
        filename = f"{role.instance}.yaml"
        files[f"{base}/{filename}"] = _dump(role_docs(role, topology), label)
        resources.append(filename)
    console = console_role(topology)
    filename = f"{console.instance}.yaml"
    files[f"{base}/{filename}"] = _dump(
        [*role_docs(console, topology), console_service(topology)], label
    )
    resources.append(filename)
    files[f"{base}/provision.yaml"] = _dump([provision_job(topology)], label)
    resources.append("provision.yaml")
    files[f"{base}/purge.yaml"] = _dump([purge_cronjob(topology)], label)
    resources.append("purge.yaml")
    files[f"{base}/topology.yaml"] = source.read_text()
    files[f"{base}/kustomization.yaml"] = _kustomization(
        "Kustomization",
        label,
        resources=resources,
        configMapGenerator=[
            {"name": f"ferry-topology-{base}", "files": ["topology.yaml"]},
            {
                "name": f"ferry-handlers-{base}",
                "literals": [f"{d}={handler_url(topology, d)}" for d in topology.durables],
            },
        ],
    )
    files[f"{base}/keda/scaledobjects.yaml"] = _dump(
        [scaled_object(topology, d) for d in topology.durables], label
    )
    files[f"{base}/keda/kustomization.yaml"] = _kustomization(
        "Component", label, resources=["scaledobjects.yaml"]
    )
    files.update(_demo_handler_files(topology, label))
    files.update(kpi_files(topology, label))
    return files


def _demo_handler_files(topology: Topology, label: str) -> dict[str, str]:
    from services.handlers.specs import SERVICES

    base = tname(topology)
    targets = [
        c for c in topology.contexts if any(d.target == c for d in topology.durables.values())
    ]
    files: dict[str, str] = {}
    resources = []
    for context in targets:
        if context not in SERVICES:
            continue  # no example service: the dev overlay expects the context's own
        filename = f"handler-{dns_name(context, f'context {context}')}.yaml"
        files[f"{base}/demo-handlers/{filename}"] = _dump(demo_handler(topology, context), label)
        resources.append(filename)
    files[f"{base}/demo-handlers/kustomization.yaml"] = _kustomization(
        "Component", label, resources=resources
    )
    return files


def cnpg_files(topologies: Iterable[Topology], label: str) -> dict[str, str]:
    """CloudNativePG ``Database`` objects: every context database of every topology."""
    databases = sorted({db for t in topologies for db in t.databases()})
    docs = [
        {
            "apiVersion": "postgresql.cnpg.io/v1",
            "kind": "Database",
            "metadata": {
                "name": f"{CNPG_CLUSTER}-{dns_name(db, f'database {db}')}",
                "labels": {"app.kubernetes.io/part-of": "ferry"},
            },
            "spec": {
                "name": db,
                "owner": CNPG_OWNER,
                "cluster": {"name": CNPG_CLUSTER},
                "ensure": "present",
            },
        }
        for db in databases
    ]
    return {
        "cnpg/databases.yaml": _dump(docs, label),
        "cnpg/kustomization.yaml": _kustomization(
            "Kustomization", label, resources=["databases.yaml"]
        ),
    }


def nats_values(topologies: Sequence[Topology]) -> Doc:
    """Values for the NATS Helm chart (1.x): the users of ``ferry nats-auth``, each password
    read by nats-server from ``$FERRY_NATS_PASSWORD_<USER>`` (chart syntax ``<< $VAR >>``),
    the variables from Secret ``ferry-nats-users``."""
    users: list[Doc] = []
    for user, permissions in nats_users(list(topologies)).items():
        entry: Doc = {"user": user, "password": f"<< ${password_variable(user)} >>"}
        if permissions is not None:
            entry["permissions"] = {
                "publish": {"allow": list(permissions.publish)},
                "subscribe": {"allow": list(permissions.subscribe)},
            }
        users.append(entry)
    return {
        "config": {"merge": {"authorization": {"users": users}}},
        "container": {"merge": {"envFrom": [{"secretRef": {"name": NATS_USERS_SECRET}}]}},
    }


def nats_files(topologies: Sequence[Topology], label: str) -> dict[str, str]:
    """The NATS users of every topology (README "Security"), for both ways to run NATS:

    * ``nats/authorization.conf``: the ``authorization`` block of ``ferry nats-auth``, each
      password a ``$FERRY_NATS_PASSWORD_<USER>`` the server takes from its environment;
      the Component ``nats/`` makes it ConfigMap ``nats-authorization`` (dev overlay);
    * ``nats/values-auth.yaml``: the same users as values for the Helm chart, given after
      ``k8s/nats/values.yaml`` (``helm ... -f values.yaml -f values-auth.yaml``).
    """
    header = _HEADER.format(sources=label)
    block = authorization_block(nats_users(list(topologies)), env_references)
    return {
        "nats/authorization.conf": header + block,
        "nats/kustomization.yaml": _kustomization(
            "Component",
            label,
            configMapGenerator=[{"name": "nats-authorization", "files": ["authorization.conf"]}],
        ),
        "nats/values-auth.yaml": _dump([nats_values(topologies)], label),
    }


#: A ``criticality: high`` durable's lag alert: oldest undelivered message older than this
#: (seconds), for :data:`CRITICAL_LAG_FOR`.
CRITICAL_LAG_SECONDS = 60
CRITICAL_LAG_FOR = "1m"
#: Window in which a high durable's dead letter (a new series, or an increase) pages.
CRITICAL_DEAD_LETTER_WINDOW = "5m"


def critical_alert_group(topologies: Sequence[Topology]) -> dict[str, Any] | None:
    """The alerts of the ``criticality: high`` durables (INFRA-005 §7: "H publish: low
    frequency but high criticality"): the FIRST dead letter pages at once, and so does any
    lag over a minute (the P0 lag alert waits for 5 minutes over 5 minutes). None when no
    durable is declared high.

    A dead letter's counter series is born at 1 (no 0 sample for ``increase`` to see), so
    the expression also takes a series that did not exist one window ago.
    """
    high = sorted(
        name for t in topologies for name, d in t.durables.items() if d.criticality == "high"
    )
    if not high:
        return None
    match = 'durable=~"' + "|".join(high) + '"'  # lower_snake names: nothing to escape
    dead = f"ferry_dead_letters_total{{{match}}}"
    window = CRITICAL_DEAD_LETTER_WINDOW
    labels = {"severity": "critical", "priority": "P0", "criticality": "high"}
    return {
        "name": "ferry.critical",
        "rules": [
            {
                "alert": "FerryCriticalDeadLetter",
                "expr": f"sum by (namespace, durable) (increase({dead}[{window}])) > 0 or "
                f"sum by (namespace, durable) ({dead} unless {dead} offset {window}) > 0",
                "for": "0m",
                "labels": labels,
                "annotations": {
                    "summary": "Critical durable {{ $labels.durable }} dead-lettered a message",
                    "description": "{{ $labels.durable }} is declared criticality: high: "
                    "every dead letter pages. See it with `ferry dlq list --durable "
                    "{{ $labels.durable }}`, fix the cause, then replay it (`ferry dlq "
                    "replay`); a held key's later events wait for it (`ferry parked list`).",
                },
            },
            {
                "alert": "FerryCriticalLag",
                "expr": f"max by (namespace, durable) (ferry_consumer_lag_seconds{{{match}}})"
                f" > {CRITICAL_LAG_SECONDS}",
                "for": CRITICAL_LAG_FOR,
                "labels": labels,
                "annotations": {
                    "summary": "Critical durable {{ $labels.durable }} is behind",
                    "description": "The oldest message {{ $labels.durable }} has not yet "
                    "delivered is {{ $value | humanizeDuration }} old (criticality: high "
                    f"pages over {CRITICAL_LAG_SECONDS}s for {CRITICAL_LAG_FOR}). Is the "
                    "consumer running and bound (ferry_consumer_bound), is the handler "
                    "answering? Scale the consumer first (INFRA-005 §7).",
                },
            },
        ],
    }


def monitoring_files(rules_path: Path, topologies: Sequence[Topology] = ()) -> dict[str, str]:
    """The PrometheusRule wrapping the plain Prometheus rules file, plus the alerts of the
    topologies' ``criticality: high`` durables (:func:`critical_alert_group`)."""
    label = _relative(rules_path)
    try:
        rules = yaml.safe_load(rules_path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"{label}: cannot read alert rules: {exc}") from exc
    if not isinstance(rules, dict) or not isinstance(rules.get("groups"), list):
        raise ConfigurationError(f"{label}: a rules file needs a top-level 'groups' list")
    groups = list(rules["groups"])
    critical = critical_alert_group(topologies)
    if critical is not None:
        groups.append(critical)
        label += " and the topologies (criticality: high)"
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "ferry-alerts",
            "labels": {"app.kubernetes.io/part-of": "ferry", "app.kubernetes.io/name": "ferry"},
        },
        "spec": {"groups": groups},
    }
    return {
        "monitoring/prometheusrule.yaml": _dump([rule], label),
        "monitoring/kustomization.yaml": _kustomization(
            "Component", label, resources=["prometheusrule.yaml"]
        ),
    }


def _relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def generate(paths: Sequence[Path], rules_path: Path = ALERT_RULES) -> dict[str, str]:
    """Every generated file, keyed by its path under the output directory."""
    loaded = [(load_topology(p), p) for p in paths]
    _check_unique(loaded)
    files: dict[str, str] = {}
    for topology, path in loaded:
        files.update(topology_files(topology, path, _relative(path)))
    sources = ", ".join(_relative(p) for p in paths)
    files.update(cnpg_files([t for t, _ in loaded], sources))
    files.update(nats_files([t for t, _ in loaded], sources))
    files.update(monitoring_files(rules_path, [t for t, _ in loaded]))
    return dict(sorted(files.items()))


def _check_unique(loaded: Sequence[tuple[Topology, Path]]) -> None:
    """Names must not collide across topologies once they are Kubernetes names."""
    seen: dict[str, str] = {}
    for topology, path in loaded:
        dns_name(topology.name, f"{path}: topology name")
        names = [f"topology {topology.name}"]
        names += [f"context {c}" for c in topology.contexts]
        names += [f"durable {d}" for d in topology.durables]
        for entry in names:
            kind, raw = entry.split(" ", 1)
            key = f"{kind}:{dns_name(raw, f'{path}: {kind} {raw}')}"
            if key in seen:
                raise ConfigurationError(
                    f"{path}: {kind} {raw!r} collides with {kind} of the same Kubernetes "
                    f"name in {seen[key]}"
                )
            seen[key] = str(path)


# ---------------------------------------------------------------- write / check


def write(files: dict[str, str], out: Path) -> list[str]:
    """Write ``files`` under ``out``, deleting generated files no longer produced."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in stale_files(files, out):
        if stale.startswith("extra: "):
            (out / stale.removeprefix("extra: ")).unlink()
    for relative, text in files.items():
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
    for directory in sorted((p for p in out.rglob("*") if p.is_dir()), reverse=True):
        if not any(directory.iterdir()):
            directory.rmdir()
    return sorted(files)


def stale_files(files: dict[str, str], out: Path) -> list[str]:
    """What differs between ``files`` and ``out``: ``missing: P``, ``differs: P``, ``extra: P``."""
    present = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    problems = []
    for relative, text in files.items():
        if relative not in present:
            problems.append(f"missing: {relative}")
        elif (out / relative).read_text() != text:
            problems.append(f"differs: {relative}")
    problems += [f"extra: {p}" for p in sorted(present - set(files))]
    return problems


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m k8s.generate", description=__doc__)
    parser.add_argument("topologies", nargs="*", type=Path, help="topology files")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    paths = args.topologies or [ROOT / p for p in DEFAULT_TOPOLOGIES]
    try:
        files = generate(paths)
    except ConfigurationError as exc:
        print(f"k8s.generate: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        problems = stale_files(files, args.out) if args.out.is_dir() else ["missing: (all)"]
        for problem in problems:
            print(f"stale {args.out}: {problem}", file=sys.stderr)
        if problems:
            print("run: python -m k8s.generate", file=sys.stderr)
        return 1 if problems else 0
    written = write(files, args.out)
    print(f"{len(written)} files in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
