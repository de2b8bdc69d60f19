"""The DataFrame transforms on small hand-built frames, with exact expected numbers."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from itertools import product
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession

from shared.domain.whereabouts import DEAD_LETTER_MEANING, Place, Trail, place_of
from spark.plan import ALL_SUBJECTS, NO_DURABLE
from spark.runner import collect
from spark.transforms import (
    DEAD_LETTER_SCHEMA,
    INBOX_SCHEMA,
    OUTBOX_SCHEMA,
    PARKED_SCHEMA,
    ROUTE_SCHEMA,
    event_facts,
    latency_histogram,
    lost_list,
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
    """Builds the five inputs of :func:`event_facts` row by row."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.outbox: list[tuple[Any, ...]] = []
        self.inbox: list[tuple[Any, ...]] = []
        self.dead: list[tuple[Any, ...]] = []
        self.parked: list[tuple[Any, ...]] = []
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
        held_by = kw.get("held_by")
        self.row(n, "processed", received, done, attempts, status, dups, None, history,
                 held_by=held_by)  # fmt: skip

    def row(
        self, n: int, status: str, *rest: Any, database: str = "vib_db", held_by: str | None = None
    ) -> None:
        """An inbox row: received_at, processed_at, attempts, handler_status, duplicates,
        reason_code, retry_history (and held_by)."""
        self.inbox.append((database, "vib__from_sea", mid(n), status, *rest, held_by))

    def dead_letter(self, n: int, status: str, reason: str | None = "HANDLER_REJECTED") -> None:
        self.dead.append(("vib_db", "vib__from_sea", mid(n), reason, status))

    def park(self, n: int, state: str) -> None:
        self.parked.append(("vib_db", "vib__from_sea", mid(n), state))

    def facts(self, *, lost_before: datetime = T0 + timedelta(days=1)) -> DataFrame:
        s = self.spark
        return event_facts(
            s.createDataFrame(self.outbox, OUTBOX_SCHEMA),
            s.createDataFrame(self.routes, ROUTE_SCHEMA),
            s.createDataFrame(self.inbox, INBOX_SCHEMA),
            s.createDataFrame(self.dead, DEAD_LETTER_SCHEMA),
            s.createDataFrame(self.parked, PARKED_SCHEMA),
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


def test_lost_needs_publication_before_the_grace_and_no_record(spark: SparkSession) -> None:
    frames = Frames(spark)
    cutoff = T0 + timedelta(minutes=10)
    frames.event(1, cutoff - timedelta(milliseconds=1))  # published exactly at the cut-off: lost
    frames.event(2, cutoff)  # published 1 ms after it: still in flight
    frames.event(3, T0, published=False)  # never published: a delivery-rate problem, not lost
    frames.event(4, T0)  # dead-lettered (dlq-router row only): not lost
    frames.dead_letter(4, "parked", "MAX_DELIVERIES_EXCEEDED")
    # Retrying in the inbox: its inbox row records it (retrying, not lost: issue 42).
    frames.event(5, T0)
    history = json.dumps([{"reason": "HTTP_503"}, {"reason": "HTTP_503"}])
    frames.row(5, "retrying", T0 + timedelta(seconds=1), None, 2, 503, 0, "HTTP_503", history)
    frames.event(6, T0)  # received, being handled, nothing failed yet: in flight
    frames.row(6, "processing", T0 + timedelta(seconds=1), None, 1, None, 0, None, "[]")
    facts = frames.facts(lost_before=cutoff)
    places = {r["message_id"]: r["place"] for r in collect(facts.select("message_id", "place"))}
    assert places == {
        mid(1): "lost",
        mid(2): "in flight",
        mid(3): "not published",
        mid(4): "dead-lettered",
        mid(5): "retrying",
        mid(6): "in flight",
    }
    lost = sorted(r["message_id"] for r in collect(facts.where("is_lost").select("message_id")))
    assert lost == [mid(1)]
    total = by_key(collect(total_kpis(facts)))[(None, "vib__from_sea", ALL_SUBJECTS)]
    assert (total["produced"], total["published"], total["dead_lettered"], total["retries"]) == (
        6,
        5,
        1,
        2,
    )
    counts = ("lost_candidates", "parked", "retrying", "in_flight")
    assert tuple(total[c] for c in counts) == (1, 0, 1, 2)


def test_parked_behind_a_held_head_are_parked_not_lost(spark: SparkSession) -> None:
    # cg_h_publish's case (issue 42): an ordering: key durable with on_dead_letter: hold.
    frames = Frames(spark)
    received = T0 + timedelta(milliseconds=5)
    history = json.dumps([{"reason": "HANDLER_REJECTED"}])
    # The held head: dead-lettered, its dead letter held for an operator, its parked row held.
    frames.event(1, T0)
    frames.row(1, "failed", received, None, 1, 422, 0, "HANDLER_REJECTED", history)
    frames.dead_letter(1, "held")
    frames.park(1, "held")
    # The events of its key behind it: received, never handed to the handler, parked.
    for n in (2, 3, 4):
        frames.event(n, T0 + timedelta(seconds=n))
        frames.row(n, "received", received, None, 0, None, 0, None, "[]")
        frames.park(n, "queued")
    # Another key's head, retrying from the parked queue.
    frames.event(5, T0)
    frames.row(5, "retrying", received, None, 2, 503, 0, "HTTP_503", json.dumps([{}]))
    frames.park(5, "retrying")
    facts = frames.facts()
    places = {r["message_id"]: r["place"] for r in collect(facts.select("message_id", "place"))}
    assert places == {mid(1): "dead-lettered", **{mid(n): "parked" for n in (2, 3, 4, 5)}}
    total = by_key(collect(total_kpis(facts)))[(None, "vib__from_sea", ALL_SUBJECTS)]
    counts = ("lost_candidates", "parked", "dead_lettered", "retrying", "in_flight", "received")
    assert tuple(total[c] for c in counts) == (0, 4, 1, 0, 0, 5)
    assert collect(lost_list(facts, 10)) == []


def test_a_truly_missing_event_is_lost_and_listed(spark: SparkSession) -> None:
    # Published long before the grace period; no inbox row, dead letter or parked row (as if
    # deleted from the stream before delivery). Beside it, one of each record.
    frames = Frames(spark)
    frames.event(1, T0)
    frames.processed(2, T0, 10.0)
    frames.event(3, T0)
    frames.row(3, "received", T0, None, 0, None, 0, None, "[]")
    frames.park(3, "queued")
    listed = collect(lost_list(frames.facts(lost_before=T0 + timedelta(hours=2)), 10))
    assert [(r["message_id"], r["durable"], r["inbox_status"]) for r in listed] == [
        (mid(1), "vib__from_sea", "not received")
    ]


def test_latency_of_events_that_waited_for_an_operator_is_apart(spark: SparkSession) -> None:
    frames = Frames(spark)
    for n, latency in enumerate([10.0, 20.0, 30.0]):
        frames.processed(n, T0, latency)
    # Released from behind a held head (inbox held_by, migration 0015), a minute later.
    frames.processed(10, T0, 60_000.0, held_by=mid(99))
    # Dead-lettered, then replayed by an operator and processed two minutes later.
    frames.processed(11, T0, 120_000.0, history=[{"reason": "HANDLER_REJECTED"}], attempts=2)
    frames.dead_letter(11, "replayed")
    facts = frames.facts()
    total = by_key(collect(total_kpis(facts)))[(None, "vib__from_sea", ALL_SUBJECTS)]
    assert (total["processed"], total["waited"], total["dead_lettered"]) == (5, 2, 1)
    assert total["latency_max_ms"] == 30.0
    assert total["latency_p99_ms"] == pytest.approx(float(np.percentile([10, 20, 30], 99)))
    assert total["waited_latency_max_ms"] == 120_000.0
    assert total["waited_latency_p99_ms"] == pytest.approx(
        float(np.percentile([60_000, 120_000], 99))
    )
    bins = {r["bin"]: r["count"] for r in collect(latency_histogram(facts))}
    assert sum(bins.values()) == 3  # the own deliveries only
    # A window without any waiting: no waited latency at all.
    quiet = Frames(spark)
    quiet.processed(1, T0, 5.0)
    row = by_key(collect(total_kpis(quiet.facts())))[(None, "vib__from_sea", ALL_SUBJECTS)]
    assert (row["waited"], row["waited_latency_p99_ms"], row["waited_latency_max_ms"]) == (
        0,
        None,
        None,
    )


#: Every combination of the facts place_of reads (retried only where there is an inbox row
#: to say so); in_stream stays None: the KPI job does not look at the stream.
TRAILS = [
    Trail(published=p, inbox_status=s, retried=r, dead_letter_status=d, parked_state=k,
          past_grace=g)
    for p, s, r, d, k, g in product(
        (True, False),
        (None, "received", "processing", "retrying", "processed", "failed"),
        (False, True),
        (None, *DEAD_LETTER_MEANING),
        (None, "queued", "retrying", "held"),
        (True, False),
    )
    if s is not None or not r
]  # fmt: skip


#: How the facts are realized in the rows, drawn by hypothesis (row n takes entry n modulo
#: the list's length): retried as (history entries, attempts), not retried as attempts,
#: the distance in microseconds from the grace cut-off, whether held_by and a dead-letter
#: reason are set. None of them may change a place.
RECIPES = st.fixed_dictionaries(
    {
        "retried": st.lists(
            st.tuples(st.integers(1, 2), st.integers(0, 6))
            | st.tuples(st.just(0), st.integers(2, 6)),
            min_size=1,
            max_size=4,
        ),
        "not_retried": st.lists(st.integers(0, 1), min_size=1, max_size=2),
        "micros": st.lists(st.integers(0, 10**10), min_size=1, max_size=4),
        "held_by": st.lists(st.booleans(), min_size=1, max_size=3),
        "reason": st.lists(st.booleans(), min_size=1, max_size=2),
    }
)


def _realize(
    frames: Frames, n: int, trail: Trail, recipe: dict[str, list[Any]], cutoff: datetime
) -> None:
    """Rows whose facts are ``trail``, their details from ``recipe``."""

    def pick(name: str) -> Any:
        return recipe[name][n % len(recipe[name])]

    # Past the grace: at or before the cut-off; else at least a microsecond after it.
    micros = timedelta(microseconds=pick("micros"))
    later = cutoff + micros + timedelta(microseconds=1)
    published_at = None
    if trail.published:
        published_at = cutoff - micros if trail.past_grace else later
    frames.outbox.append(("sea", mid(n), "model_published", 1, T0, published_at))
    if trail.inbox_status is not None:
        entries, attempts = pick("retried") if trail.retried else (0, pick("not_retried"))
        history = json.dumps([{"reason": "HTTP_503"}] * entries)
        done = T0 + timedelta(seconds=1) if trail.inbox_status == "processed" else None
        held_by = mid(10**6) if pick("held_by") else None
        frames.row(n, trail.inbox_status, T0, done, attempts, None, 0, None, history,
                   held_by=held_by)  # fmt: skip
    if trail.dead_letter_status is not None:
        reason = "HANDLER_REJECTED" if pick("reason") else None
        frames.dead_letter(n, trail.dead_letter_status, reason)
    if trail.parked_state is not None:
        frames.park(n, trail.parked_state)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=RECIPES)
def test_the_place_column_is_place_of(spark: SparkSession, recipe: dict[str, list[Any]]) -> None:
    # One Spark job per example, over every combination of the facts at once.
    cutoff = T0 + timedelta(hours=1)
    frames = Frames(spark)
    for n, trail in enumerate(TRAILS):
        _realize(frames, n, trail, recipe, cutoff)
    facts = frames.facts(lost_before=cutoff)
    got = {r["message_id"]: r["place"] for r in collect(facts.select("message_id", "place"))}
    want = {mid(n): place_of(trail).value for n, trail in enumerate(TRAILS)}
    assert got == want
    assert set(want.values()) == {p.value for p in Place}  # every place was reached


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
    facts = frames.facts()
    rows = by_key(collect(window_kpis(facts)))
    orphan = rows[(T0, NO_DURABLE, "sea.event.model_archived.v1")]
    assert (orphan["produced"], orphan["published"], orphan["lost_candidates"]) == (2, 1, 0)
    assert rows[(T0, "vib__from_sea", ALL_SUBJECTS)]["produced"] == 1
    assert rows[(T0, NO_DURABLE, ALL_SUBJECTS)]["produced"] == 2
    # Nobody should receive them: no delivery is expected, so they have no place.
    orphans = facts.where(f"durable = '{NO_DURABLE}'").select("place")
    assert [r["place"] for r in collect(orphans)] == [None, None]


def test_latency_histogram_bins(spark: SparkSession) -> None:
    frames = Frames(spark)
    for n, latency in enumerate([0.0, 1.0, 1.2, 9.99, 10.0, 450.0]):
        frames.processed(n, T0, latency)
    bins = {r["bin"]: r["count"] for r in collect(latency_histogram(frames.facts()))}
    # 10 bins per decade: 1.0 and 1.2 share [1, 1.26); 9.99 is in [7.94, 10); 0 is clipped low.
    assert bins == {-10: 1, 0: 2, 9: 1, 10: 1, 26: 1}
