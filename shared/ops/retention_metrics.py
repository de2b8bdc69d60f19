"""The retention role's instruments (``ferry purge --every``; the core is
:mod:`shared.runtime.metrics`), served on ``/metrics`` when ``FERRY_HEALTH_PORT`` is set.

Per table and database, from each run's report (nothing queried at scrape time):

``ferry_retention_purged_rows_total``       rows deleted
``ferry_retention_table_rows``              rows as the statistics estimate them
                                            (``pg_class.reltuples``: no count)
``ferry_retention_table_bytes``             ``pg_total_relation_size`` (indexes, TOAST)
``ferry_retention_oldest_row_age_seconds``  the oldest row's age now (measured after the
                                            run through an index, aged since); for the
                                            outbox and inbox, the oldest row past its
                                            retention (absent while the purge keeps up)
``ferry_retention_seconds``                 the table's retention (the policy), so an
                                            alert compares the two
``ferry_retention_last_run_timestamp_seconds``  when the last complete run ended (purge lag)
``ferry_retention_run_duration_seconds``    how long it took
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric

from shared.ops.retention_common import Purged
from shared.runtime.metrics import RoleMetrics

LABELS = ["table", "database"]
#: The report's names of the outbox and inbox purges, as the tables are named.
TABLES = {"outbox": "outbox_events", "inbox": "inbox_messages"}


class RetentionMetrics:
    """What ``ferry purge --every`` exports after each run."""

    def __init__(self, role: RoleMetrics) -> None:
        self.role = role
        registry = role.registry
        self._purged = Counter(
            "ferry_retention_purged_rows", "Rows the retention purge deleted, per table.",
            LABELS, registry=registry,
        )  # fmt: skip
        self._rows = Gauge(
            "ferry_retention_table_rows",
            "Rows of the table as the statistics estimate them (pg_class.reltuples).",
            LABELS, registry=registry,
        )  # fmt: skip
        self._bytes = Gauge(
            "ferry_retention_table_bytes", "Bytes of the table (pg_total_relation_size).",
            LABELS, registry=registry,
        )  # fmt: skip
        self._retention = Gauge(
            "ferry_retention_seconds", "The table's retention (its policy), in seconds.",
            LABELS, registry=registry,
        )  # fmt: skip
        self._last_run = Gauge(
            "ferry_retention_last_run_timestamp_seconds",
            "Unix time the last complete retention run ended.", registry=registry,
        )  # fmt: skip
        self._duration = Gauge(
            "ferry_retention_run_duration_seconds", "Seconds the last complete run took.",
            registry=registry,
        )  # fmt: skip
        #: (table, database) → the oldest row's Unix time, as last measured.
        self._oldest: dict[tuple[str, str], float] = {}
        role.add_collector(self._oldest_ages)

    def observe(self, report: list[Purged], started: float, ended: float) -> None:
        """Record one complete run (``started``/``ended``: Unix times)."""
        retention: dict[tuple[str, str], float] = {}
        #: The oldest row's Unix time per table this run (None: measured, none found);
        #: a table purged per durable or context reports each, and the oldest governs.
        oldest: dict[tuple[str, str], float | None] = {}
        for entry in report:
            key = (TABLES.get(entry.table, entry.table), entry.database)
            self._purged.labels(*key).inc(entry.purged)
            # A per-durable table has a policy per durable: the longest one governs it.
            retention[key] = max(retention.get(key, 0.0), entry.retention_seconds)
            if entry.rows_estimate is not None:
                self._rows.labels(*key).set(entry.rows_estimate)
            if entry.bytes is not None:
                self._bytes.labels(*key).set(entry.bytes)
            if entry.oldest_age_seconds is not None:
                found = ended - entry.oldest_age_seconds
                known = oldest.get(key)
                oldest[key] = found if known is None else min(known, found)
            elif entry.rows_estimate is not None:
                oldest.setdefault(key, None)  # measured, and nothing found
        for key, when in oldest.items():
            if when is None:
                self._oldest.pop(key, None)
            else:
                self._oldest[key] = when
        for key, seconds in retention.items():
            self._retention.labels(*key).set(seconds)
        self._last_run.set(ended)
        self._duration.set(ended - started)

    def _oldest_ages(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "ferry_retention_oldest_row_age_seconds",
            "Age of the table's oldest row (measured after each run, aged since).",
            labels=LABELS,
        )
        now = time.time()
        for (table, database), oldest in sorted(self._oldest.items()):
            family.add_metric([table, database], max(0.0, now - oldest))
        yield family
