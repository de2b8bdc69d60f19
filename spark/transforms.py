"""The DataFrame transforms: records of every database in, per-window KPI counts out.

Pure functions of DataFrames (no I/O), so tests feed them small frames. The shapes:

outbox        context, message_id, event_type, event_version, occurred_at, published_at
routes        context, event_type, event_version, subject, durable, target_context,
              target_database                       (:meth:`spark.plan.Plan.routes`)
inbox         database, durable, message_id, status, received_at, processed_at, attempts,
              handler_status, duplicates, reason_code, retry_history (JSON text),
              held_by (the held head it waited behind, migration 0015)
dead_letters  database, durable, message_id, dl_reason, dl_status
parked        database, durable, message_id, parked_state (``parked_messages.state``)

:func:`event_facts` joins them into one row per *expected delivery* (an outbox event and
a durable that should receive it; events nobody subscribes to get durable ``-``). The
cross-database join happens here: the outbox comes from the source context's database,
inbox, dead letters and parked messages from the database of the durable's target context.

Each expected delivery gets its ``place`` by the rules of
:func:`shared.domain.whereabouts.place_of` (the one definition; a test holds the two equal
on every combination of the facts), with no look at the stream (``in_stream=None``),
``past_grace = published_at <= lost_before`` and ``retried`` = its inbox row's
retry_history has an entry or its attempts exceed 1.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from shared.domain.whereabouts import Place
from spark.plan import ALL_SUBJECTS, NO_DURABLE

OUTBOX_SCHEMA = StructType(
    [
        StructField("context", StringType(), False),
        StructField("message_id", StringType(), False),
        StructField("event_type", StringType(), False),
        StructField("event_version", IntegerType(), False),
        StructField("occurred_at", TimestampType(), False),
        StructField("published_at", TimestampType(), True),
    ]
)
ROUTE_SCHEMA = StructType(
    [
        StructField("context", StringType(), False),
        StructField("event_type", StringType(), False),
        StructField("event_version", IntegerType(), False),
        StructField("subject", StringType(), False),
        StructField("durable", StringType(), False),
        StructField("target_context", StringType(), True),
        StructField("target_database", StringType(), True),
    ]
)
INBOX_SCHEMA = StructType(
    [
        StructField("database", StringType(), False),
        StructField("durable", StringType(), False),
        StructField("message_id", StringType(), False),
        StructField("status", StringType(), False),
        StructField("received_at", TimestampType(), True),
        StructField("processed_at", TimestampType(), True),
        StructField("attempts", IntegerType(), True),
        StructField("handler_status", IntegerType(), True),
        StructField("duplicates", IntegerType(), True),
        StructField("reason_code", StringType(), True),
        StructField("retry_history", StringType(), True),
        StructField("held_by", StringType(), True),
    ]
)
DEAD_LETTER_SCHEMA = StructType(
    [
        StructField("database", StringType(), False),
        StructField("durable", StringType(), False),
        StructField("message_id", StringType(), False),
        StructField("dl_reason", StringType(), True),
        StructField("dl_status", StringType(), True),
    ]
)
PARKED_SCHEMA = StructType(
    [
        StructField("database", StringType(), False),
        StructField("durable", StringType(), False),
        StructField("message_id", StringType(), False),
        StructField("parked_state", StringType(), False),
    ]
)
#: One entry of inbox_messages.retry_history, as the consumer appends it.
HISTORY_SCHEMA = ArrayType(
    StructType(
        [
            StructField("attempt", IntegerType()),
            StructField("at", StringType()),
            StructField("status", IntegerType()),
            StructField("reason", StringType()),
            StructField("detail", StringType()),
        ]
    )
)
#: The latency histogram's bins: 10 per decade, from 0.1 ms to 10^7 ms (about 3 hours).
HIST_BINS_PER_DECADE = 10
HIST_MIN_BIN, HIST_MAX_BIN = -10, 70
#: Counted columns of a KPI row, in table order.
COUNT_COLUMNS = (
    "produced",
    "published",
    "received",
    "processed",
    "dead_lettered",
    "handler_409",
    "duplicate_deliveries",
    "retries",
    "attempts",
    "lost_candidates",
    "parked",
    "retrying",
    "in_flight",
    "waited",
)
#: Measured columns (null without data). ``latency_*``: the pipeline's own (processed
#: events that did not wait for an operator); ``waited_latency_*``: those that did.
MEASURE_COLUMNS = (
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "latency_max_ms",
    "lag_p50_ms",
    "lag_max_ms",
    "waited_latency_p99_ms",
    "waited_latency_max_ms",
)
PERCENTILES = (0.5, 0.95, 0.99)
KEY_COLUMNS = ("context", "durable", "subject", "target_context")


def _ms_between(later: str, earlier: str) -> Column:
    """Milliseconds from ``earlier`` to ``later`` (exact: integer microseconds first)."""
    return (F.unix_micros(F.col(later)) - F.unix_micros(F.col(earlier))) / F.lit(1000.0)


def event_facts(
    outbox: DataFrame,
    routes: DataFrame,
    inbox: DataFrame,
    dead_letters: DataFrame,
    parked: DataFrame,
    *,
    window_seconds: int,
    lost_before: datetime,
    broadcast_dead_letters: bool = True,
    broadcast_parked: bool = True,
) -> DataFrame:
    """One row per expected delivery with what became of it, and its ``place``.

    ``lost_before``: an event published at or before it is past the grace period
    (``as_of - grace``): with no inbox row, dead letter or parked row it is lost.
    ``broadcast_dead_letters``, ``broadcast_parked``: they are few (the caller counted
    them), so ship them to every task instead of shuffling the facts for a join (Spark
    cannot size a JDBC read).
    """
    size = window_seconds * 1_000_000
    on = ["target_database", "durable", "message_id"]
    dead = dead_letters.withColumnRenamed("database", "target_database").withColumn(
        "has_dead_letter", F.lit(True)
    )
    held = parked.withColumnRenamed("database", "target_database")
    keyed = outbox.join(
        F.broadcast(routes), ["context", "event_type", "event_version"], "inner"
    ).withColumn(
        "window_start", F.expr(f"timestamp_micros((unix_micros(occurred_at) div {size}) * {size})")
    )
    joined = (
        keyed.join(inbox.withColumnRenamed("database", "target_database"), on, "left")
        .join(F.broadcast(dead) if broadcast_dead_letters else dead, on, "left")
        .join(F.broadcast(held) if broadcast_parked else held, on, "left")
    )
    return _derive(joined, lost_before)


def _is(column: str, value: str) -> Column:
    """``column = value``, false (never null) where the column is null."""
    return F.coalesce(F.col(column) == F.lit(value), F.lit(False))


def place_column(*, retried: Column, past_grace: Column) -> Column:
    """:func:`shared.domain.whereabouts.place_of` as a column, ``in_stream=None``.

    Null for events nobody subscribes to (no delivery is expected). The rules, first
    match wins, in place_of's order; the stream rules fall away since nobody looked.
    """
    status = F.col("status")
    received = status.isNotNull()
    dead = F.coalesce(F.col("has_dead_letter"), F.lit(False)) | _is("status", "failed")
    return (
        F.when(F.col("durable") == F.lit(NO_DURABLE), F.lit(None).cast(StringType()))
        .when(_is("status", "processed"), F.lit(Place.PROCESSED.value))
        .when(dead, F.lit(Place.DEAD_LETTERED.value))
        .when(F.col("parked_state").isNotNull(), F.lit(Place.PARKED.value))
        .when(received & (retried | _is("status", "retrying")), F.lit(Place.RETRYING.value))
        .when(received, F.lit(Place.IN_FLIGHT.value))
        .when(F.col("published_at").isNull(), F.lit(Place.NOT_PUBLISHED.value))
        .when(~past_grace, F.lit(Place.IN_FLIGHT.value))
        .otherwise(F.lit(Place.LOST.value))
    )


def _derive(joined: DataFrame, lost_before: datetime) -> DataFrame:
    published = F.col("published_at").isNotNull()
    processed = _is("status", "processed")
    has_dead_letter = F.coalesce(F.col("has_dead_letter"), F.lit(False))
    dead = has_dead_letter | _is("status", "failed")
    # Counting entries does not need a parse (from_json on every row would double the cost
    # of the facts); only reason_counts parses, and only the rows that had retries.
    n_entries = F.coalesce(F.json_array_length(F.col("retry_history")), F.lit(0))
    # The last entry of a dead-lettered row records the dead-lettering, not a retry.
    final_entry = F.when((F.col("status") == F.lit("failed")) & (n_entries > 0), 1).otherwise(0)
    retried = (n_entries > 0) | F.coalesce(F.col("attempts") > F.lit(1), F.lit(False))
    past_grace = F.coalesce(F.col("published_at") <= F.lit(lost_before), F.lit(False))
    # Processed after an operator's move: dead-lettered then replayed, or released from
    # behind a held head. Its latency is the operator's, not the pipeline's.
    waited = processed & (has_dead_letter | F.col("held_by").isNotNull())
    place = F.col("place")
    return joined.withColumn("place", place_column(retried=retried, past_grace=past_grace)).select(
        "window_start",
        *KEY_COLUMNS,
        "message_id",
        "occurred_at",
        "published_at",
        "received_at",
        "processed_at",
        "status",
        "place",
        published.alias("is_published"),
        F.col("status").isNotNull().alias("is_received"),
        processed.alias("is_processed"),
        dead.alias("is_dead"),
        (processed & (F.col("handler_status") == F.lit(409))).alias("is_409"),
        F.coalesce(F.col("duplicates"), F.lit(0)).cast(LongType()).alias("duplicates"),
        F.coalesce(F.col("attempts"), F.lit(0)).cast(LongType()).alias("attempts"),
        "retry_history",
        (n_entries - final_entry).cast(LongType()).alias("retries"),
        F.coalesce(
            F.col("dl_reason"), F.when(F.col("status") == F.lit("failed"), F.col("reason_code"))
        ).alias("dead_letter_reason"),
        waited.alias("is_waited"),
        F.when(processed & ~waited, _ms_between("processed_at", "occurred_at")).alias("latency_ms"),
        F.when(waited, _ms_between("processed_at", "occurred_at")).alias("waited_latency_ms"),
        F.when(
            published & F.col("received_at").isNotNull(), _ms_between("received_at", "published_at")
        ).alias("lag_ms"),
        _place_is(place, Place.LOST).alias("is_lost"),
        _place_is(place, Place.PARKED).alias("is_parked"),
        _place_is(place, Place.RETRYING).alias("is_retrying"),
        _place_is(place, Place.IN_FLIGHT).alias("is_in_flight"),
    )


def _place_is(place: Column, wanted: Place) -> Column:
    return F.coalesce(place == F.lit(wanted.value), F.lit(False))


def with_rollup(facts: DataFrame) -> DataFrame:
    """Each fact twice: under its subject and under the durable's roll-up subject ``*``."""
    return facts.withColumn("subject", F.explode(F.array(F.col("subject"), F.lit(ALL_SUBJECTS))))


def _count(flag: str) -> Column:
    return F.sum(F.when(F.col(flag), 1).otherwise(0)).cast(LongType()).alias(_COUNT_OF[flag])


_COUNT_OF = {
    "is_published": "published",
    "is_received": "received",
    "is_processed": "processed",
    "is_dead": "dead_lettered",
    "is_409": "handler_409",
    "is_lost": "lost_candidates",
    "is_parked": "parked",
    "is_retrying": "retrying",
    "is_in_flight": "in_flight",
    "is_waited": "waited",
}


def _percentiles(column: str, *, exact: bool) -> Column:
    if exact:
        return F.percentile(F.col(column), list(PERCENTILES))
    return F.percentile_approx(F.col(column), list(PERCENTILES), 10_000)


def _percentile(column: str, q: float, *, exact: bool) -> Column:
    if exact:
        return F.percentile(F.col(column), q)
    return F.percentile_approx(F.col(column), q, 10_000).cast("double")


def _aggregations(*, exact: bool) -> list[Column]:
    return [
        F.count(F.lit(1)).cast(LongType()).alias("produced"),
        _count("is_published"),
        _count("is_received"),
        _count("is_processed"),
        _count("is_dead"),
        _count("is_409"),
        F.sum("duplicates").cast(LongType()).alias("duplicate_deliveries"),
        F.sum("retries").cast(LongType()).alias("retries"),
        F.sum("attempts").cast(LongType()).alias("attempts"),
        _count("is_lost"),
        _count("is_parked"),
        _count("is_retrying"),
        _count("is_in_flight"),
        _count("is_waited"),
        _percentiles("latency_ms", exact=exact).alias("latency_q"),
        F.max("latency_ms").alias("latency_max_ms"),
        _percentile("lag_ms", 0.5, exact=exact).alias("lag_p50_ms"),
        F.max("lag_ms").alias("lag_max_ms"),
        _percentile("waited_latency_ms", 0.99, exact=exact).alias("waited_latency_p99_ms"),
        F.max("waited_latency_ms").alias("waited_latency_max_ms"),
    ]


def _flatten(aggregated: DataFrame, keys: list[str]) -> DataFrame:
    return aggregated.select(
        *keys,
        *COUNT_COLUMNS,
        *(
            F.col("latency_q").getItem(i).cast("double").alias(name)
            for i, name in enumerate(("latency_p50_ms", "latency_p95_ms", "latency_p99_ms"))
        ),
        "latency_max_ms",
        F.col("lag_p50_ms").cast("double").alias("lag_p50_ms"),
        "lag_max_ms",
        F.col("waited_latency_p99_ms").cast("double").alias("waited_latency_p99_ms"),
        "waited_latency_max_ms",
    )


def all_kpis(facts: DataFrame, *, exact: bool = True) -> DataFrame:
    """Per-window rows and run totals (``window_start`` null) in one pass over the facts.

    Each fact is counted four times: under its subject and the roll-up ``*``, in its window
    and in the total. One aggregation instead of two: the facts are scanned once.
    """
    keys = ["window_start", *KEY_COLUMNS]
    spread = with_rollup(facts).withColumn(
        "window_start",
        F.explode(F.array(F.col("window_start"), F.lit(None).cast(TimestampType()))),
    )
    return _flatten(spread.groupBy(*keys).agg(*_aggregations(exact=exact)), keys)


def window_kpis(facts: DataFrame, *, exact: bool = True) -> DataFrame:
    """Counts and percentiles per (window, context, durable, subject), roll-ups included."""
    return all_kpis(facts, exact=exact).where(F.col("window_start").isNotNull())


def total_kpis(facts: DataFrame, *, exact: bool = True) -> DataFrame:
    """The same over the whole range: per (context, durable, subject), roll-ups included."""
    return all_kpis(facts, exact=exact).where(F.col("window_start").isNull()).drop("window_start")


def reason_counts(facts: DataFrame) -> DataFrame:
    """Retries (every non-final retry_history entry) and dead letters by reason code."""
    keys = ["window_start", *KEY_COLUMNS]
    retries = (
        facts.where(F.col("retries") > 0)
        .select(
            *keys,
            "retries",
            F.posexplode(F.from_json(F.col("retry_history"), HISTORY_SCHEMA)).alias("pos", "entry"),
        )
        .where(F.col("pos") < F.col("retries"))
        .select(
            *keys,
            F.lit("retry").alias("kind"),
            F.coalesce(F.col("entry.reason"), F.lit("UNKNOWN")).alias("reason_code"),
        )
    )
    dead = facts.where(F.col("is_dead")).select(
        *keys,
        F.lit("dead_letter").alias("kind"),
        F.coalesce(F.col("dead_letter_reason"), F.lit("UNKNOWN")).alias("reason_code"),
    )
    return (
        with_rollup(retries.unionByName(dead))
        .groupBy(*keys, "kind", "reason_code")
        .agg(F.count(F.lit(1)).cast(LongType()).alias("count"))
    )


def latency_histogram(facts: DataFrame) -> DataFrame:
    """The pipeline's own processed deliveries (not those that waited for an operator)
    per (context, durable, bin).

    Bin b covers [10^(b/10), 10^((b+1)/10)) ms; everything outside the range is clipped in.
    """
    raw = F.floor(F.log10(F.greatest(F.col("latency_ms"), F.lit(1e-9))) * HIST_BINS_PER_DECADE)
    binned = F.least(F.greatest(raw, F.lit(HIST_MIN_BIN)), F.lit(HIST_MAX_BIN)).cast("int")
    return (
        facts.where(F.col("is_processed") & ~F.col("is_waited"))
        .groupBy("context", "durable", binned.alias("bin"))
        .agg(F.count(F.lit(1)).cast(LongType()).alias("count"))
    )


def lost_list(facts: DataFrame, limit: int) -> DataFrame:
    """The first ``limit`` lost deliveries (place ``lost`` only: nothing parked, retrying or
    in flight), oldest publication first."""
    return (
        facts.where(F.col("is_lost"))
        .select(
            "context",
            "durable",
            "subject",
            "message_id",
            "occurred_at",
            "published_at",
            F.coalesce(F.col("status"), F.lit("not received")).alias("inbox_status"),
        )
        .orderBy("published_at", "message_id", "durable")
        .limit(limit)
    )
