"""The demo handler services of the dev overlay: one Deployment, Service and
PodDisruptionBudget per context whose example handler the durables call."""

from __future__ import annotations

from urllib.parse import urlsplit

from k8s.pods import (
    GRACE_MARGIN,
    HANDLER_SHUTDOWN,
    POD_SECURITY,
    PRESTOP_SLEEP,
    SMALL,
    Doc,
    common_env,
    container,
    copy_pgpass,
    credential_env,
    disruption_budget,
    dns_name,
    header,
    health_probes,
    pod_volumes,
    role_secret,
    selector_labels,
    workload_labels,
)
from shared.access.identities import Identity
from shared.contracts.replay_jobs import replay_workers
from shared.contracts.topology import Topology


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
    labels = workload_labels("handler", instance, "handler", {"ferry/topology": topology.name})
    selector = selector_labels("handler", instance)
    named: list[Doc] = [
        {"name": f"http-{port}", "containerPort": port, "protocol": "TCP"} for port in ports
    ]
    # The handler that runs the replay API's jobs has a NATS user and runs them.
    replaying = context in replay_workers(topology)
    identity = Identity("handler", context, nats=replaying)
    env = common_env("handler", topology, {"ferry.context": context})
    env.append({"name": "FERRY_HOST", "value": "0.0.0.0"})
    if replaying:
        env.append({"name": "FERRY_HANDLER_REPLAY_JOBS", "value": "true"})
    env += credential_env(identity)
    main = container(
        "handler",
        ["-m", "services.handlers", "--service", context],
        env,
        SMALL,
        ports=named,
        **health_probes(named[0]["name"]),
        lifecycle={"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP)]}}},
    )
    grace = PRESTOP_SLEEP + HANDLER_SHUTDOWN + GRACE_MARGIN
    deployment_doc: Doc = {
        **header("apps/v1", "Deployment", instance, labels),
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
                    "initContainers": [copy_pgpass()],
                    "containers": [main],
                    "volumes": pod_volumes(topology, role_secret(identity)),
                },
            },
        },
    }
    service = {
        **header("v1", "Service", instance, labels),
        "spec": {
            "selector": selector,
            "ports": [
                {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"]}
                for p in named
            ],
        },
    }
    return [deployment_doc, service, disruption_budget("handler", instance, labels)]
