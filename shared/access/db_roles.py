"""PostgreSQL logins per process role, granted only what the role's statements use.

One login per process role (:mod:`shared.access.identities`), derived from the topology:

==========================  ================================================================
outbox-publisher-{ctx}      its context's database: read ``outbox_events`` and mark rows
                            (UPDATE of the publish and set-aside columns only; no INSERT,
                            no DELETE), ``outbox_actions`` (insert: the rows it sets aside),
                            ``outbox_watch`` (its promise to claim on a timer; every login
                            may read that table, the outbox trigger does as the producer)
producer-{ctx}              INSERT of the SDS-047 columns of ``outbox_events`` (never
                            ``published_at``), nothing else
inbox-consumer-{durable}    its target's database: its own rows of ``inbox_messages`` and
                            ``dead_letters`` (read, insert, update) and ``dead_letter_actions``
                            (insert), enforced per row (row-level security on ``durable``);
                            an ``ordering: key`` durable also its ``parked_messages`` and
                            ``partition_members`` (all four) and ``partition_leases`` (no
                            delete); its row of ``throttle_overrides`` (read) and its
                            processes' rows of ``throttle_members`` (all four)
handler-{ctx}               its context's database: create and use its own ``handler_*``
                            tables; a handler that forwards events (module_f) may also
                            INSERT into ``outbox_events``; the handler that runs the replay
                            API's jobs (module_g) also reads and updates ``replay_jobs`` and
                            has the dlq-replayer's grants in every target database
dlq-router-{topology}       each target database: the rows of its topology's durables in
                            ``inbox_messages``/``dead_letters`` (read, insert, update),
                            ``dead_letter_actions`` (insert)
dlq-replayer-{topology}     the same rows: read and update (it never inserts an inbox row
                            or a dead letter), ``dead_letter_actions`` (insert)
kpi-spark-job-{topology}    every database of the topology: read ``outbox_events``, its
                            durables' ``inbox_messages``/``dead_letters`` (and the
                            ``ordering: key`` ones' ``parked_messages``); write its own
                            ``kpi_*`` result tables
retention-{topology}        ``ferry purge``: read and DELETE ``outbox_events`` and
                            ``outbox_actions`` in its contexts' databases, its durables'
                            rows of ``inbox_messages`` and the audit tables
                            (``dead_letter_actions``, ``dead_letter_edits``,
                            ``throttle_actions``, ``pause_actions``, ``durable_rewinds``;
                            an ordered durable's ``parked_actions`` and
                            ``partition_leases``), ``replay_jobs`` in the replay lane's
                            database; read and DELETE its durables' ``dead_letters``
                            (settled ones, with their 'failed' inbox rows); read the
                            ``parked_messages`` (a parked key's audit is kept); read and
                            DELETE the ``kpi_*`` results
                            (not ``kpi_watermarks``) in every database of the
                            topology; nothing else: no INSERT, no UPDATE
console-{topology}          the operator console (services/console): read the outbox,
                            its durables' inbox, dead letters, parked messages, the
                            actions and the ``kpi_*`` tables of every database; write
                            only what ``ferry dlq`` and ``ferry parked`` write (UPDATE of
                            ``dead_letters`` and ``inbox_messages`` for replays, park and
                            discard; INSERT into ``dead_letter_actions`` and
                            ``parked_actions``, and ``dead_letter_edits`` for an edited
                            replay; DELETE of a held ``parked_messages`` head and
                            UPDATE of the next one's ``next_attempt_at`` (it is due);
                            INSERT into ``pause_actions`` for its pause buttons);
                            in the replay lane's database (module_g) INSERT into
                            ``replay_jobs`` and ``outbox_events`` (the replay API's jobs)
==========================  ================================================================

No login may connect to a database it has no grant in (``CONNECT`` is revoked from
PUBLIC). The tables belong to :data:`~shared.access.identities.DB_OWNER`, which runs the migrations
and which no long-running role uses.

``ferry durable rewind`` (an operator command, run as the console's login) writes its audit
in ``durable_rewinds`` of the durable's target database: the console may read, insert and
update its durables' rows there (row-level security on ``durable``).

``ferry db-roles`` applies all of this (:mod:`shared.access.db_apply`; idempotently:
privileges our roles no longer need are revoked, stale policies dropped) with an
administrative DSN. Passwords are set as SCRAM-SHA-256 verifiers computed there, so a
password never reaches the server (or its statement log) in clear, and are never printed.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.access.identities import Identity, check_unique, handler_contexts, identities
from shared.contracts.replay_jobs import replay_lane, replay_workers
from shared.contracts.topology import Topology

#: Columns the publisher updates when it marks a row published or failed.
OUTBOX_MARK_COLUMNS = (
    "published_at", "publish_attempts", "publish_error", "last_attempt_at",
    "set_aside_at", "set_aside_reason",
)  # fmt: skip
#: Columns a producer may write (SDS-047's, plus trace context); the rest are defaults.
OUTBOX_INSERT_COLUMNS = (
    "id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "event_version",
    "payload",
    "occurred_at",
    "correlation_id",
    "causation_id",
    "traceparent",
    "tracestate",
)
#: The KPI job's result tables (migrations/0004_kpi.sql).
KPI_TABLES = ("kpi_windows", "kpi_reasons", "kpi_watermarks", "kpi_runs")
#: Tables holding one durable's rows, guarded by row-level security on ``durable``
#: (``dead_letter_edits``: edit-and-retry's audit, migrations/0017).
EDITS_TABLE = "dead_letter_edits"
#: The failure groups' counts, kept by triggers on dead_letters (migrations/0027): written
#: only by the triggers and ``ferry_fold_dead_letter_groups()``, which run as the owner.
GROUP_TABLES = ("dead_letter_groups", "dead_letter_group_changes")
PER_DURABLE_TABLES = ("inbox_messages", "dead_letters", "dead_letter_actions", EDITS_TABLE,
                      *GROUP_TABLES)  # fmt: skip
#: ``ordering: key`` durables' tables (migrations 0009, 0010), also one durable's rows each.
ORDERING_TABLES = ("parked_messages", "parked_actions", "partition_leases", "partition_members")
#: The audit of ``ferry durable rewind`` (migrations/0011_rewinds.sql), one durable's rows each.
REWIND_TABLE = "durable_rewinds"
#: The replay API's jobs (migrations/0013_replay_jobs.sql).
REPLAY_JOBS_TABLE = "replay_jobs"
#: Throttle overrides and their audit (migrations/0012_throttles.sql), one durable's rows each.
THROTTLE_TABLES = ("throttle_overrides", "throttle_actions", "throttle_members")
#: The audit of ``ferry durable pause|resume`` (migrations/0018_pauses.sql), one durable's
#: rows each (the pause itself is JetStream's).
PAUSE_TABLE = "pause_actions"
#: The publishers' promises to claim on a timer (migrations/0014_outbox_watch.sql);
#: readable by PUBLIC (the outbox trigger runs as the producer), written by publishers.
WATCH_TABLE = "outbox_watch"
#: Every table of the migrations that a grant here may touch.
FERRY_TABLES = (
    *THROTTLE_TABLES,
    PAUSE_TABLE,
    "outbox_events",
    "outbox_actions",
    WATCH_TABLE,
    *PER_DURABLE_TABLES,
    *ORDERING_TABLES,
    *KPI_TABLES,
    REWIND_TABLE,
    REPLAY_JOBS_TABLE,
)
#: Handler services that record events in their own outbox while handling one
#: (services/handlers/contexts/module_f.py forwards lane E→F into lane F→G).
FORWARDING_HANDLERS = frozenset({"module_f"})
#: SCRAM iterations (PostgreSQL's default).
SCRAM_ITERATIONS = 4096

_READ_WRITE = ("SELECT", "INSERT", "UPDATE")
_READ_UPDATE = ("SELECT", "UPDATE")


@dataclass(frozen=True)
class TableAccess:
    """Privileges on one table; ``durables`` limits the visible rows (None: every row)."""

    table: str
    privileges: tuple[str, ...]
    durables: tuple[str, ...] | None = None


@dataclass(frozen=True)
class RoleAccess:
    """What one role may do in one database."""

    identity: Identity
    database: str
    tables: tuple[TableAccess, ...]
    #: May create tables in schema public (a handler's own ``handler_*`` tables).
    create_tables: bool = False

    @property
    def role(self) -> str:
        """The PostgreSQL login."""
        return self.identity.pg_role


def _columns(privilege: str, columns: tuple[str, ...]) -> str:
    return f"{privilege} ({', '.join(columns)})"


def _per_durable(
    durables: list[str], *, inbox: tuple[str, ...], dead: tuple[str, ...]
) -> tuple[TableAccess, ...]:
    rows = tuple(sorted(durables))
    return (
        TableAccess("inbox_messages", inbox, rows),
        TableAccess("dead_letters", dead, rows),
        TableAccess("dead_letter_actions", ("INSERT",), rows),
    )


def _by_target_db(topology: Topology) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, spec in sorted(topology.durables.items()):
        found.setdefault(topology.contexts[spec.target].database, []).append(name)
    return found


def _outbox_insert() -> TableAccess:
    return TableAccess("outbox_events", (_columns("INSERT", OUTBOX_INSERT_COLUMNS),))


def role_access(identity: Identity, topology: Topology) -> list[RoleAccess]:
    """Every database ``identity`` may use and what it may do there."""
    kind, of = identity.kind, identity.of
    if kind in ("outbox-publisher", "producer", "handler"):
        database = topology.contexts[of].database
        if kind == "outbox-publisher":
            mark = ("SELECT", _columns("UPDATE", OUTBOX_MARK_COLUMNS))
            # outbox_actions: the audit of the rows it sets aside.
            audit = TableAccess("outbox_actions", ("INSERT",))
            # outbox_watch: its promise to claim on a timer (every role may read it).
            watch = TableAccess(WATCH_TABLE, ("SELECT", "INSERT", "UPDATE", "DELETE"))
            mine: tuple[TableAccess, ...] = (TableAccess("outbox_events", mark), audit, watch)
            return [RoleAccess(identity, database, mine)]
        if kind == "producer":
            return [RoleAccess(identity, database, (_outbox_insert(),))]
        return _handler_access(identity, topology, database)
    if kind == "inbox-consumer":
        spec = topology.durables[of]
        database = topology.contexts[spec.target].database
        tables = _per_durable([of], inbox=_READ_WRITE, dead=_READ_WRITE)
        # Its operator throttle override (read every few seconds) and its live processes.
        tables += (
            TableAccess("throttle_overrides", ("SELECT",), (of,)),
            TableAccess("throttle_members", ("SELECT", "INSERT", "UPDATE", "DELETE"), (of,)),
        )
        if spec.ordering == "key":
            # Its parked messages and its partition leases and members (issue 23).
            every = ("SELECT", "INSERT", "UPDATE", "DELETE")
            tables += (
                TableAccess("parked_messages", every, (of,)),
                TableAccess("partition_leases", _READ_WRITE, (of,)),
                TableAccess("partition_members", every, (of,)),
            )
        return [RoleAccess(identity, database, tables)]
    if kind in ("dlq-router", "dlq-replayer"):
        inbox = _READ_WRITE if kind == "dlq-router" else _READ_UPDATE
        return [
            RoleAccess(identity, db, _per_durable(names, inbox=inbox, dead=inbox))
            for db, names in _by_target_db(topology).items()
        ]
    by_db = _by_target_db(topology)
    if kind == "retention":
        return _retention_access(identity, topology, by_db)
    if kind == "console":
        return _console_access(identity, topology, by_db)
    # kpi-spark-job: read the sources, write its results, in every database.
    out = []
    ordered = {name for name, spec in topology.durables.items() if spec.ordering == "key"}
    for database in topology.databases():
        rows = tuple(by_db.get(database, []))
        # The ordered durables' parked events: parked, never lost (shared.domain.whereabouts).
        keyed = tuple(name for name in rows if name in ordered)
        tables = (
            TableAccess("outbox_events", ("SELECT",)),
            TableAccess("inbox_messages", ("SELECT",), rows),
            TableAccess("dead_letters", ("SELECT",), rows),
            *((TableAccess("parked_messages", ("SELECT",), keyed),) if keyed else ()),
            *(TableAccess(t, ("SELECT", "INSERT", "UPDATE", "DELETE")) for t in KPI_TABLES),
        )
        out.append(RoleAccess(identity, database, tables))
    return out


def _handler_access(identity: Identity, topology: Topology, database: str) -> list[RoleAccess]:
    """A handler service: its own tables; a forwarding one its outbox; the replay worker
    more (:func:`_replay_worker_access`)."""
    own: tuple[TableAccess, ...] = (_outbox_insert(),) if identity.of in FORWARDING_HANDLERS else ()
    if identity.of in replay_workers(topology):
        return _replay_worker_access(identity, topology, database, own)
    return [RoleAccess(identity, database, own, create_tables=True)]


def _replay_worker_access(
    identity: Identity, topology: Topology, database: str, own: tuple[TableAccess, ...]
) -> list[RoleAccess]:
    """The handler that runs the replay API's jobs: its own tables, the job rows (read,
    update: it marks them running and done), and in every database what a replay writes
    (the dlq-replayer's grants: ``ferry dlq replay``'s statements)."""
    lane = replay_lane(topology)
    out: dict[str, list[TableAccess]] = {database: list(own)}
    if lane is not None:
        out.setdefault(lane.database, []).append(
            TableAccess(REPLAY_JOBS_TABLE, ("SELECT", "UPDATE"))
        )
    for db, names in _by_target_db(topology).items():
        out.setdefault(db, []).extend(_per_durable(names, inbox=_READ_UPDATE, dead=_READ_UPDATE))
    return [
        RoleAccess(identity, db, tuple(tables), create_tables=db == database)
        for db, tables in out.items()
    ]


def _retention_access(
    identity: Identity, topology: Topology, by_db: dict[str, list[str]]
) -> list[RoleAccess]:
    """``ferry purge`` deletes the rows past their retention (shared.ops.retention_tables):
    published outbox rows, processed inbox rows, old audit rows, settled dead letters (with
    their dead-lettered inbox rows), the topology's old KPI results; it reads them to find
    them (DELETE ... WHERE needs SELECT), reads the parked messages that keep their audit
    rows, and touches nothing else."""
    publishing = {c.database for c in topology.contexts.values() if c.stream is not None}
    lane = replay_lane(topology)
    ordered = {name for name, spec in topology.durables.items() if spec.ordering == "key"}
    purge = ("SELECT", "DELETE")
    out = []
    for database in topology.databases():
        tables: list[TableAccess] = []
        if database in publishing:
            tables.append(TableAccess("outbox_events", purge))
            tables.append(TableAccess("outbox_actions", purge))
        rows = tuple(by_db.get(database, ()))
        if rows:
            tables.append(TableAccess("inbox_messages", purge, rows))
            tables.append(TableAccess("dead_letters", purge, rows))
            audit = ("dead_letter_actions", EDITS_TABLE, "throttle_actions", PAUSE_TABLE)
            tables += [TableAccess(t, purge, rows) for t in (*audit, REWIND_TABLE)]
            keyed = tuple(name for name in rows if name in ordered)
            if keyed:
                tables += [
                    TableAccess("parked_messages", ("SELECT",), keyed),
                    TableAccess("parked_actions", purge, keyed),
                    TableAccess("partition_leases", purge, keyed),
                ]
        if lane is not None and database == lane.database:
            tables.append(TableAccess(REPLAY_JOBS_TABLE, purge))
        # The KPI job's results, in whichever database holds them (FERRY_KPI_DATABASE).
        tables += [TableAccess(t, purge) for t in KPI_TABLES if t != "kpi_watermarks"]
        out.append(RoleAccess(identity, database, tuple(tables)))
    return out


def _console_access(
    identity: Identity, topology: Topology, by_db: dict[str, list[str]]
) -> list[RoleAccess]:
    """The operator console reads everything an operator looks at and writes only what the
    operator commands it runs write (``ferry dlq replay|park|discard``, ``ferry parked
    discard``): the same statements, so the same grants as the dlq-replayer plus the
    parked queue's discard."""
    out = []
    lane = replay_lane(topology)
    ordered = {name for name, spec in topology.durables.items() if spec.ordering == "key"}
    for database in topology.databases():
        rows = tuple(by_db.get(database, []))
        replay_lane_db = lane is not None and database == lane.database
        outbox: tuple[str, ...] = ("SELECT",)
        if replay_lane_db:
            # The replay API: a job row and its event's outbox row, in one transaction.
            outbox += (_columns("INSERT", OUTBOX_INSERT_COLUMNS),)
        tables: list[TableAccess] = [TableAccess("outbox_events", outbox)]
        # `ferry where` looks for an event's inbox rows and dead letters in every database:
        # where no durable of the topology lives, it may read (and sees no row).
        read, note = (_READ_UPDATE, ("SELECT", "INSERT")) if rows else (("SELECT",),) * 2
        tables += [
            TableAccess("inbox_messages", read, rows),
            TableAccess("dead_letters", read, rows),
            TableAccess("dead_letter_actions", note, rows),
            # Edit-and-retry (`ferry dlq edit`, the console): both versions, audited.
            TableAccess(EDITS_TABLE, note, rows),
            # The Failures page's counts.
            *(TableAccess(t, ("SELECT",), rows) for t in GROUP_TABLES),
        ]
        if rows:
            keyed = tuple(name for name in rows if name in ordered)
            if keyed:
                tables += [
                    # A discard of a held head makes the key's next event due (0022).
                    TableAccess(
                        "parked_messages",
                        ("SELECT", _columns("UPDATE", ("next_attempt_at",)), "DELETE"),
                        keyed,
                    ),
                    TableAccess("parked_actions", ("SELECT", "INSERT"), keyed),
                ]
            # `ferry durable rewind`'s audit: written at the start, completed at the end.
            tables.append(TableAccess(REWIND_TABLE, _READ_WRITE, rows))
        if rows:  # the throttles in force and their audit (read only)
            tables += [TableAccess(t, ("SELECT",), rows) for t in THROTTLE_TABLES]
            # Its pause and resume buttons: recorded as `ferry durable pause` records them.
            tables.append(TableAccess(PAUSE_TABLE, ("SELECT", "INSERT"), rows))
        tables += [TableAccess(t, ("SELECT",)) for t in KPI_TABLES]
        if replay_lane_db:
            tables.append(TableAccess(REPLAY_JOBS_TABLE, ("SELECT", "INSERT")))
        out.append(RoleAccess(identity, database, tuple(tables)))
    return out


def plan(topologies: list[Topology]) -> dict[str, list[RoleAccess]]:
    """Database → the access of every role that uses it, for all ``topologies``."""
    check_unique(topologies)
    by_db: dict[str, list[RoleAccess]] = {}
    for topology in topologies:
        for database in topology.databases():
            by_db.setdefault(database, [])
        for identity in identities(topology):
            for access in role_access(identity, topology):
                by_db[access.database].append(access)
    return by_db


def login_roles(topologies: list[Topology]) -> list[Identity]:
    """Every login of ``topologies`` (the owner aside)."""
    return [i for t in topologies for i in identities(t)]


def handler_identities(topology: Topology) -> list[Identity]:
    """The handler services' identities (they own their ``handler_*`` tables)."""
    return [Identity("handler", c) for c in handler_contexts(topology)]


def describe(topologies: list[Topology]) -> list[dict[str, object]]:
    """Each role's grants per database, for ``ferry db-roles --show`` and the docs."""
    out: list[dict[str, object]] = []
    for database, accesses in plan(topologies).items():
        for access in accesses:
            out.append(
                {
                    "role": access.role,
                    "database": database,
                    "create_tables": access.create_tables,
                    "tables": {
                        t.table: {
                            "privileges": list(t.privileges),
                            "rows": "all" if t.durables is None else list(t.durables),
                        }
                        for t in access.tables
                    },
                }
            )
    return out
