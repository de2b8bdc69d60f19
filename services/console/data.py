"""The console's reads besides the overview (:mod:`services.console.overview`): failure
groups and their entries, event search, KPI runs — with the console's own login.

Every query is bounded by an index or a kept count: failure groups by the counts kept as
dead letters change (``dead_letter_groups``, migration 0027) and one probe of
``idx_dead_letters_group`` per group and status; the outbox and inbox by id, subject or
aggregate.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared.adapters.dead_letters import subject_regex
from shared.adapters.postgres import Pool
from shared.contracts.topology import Topology
from shared.domain.dead_letter import DISCARDABLE_STATUSES, PARKABLE_STATUSES, REPLAYABLE_STATUSES

log = logging.getLogger("ferry.console")

#: Dead-letter statuses that still need somebody (the failures page's default).
OPEN_STATUSES = ("dead", "held", "replaying", "parked")
# The fingerprint of an error: its first 500 characters with ids and numbers blanked, so
# "order 17 failed" and "order 18 failed" (or two timestamps) are one group. PostgreSQL
# keeps it as a column (migration 0026, this expression word for word); tests compare the two.
FINGERPRINT_SQL = (
    "left(md5(regexp_replace(left(last_error, 500), "
    "'[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}|[0-9]+', '#', 'g')), 12)"
)
#: The counts of each (group, status): those folded so far plus the changes pending
#: (migration 0027), read in one snapshot; $1 durables, $2 statuses, $3 a reason or NULL.
COUNTS = """
SELECT durable, reason_code, fingerprint, status, sum(count)::bigint AS count,
       min(first_seen) AS first_seen
FROM (SELECT durable, reason_code, fingerprint, status, count, first_seen
      FROM dead_letter_groups
      WHERE durable = ANY($1::text[]) AND status = ANY($2::text[])
        AND ($3::text IS NULL OR reason_code = $3)
      UNION ALL
      SELECT durable, reason_code, fingerprint, status, delta, first_seen
      FROM dead_letter_group_changes
      WHERE durable = ANY($1::text[]) AND status = ANY($2::text[])
        AND ($3::text IS NULL OR reason_code = $3)) AS kept
GROUP BY durable, reason_code, fingerprint, status
HAVING sum(count) > 0
"""

#: Groups of dead letters, latest first: their counts (:data:`COUNTS`), and the newest
#: letter of each, found by one probe of idx_dead_letters_group per status it has.
_GROUPS = f"""
WITH counts AS ({COUNTS}),
groups AS (
  SELECT durable, reason_code, fingerprint, sum(count)::bigint AS count,
         min(first_seen) AS first_seen, array_agg(status ORDER BY status) AS statuses
  FROM counts GROUP BY durable, reason_code, fingerprint
)
SELECT g.durable, g.reason_code, g.fingerprint, g.count, g.first_seen, g.statuses,
       newest.dead_lettered_at AS last_seen, newest.last_error
FROM groups AS g
LEFT JOIN LATERAL (
  SELECT d.dead_lettered_at, d.last_error
  FROM unnest(g.statuses) AS s(status)
  CROSS JOIN LATERAL (
    SELECT dead_lettered_at, last_error FROM dead_letters
    WHERE durable = g.durable AND reason_code = g.reason_code AND fingerprint = g.fingerprint
      AND status = s.status
    ORDER BY dead_lettered_at DESC LIMIT 1
  ) AS d
  ORDER BY d.dead_lettered_at DESC LIMIT 1
) AS newest ON true
ORDER BY newest.dead_lettered_at DESC NULLS LAST
"""

#: One group's count per status.
_GROUP_STATUS_COUNTS = f"""
SELECT status, count FROM ({COUNTS}) AS counts WHERE fingerprint = $4
"""

_GROUP_ENTRIES = """
SELECT durable, message_id, status, reason_code, last_error, original_subject, attempts,
       replay_attempts, first_dead_lettered_at, dead_lettered_at, stream_seq
FROM dead_letters
WHERE durable = $1 AND reason_code = $2 AND fingerprint = $3 AND status = ANY($4::text[])
ORDER BY dead_lettered_at, message_id
LIMIT $5
"""

_STATUSES_OF = """
SELECT message_id, status, replay_attempts, replayed_at FROM dead_letters
WHERE durable = $1 AND message_id = ANY($2::uuid[])
"""


def durables_by_database(topology: Topology) -> dict[str, list[str]]:
    """Database → the durables whose inbox and dead letters it holds."""
    found: dict[str, list[str]] = {}
    for name, spec in sorted(topology.durables.items()):
        found.setdefault(topology.context(spec.target).database, []).append(name)
    return found


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
    pools: dict[str, Pool],
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
            doc["statuses"] = list(doc["statuses"])
            if doc["last_seen"] is None:  # counted but not there: not within one snapshot
                continue
            out.append(doc)
    out.sort(key=lambda g: g["last_seen"], reverse=True)
    return out


async def group_entries(
    topology: Topology,
    pools: dict[str, Pool],
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
            _GROUP_STATUS_COUNTS, [key.durable], statuses, key.reason, key.fingerprint
        )
    return [dict(r) for r in rows], {r["status"]: r["count"] for r in counts}


async def statuses_of(
    topology: Topology, pools: dict[str, Pool], entries: list[tuple[str, uuid.UUID]]
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
    topology: Topology, pools: dict[str, Pool], text: str, *, limit: int = 50
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
    topology: Topology, pools: dict[str, Pool], *, limit: int = 10
) -> list[dict[str, Any]]:
    """The latest KPI runs recorded in any database of the topology, newest first."""
    runs: dict[str, dict[str, Any]] = {}
    for database in topology.databases():
        async with pools[database].acquire() as conn:
            for row in await conn.fetch(_KPI_RUNS, topology.name, limit):
                runs[str(row["run_id"])] = {**dict(row), "database": database}
    return sorted(runs.values(), key=lambda r: r["as_of"], reverse=True)[:limit]
