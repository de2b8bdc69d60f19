"""The KPI job of one topology: a CronJob running ``spark-submit`` in the ``ferry-kpi``
image, or a ScheduledSparkApplication for the Spark operator (overlay ``spark-operator``)."""

from __future__ import annotations

from k8s.jobs import cron_job
from k8s.pods import (
    CONTAINER_SECURITY,
    Doc,
    common_env,
    container,
    copy_pgpass,
    credential_env,
    header,
    pod_mounts,
    pod_volumes,
    role_secret,
    settings_env_from,
    tname,
    workload_labels,
)
from shared.access.identities import Identity
from shared.contracts.topology import Topology

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
    env = common_env("kpi-spark-job", topology, {})
    env.append({"name": "FERRY_KPI_REPORT_DIR", "value": KPI_REPORT_DIR})
    return env


def _kpi_volumes(topology: Topology) -> list[Doc]:
    return pod_volumes(topology, role_secret(_kpi_identity(topology)), tmp_size="4Gi")


def kpi_cronjob(topology: Topology) -> Doc:
    """The KPI job of the topology: spark-submit in local mode, hourly, never overlapping."""
    name = f"kpi-spark-job-{tname(topology)}"
    labels = workload_labels("kpi-spark-job", name, "kpi", {"ferry/topology": topology.name})
    main = container(
        "kpi-spark-job",
        [
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
        _kpi_env(topology) + credential_env(_kpi_identity(topology)),
        KPI_RESOURCES,
        image=KPI_IMAGE,
    )
    return cron_job(
        name,
        labels,
        main,
        schedule=KPI_SCHEDULE,
        starting_deadline=600,
        retries=1,
        final_exit_codes=KPI_FINAL_EXIT_CODES,
        active_deadline=3000,
        volumes=_kpi_volumes(topology),
    )


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
        "envFrom": settings_env_from(),
        "env": _kpi_env(topology),
        "securityContext": security,
        # Executors get no credentials: the driver reads the databases' passwords and
        # hands Spark's JDBC reads what they need.
        "volumeMounts": pod_mounts(secrets=False),
    }
    driver = {
        **pod,
        "env": _kpi_env(topology) + credential_env(_kpi_identity(topology)),
        "volumeMounts": pod_mounts(),
        "initContainers": [copy_pgpass()],
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
    labels = workload_labels("kpi-spark-job", name, "kpi", {"ferry/topology": topology.name})
    return {
        **header("sparkoperator.k8s.io/v1beta2", "ScheduledSparkApplication", name, labels),
        "spec": {
            "schedule": KPI_SCHEDULE,
            "concurrencyPolicy": "Forbid",
            "successfulRunHistoryLimit": 3,
            "failedRunHistoryLimit": 3,
            "template": spark_application_spec(topology),
        },
    }
