"""Spark JDBC reads of outbox, inbox, dead letters and parked messages, split into partitions.

Each read is a sub-query limited to the run's range (so PostgreSQL filters, not Spark)
and, when the range holds enough rows, is split on a numeric column into up to
``FERRY_KPI_READ_PARTITIONS`` parallel queries: the outbox on ``seq`` (unique, indexed),
the inbox on ``stream_seq``. The bounds come from one small query per table
(:mod:`spark.store`); Spark puts rows outside them (and NULLs) into the edge partitions,
so a bound that moved since costs balance, never rows.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from spark.jdbc import JdbcTarget, sql_literal
from spark.plan import Source
from spark.settings import KpiSettings
from spark.store import Span
from spark.transforms import DEAD_LETTER_SCHEMA, INBOX_SCHEMA, OUTBOX_SCHEMA, PARKED_SCHEMA

#: The inbox copies occurred_at from the envelope (microseconds, like the outbox); the
#: second of slack only guards against a producer in another language rounding it.
INBOX_SLACK = timedelta(seconds=1)
#: Rows without occurred_at (a body too broken to parse) and dead letters are found by
#: their own timestamps, written by another database's clock: allow for skew.
CLOCK_SLACK = timedelta(days=1)


def _ts(moment: datetime) -> str:
    return f"TIMESTAMPTZ {sql_literal(moment.isoformat())}"


def _names(values: list[str]) -> str:
    return ", ".join(sql_literal(v) for v in values)


def outbox_query(source: Source, start: datetime, end: datetime) -> str:
    """The outbox rows of ``source`` that occurred in ``[start, end)``."""
    return (
        f"SELECT {sql_literal(source.context)} AS context, id::text AS message_id, event_type,"
        " event_version, occurred_at, published_at, seq FROM outbox_events"
        f" WHERE occurred_at >= {_ts(start)} AND occurred_at < {_ts(end)}"
    )


def inbox_window(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """The occurred_at bounds the inbox is read with."""
    return start - INBOX_SLACK, end + INBOX_SLACK


def inbox_query(database: str, durables: list[str], start: datetime, end: datetime) -> str:
    """Inbox rows of ``durables`` whose event occurred in the range (with slack)."""
    low, high = inbox_window(start, end)
    return (
        f"SELECT {sql_literal(database)} AS database, durable, message_id::text AS message_id,"
        " status, received_at, processed_at, attempts, handler_status, duplicates, reason_code,"
        " retry_history::text AS retry_history, held_by::text AS held_by, stream_seq"
        " FROM inbox_messages"
        f" WHERE durable IN ({_names(durables)}) AND ("
        f"(occurred_at >= {_ts(low)} AND occurred_at < {_ts(high)})"
        f" OR (occurred_at IS NULL AND received_at >= {_ts(start - CLOCK_SLACK)}))"
    )


def dead_letter_query(database: str, durables: list[str], start: datetime) -> str:
    """Dead letters of ``durables`` recorded since the range began (with slack)."""
    return (
        f"SELECT {sql_literal(database)} AS database, durable, message_id::text AS message_id,"
        " reason_code AS dl_reason, status AS dl_status FROM dead_letters"
        f" WHERE durable IN ({_names(durables)})"
        f" AND dead_lettered_at >= {_ts(start - CLOCK_SLACK)}"
    )


def parked_query(database: str, durables: list[str]) -> str:
    """The messages ``durables`` hold parked now (``ordering: key`` durables only park).

    Not limited to the range: a parked row is the present state of its event, and the
    left join keeps only the events of the range."""
    return (
        f"SELECT {sql_literal(database)} AS database, durable, message_id::text AS message_id,"
        " state AS parked_state FROM parked_messages"
        f" WHERE durable IN ({_names(durables)})"
    )


def partitions_for(rows: int, settings: KpiSettings) -> int:
    """How many JDBC partitions a read of ``rows`` rows gets."""
    wanted = math.ceil(rows / settings.kpi_partition_min_rows)
    return max(1, min(settings.kpi_read_partitions, wanted))


def read_jdbc(
    spark: SparkSession,
    target: JdbcTarget,
    query: str,
    *,
    settings: KpiSettings,
    column: str | None = None,
    span: Span | None = None,
) -> DataFrame:
    """``query`` as a DataFrame, split on ``column`` within ``span`` when worth it."""
    reader = (
        spark.read.format("jdbc")
        .options(**target.options())
        .option("dbtable", f"({query}) AS kpi_read")
        .option("fetchsize", str(settings.kpi_fetch_size))
    )
    parts = 1 if span is None else partitions_for(span.rows, settings)
    if (
        column is not None
        and span is not None
        and span.low is not None
        and span.high is not None
        and parts > 1
        and span.high > span.low
    ):
        reader = (
            reader.option("partitionColumn", column)
            .option("lowerBound", str(span.low))
            .option("upperBound", str(span.high + 1))
            .option("numPartitions", str(parts))
        )
    return reader.load()


def shaped(frame: DataFrame, schema: StructType) -> DataFrame:
    """``frame`` with exactly ``schema``'s columns and types (JDBC types vary a little)."""
    return frame.select(*(frame[f.name].cast(f.dataType).alias(f.name) for f in schema.fields))


def empty(spark: SparkSession, schema: StructType) -> DataFrame:
    """An empty frame of ``schema`` (a source with nothing in range)."""
    return spark.createDataFrame([], schema)


def union_all(spark: SparkSession, frames: list[DataFrame], schema: StructType) -> DataFrame:
    """The union of ``frames`` shaped to ``schema`` (empty when there are none)."""
    if not frames:
        return empty(spark, schema)
    shaped_frames = [shaped(f, schema) for f in frames]
    result = shaped_frames[0]
    for frame in shaped_frames[1:]:
        result = result.unionByName(frame)
    return result


__all__ = [
    "DEAD_LETTER_SCHEMA",
    "INBOX_SCHEMA",
    "OUTBOX_SCHEMA",
    "PARKED_SCHEMA",
    "dead_letter_query",
    "empty",
    "inbox_query",
    "outbox_query",
    "parked_query",
    "partitions_for",
    "read_jdbc",
    "union_all",
]
