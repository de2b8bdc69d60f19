"""The roles of one topology as workloads: an outbox-publisher per context that owns a
stream, an inbox-consumer per durable (with its KEDA ScaledObject), the dlq-router, the
dlq-replayer, retention (``ferry purge --every``) and the console, which shows each
watched role's liveness through the role's health Service (its Jobs are in
:mod:`k8s.jobs`)."""

from __future__ import annotations

import json
import math
from urllib.parse import urlsplit

from k8s.pods import (
    CONSUMER,
    CONSUMER_DRAIN_SLACK,
    DEFAULT_DRAIN,
    FETCH_TIMEOUT,
    HEALTH_PORT,
    MAX_REPLICAS,
    MIN_INFLIGHT_PER_REPLICA,
    MIN_REPLICAS,
    NATS_MONITORING_ENDPOINT,
    PROMETHEUS_ADDRESS,
    REPLACE,
    SMALL,
    Doc,
    Role,
    as_seconds,
    common_env,
    dns_name,
    header,
    selector_labels,
    tname,
    workload_labels,
)
from shared.access.identities import Identity, Kind
from shared.contracts.topology import Topology


def _role(
    name: Kind,
    component: str,
    env: list[Doc],
    topology: Topology,
    *,
    per: tuple[str, str] | None = None,
    drain: float = DEFAULT_DRAIN,
    resources: Doc = SMALL,
    replicas: int | None = 1,
) -> Role:
    """Role ``name`` (``python -m services.<name>``, its dashes underscores) of the
    topology, or, ``per`` ``(kind, value)``, of one context or durable: passed as
    ``--<kind> <value>``, named and labelled after it, with its credentials."""
    if per is None:
        scope, suffix, args, labels = topology.name, tname(topology), [], {}
    else:
        kind, scope = per
        suffix = dns_name(scope, f"{kind} {scope}")
        args, labels = [f"--{kind}", scope], {f"ferry/{kind}": scope}
    return Role(
        name=name,
        instance=f"{name}-{suffix}",
        identity=Identity(name, scope),
        component=component,
        args=["-m", f"services.{name.replace('-', '_')}", *args],
        env=env,
        drain=drain,
        resources=resources,
        labels={"ferry/topology": topology.name, **labels},
        replicas=replicas,
    )


def publishers(topology: Topology) -> list[Role]:
    """One outbox-publisher per context that owns a stream."""
    roles = []
    for context, spec in topology.contexts.items():
        if spec.stream is None:
            continue
        env = common_env("outbox-publisher", topology, {"ferry.context": context})
        env.append({"name": "FERRY_DRAIN_DEADLINE", "value": as_seconds(DEFAULT_DRAIN)})
        per = ("context", context)
        roles.append(_role("outbox-publisher", "publisher", env, topology, per=per))
    return roles


def consumer_drain(topology: Topology, durable: str) -> int:
    """FERRY_DRAIN_DEADLINE of a durable's consumer: its handler timeout plus slack."""
    timeout = topology.durables[durable].handler.timeout
    return max(DEFAULT_DRAIN, math.ceil(timeout) + CONSUMER_DRAIN_SLACK)


def consumers(topology: Topology) -> list[Role]:
    """One inbox-consumer per durable; replicas left to KEDA (prod) or 1 (dev)."""
    roles = []
    for durable in topology.durables:
        drain = consumer_drain(topology, durable)
        env = common_env("inbox-consumer", topology, {"ferry.durable": durable})
        env += [
            {"name": "FERRY_DRAIN_DEADLINE", "value": as_seconds(drain)},
            {"name": "FERRY_FETCH_TIMEOUT", "value": as_seconds(FETCH_TIMEOUT)},
            {
                "name": "FERRY_HANDLER_URL",
                "valueFrom": {
                    "configMapKeyRef": {"name": f"ferry-handlers-{tname(topology)}", "key": durable}
                },
            },
        ]
        roles.append(
            _role("inbox-consumer", "consumer", env, topology, per=("durable", durable),
                  drain=drain + FETCH_TIMEOUT, resources=CONSUMER, replicas=None)
        )  # fmt: skip
    return roles


def dlq_roles(topology: Topology) -> list[Role]:
    """dlq-router and dlq-replayer of the topology."""
    env = common_env("dlq-router", topology, {})
    env += [
        {"name": "FERRY_DRAIN_DEADLINE", "value": as_seconds(DEFAULT_DRAIN)},
        {"name": "FERRY_FETCH_TIMEOUT", "value": as_seconds(FETCH_TIMEOUT)},
    ]
    replayer_env = common_env("dlq-replayer", topology, {})
    replayer_env.append({"name": "FERRY_DRAIN_DEADLINE", "value": as_seconds(DEFAULT_DRAIN)})
    return [
        _role("dlq-router", "dlq", env, topology, drain=DEFAULT_DRAIN + FETCH_TIMEOUT),
        _role("dlq-replayer", "dlq", replayer_env, topology),
    ]


#: How often the retention role purges (``ferry purge --every``). A run finds what is due
#: through an index and deletes it in batches, so a run with little to do is cheap; every
#: 15 minutes a row outlives its policy by at most that much, each run deletes a
#: quarter-hour's rows (steady, small bursts of deletes and WAL rather than a day's at
#: once), and its figures (``ferry_retention_*``) are refreshed twice within the 30 minutes
#: FerryTableOutgrowsPolicy waits.
RETENTION_EVERY = "15m"


def retention_role(topology: Topology) -> Role:
    """Retention: ``ferry purge --every`` (:data:`RETENTION_EVERY`) as the topology's
    ``retention`` login, purging at start and then at each interval (published outbox
    rows, processed inbox rows, old claims and audit rows past the topology's retention
    settings; nothing unfinished), its ``ferry_retention_*`` metrics on the health port.

    One replica, replaced rather than rolled (:data:`~k8s.pods.REPLACE`): two purges at
    once are safe (the second skips the rows the first is deleting) but pointless. On
    SIGTERM the loop ends once the run in hand is done; one cut short by the grace period
    loses only its current batch (one statement, one transaction, rolled back)."""
    env = common_env("retention", topology, {})
    return Role(
        name="retention",
        instance=f"retention-{tname(topology)}",
        identity=Identity("retention", topology.name),
        component="retention",
        args=["-m", "shared.cli", "purge", "--every", RETENTION_EVERY],
        env=env,
        drain=DEFAULT_DRAIN,
        resources=SMALL,
        labels={"ferry/topology": topology.name},
        strategy=REPLACE,
    )


def watched_roles(topology: Topology) -> list[Role]:
    """The roles whose liveness the console's overview shows (FERRY_CONSOLE_ROLE_HEALTH,
    as supervisord.conf gives the consoles): every publisher, consumer and dlq role."""
    return publishers(topology) + consumers(topology) + dlq_roles(topology)


def role_service(role: Role, port_name: str, port: int) -> Doc:
    """A ClusterIP Service named after the role's Deployment, selecting its pods, its one
    port ``port_name`` sent to their health port (a Service routes to ready pods only)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": role.instance,
            "labels": workload_labels(role.name, role.instance, role.component, role.labels),
        },
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(role.name, role.instance),
            "ports": [{"name": port_name, "port": port, "targetPort": "health", "protocol": "TCP"}],
        },
    }


def health_service(role: Role) -> Doc:
    """The role's health Service: its health port as is (plain HTTP, also with the TLS
    component), so what answers its /healthz is a ready replica of the role."""
    return role_service(role, "health", HEALTH_PORT)


def role_health_urls(topology: Topology) -> dict[str, str]:
    """FERRY_CONSOLE_ROLE_HEALTH of the topology's console: each watched role's name (its
    identity, as under supervisord: ``inbox-consumer-<durable>``) to the /healthz of its
    health Service (:func:`health_service`), in the console's namespace."""
    return {
        role.identity.name: f"http://{role.instance}:{HEALTH_PORT}/healthz"
        for role in watched_roles(topology)
    }


def console_role(topology: Topology) -> Role:
    """The operator console of the topology: its pages, /healthz, /readyz and /metrics on
    the health port (one port), behind a ClusterIP Service (:func:`console_service`); its
    overview shows each watched role's liveness (:func:`role_health_urls`)."""
    env = common_env("console", topology, {})
    env += [
        {"name": "FERRY_CONSOLE_HOST", "value": "0.0.0.0"},
        {"name": "FERRY_CONSOLE_PORT", "value": str(HEALTH_PORT)},
        # Reached over TLS through an ingress or a port-forward; the cookie says so.
        {"name": "FERRY_CONSOLE_SECURE_COOKIE", "value": "true"},
        {"name": "FERRY_DRAIN_DEADLINE", "value": as_seconds(DEFAULT_DRAIN)},
        {"name": "FERRY_CONSOLE_ROLE_HEALTH", "value": json.dumps(role_health_urls(topology))},
    ]
    return _role("console", "console", env, topology)


def console_service(topology: Topology) -> Doc:
    """The console's Service (ClusterIP: an ingress with TLS, or ``kubectl port-forward``)."""
    return role_service(console_role(topology), "http", 80)


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
    labels = workload_labels("inbox-consumer", instance, "consumer", {"ferry/durable": durable})
    # One replica per window of max_ack_pending messages waiting.
    threshold = spec.max_ack_pending
    # One trigger per JetStream consumer (each partition's, for an ordered durable on a
    # partitioned stream): the formula takes the largest of them.
    lag_triggers = [
        {
            "type": "nats-jetstream",
            "name": f"lag_{k}",
            "metadata": {
                "natsServerMonitoringEndpoint": NATS_MONITORING_ENDPOINT,
                "account": "$G",
                "stream": spec.stream,
                "consumer": plan.name,
                "lagThreshold": str(threshold),
                "useHttps": "false",
            },
        }
        for k, plan in enumerate(plans)
    ]
    names = [f"lag_{k}" for k in range(len(lag_triggers))]
    lag = names[0] if len(names) == 1 else f"max({', '.join(names)})"
    paused_trigger = {
        "type": "prometheus",
        "name": "paused",
        "metadata": {
            "serverAddress": PROMETHEUS_ADDRESS,
            "query": f'sum(ferry_consumer_paused{{durable="{durable}"}}) or vector(0)',
            "threshold": "1",
        },
    }
    return {
        **header("keda.sh/v1alpha1", "ScaledObject", instance, labels),
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
                },
                # A paused durable (`ferry durable pause`) is held at its replica count:
                # its lag grows while nothing may be delivered, and more replicas would
                # only wait. Paused, each replica exports ferry_consumer_paused 1, so the
                # sum is their count; times the target, the HPA keeps exactly that many.
                "scalingModifiers": {
                    "formula": f"paused > 0 ? paused * {threshold} : {lag}",
                    "target": str(threshold),
                    "metricType": "AverageValue",
                },
            },
            "triggers": [*lag_triggers, paused_trigger],
        },
    }
