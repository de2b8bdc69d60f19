"""The topology's Jobs: the provisioning Job (logins, migrations, grants, streams), and the
CronJob every scheduled task is built as (the KPI job: :mod:`k8s.kpi`). Retention is a
long-running role, not a CronJob (:func:`k8s.roles.retention_role`): ``ferry purge
--every`` serves its metrics for Prometheus to scrape."""

from __future__ import annotations

from k8s.pods import (
    ADMIN_DIR,
    ADMIN_SECRET,
    NATS_PASSWORD,
    PG_ADMIN_USER,
    POD_SECURITY,
    SMALL,
    Doc,
    common_env,
    container,
    copy_pgpass,
    dsn_template,
    header,
    pod_mounts,
    pod_volumes,
    tname,
    workload_labels,
)
from shared.access.identities import DB_OWNER, NATS_ADMIN
from shared.contracts.topology import Topology


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
    labels = workload_labels(
        "ferry-provision", name, "provisioning", {"ferry/topology": topology.name}
    )
    admin_dsn = {"name": "FERRY_DSN_TEMPLATE", "value": dsn_template(f"$({PG_ADMIN_USER})")}
    owner_dsn = {"name": "FERRY_DSN_TEMPLATE", "value": dsn_template(DB_OWNER)}
    nats_admin = [
        {"name": "FERRY_NATS_USER", "value": NATS_ADMIN},
        {"name": "FERRY_NATS_PASSWORD_FILE", "value": f"{ADMIN_DIR}/{NATS_PASSWORD}"},
    ]
    passwords = ["--passwords-dir", ADMIN_DIR]

    def step(step_name: str, args: list[str], env: list[Doc]) -> Doc:
        return container(
            step_name,
            ["-m", "shared.cli", *args],
            common_env("ferry-provision", topology, {}) + env,
            SMALL,
            mounts=pod_mounts(ADMIN_DIR),
        )

    return {
        **header("batch/v1", "Job", name, labels),
        "spec": {
            "backoffLimit": 6,
            "activeDeadlineSeconds": 900,
            "ttlSecondsAfterFinished": 3600,
            "template": job_pod(
                labels,
                [
                    copy_pgpass(ADMIN_DIR),
                    step("logins", ["db-roles", "--logins-only", *passwords], [admin_dsn]),
                    step("migrate", ["migrate"], [owner_dsn]),
                    step("grants", ["db-roles", *passwords], [admin_dsn]),
                ],
                step("provision", ["provision"], nats_admin),
                pod_volumes(topology, ADMIN_SECRET),
            ),
        },
    }


def cron_job(
    name: str,
    labels: dict[str, str],
    main: Doc,
    *,
    schedule: str,
    starting_deadline: int,
    retries: int,
    final_exit_codes: list[int],
    active_deadline: int,
    volumes: list[Doc],
) -> Doc:
    """A CronJob of one container (in UTC, never two runs at once): ``retries`` more
    tries of a failed run, except on one of ``final_exit_codes`` (a failure a retry
    cannot cure) and not counting a pod evicted or preempted."""
    return {
        **header("batch/v1", "CronJob", name, labels),
        "spec": {
            "schedule": schedule,
            "timeZone": "Etc/UTC",
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": starting_deadline,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": labels},
                "spec": {
                    "backoffLimit": retries,
                    "podFailurePolicy": {
                        "rules": [
                            {
                                "action": "FailJob",
                                "onExitCodes": {
                                    "containerName": main["name"],
                                    "operator": "In",
                                    "values": final_exit_codes,
                                },
                            },
                            {
                                "action": "Ignore",
                                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                            },
                        ]
                    },
                    "activeDeadlineSeconds": active_deadline,
                    "ttlSecondsAfterFinished": 86400,
                    "template": job_pod(labels, [copy_pgpass()], main, volumes),
                },
            },
        },
    }


def job_pod(labels: dict[str, str], init: list[Doc], main: Doc, volumes: list[Doc]) -> Doc:
    """The pod template of a Job: run once, no API token, the hardened pod context."""
    return {
        "metadata": {"labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": "ferry",
            "automountServiceAccountToken": False,
            "securityContext": POD_SECURITY,
            "initContainers": init,
            "containers": [main],
            "volumes": volumes,
        },
    }
