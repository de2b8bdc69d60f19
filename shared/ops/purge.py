"""Retention: what ``ferry purge`` (shared/cli/purge.py) runs, deleting what the topology
says need not be kept.

Per context, published outbox rows older than ``outbox_retention``; per durable, inbox
rows processed longer ago than its target context's ``inbox_retention``. Nothing
unfinished is ever deleted: an unpublished outbox row (pending or failing), an inbox row
still in process or retrying, a dead-lettered inbox row (its dead letter's lifecycle
governs it). Every other table Ferry or its handler SDK writes (the audit tables, the
SDK's claims and calls, lease rows of dropped partitions) is purged after them by its
policy (:mod:`shared.ops.retention_tables`, run by :mod:`shared.ops.retention_run`), at
the context's ``audit_retention`` or ``claims_retention``. Deletion goes in batches of
``batch`` rows, one statement each in its own transaction, so a large purge never holds
many row locks for long nor blocks the roles; two purges can run at once (the second
waits for the rows the first is deleting, then skips them).

The cut-off is taken once, from the database's clock, at the start of each table's
purge. It runs as the topology's ``retention-{topology}`` login, which may read and
DELETE exactly those tables' rows (reading what decides whether a row is still needed)
and nothing else (``ferry db-roles``); the roles' own
logins may not delete. ``ferry purge --every`` runs it as a role: under supervisord, and
in Kubernetes as a Deployment of one replica (``k8s/generate.py``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from functools import partial

from shared.adapters import inbox, outbox
from shared.domain.errors import ConfigurationError, TransientError
from shared.ops.retention_common import Purged, age, cutoff, database, drain
from shared.ops.retention_metrics import RetentionMetrics
from shared.ops.retention_run import purge_tables, table_size
from shared.runtime.health import HealthServer
from shared.runtime.metrics import RoleMetrics
from shared.runtime.settings import CommonSettings
from shared.waits import sleep_unless

__all__ = ["DEFAULT_BATCH", "Purged", "purge", "purge_forever"]

log = logging.getLogger("ferry.retention")

#: Rows per DELETE statement.
DEFAULT_BATCH = 5000


async def purge(
    settings: CommonSettings, *, batch: int = DEFAULT_BATCH, dry_run: bool = False,
    only: str | None = None,
) -> list[Purged]:  # fmt: skip
    """Purge every context's outbox and every durable's inbox (or only the context or
    durable named ``only``); with ``dry_run``, count instead of deleting."""
    topology = settings.load_topology()
    if only is not None and only not in topology.contexts and only not in topology.durables:
        raise ConfigurationError(
            f"{only!r} is neither a context nor a durable of topology {topology.name}"
        )
    report: list[Purged] = []
    for name, ctx in topology.contexts.items():
        if only not in (None, name) or ctx.stream is None:
            continue  # a context without a stream publishes nothing: it has no outbox rows
        async with database(settings, ctx.database) as conn:
            before = await cutoff(conn, ctx.outbox_retention)
            if dry_run:
                count = await outbox.purgeable(conn, before)
            else:
                count = await drain(partial(outbox.purge_batch, conn, before, batch))
            rows, size = await table_size(conn, "outbox_events")
            oldest = await age(conn, await outbox.oldest_past(conn, before))
        report.append(Purged("outbox", name, ctx.database, ctx.outbox_retention, before, count,
                             rows_estimate=rows, bytes=size,
                             oldest_age_seconds=oldest))  # fmt: skip
    for name, durable in topology.durables.items():
        if only not in (None, name, durable.target):
            continue
        target = topology.context(durable.target)
        async with database(settings, target.database) as conn:
            before = await cutoff(conn, target.inbox_retention)
            if dry_run:
                count = await inbox.purgeable(conn, name, before)
            else:
                count = await drain(partial(inbox.purge_batch, conn, name, before, batch))
            rows, size = await table_size(conn, "inbox_messages")
            oldest = await age(conn, await inbox.oldest_past(conn, name, before))
        report.append(Purged("inbox", name, target.database, target.inbox_retention, before,
                             count, rows_estimate=rows, bytes=size,
                             oldest_age_seconds=oldest))  # fmt: skip
    report += await purge_tables(settings, topology, batch=batch, dry_run=dry_run, only=only)
    return report


async def purge_forever(
    settings: CommonSettings,
    every: float,
    *,
    batch: int = DEFAULT_BATCH,
    only: str | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Purge now and then every ``every`` seconds until ``stop`` (or SIGTERM/SIGINT).

    A run that fails on the way (a server down, a connection lost) is logged and the next
    one comes at the next interval: rows past their retention only wait. A configuration
    error (an unknown scope, a login without its grants) ends the loop: no later run
    could succeed. With ``FERRY_HEALTH_PORT`` set, ``/metrics`` there serves each table's
    figures (:mod:`shared.ops.retention_metrics`) and ``/healthz``.
    """
    stop = stop or _stop_on_signals()
    role = RoleMetrics("retention", refresh_interval=settings.metrics_refresh_interval)
    metrics = RetentionMetrics(role)
    health = HealthServer(
        host=settings.health_host, port=settings.health_port or 0, checks={}, metrics=role
    )
    if settings.health_port:
        await health.start()
    try:
        while not stop.is_set():
            started = time.time()
            try:
                report = await purge(settings, batch=batch, only=only)
            except TransientError as exc:
                log.warning(
                    "purge failed; retrying at the next interval", extra={"error": str(exc)}
                )
            else:
                metrics.observe(report, started, time.time())
                for table in report:
                    log.info(table.line(False), extra=_log_fields(table))
            await sleep_unless(stop, every)
    finally:
        await health.stop()
    log.info("retention scheduler stopped")
    return 0


def _log_fields(table: Purged) -> dict[str, object]:
    fields: dict[str, object] = {"table": table.table, "scope": table.scope,
                                 "database": table.database, "purged": table.purged}  # fmt: skip
    for name in ("rows_estimate", "bytes", "oldest_age_seconds", "skipped"):
        value = getattr(table, name)
        if value not in (None, ""):
            fields[name] = value
    return fields


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop
