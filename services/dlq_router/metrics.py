"""The dlq-router's instruments (see :mod:`shared.runtime.metrics` for the core)."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from shared.runtime.metrics import RoleMetrics, counter_family, dead_letter_counter


class RouterMetrics:
    """dlq-router: advisories by outcome, dead letters recorded."""

    def __init__(self, role: RoleMetrics) -> None:
        self.role = role
        self._dead_letters = dead_letter_counter(role.registry)

    def dead_lettered(self, durable: str, reason: str, source: str) -> None:
        """A dead letter the router recorded."""
        self._dead_letters.labels(durable, reason, source).inc()

    def watch(self, router: Any) -> None:
        """Export ``router.stats`` and its sweep's."""
        self.role.add_collector(lambda: router_families(router.stats))
        self.role.add_collector(lambda: sweep_families(router.sweep.stats))


def router_families(stats: Any) -> list[Metric]:
    """The router's exact counts as Prometheus families."""
    outcomes = {
        "recorded": stats.recorded,
        "already": stats.already,
        "processed_late": stats.processed_late,
        "waiting": stats.waiting,
        "error": stats.errors,
        "invalid": stats.invalid,
        "failed": stats.failed,
    }
    bound = GaugeMetricFamily(
        "ferry_dlq_router_bound", "1 once bound to the advisory durable.", labels=[]
    )
    bound.add_metric([], 1 if stats.bound else 0)
    return [
        counter_family(
            "ferry_dlq_router_advisories",
            "MAX_DELIVERIES / MSG_TERMINATED advisories handled, by outcome (error: retried "
            "later; invalid: unusable, terminated; failed: unexpected, retried then terminated).",
            ["outcome"],
            {(k,): v for k, v in outcomes.items()},
        ),
        bound,
    ]


def sweep_families(stats: Any) -> list[Metric]:
    """The router's sweep for unreported exhaustions, as Prometheus families."""
    return [
        counter_family(
            "ferry_dlq_router_sweep",
            "Sweep for exhaustions no advisory reported: sweeps run, rows dead-lettered "
            "(DELIVERY_EXHAUSTED_UNREPORTED), rows left because JetStream may still deliver "
            "them, rows another path had recorded, errors.",
            ["outcome"],
            {
                ("sweep",): stats.sweeps,
                ("recorded",): stats.recorded,
                ("still_pending",): stats.still_pending,
                ("already",): stats.already,
                ("error",): stats.errors,
            },
        )
    ]
