"""The inbox-consumer's instruments (see :mod:`shared.runtime.metrics` for the core)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.inbox_consumer.breaker import STATE_VALUES
from shared.adapters import inbox, parked_queue
from shared.adapters.lag import oldest_undelivered_age
from shared.domain.ack import HandlerFailure, HandlerResponse
from shared.domain.pause import describe_until, parse_server_time
from shared.domain.throttle import Limit
from shared.runtime.metrics import (
    BATCH_BUCKETS,
    DESTINATION,
    END_TO_END_BUCKETS,
    ERROR,
    GROUP,
    OPERATION,
    OPERATION_BUCKETS,
    SYSTEM,
    RoleMetrics,
    age_seconds,
    counter_family,
    dead_letter_counter,
)
from shared.telemetry import MESSAGING_SYSTEM

log = logging.getLogger("ferry.inbox_consumer")


class ConsumerMetrics:
    """inbox-consumer: receives, processing and end-to-end latency, outcomes, backlog, lag."""

    def __init__(
        self,
        role: RoleMetrics,
        *,
        durable: str,
        stream: str,
        consumers: list[str] | None = None,
    ) -> None:
        reg, self.role, self.durable, self.stream = role.registry, role, durable, stream
        #: The durable's JetStream consumers (one per partition of an ordered durable).
        self.consumers = consumers or [durable]
        self._process = Histogram(
            "messaging_process_duration_seconds",
            "Handler call duration (error_type: HTTP status of a failure, timeout, unreachable).",
            [SYSTEM, OPERATION, DESTINATION, GROUP, ERROR],
            buckets=OPERATION_BUCKETS,
            registry=reg,
        )
        self._process_ok = self._process.labels(MESSAGING_SYSTEM, "process", stream, durable, "")
        self._responses = Counter(
            "ferry_handler_responses",
            "Handler answers by HTTP status (or timeout / unreachable).",
            ["durable", "status"],
            registry=reg,
        )
        self._end_to_end = Histogram(
            "ferry_end_to_end_latency_seconds",
            "occurred_at to processed (inbox marked, message acked), per processed message.",
            ["durable"],
            buckets=END_TO_END_BUCKETS,
            registry=reg,
        ).labels(durable)
        self._dead_letters = dead_letter_counter(reg)
        self._batch = Histogram(
            "ferry_consumer_batch_messages",
            "Messages per fetched batch (one inbox claim and one processed mark each).",
            ["durable"],
            buckets=BATCH_BUCKETS,
            registry=reg,
        ).labels(durable)
        self._batch_size = Histogram(
            "ferry_handler_batch_size",
            "Events per batch handler call (durables with handler.batch >= 2).",
            ["durable"],
            buckets=BATCH_BUCKETS,
            registry=reg,
        ).labels(durable)
        self._batch_problems = Counter(
            "ferry_handler_batch_problems",
            "Events of batch calls whose answer could not be used (problem: malformed = "
            "every event of the call retried; missing / duplicated = that event retried; "
            "unknown = a result for an id the call did not carry, ignored).",
            ["durable", "problem"],
            registry=reg,
        )
        self._backlog = Gauge(
            "ferry_inbox_backlog",
            "QRY-051: inbox rows without processed_at, by state (pending = received or "
            "processing; failed = dead-lettered).",
            ["durable", "state"],
            registry=reg,
        )
        self._oldest = Gauge(
            "ferry_inbox_oldest_age_seconds",
            "QRY-051: age of the oldest unprocessed row's received_at (0 when none).",
            ["durable"],
            registry=reg,
        ).labels(durable)
        self._lag = Gauge(
            "ferry_consumer_lag_messages",
            "Consumer lag: JetStream num_pending + num_ack_pending of the durable.",
            ["durable"],
            registry=reg,
        ).labels(durable)
        #: The durable was paused at the last refresh (JetStream's consumer pause).
        self.paused = False
        self._paused = Gauge(
            "ferry_consumer_paused",
            "1 while the durable is paused (`ferry durable pause`: JetStream delivers "
            "nothing), else 0; summed over replicas it is their count, which KEDA holds.",
            ["durable"],
            registry=reg,
        ).labels(durable)
        self._paused_until = Gauge(
            "ferry_consumer_paused_until_timestamp_seconds",
            "When a paused durable resumes by itself (Unix time; 0 when not paused).",
            ["durable"],
            registry=reg,
        ).labels(durable)
        self._pending = Gauge(
            "ferry_consumer_pending_messages",
            "JetStream's view of the durable: pending (not yet delivered) and ack_pending.",
            ["durable", "state"],
            registry=reg,
        )
        self._lag_seconds = Gauge(
            "ferry_consumer_lag_seconds",
            "Age of the oldest message the durable has not yet delivered (0 when none).",
            ["durable"],
            registry=reg,
        ).labels(durable)
        self._parked = Gauge(
            "ferry_parked",
            "ordering: key durables: keys with parked messages, the messages parked, and "
            "the keys whose head is held for an operator (a dead letter under "
            "on_dead_letter: hold).",
            ["durable", "what"],
            registry=reg,
        )
        self._parked_oldest = Gauge(
            "ferry_parked_oldest_age_seconds",
            "ordering: key durables: age of the oldest parked message (0 when none).",
            ["durable"],
            registry=reg,
        ).labels(durable)
        self._errors = Counter(
            "ferry_consumer_errors",
            "Messages the consumer could not settle as decided and nak'ed or dead-lettered "
            "instead (stage: dead_letter = record not written, e.g. no stream leader; "
            "decide/settle/batch = an unexpected exception).",
            ["durable", "stage"],
            registry=reg,
        )

    def batch_fetched(self, messages: int) -> None:
        """One batch of ``messages`` handed over by the puller."""
        self._batch.observe(messages)

    def batch_called(self, events: int) -> None:
        """One batch handler call carrying ``events``."""
        self._batch_size.observe(events)

    def batch_problem(self, problem: str, events: int) -> None:
        """``events`` of a batch answer that could not be used as they were."""
        self._batch_problems.labels(self.durable, problem).inc(events)

    def handled(self, outcome: Any, seconds: float) -> None:
        """One handler call and what it answered."""
        if isinstance(outcome, HandlerResponse):
            status = str(outcome.status)
            error = "" if outcome.status < 400 or outcome.status == 409 else f"HTTP_{status}"
        elif isinstance(outcome, HandlerFailure):
            status = error = f"handler_{outcome.kind}"
        else:
            status = error = type(outcome).__name__
        self._responses.labels(self.durable, status).inc()
        if error:
            self._process.labels(MESSAGING_SYSTEM, "process", self.stream, self.durable, error)\
                .observe(seconds)  # fmt: skip
        else:
            self._process_ok.observe(seconds)

    def processed(self, occurred_at: datetime | None) -> None:
        """End-to-end latency of a message just processed."""
        if occurred_at is not None:
            self._end_to_end.observe(max(age_seconds(occurred_at), 0.0))

    def dead_lettered(self, reason: str) -> None:
        """A dead letter this consumer recorded (direct path)."""
        self._dead_letters.labels(self.durable, reason, "consumer").inc()

    def consumer_error(self, stage: str) -> None:
        """A message whose settlement failed at ``stage`` (it was nak'ed or dead-lettered)."""
        self._errors.labels(self.durable, stage).inc()

    def watch(self, stats: Any, pool: Any, js: Any) -> None:
        """Export ``stats`` and refresh backlog and lag from ``pool`` and ``js``."""
        durable, stream = self.durable, self.stream
        self.role.add_collector(lambda: consumer_families(durable, stream, stats))
        self.role.add_refresher("inbox", lambda: self._refresh_inbox(pool))
        self.role.add_refresher("jetstream", lambda: self._refresh_lag(js))

    def watch_parking(self, pool: Any) -> None:
        """Refresh the parked keys and messages of an ``ordering: key`` durable."""
        self.role.add_refresher("parking", lambda: self._refresh_parking(pool))

    def watch_breaker(self, breaker: Any) -> None:
        """Export the durable's circuit breaker: its state and what it did."""
        durable = self.durable
        self.role.add_collector(lambda: breaker_families(durable, breaker))

    def watch_ownership(self, ownership: Any) -> None:
        """Export a partitioned durable's ownership: partitions owned, lease events."""
        durable = self.durable
        self.role.add_collector(lambda: ownership_families(durable, ownership))

    async def _refresh_parking(self, pool: Any) -> None:
        async with pool.acquire() as conn:
            doc = await parked_queue.summary(conn, self.durable)
        self._parked.labels(self.durable, "keys").set(doc["keys"])
        self._parked.labels(self.durable, "events").set(doc["events"])
        self._parked.labels(self.durable, "held_keys").set(doc["held"])
        self._parked_oldest.set(age_seconds(doc["oldest_at"]))

    async def _refresh_inbox(self, pool: Any) -> None:
        async with pool.acquire() as conn:
            doc = await inbox.backlog(conn, self.durable)
        pending = doc["count"] - doc["retrying"] - doc["failed"]
        for state, value in (("pending", pending), ("retrying", doc["retrying"]),
                             ("failed", doc["failed"])):  # fmt: skip
            self._backlog.labels(self.durable, state).set(value)
        self._oldest.set(age_seconds(doc["oldest_at"]))

    async def _refresh_lag(self, js: Any) -> None:
        pending = ack_pending = 0
        oldest = 0.0
        ends: list[datetime | None] = []
        for name in self.consumers:  # every partition's consumer, summed
            info = await js.consumer_info(self.stream, name)
            pending += info.num_pending or 0
            ack_pending += info.num_ack_pending or 0
            if info.paused:
                ends.append(parse_server_time(info.config.pause_until))
            if info.num_pending:
                oldest = max(oldest, await oldest_undelivered_age(js, info))
        self._pending.labels(self.durable, "pending").set(pending)
        self._pending.labels(self.durable, "ack_pending").set(ack_pending)
        self._lag.set(pending + ack_pending)
        self._lag_seconds.set(oldest)
        self._set_paused(ends if len(ends) == len(self.consumers) else [])

    def _set_paused(self, ends: list[datetime | None]) -> None:
        """Paused when every consumer of the durable is; logged when that changes."""
        paused = bool(ends)
        until = min((e for e in ends if e is not None), default=None)
        if paused != self.paused:
            if paused:
                log.warning("%s is paused %s: JetStream delivers nothing to it until then",
                            self.durable, describe_until(until))  # fmt: skip
            else:
                log.warning("%s is no longer paused: deliveries resume", self.durable)
        self.paused = paused
        self._paused.set(1 if paused else 0)
        self._paused_until.set(until.timestamp() if until is not None else 0)


def breaker_families(durable: str, breaker: Any) -> list[Metric]:
    """A durable's circuit breaker (services/inbox_consumer/breaker.py)."""
    state = GaugeMetricFamily(
        "ferry_consumer_circuit_state",
        "The handler's circuit breaker in this process: 0 closed (calling), 1 open (holding "
        "messages, not calling), 2 half-open (one probe call in flight).",
        labels=["durable"],
    )
    state.add_metric([durable], STATE_VALUES.get(breaker.state, 0))
    return [
        state,
        counter_family(
            "ferry_consumer_circuit",
            "What the circuit breaker did: opened, probes (calls let through while open), "
            "held (calls that waited at it), kept (failed calls whose messages stayed in "
            "hand for a later probe instead of being nak'ed).",
            ["durable", "event"],
            {
                (durable, "opened"): breaker.opened,
                (durable, "probes"): breaker.probes,
                (durable, "held"): breaker.held,
                (durable, "kept"): breaker.kept,
            },
        ),
    ]


def ownership_families(durable: str, ownership: Any) -> list[Metric]:
    """A partitioned durable's leases as seen by this replica."""
    owned = GaugeMetricFamily(
        "ferry_partitions_owned",
        "Partitions of an ordering: key durable this replica consumes now.",
        labels=["durable"],
    )
    owned.add_metric([durable], len(ownership.owned()))
    events = {
        "acquired": ownership.acquired,
        "takeover": ownership.takeovers,
        "waited": ownership.waits,
        "shed": ownership.sheds,
        "fenced": ownership.fences,
        "restarted": ownership.restarts,
    }
    return [
        owned,
        counter_family(
            "ferry_partition_leases",
            "Partition lease events of this replica: acquired, takeover (of a dead owner's "
            "expired lease), waited (messages were in flight: a takeover or a restart waited "
            "until they were redeliverable), "
            "shed (given up for a new replica), fenced (lost), restarted (work restarted).",
            ["durable", "event"],
            {(durable, k): v for k, v in events.items()},
        ),
    ]


def throttle_families(
    durable: str, source: str, limit: Limit | None, members: int, waited: float
) -> list[Metric]:
    """The throttle of a durable (:mod:`.throttle`): ``ferry_throttle_rate`` and
    ``ferry_throttle_burst`` while a limit is in force, ``ferry_throttle_processes``,
    ``ferry_throttle_wait_seconds_total``."""
    rate = GaugeMetricFamily(
        "ferry_throttle_rate",
        "The durable's processing rate limit in force (messages/s, shared by its consumer "
        "processes), by source (topology, override); absent when it is not throttled.",
        labels=["durable", "source"],
    )
    processes = GaugeMetricFamily(
        "ferry_throttle_processes",
        "Live consumer processes of the durable sharing its limit (as this one last read).",
        labels=["durable"],
    )
    processes.add_metric([durable], members)
    burst = GaugeMetricFamily(
        "ferry_throttle_burst",
        "Burst of the rate limit in force (messages); absent when not throttled.",
        labels=["durable"],
    )
    if limit is not None:
        rate.add_metric([durable, source], limit.rate)
        burst.add_metric([durable], limit.burst)
    waiting = counter_family(
        "ferry_throttle_wait_seconds",
        "Seconds the consumer's fetch loops waited for the throttle (summed over loops).",
        ["durable"],
        {(durable,): waited},
    )
    return [rate, burst, processes, waiting]


def consumer_families(durable: str, stream: str, stats: Any) -> list[Metric]:
    """The consumer's exact counts (its stats) as Prometheus families."""
    outcomes = {
        "processed": stats.processed,
        "duplicate": stats.duplicates,
        "retried": stats.retries,
        "dead_lettered": stats.dead_lettered,
        "exhausted": stats.exhausted,
        "contended": stats.contended,
        "parked": stats.parked,
        "released": stats.released,
    }
    bound = GaugeMetricFamily(
        "ferry_consumer_bound", "1 once the consumer is bound to its durable.", labels=["durable"]
    )
    bound.add_metric([durable], 1 if stats.bound else 0)
    consumed = CounterMetricFamily(
        "messaging_client_consumed_messages",
        "Messages fetched from the durable (every delivery, redeliveries included).",
        labels=[SYSTEM, OPERATION, DESTINATION, GROUP],
    )
    consumed.add_metric([MESSAGING_SYSTEM, "fetch", stream, durable], stats.fetched)
    return [
        consumed,
        counter_family(
            "ferry_consumer_messages",
            "Deliveries by outcome. Success ratio = (processed + duplicate) / (processed + "
            "duplicate + retried + dead_lettered + exhausted); contended = left to the copy "
            "holding the lease.",
            ["durable", "outcome"],
            {(durable, k): v for k, v in outcomes.items()},
        ),
        counter_family(
            "ferry_consumer_retries",
            "Deliveries nak'ed for a retry, by reason code (HTTP_503, handler_timeout, ...).",
            ["durable", "reason"],
            {(durable, k): v for k, v in stats.retries_by_reason.items()},
        ),
        counter_family(
            "ferry_consumer_duplicates_skipped",
            "Deliveries of an id whose outcome was already final: acked, handler not called.",
            ["durable"],
            {(durable,): stats.duplicates},
        ),
        counter_family(
            "ferry_handler_config_alerts",
            "Handler answers that mean a configuration problem (e.g. 401, 404): alert, no ack.",
            ["durable"],
            {(durable,): stats.alerts},
        ),
        counter_family(
            "ferry_consumer_answers",
            "Answers to JetStream that needed more than one try (issue 44): naks and terms "
            "confirmed only after retrying (confirmed_late) or never (unconfirmed: the "
            "message waits its ack_wait), and acks re-sent after a leader change or a "
            "reconnect (acks_resent).",
            ["durable", "outcome"],
            {
                (durable, "confirmed_late"): stats.answers.confirmed_late,
                (durable, "unconfirmed"): stats.answers.unconfirmed,
                (durable, "acks_resent"): stats.answers.acks_resent,
            },
        ),
        counter_family(
            "ferry_consumer_delivery_gaps",
            "ordering: key: deliveries of a partition's consumer that never arrived (a jump "
            "in its sequence); the partition stops and restarts once they are redeliverable "
            "(ack_wait plus a pull's lifetime), so no later event of their key goes first.",
            ["durable"],
            {(durable,): stats.delivery_gaps},
        ),
        bound,
    ]
