"""The DataFrame transforms on small hand-built frames, with exact expected numbers."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from pyspark.sql import DataFrame, SparkSession

from spark.plan import ALL_SUBJECTS, NO_DURABLE
from spark.runner import collect
from spark.transforms import (
    DEAD_LETTER_SCHEMA,
    INBOX_SCHEMA,
    OUTBOX_SCHEMA,
    ROUTE_SCHEMA,
    event_facts,
    latency_histogram,
    reason_counts,
    total_kpis,
    window_kpis,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HOUR = 3600
SUBJECT = "sea.event.model_published.v1"
ROUTE = ("sea", "model_published", 1, SUBJECT, "vib__from_sea", "vibespro", "vib_db")


def mid(n: int) -> str:
    return str(uuid.UUID(int=n))


class Frames:
    """Builds the four inputs of :func:`event_facts` row by row."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.outbox: list[tuple[Any, ...]] = []
        self.inbox: list[tuple[Any, ...]] = []
        self.dead: list[tuple[Any, ...]] = []
        self.routes: list[tuple[Any, ...]] = [ROUTE]

    def event(
        self,
        n: int,
        occurred: datetime,
        *,
        published: bool = True,
        event_type: str = "model_published",
    ) -> None:
        published_at = occurred + timedelta(milliseconds=1) if published else None
        self.outbox.append(("sea", mid(n), event_type, 1, occurred, published_at))

    def processed(self, n: int, occurred: datetime, latency_ms: float, **kw: Any) -> None:
        self.event(n, occurred)
        done = occurred + timedelta(milliseconds=latency_ms)
        received = occurred + timedelta(milliseconds=1)
        history = json.dumps(kw.get("history", []))
        attempts, status, dups = (
            kw.get("attempts", 1),
            kw.get("status", 200),
            kw.get("duplicates", 0),
        )
        self.row(n, "processed", received, done, attempts, status, dups, None, history)

    def row(self, n: int, status: str, *rest: Any, database: str = "vib_db") -> None:
        """An inbox row: received_at, processed_at, attempts, handler_status, duplicates,
        reason_code, retry_history."""
        self.inbox.append((database, "vib__from_sea", mid(n), status, *rest))

    def facts(self, *, lost_before: datetime = T0 + timedelta(days=1)) -> DataFrame:
        s = self.spark
        return event_facts(
            s.createDataFrame(self.outbox, OUTBOX_SCHEMA),
            s.createDataFrame(self.routes, ROUTE_SCHEMA),
            s.createDataFrame(self.inbox, INBOX_SCHEMA),
            s.createDataFrame(self.dead, DEAD_LETTER_SCHEMA),
            window_seconds=HOUR,
            lost_before=lost_before,
        )


def by_key(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {(r.get("window_start"), r["durable"], r["subject"]): r for r in rows}


def test_percentile_edges(spark: SparkSession) -> None:
    frames = Frames(spark)
    # Window 0: one delivery. Window 1: two. Window 2: 1..100 ms. Window 3: nothing processed.
    frames.processed(1, T0, 42.0)
    frames.processed(2, T0 + timedelta(hours=1), 0.0)
    frames.processed(3, T0 + timedelta(hours=1, seconds=1), 100.0)
    values = list(range(1, 101))
    for i, v in enumerate(values):
        frames.processed(100 + i, T0 + timedelta(hours=2, seconds=i), float(v))
    frames.event(999, T0 + timedelta(hours=3))
    rows = by_key(collect(window_kpis(frames.facts())))

    one = rows[(T0, "vib__from_sea", SUBJECT)]
    assert (one["latency_p50_ms"], one["latency_p95_ms"], one["latency_p99_ms"]) == (
        42.0,
        42.0,
        42.0,
    )
    two = rows[(T0 + timedelta(hours=1), "vib__from_sea", SUBJECT)]
    assert (two["latency_p50_ms"], two["latency_p99_ms"], two["latency_max_ms"]) == (
        50.0,
        99.0,
        100.0,
    )
    many = rows[(T0 + timedelta(hours=2), "vib__from_sea", SUBJECT)]
    for q, column in ((50, "latency_p50_ms"), (95, "latency_p95_ms"), (99, "latency_p99_ms")):
        assert many[column] == pytest.approx(float(np.percentile(values, q)), abs=1e-9)
    assert many["latency_p99_ms"] == pytest.approx(99.01)
    none = rows[(T0 + timedelta(hours=3), "vib__from_sea", SUBJECT)]
    assert (
        none["processed"] == 0 and none["latency_p50_ms"] is None and none["latency_max_ms"] is None
    )
    assert none["lost_candidates"] == 1


def test_window_boundaries_belong_to_the_later_window(spark: SparkSession) -> None:
    frames = Frames(spark)
    frames.processed(1, T0 + timedelta(hours=1) - timedelta(microseconds=1), 5.0)
    frames.processed(2, T0 + timedelta(hours=1), 7.0)
    rows = by_key(collect(window_kpis(frames.facts())))
    assert rows[(T0, "vib__from_sea", SUBJECT)]["latency_max_ms"] == 5.0
    assert rows[(T0 + timedelta(hours=1), "vib__from_sea", SUBJECT)]["latency_max_ms"] == 7.0


def test_lost_needs_publication_before_the_grace_and_no_outcome(spark: SparkSession) -> None:
    frames = Frames(spark)
    cutoff = T0 + timedelta(minutes=10)
    frames.event(1, cutoff - timedelta(milliseconds=1))  # published exactly at the cut-off: lost
    frames.event(2, cutoff)  # published 1 ms after it: still in flight
    frames.event(3, T0, published=False)  # never published: a delivery-rate problem, not lost
    frames.event(4, T0)  # dead-lettered (dlq-router row only): not lost
    frames.dead.append(("vib_db", "vib__from_sea", mid(4), "MAX_DELIVERIES_EXCEEDED", "parked"))
    frames.event(5, T0)  # retrying in the inbox: lost (neither processed nor dead-lettered)
    history = json.dumps([{"reason": "HTTP_503"}, {"reason": "HTTP_503"}])
    frames.row(5, "retrying", T0 + timedelta(seconds=1), None, 2, 503, 0, "HTTP_503", history)
    facts = frames.facts(lost_before=cutoff)
    lost = sorted(r["message_id"] for r in collect(facts.where("is_lost").select("message_id")))
    assert lost == [mid(1), mid(5)]
    total = by_key(collect(total_kpis(facts)))[(None, "vib__from_sea", ALL_SUBJECTS)]
    assert (total["produced"], total["published"], total["dead_lettered"], total["retries"]) == (
        5,
        4,
        1,
        2,
    )


def test_an_inbox_row_in_another_database_does_not_count(spark: SparkSession) -> None:
    frames = Frames(spark)
    frames.event(1, T0)
    done = T0 + timedelta(seconds=1)
    frames.row(1, "processed", T0, done, 1, 200, 0, None, "[]", database="sea_db")
    total = by_key(collect(total_kpis(frames.facts())))[(None, "vib__from_sea", SUBJECT)]
    assert (total["received"], total["processed"], total["lost_candidates"]) == (0, 0, 1)


def test_duplicates_409s_retries_and_reasons(spark: SparkSession) -> None:
    frames = Frames(spark)
    frames.processed(1, T0, 10.0, status=409)
    retries = [{"reason": "HTTP_503"}, {"reason": "handler_timeout"}]
    frames.processed(2, T0, 10.0, duplicates=3, attempts=3, history=retries)
    frames.event(3, T0)
    history = json.dumps([{"reason": "HTTP_503"}, {"reason": "HANDLER_REJECTED"}])
    frames.row(3, "failed", T0, None, 2, 422, 0, "HANDLER_REJECTED", history)
    facts = frames.facts()
    row = by_key(collect(window_kpis(facts)))[(T0, "vib__from_sea", SUBJECT)]
    assert (row["handler_409"], row["duplicate_deliveries"], row["processed"]) == (1, 3, 2)
    assert (row["retries"], row["attempts"], row["dead_lettered"]) == (3, 6, 1)
    reasons = {
        (r["subject"], r["kind"], r["reason_code"]): r["count"]
        for r in collect(reason_counts(facts))
    }
    counts = (
        ("retry", "HTTP_503", 2),
        ("retry", "handler_timeout", 1),
        ("dead_letter", "HANDLER_REJECTED", 1),
    )
    assert reasons == {
        (s, kind, code): n for s in (SUBJECT, ALL_SUBJECTS) for kind, code, n in counts
    }


def test_unsubscribed_events_and_roll_ups(spark: SparkSession) -> None:
    frames = Frames(spark)
    frames.routes.append(
        ("sea", "model_archived", 1, "sea.event.model_archived.v1", NO_DURABLE, None, None)
    )
    frames.processed(1, T0, 10.0)
    frames.event(2, T0, event_type="model_archived")
    frames.event(3, T0, event_type="model_archived", published=False)
    rows = by_key(collect(window_kpis(frames.facts())))
    orphan = rows[(T0, NO_DURABLE, "sea.event.model_archived.v1")]
    assert (orphan["produced"], orphan["published"], orphan["lost_candidates"]) == (2, 1, 0)
    assert rows[(T0, "vib__from_sea", ALL_SUBJECTS)]["produced"] == 1
    assert rows[(T0, NO_DURABLE, ALL_SUBJECTS)]["produced"] == 2


def test_latency_histogram_bins(spark: SparkSession) -> None:
    frames = Frames(spark)
    for n, latency in enumerate([0.0, 1.0, 1.2, 9.99, 10.0, 450.0]):
        frames.processed(n, T0, latency)
    bins = {r["bin"]: r["count"] for r in collect(latency_histogram(frames.facts()))}
    # 10 bins per decade: 1.0 and 1.2 share [1, 1.26); 9.99 is in [7.94, 10); 0 is clipped low.
    assert bins == {-10: 1, 0: 2, 9: 1, 10: 1, 26: 1}
