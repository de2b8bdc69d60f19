"""What the console's pages show, read with the console's own login.

The figures are the ones the roles export as metrics and the CLI prints (QRY-050's
outbox backlog, QRY-051's inbox backlog, JetStream's consumer info for lag), read here
directly so the console needs no Prometheus. Every query is bounded by an index
(migrations 0001-0009): unpublished outbox rows (``idx_outbox_unpublished``), unprocessed
inbox rows (``idx_inbox_unprocessed``), recent processing (BRIN ``processed_at``), open
dead letters (``idx_dead_letters_status``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

from shared.adapters import inbox, outbox, parking, throttles
from shared.adapters.dead_letters import subject_regex
from shared.contracts.topology import Topology
from shared.domain.dead_letter import DISCARDABLE_STATUSES, PARKABLE_STATUSES, REPLAYABLE_STATUSES

log = logging.getLogger("ferry.console")

#: Dead-letter statuses that still need somebody (the failures page's default).
OPEN_STATUSES = ("dead", "held", "replaying", "parked")
#: Seconds of processing the rate and the success ratio are computed over.
RATE_WINDOW = 300
#: Thresholds of the alert rules (k8s/base/alerts/ferry-alerts.rules.yaml), drawn on the
#: sparklines; tests/console/test_units.py checks they match the rules.
THRESHOLDS = {
    "outbox_oldest_age": 300.0,  # FerryOutboxLagHigh
    "lag_seconds": 300.0,  # FerryConsumerLagHigh
    "success_ratio": 0.95,  # FerrySuccessRatioLow
    "parked_oldest_age": 900.0,  # FerryParkedKeyStuck
}

_RECENT = """
SELECT count(*) FILTER (WHERE status = 'processed') AS processed
FROM inbox_messages
WHERE durable = $1 AND processed_at > now() - $2 * interval '1 second'
"""

_RETRYING = """
SELECT count(*) FROM inbox_messages
WHERE durable = $1 AND processed_at IS NULL AND status = 'retrying'
"""

_DEAD_RECENT = """
SELECT count(*) FROM dead_letters
WHERE durable = $1 AND dead_lettered_at > now() - $2 * interval '1 second'
"""

_DEAD_BY_REASON = """
SELECT durable, reason_code, count(*) AS count FROM dead_letters
WHERE durable = ANY($1::text[]) AND status = ANY($2::text[])
GROUP BY durable, reason_code ORDER BY durable, count(*) DESC
"""

# The fingerprint of an error: its first 500 characters with ids and numbers blanked, so
# "order 17 failed" and "order 18 failed" (or two timestamps) are one group.
_FINGERPRINT = (
    "left(md5(regexp_replace(left(last_error, 500), "
    "'[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}|[0-9]+', '#', 'g')), 12)"
)

_GROUPS = f"""
SELECT durable, reason_code, {_FINGERPRINT} AS fingerprint, count(*) AS count,
       min(first_dead_lettered_at) AS first_seen, max(dead_lettered_at) AS last_seen,
       (array_agg(last_error ORDER BY dead_lettered_at DESC))[1] AS last_error,
       jsonb_object_agg_strict(status, 1) AS statuses
FROM dead_letters
WHERE durable = ANY($1::text[]) AND status = ANY($2::text[])
  AND ($3::text IS NULL OR reason_code = $3)
GROUP BY durable, reason_code, fingerprint
ORDER BY max(dead_lettered_at) DESC
"""

_GROUP_STATUS_COUNTS = f"""
SELECT status, count(*) AS count FROM dead_letters
WHERE durable = $1 AND reason_code = $2 AND {_FINGERPRINT} = $3 AND status = ANY($4::text[])
GROUP BY status
"""

_GROUP_ENTRIES = f"""
SELECT durable, message_id, status, reason_code, last_error, original_subject, attempts,
       replay_attempts, first_dead_lettered_at, dead_lettered_at, stream_seq
FROM dead_letters
WHERE durable = $1 AND reason_code = $2 AND {_FINGERPRINT} = $3 AND status = ANY($4::text[])
ORDER BY dead_lettered_at, message_id
LIMIT $5
"""

_STATUSES_OF = """
SELECT message_id, status, replay_attempts, replayed_at FROM dead_letters
WHERE durable = $1 AND message_id = ANY($2::uuid[])
"""


@dataclass
class DurableView:
    """One durable on the overview."""

    name: str
    target: str
    ordered: bool
    #: Declared ``criticality: high`` (INFRA-005 §7): listed first, marked.
    critical: bool = False
    #: The throttle in force (INFRA-005 §7.3), e.g. ``20/s (burst 40)``, with
    #: ``override`` when an operator set it (``ferry durable throttle``); None: none.
    throttle: str | None = None
    backlog: int = 0
    retrying: int = 0
    failed: int = 0
    oldest_at: str | None = None
    lag_messages: int | None = None
    lag_seconds: float | None = None
    rate: float = 0.0
    success_ratio: float | None = None
    dead_by_reason: list[tuple[str, int]] = field(default_factory=list)
    parked: dict[str, Any] | None = None
    error: str | None = None

    @property
    def dead_open(self) -> int:
        """Open dead letters (every reason)."""
        return sum(count for _, count in self.dead_by_reason)


@dataclass
class ContextView:
    """One context's outbox on the overview."""

    name: str
    backlog: int = 0
    oldest_age: float | None = None
    failing: int = 0
    set_aside: int = 0
    error: str | None = None


@dataclass
class Overview:
    """Everything the overview shows, and how long reading it took."""

    topology: str
    at: datetime
    contexts: list[ContextView]
    durables: list[DurableView]
    seconds: float = 0.0


def durables_by_database(topology: Topology) -> dict[str, list[str]]:
    """Database → the durables whose inbox and dead letters it holds."""
    found: dict[str, list[str]] = {}
    for name, spec in sorted(topology.durables.items()):
        found.setdefault(topology.context(spec.target).database, []).append(name)
    return found


def durable_views(topology: Topology) -> dict[str, DurableView]:
    """The overview's durables, empty: the ``criticality: high`` ones first, then by name."""
    ranked = sorted(topology.durables.items(), key=lambda i: (i[1].criticality != "high", i[0]))
    return {
        name: DurableView(
            name,
            spec.target,
            spec.ordering == "key",
            spec.criticality == "high",
            spec.throttle.limit().describe() if spec.throttle else None,
        )
        for name, spec in ranked
    }


def _age(oldest: str | None, now: datetime) -> float | None:
    if not oldest:
        return None
    return max((now - datetime.fromisoformat(oldest)).total_seconds(), 0.0)


async def read_overview(
    topology: Topology, pools: dict[str, asyncpg.Pool], nc: NATS | None
) -> Overview:
    """The overview's figures: outboxes, durables (inbox, lag, rate, ratio, dead letters)."""
    started = time.perf_counter()
    now = datetime.now(UTC)
    contexts = [
        ContextView(name)
        for name, spec in sorted(topology.contexts.items())
        if spec.stream is not None
    ]
    durables = durable_views(topology)
    jobs = [_read_outbox(topology, pools, view, now) for view in contexts]
    jobs += [
        _read_database(pools[db], [durables[n] for n in names])
        for db, names in durables_by_database(topology).items()
    ]
    jobs += [_read_lag(topology, nc, view) for view in durables.values()]
    await asyncio.gather(*jobs)
    return Overview(
        topology.name, now, contexts, list(durables.values()), time.perf_counter() - started
    )


async def _read_outbox(
    topology: Topology, pools: dict[str, asyncpg.Pool], view: ContextView, now: datetime
) -> None:
    try:
        async with pools[topology.context(view.name).database].acquire() as conn:
            doc = await outbox.backlog(conn)
    except (OSError, asyncpg.PostgresError) as exc:
        view.error = _short_error(exc)
        return
    view.backlog, view.failing, view.set_aside = doc["count"], doc["failing"], doc["set_aside"]
    view.oldest_age = _age(doc["oldest_at"], now)


async def _read_database(pool: asyncpg.Pool, views: list[DurableView]) -> None:
    try:
        async with pool.acquire() as conn:
            for view in views:
                doc = await inbox.backlog(conn, view.name)
                view.backlog, view.oldest_at = doc["count"], doc["oldest_at"]
                view.retrying, view.failed = doc["retrying"], doc["failed"]
                processed = await conn.fetchval(_RECENT, view.name, RATE_WINDOW)
                dead = await conn.fetchval(_DEAD_RECENT, view.name, RATE_WINDOW)
                retrying = await conn.fetchval(_RETRYING, view.name)
                view.rate = processed / RATE_WINDOW
                judged = processed + dead + retrying
                view.success_ratio = processed / judged if judged else None
                if view.ordered:
                    view.parked = await parking.summary(conn, view.name)
            rows = await conn.fetch(_DEAD_BY_REASON, [v.name for v in views], list(OPEN_STATUSES))
    except (OSError, asyncpg.PostgresError) as exc:
        for view in views:
            view.error = _short_error(exc)
        return
    by_name = {v.name: v for v in views}
    for row in rows:
        by_name[row["durable"]].dead_by_reason.append((row["reason_code"], row["count"]))
    await _read_throttles(pool, by_name)


async def _read_throttles(pool: asyncpg.Pool, by_name: dict[str, DurableView]) -> None:
    """Operators' throttle overrides replace the topology's value on the overview (a
    database not migrated that far just shows the topology's)."""
    try:
        async with pool.acquire() as conn:
            for override in await throttles.overrides(conn, list(by_name)):
                limit = override.limit()
                shown = limit.describe() if limit is not None else "no limit"
                by_name[override.durable].throttle = f"{shown}, override"
    except (OSError, asyncpg.PostgresError) as exc:
        log.warning("throttle overrides not read: %s", _short_error(exc))


async def _read_lag(topology: Topology, nc: NATS | None, view: DurableView) -> None:
    """JetStream's lag of every consumer of the durable (its partitions summed)."""
    if nc is None or not nc.is_connected:
        view.error = view.error or "NATS is not connected"
        return
    js = nc.jetstream()
    spec = topology.durables[view.name]
    pending, oldest = 0, 0.0
    try:
        for plan in topology.consumers(view.name):
            info = await js.consumer_info(spec.stream, plan.name, timeout=3)
            pending += (info.num_pending or 0) + (info.num_ack_pending or 0)
            if info.num_pending:
                oldest = max(oldest, await _oldest_undelivered(js, spec.stream, info))
    except (NatsError, TimeoutError, OSError) as exc:
        view.error = view.error or f"JetStream: {_short_error(exc)}"
        return
    view.lag_messages, view.lag_seconds = pending, oldest


async def _oldest_undelivered(js: Any, stream: str, info: Any) -> float:
    """Seconds since the first message after the consumer's last delivered one was stored."""
    config = info.config
    filters = list(config.filter_subjects or []) or [config.filter_subject or ">"]
    start = (info.delivered.stream_seq if info.delivered else 0) + 1
    oldest: datetime | None = None
    for subject in filters:
        try:
            msg = await js.get_msg(stream, seq=start, subject=subject, next=True)
        except (NatsError, TimeoutError):
            continue
        stamp = _stored_at(msg)
        if stamp is not None and (oldest is None or stamp < oldest):
            oldest = stamp
    if oldest is None:
        return 0.0
    return max((datetime.now(UTC) - oldest).total_seconds(), 0.0)


def _stored_at(msg: Any) -> datetime | None:
    stamp = getattr(msg, "time", None)
    if isinstance(stamp, datetime):
        return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")[:26] + "+00:00")
        except ValueError:
            return None
    return None


def _short_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --------------------------------------------------------------------------- failures


@dataclass(frozen=True)
class GroupKey:
    """A failure group: durable, reason code and the fingerprint of the last error."""

    durable: str
    reason: str
    fingerprint: str


def statuses_for(which: str) -> list[str]:
    """The statuses a ``status=`` filter means: ``open`` (default), ``all`` or one status."""
    every = ["dead", "held", "replaying", "replayed", "parked", "discarded"]
    if which in ("", "open"):
        return list(OPEN_STATUSES)
    if which == "all":
        return every
    if which in every:
        return [which]
    raise ValueError(f"unknown status {which!r}: open, all or one of {', '.join(every)}")


async def failure_groups(
    topology: Topology,
    pools: dict[str, asyncpg.Pool],
    *,
    durable: str | None,
    reason: str | None,
    statuses: list[str],
) -> list[dict[str, Any]]:
    """Dead letters grouped by (durable, reason, fingerprint), latest group first."""
    out: list[dict[str, Any]] = []
    for database, names in durables_by_database(topology).items():
        chosen = [n for n in names if durable in (None, n)]
        if not chosen:
            continue
        async with pools[database].acquire() as conn:
            rows = await conn.fetch(_GROUPS, chosen, statuses, reason)
        for row in rows:
            doc = dict(row)
            doc["statuses"] = sorted(json.loads(doc["statuses"] or "{}"))
            out.append(doc)
    out.sort(key=lambda g: g["last_seen"], reverse=True)
    return out


async def group_entries(
    topology: Topology,
    pools: dict[str, asyncpg.Pool],
    key: GroupKey,
    statuses: list[str],
    *,
    limit: int = 500,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """A group's entries (oldest first, at most ``limit``) and its count per status."""
    database = topology.context(topology.durable(key.durable).target).database
    async with pools[database].acquire() as conn:
        rows = await conn.fetch(
            _GROUP_ENTRIES, key.durable, key.reason, key.fingerprint, statuses, limit
        )
        counts = await conn.fetch(
            _GROUP_STATUS_COUNTS, key.durable, key.reason, key.fingerprint, statuses
        )
    return [dict(r) for r in rows], {r["status"]: r["count"] for r in counts}


async def statuses_of(
    topology: Topology, pools: dict[str, asyncpg.Pool], entries: list[tuple[str, uuid.UUID]]
) -> dict[tuple[str, uuid.UUID], dict[str, Any]]:
    """The current status of each (durable, message id)."""
    by_durable: dict[str, list[uuid.UUID]] = {}
    for durable, message_id in entries:
        by_durable.setdefault(durable, []).append(message_id)
    found: dict[tuple[str, uuid.UUID], dict[str, Any]] = {}
    for durable, ids in by_durable.items():
        database = topology.context(topology.durable(durable).target).database
        async with pools[database].acquire() as conn:
            for row in await conn.fetch(_STATUSES_OF, durable, ids):
                found[(durable, row["message_id"])] = dict(row)
    return found


def predicted(action: str, status: str) -> tuple[bool, str]:
    """What an action would do to an entry in ``status``: (allowed, what the page says)."""
    allowed = {
        "replay": REPLAYABLE_STATUSES,
        "park": PARKABLE_STATUSES,
        "discard": DISCARDABLE_STATUSES,
    }[action]
    if status in allowed:
        verb = {"replay": "replayed", "park": "parked", "discard": "discarded"}[action]
        return True, f"would be {verb}"
    return False, (
        f"would be refused: it is {status} ({action} is allowed from {', '.join(allowed)})"
    )


# --------------------------------------------------------------------------- events

_SEARCH_OUTBOX = """
SELECT id AS message_id, aggregate_type, aggregate_id, event_type, event_version,
       occurred_at, published_at, correlation_id
FROM outbox_events
WHERE ($1::uuid IS NOT NULL AND (id = $1 OR correlation_id = $1))
   OR ($2::text IS NOT NULL AND aggregate_type = $2 AND aggregate_id = $3)
   OR ($4::text IS NOT NULL AND event_type = $4 AND ($5::int IS NULL OR event_version = $5))
ORDER BY occurred_at DESC LIMIT $6
"""

_SEARCH_INBOX = """
SELECT message_id, durable, subject, status, received_at FROM inbox_messages
WHERE subject ~ $1 ORDER BY received_at DESC LIMIT $2
"""

_UUID = re.compile(
    r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"
)
_SUBJECT = re.compile(r"^[A-Za-z0-9_\-]+(\.([A-Za-z0-9_\-]+|\*|>))+$")
_AGGREGATE = re.compile(r"^[^/\s]{1,200}/\S{1,500}$")


def parse_search(text: str) -> tuple[str, Any]:
    """What a search box query means: ``("id", UUID)``, ``("aggregate", (type, id))`` or
    ``("subject", pattern)``; ValueError with what is accepted otherwise."""
    text = text.strip()
    if _UUID.match(text):
        return "id", uuid.UUID(text)
    if _AGGREGATE.match(text):
        kind, _, ident = text.partition("/")
        return "aggregate", (kind, ident)
    if _SUBJECT.match(text) and len(text) <= 300:
        return "subject", text
    raise ValueError(
        "search for a message or correlation id (a UUID), an aggregate (type/id, e.g. "
        "vibe/v-17) or a subject (e.g. vibespro.vibe_created.v1, wildcards * and >)"
    )


async def search_events(
    topology: Topology, pools: dict[str, asyncpg.Pool], text: str, *, limit: int = 50
) -> list[dict[str, Any]]:
    """Events matching a search (see :func:`parse_search`), newest first."""
    kind, value = parse_search(text)
    found: dict[str, dict[str, Any]] = {}
    ident = value if kind == "id" else None
    agg_type, agg_id = value if kind == "aggregate" else (None, None)
    event_type: str | None = None
    version: int | None = None
    if kind == "subject":
        event_type, version = _event_of_subject(topology, value)
    with_inbox = durables_by_database(topology)
    for database in topology.databases():
        async with pools[database].acquire() as conn:
            if kind != "subject" or event_type is not None:
                rows = await conn.fetch(
                    _SEARCH_OUTBOX, ident, agg_type, agg_id, event_type, version, limit
                )
                for row in rows:
                    doc = {**dict(row), "where": f"outbox of {database}"}
                    found.setdefault(str(row["message_id"]), doc)
            if kind == "subject" and database in with_inbox:
                for row in await conn.fetch(_SEARCH_INBOX, subject_regex(value), limit):
                    doc = {**dict(row), "where": f"inbox of {row['durable']}"}
                    found.setdefault(str(row["message_id"]), doc)
    stamp = datetime.min.replace(tzinfo=UTC)
    return sorted(
        found.values(),
        key=lambda d: d.get("occurred_at") or d.get("received_at") or stamp,
        reverse=True,
    )[:limit]


def _event_of_subject(topology: Topology, pattern: str) -> tuple[str | None, int | None]:
    """The event type (and version) a literal ``{ns}.{type}.v{n}`` subject names."""
    parts = pattern.split(".")
    if len(parts) < 2 or "*" in parts[:2] or ">" in parts[:2]:
        return None, None
    version = None
    if len(parts) >= 3 and re.fullmatch(r"v[0-9]+", parts[2]):
        version = int(parts[2][1:])
    namespaces = {ctx.namespace for ctx in topology.contexts.values()}
    return (parts[1], version) if parts[0] in namespaces else (None, None)


# --------------------------------------------------------------------------- KPI

_KPI_RUNS = """
SELECT run_id, topology, window_seconds, range_start, range_end, as_of, windows, events,
       verdict, exit_code, report_dir
FROM kpi_runs WHERE topology = $1 ORDER BY as_of DESC LIMIT $2
"""


async def kpi_runs(
    topology: Topology, pools: dict[str, asyncpg.Pool], *, limit: int = 10
) -> list[dict[str, Any]]:
    """The latest KPI runs recorded in any database of the topology, newest first."""
    runs: dict[str, dict[str, Any]] = {}
    for database in topology.databases():
        async with pools[database].acquire() as conn:
            for row in await conn.fetch(_KPI_RUNS, topology.name, limit):
                runs[str(row["run_id"])] = {**dict(row), "database": database}
    return sorted(runs.values(), key=lambda r: r["as_of"], reverse=True)[:limit]
