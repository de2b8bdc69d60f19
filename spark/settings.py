"""Settings of the KPI job: the common ``FERRY_*`` settings plus ``FERRY_KPI_*``.

Like every role's settings class this extends :class:`shared.runtime.settings.CommonSettings`
(topology, DSNs); its own fields are named ``kpi_*`` so that, under the common
``FERRY_`` prefix, they read ``FERRY_KPI_*``. Every field is documented in
docs/reference/settings.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BeforeValidator, Field, field_validator
from pydantic_settings import SettingsConfigDict

from shared.domain.durations import parse_duration
from shared.runtime.settings import CommonSettings

Seconds = Annotated[float, BeforeValidator(parse_duration)]

#: Where Debian's libpostgresql-jdbc-java puts the driver.
DEFAULT_JDBC_DRIVER = Path("/usr/share/java/postgresql.jar")


class KpiSettings(CommonSettings):
    """kpi-spark-job: one run reads every context database of a topology."""

    # validate_by_name: tests and callers may pass kpi_java_home= despite its env aliases.
    model_config = SettingsConfigDict(
        env_prefix="FERRY_", extra="ignore", validate_by_name=True, validate_by_alias=True
    )

    # ---- windows and incrementality
    #: Window length (``1h``, ``15m``, ``10s``); windows are aligned to the Unix epoch.
    kpi_window: Seconds = 3600.0
    #: A window is final this long after it ends; an event published this long ago and
    #: neither processed nor dead-lettered by a durable that should receive it is a lost
    #: candidate.
    kpi_grace: Seconds = 300.0
    #: Where the first run starts when no watermark exists (ISO 8601); unset: the
    #: earliest event in any outbox.
    kpi_start: str | None = None
    #: Run forever, once per this interval (aligned to the epoch, plus the grace); unset:
    #: run once. The ``--every`` option wins.
    kpi_every: Seconds | None = None

    # ---- where results go
    #: Database holding the KPI tables: one of the topology's (``ferry migrate`` creates
    #: the tables there); unset: the database of the topology's first context.
    kpi_database: str | None = None
    #: Directory of the JSON/HTML/PNG reports (one sub-directory per topology and run).
    kpi_report_dir: Path = Path(".var/kpi")
    #: Report directories kept per topology (older ones are deleted).
    kpi_keep_reports: int = Field(default=48, ge=1)
    #: Lost candidates listed by id in the JSON report (all are counted).
    kpi_max_listed_lost: int = Field(default=1000, ge=0)

    # ---- Spark and JDBC
    #: Spark master; unset: spark-submit's ``--master`` if given, else ``local[*]``.
    kpi_master: str | None = None
    #: Set by spark-submit in the environment of the Python driver it launches (never by
    #: hand): the JVM is already running, with spark-submit's master and --jars.
    pyspark_gateway_port: int | None = Field(
        default=None, validation_alias=AliasChoices("PYSPARK_GATEWAY_PORT")
    )
    #: The PostgreSQL JDBC driver jar (Debian: libpostgresql-jdbc-java).
    kpi_jdbc_driver: Path = DEFAULT_JDBC_DRIVER
    #: Java installation (its bin/java runs Spark); falls back to JAVA_HOME, then PATH.
    kpi_java_home: Path | None = Field(
        default=None, validation_alias=AliasChoices("FERRY_KPI_JAVA_HOME", "JAVA_HOME")
    )
    #: Most JDBC partitions one table of one database is read with.
    kpi_read_partitions: int = Field(default=8, ge=1, le=1024)
    #: Fewest rows per JDBC partition (small tables are read with fewer partitions).
    kpi_partition_min_rows: int = Field(default=20_000, ge=1)
    #: Rows per JDBC fetch round trip.
    kpi_fetch_size: int = Field(default=10_000, ge=1)
    #: spark.sql.shuffle.partitions (raise on a cluster).
    kpi_shuffle_partitions: int = Field(default=8, ge=1)
    #: Extra Spark configuration as JSON, e.g. ``{"spark.driver.memory": "2g"}``.
    kpi_spark_conf: dict[str, str] = Field(default_factory=dict)
    #: Exact percentiles (linear interpolation); false: percentile_approx (bounded memory).
    kpi_exact_percentiles: bool = True
    #: Seconds to wait for each database when checking it is reachable.
    kpi_connect_timeout: Seconds = 10.0

    # ---- PRD-022 targets
    #: Which verdicts gate the exit code: ``total`` (the run's whole range per durable and
    #: subject) or ``window`` (every single window).
    kpi_gate: Literal["total", "window"] = "total"
    #: Rows with fewer events than this get no rate verdicts (lost events always count).
    kpi_min_events: int = Field(default=1, ge=1)
    #: Delivery rate (published / produced) at least this.
    kpi_delivery_target: float = Field(default=0.9999, ge=0, le=1)
    #: Duplicate-processing rate at most this.
    kpi_duplicate_max: float = Field(default=0.0, ge=0, le=1)
    #: Dead-letter rate strictly below this.
    kpi_dlq_max: float = Field(default=0.001, ge=0, le=1)
    #: End-to-end latency p99 strictly below this many milliseconds.
    kpi_p99_max_ms: float = Field(default=500.0, gt=0)

    # ---- INFRA-005 §6 P0 alerts
    #: Consumer lag (median publish → first receipt in a window) above this ...
    kpi_lag_alert: Seconds = 300.0
    #: ... in this many consecutive windows raises the lag alert.
    kpi_lag_sustained_windows: int = Field(default=1, ge=1)
    #: Windows before each window whose mean dead-letter count is the baseline.
    kpi_baseline_windows: int = Field(default=24, ge=1)
    #: A dead-letter spike: more than this many times the baseline ...
    kpi_dlq_spike_factor: float = Field(default=3.0, gt=0)
    #: ... and at least this many dead letters in the window.
    kpi_dlq_spike_min: int = Field(default=10, ge=1)
    #: Success ratio (processed / (processed + dead-lettered)) below this raises an alert.
    kpi_min_success_ratio: float = Field(default=0.99, ge=0, le=1)

    @field_validator("kpi_window", "kpi_every")
    @classmethod
    def _whole_seconds(cls, value: float | None) -> float | None:
        if value is not None and (value < 1 or not math.isclose(value, round(value))):
            raise ValueError("must be a whole number of seconds, at least 1s")
        return value

    @property
    def window_seconds(self) -> int:
        """The window length as whole seconds."""
        return round(self.kpi_window)
