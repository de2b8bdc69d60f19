"""The retention policy of every table ``ferry purge`` keeps bounded beyond the outbox and
inbox (issue 48): which setting, what is never deleted, the statements.

=====================  ====================  =============================================
table                  retention (context)   never deleted
=====================  ====================  =============================================
outbox_actions         audit_retention       a row whose outbox event is still unpublished
dead_letter_actions    audit_retention       a row whose dead letter is still open (any
                                             status but replayed or discarded)
dead_letter_edits      audit_retention       the same
parked_actions         audit_retention       a row whose ordering key is still parked
throttle_actions       audit_retention       the durable's latest row (who set the
                                             throttle in force)
pause_actions          audit_retention       the durable's latest row (who set the pause)
durable_rewinds        audit_retention       a rewind still running
replay_jobs            audit_retention       a job queued or running
dead_letters           audit_retention       an open dead letter (dead, held, replaying,
                                             parked); its 'failed' inbox row goes with it
handler_applied        claims_retention      nothing younger (lint: the retention outlasts
                                             every way a copy can still arrive)
handler_calls          claims_retention      nothing younger
kpi_windows            audit_retention       nothing younger (the topology's rows only)
kpi_reasons            audit_retention       the same
kpi_runs               audit_retention       the latest run of each window length
partition_leases       (lease expiry + 1d)   every lease of a partition the stream still
                                             has; a held one (not released, not expired)
=====================  ====================  =============================================

The age is each table's own time column (``at``, ``started_at``, ``created_at``,
``applied_at``, ``called_at``, a KPI window's ``window_start``, a settled dead letter's
``updated_at``: when it was replayed or discarded). Each DELETE takes at
most ``limit`` rows found through an index (BRIN on the time column for the append-only
tables, migration 0019 and the SDK's DDL; (topology, window_start) for the KPI results,
migration 0020; the existing (durable, time) or time b-trees otherwise) and re-checks its
conditions on the rows it locks, as the outbox and inbox purges do. Per-durable tables are
purged one durable at a time (their rows are the topology's only: row-level security);
the KPI results by topology, in every database (only one holds them), and only by a purge
of the whole topology (not ``--only``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: A lease row of a dropped partition goes this long after it was released or expired.
LEASE_GRACE_SECONDS = 86400.0


@dataclass(frozen=True)
class TablePolicy:
    """One table's retention: its setting, the rows it may delete, how it finds them.

    ``per_durable`` statements take ($1 durable, $2 before, $3 limit), ``per_topology``
    ones ($1 topology, $2 before, $3 limit), the others ($1 before, $2 limit).
    ``oldest`` gives the oldest row's time cheaply (an index); a ``per_topology`` one
    takes ($1 topology).
    """

    table: str
    setting: Literal["audit_retention", "claims_retention", "lease"]
    per_durable: bool
    #: The conditions a row must meet to go (the table's own name qualifies columns).
    where: str
    oldest: str
    #: Where the policy applies: every database of the durables' targets, publishing
    #: databases, the replay lane's, the handlers' (their tables may not exist).
    where_found: Literal["durables", "ordered", "publishing", "replay_lane", "handlers", "kpi"]
    #: Rows are the topology's (the KPI results: keyed by topology, in any database).
    per_topology: bool = False
    #: A statement run with the deleted rows (a CTE named ``gone``, the table's columns it
    #: RETURNS): what goes with them. The DELETE then answers its count with a SELECT.
    cascade: str = ""
    returning: str = ""

    def delete_sql(self) -> str:
        delete = (
            f"DELETE FROM {self.table} WHERE ctid = ANY(ARRAY("
            f"SELECT ctid FROM {self.table} WHERE {self.where} LIMIT {self._limit()}))"
            f" AND {self.where}"
        )
        if not self.cascade:
            return delete
        return (
            f"WITH gone AS ({delete} RETURNING {self.returning}), "
            f"cascade AS ({self.cascade}) SELECT count(*) FROM gone"
        )

    def count_sql(self) -> str:
        return f"SELECT count(*) FROM {self.table} WHERE {self.where}"

    def _limit(self) -> str:
        return "$3" if self.per_durable or self.per_topology else "$2"


def _open_dead_letter(table: str) -> str:
    return (
        f"NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.durable = {table}.durable"
        f" AND d.message_id = {table}.message_id AND d.status NOT IN ('replayed', 'discarded'))"
    )


def _latest_kept(table: str) -> str:
    return (
        f"EXISTS (SELECT 1 FROM {table} n WHERE n.durable = {table}.durable AND n.id > {table}.id)"
    )


POLICIES: tuple[TablePolicy, ...] = (
    TablePolicy(
        "outbox_actions",
        "audit_retention",
        False,
        "at < $1 AND NOT EXISTS (SELECT 1 FROM outbox_events e"
        " WHERE e.id = outbox_actions.event_id AND e.published_at IS NULL)",
        "SELECT at FROM outbox_actions ORDER BY id LIMIT 1",
        "publishing",
    ),
    TablePolicy(
        "dead_letter_actions",
        "audit_retention",
        True,
        f"durable = $1 AND at < $2 AND {_open_dead_letter('dead_letter_actions')}",
        "SELECT at FROM dead_letter_actions ORDER BY id LIMIT 1",
        "durables",
    ),
    TablePolicy(
        "dead_letter_edits",
        "audit_retention",
        True,
        f"durable = $1 AND at < $2 AND {_open_dead_letter('dead_letter_edits')}",
        "SELECT at FROM dead_letter_edits ORDER BY id LIMIT 1",
        "durables",
    ),
    TablePolicy(
        "parked_actions",
        "audit_retention",
        True,
        "durable = $1 AND at < $2 AND NOT EXISTS (SELECT 1 FROM parked_messages p"
        " WHERE p.durable = parked_actions.durable"
        " AND p.ordering_key = parked_actions.ordering_key)",
        "SELECT at FROM parked_actions ORDER BY id LIMIT 1",
        "ordered",
    ),
    TablePolicy(
        "throttle_actions",
        "audit_retention",
        True,
        f"durable = $1 AND at < $2 AND {_latest_kept('throttle_actions')}",
        "SELECT at FROM throttle_actions ORDER BY id LIMIT 1",
        "durables",
    ),
    TablePolicy(
        "pause_actions",
        "audit_retention",
        True,
        f"durable = $1 AND at < $2 AND {_latest_kept('pause_actions')}",
        "SELECT at FROM pause_actions ORDER BY id LIMIT 1",
        "durables",
    ),
    TablePolicy(
        "durable_rewinds",
        "audit_retention",
        True,
        "durable = $1 AND started_at < $2 AND outcome <> 'running'",
        "SELECT min(started_at) FROM durable_rewinds",
        "durables",
    ),
    TablePolicy(
        "replay_jobs",
        "audit_retention",
        False,
        "created_at < $1 AND state IN ('done', 'failed')",
        "SELECT min(created_at) FROM replay_jobs",
        "replay_lane",
    ),
    # A settled dead letter and, if its consumer left it 'failed' (a discarded one), its
    # inbox row. The retention login deletes both (its durables' rows: row-level security).
    TablePolicy(
        "dead_letters",
        "audit_retention",
        True,
        "durable = $1 AND status IN ('replayed', 'discarded') AND updated_at < $2",
        "SELECT min(updated_at) FROM dead_letters WHERE status IN ('replayed', 'discarded')",
        "durables",
        cascade="DELETE FROM inbox_messages i USING gone g WHERE i.durable = g.durable"
        " AND i.message_id = g.message_id AND i.status = 'failed'",
        returning="durable, message_id",
    ),
    TablePolicy(
        "handler_applied",
        "claims_retention",
        False,
        "applied_at < $1",
        "SELECT min(applied_at) FROM handler_applied",
        "handlers",
    ),
    TablePolicy(
        "handler_calls",
        "claims_retention",
        False,
        "called_at < $1",
        "SELECT called_at FROM handler_calls ORDER BY id LIMIT 1",
        "handlers",
    ),
    # The KPI job's results live in one database of the topology (FERRY_KPI_DATABASE),
    # which the purge does not know: it looks in every one, by (topology, window_start)
    # (migration 0020), which costs an index probe where there are none.
    TablePolicy(
        "kpi_windows",
        "audit_retention",
        False,
        "topology = $1 AND window_start < $2",
        "SELECT min(window_start) FROM kpi_windows WHERE topology = $1",
        "kpi",
        per_topology=True,
    ),
    TablePolicy(
        "kpi_reasons",
        "audit_retention",
        False,
        "topology = $1 AND window_start < $2",
        "SELECT min(window_start) FROM kpi_reasons WHERE topology = $1",
        "kpi",
        per_topology=True,
    ),
    TablePolicy(
        "kpi_runs",
        "audit_retention",
        False,
        "topology = $1 AND started_at < $2 AND EXISTS (SELECT 1 FROM kpi_runs n"
        " WHERE n.topology = kpi_runs.topology AND n.window_seconds = kpi_runs.window_seconds"
        " AND n.started_at > kpi_runs.started_at)",
        "SELECT min(started_at) FROM kpi_runs WHERE topology = $1",
        "kpi",
        per_topology=True,
    ),
)

#: Lease rows of partitions the durable's stream no longer has: $1 durable, $2 partitions
#: the stream has now, $3 before (the lease ended before it: released or not, nobody
#: holds it), $4 limit.
LEASES_WHERE = "durable = $1 AND partition >= $2 AND expires_at < $3"
LEASES_DELETE = (
    "DELETE FROM partition_leases WHERE ctid = ANY(ARRAY("
    f"SELECT ctid FROM partition_leases WHERE {LEASES_WHERE} LIMIT $4)) AND {LEASES_WHERE}"
)
LEASES_COUNT = f"SELECT count(*) FROM partition_leases WHERE {LEASES_WHERE}"

#: The size of a table as the statistics know it (no scan): rows estimated, bytes.
SIZE_SQL = (
    "SELECT greatest(c.reltuples, 0)::bigint AS rows, pg_total_relation_size(c.oid) AS bytes"
    " FROM pg_class c WHERE c.oid = to_regclass($1)"
)

#: Tables ``ferry purge`` does not purge, and why (everything else Ferry or its SDK creates
#: has a policy above, or is the outbox or the inbox: tests/unit/test_retention_policies.py
#: fails on a new table that has neither).
NOT_PURGED = {
    "outbox_events": "purged by its own policy (outbox_retention, shared.adapters.outbox)",
    "inbox_messages": "purged by its own policy (inbox_retention, shared.adapters.inbox)",
    "partition_leases": "purged by LEASES_DELETE (dropped partitions only)",
    "parked_messages": "unfinished work: each row waits for its key's head",
    "throttle_overrides": "live state: one row per durable at most",
    "throttle_members": "live state: each consumer prunes the members not seen for a while",
    "partition_members": "live state: each consumer prunes the members not seen for a while",
    "outbox_watch": "live state: one row per publisher at most",
    "ferry_schema_migrations": "one row per migration",
    "kpi_watermarks": "the KPI job's state: one row per topology and window",
    "dead_letter_groups": "counts: one row per failure group and status that has letters",
    "dead_letter_group_changes": "pending counts: folded away at every dlq-replayer scan",
}
