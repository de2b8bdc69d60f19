"""The console's overview: per context its outbox backlog, per durable its inbox
backlog, lag, recent processing, retries, dead letters and parked keys, read with the
console's own login.

The figures are the ones the roles export as metrics and the CLI prints (QRY-050's
outbox backlog, QRY-051's inbox backlog, JetStream's consumer info for lag), read here
directly so the console needs no Prometheus. Every query is bounded by an index
(migrations 0001-0021): unpublished outbox rows (``idx_outbox_unpublished``), inbox rows
in play and dead-lettered ones (``idx_inbox_open``, ``idx_inbox_failed``), recent
processing (BRIN ``processed_at``), open dead letters (``idx_dead_letters_status``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp

from services.console.data import COUNTS, OPEN_STATUSES, durables_by_database
from shared.adapters import circuits, inbox, outbox, parked_queue, pauses, throttles
from shared.adapters.jetstream import NATS_FAILURES
from shared.adapters.lag import oldest_undelivered_age
from shared.adapters.nats import NatsClient
from shared.adapters.postgres import SERVER_ERRORS, Pool
from shared.contracts.topology import Topology
from shared.domain.pause import describe_until, parse_server_time

log = logging.getLogger("ferry.console")

#: A database read that failed: the server away (OSError) or refusing the statement;
#: the page shows the error instead of the numbers.
_UNREADABLE: tuple[type[BaseException], ...] = (OSError, *SERVER_ERRORS)
#: Seconds of processing the rate and the success ratio are computed over.
RATE_WINDOW = 300
#: A consumer process whose heartbeat is older than this is not counted (seconds).
CIRCUIT_ALIVE = 30.0
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

_DEAD_RECENT = """
SELECT count(*) FROM dead_letters
WHERE durable = $1 AND dead_lettered_at > now() - $2 * interval '1 second'
"""

#: Open dead letters by durable and reason: the failure groups' kept counts (migration
#: 0027, :data:`services.console.data.COUNTS`), not a count of the letters themselves.
_DEAD_BY_REASON = f"""
SELECT durable, reason_code, sum(count)::bigint AS count FROM ({COUNTS}) AS counts
GROUP BY durable, reason_code ORDER BY durable, sum(count) DESC
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
    #: Inbox rows still to be processed (received, processing or retrying): what waits.
    waiting: int = 0
    retrying: int = 0
    #: Inbox rows given up on (status 'failed': dead-lettered), shown apart from what waits.
    dead_lettered: int = 0
    oldest_at: str | None = None
    lag_messages: int | None = None
    lag_seconds: float | None = None
    rate: float = 0.0
    success_ratio: float | None = None
    dead_by_reason: list[tuple[str, int]] = field(default_factory=list)
    parked: dict[str, Any] | None = None
    error: str | None = None
    #: Paused (``ferry durable pause``): ``until resumed`` or ``until <time>``; None: not.
    paused: str | None = None
    #: Who paused it and why (the newest ``pause_actions`` row), when paused.
    paused_by: str | None = None
    #: Its consumer processes whose circuit breaker is open or half-open, of those live.
    circuit_open: int = 0
    circuit_live: int = 0
    #: Its consumer's liveness (``inbox-consumer-DURABLE`` in ``console_role_health``);
    #: None when the console is not told where that role's /healthz is.
    consumer: RoleView | None = None

    @property
    def consumer_down(self) -> bool:
        """Its consumer's /healthz did not answer: down, whatever the lag says yet."""
        return self.consumer is not None and not self.consumer.alive

    @property
    def dead_open(self) -> int:
        """Open dead letters (every reason)."""
        return sum(count for _, count in self.dead_by_reason)


#: The role name of a durable's consumer in ``console_role_health``.
CONSUMER_ROLE = "inbox-consumer-{durable}"


@dataclass
class RoleView:
    """One role's liveness on the overview: its ``/healthz`` answered 200, or why not."""

    name: str
    url: str
    alive: bool = False
    detail: str = ""


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
    #: Every role of ``console_role_health`` with its liveness, by name.
    roles: list[RoleView] = field(default_factory=list)


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
    topology: Topology,
    pools: dict[str, Pool],
    nc: NatsClient | None,
    health: dict[str, str] | None = None,
    health_timeout: float = 1.0,
) -> Overview:
    """The overview's figures: outboxes, durables (inbox, lag, rate, ratio, dead letters)
    and, for the roles of ``health`` (name → /healthz URL), their liveness."""
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
    roles = [RoleView(name, url) for name, url in sorted((health or {}).items())]
    for role in roles:
        for view in durables.values():
            if role.name == CONSUMER_ROLE.format(durable=view.name):
                view.consumer = role
    jobs.append(_read_liveness(roles, health_timeout))
    await asyncio.gather(*jobs)
    return Overview(
        topology.name,
        now,
        contexts,
        list(durables.values()),
        time.perf_counter() - started,
        roles,
    )


async def _read_liveness(roles: list[RoleView], timeout: float) -> None:
    """Each role's /healthz: 200 within ``timeout`` seconds is alive, anything else down."""
    if not roles:
        return
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:

        async def probe(role: RoleView) -> None:
            try:
                async with session.get(role.url, allow_redirects=False) as resp:
                    role.alive = resp.status == 200
                    role.detail = "alive" if role.alive else f"answered {resp.status}"
            except TimeoutError:
                role.detail = f"no answer within {timeout:g} s"
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                role.detail = f"unreachable ({_short_error(exc)})"

        await asyncio.gather(*(probe(role) for role in roles))


async def _read_outbox(
    topology: Topology, pools: dict[str, Pool], view: ContextView, now: datetime
) -> None:
    try:
        async with pools[topology.context(view.name).database].acquire() as conn:
            doc = await outbox.backlog(conn)
    except _UNREADABLE as exc:
        view.error = _short_error(exc)
        return
    view.backlog, view.failing, view.set_aside = doc["count"], doc["failing"], doc["set_aside"]
    view.oldest_age = _age(doc["oldest_at"], now)


async def _read_database(pool: Pool, views: list[DurableView]) -> None:
    try:
        async with pool.acquire() as conn:
            for view in views:
                doc = await inbox.backlog(conn, view.name)
                # QRY-051 counts every unprocessed row; a dead-lettered one waits for
                # nobody but an operator, so the overview shows it apart.
                view.waiting = doc["count"] - doc["failed"]
                view.oldest_at = doc["oldest_at"]
                view.retrying, view.dead_lettered = doc["retrying"], doc["failed"]
                processed = await conn.fetchval(_RECENT, view.name, RATE_WINDOW)
                dead = await conn.fetchval(_DEAD_RECENT, view.name, RATE_WINDOW)
                view.rate = processed / RATE_WINDOW
                judged = processed + dead + view.retrying
                view.success_ratio = processed / judged if judged else None
                if view.ordered:
                    view.parked = await parked_queue.summary(conn, view.name)
            rows = await conn.fetch(
                _DEAD_BY_REASON, [v.name for v in views], list(OPEN_STATUSES), None
            )
    except _UNREADABLE as exc:
        for view in views:
            view.error = _short_error(exc)
        return
    by_name = {v.name: v for v in views}
    for row in rows:
        by_name[row["durable"]].dead_by_reason.append((row["reason_code"], row["count"]))
    await _read_throttles(pool, by_name)
    await _read_pauses_and_breakers(pool, by_name)


async def _read_pauses_and_breakers(pool: Pool, by_name: dict[str, DurableView]) -> None:
    """Who paused each durable (its newest pause), and its replicas' circuit breakers (a
    database not migrated that far shows neither)."""
    try:
        async with pool.acquire() as conn:
            newest = await pauses.latest(conn, list(by_name))
            live = await circuits.circuits(conn, list(by_name), alive=CIRCUIT_ALIVE)
    except _UNREADABLE as exc:
        log.warning("pauses and circuit breakers not read: %s", _short_error(exc))
        return
    for name, view in by_name.items():
        action = newest.get(name)
        if action is not None and action["action"] == "pause":
            view.paused_by = f"{action['actor']}: {action['reason']}"
        rows = live.get(name, [])
        view.circuit_live = len(rows)
        view.circuit_open = sum(1 for r in rows if r["circuit"] in ("open", "half_open"))


async def _read_throttles(pool: Pool, by_name: dict[str, DurableView]) -> None:
    """Operators' throttle overrides replace the topology's value on the overview (a
    database not migrated that far just shows the topology's)."""
    try:
        async with pool.acquire() as conn:
            for override in await throttles.overrides(conn, list(by_name)):
                limit = override.limit()
                shown = limit.describe() if limit is not None else "no limit"
                by_name[override.durable].throttle = f"{shown}, override"
    except _UNREADABLE as exc:
        log.warning("throttle overrides not read: %s", _short_error(exc))


async def _read_lag(topology: Topology, nc: NatsClient | None, view: DurableView) -> None:
    """JetStream's lag of every consumer of the durable (its partitions summed)."""
    if nc is None or not nc.is_connected:
        view.error = view.error or "NATS is not connected"
        return
    js = nc.jetstream()
    spec = topology.durables[view.name]
    pending, oldest = 0, 0.0
    ends: list[datetime | None] = []
    plans = topology.consumers(view.name)
    try:
        for plan in plans:
            info = await js.consumer_info(spec.stream, plan.name, timeout=3)
            pending += (info.num_pending or 0) + (info.num_ack_pending or 0)
            if info.paused:
                ends.append(parse_server_time(info.config.pause_until))
            if info.num_pending:
                oldest = max(oldest, await oldest_undelivered_age(js, info))
    except NATS_FAILURES as exc:
        view.error = view.error or f"JetStream: {_short_error(exc)}"
        return
    view.lag_messages, view.lag_seconds = pending, oldest
    if ends:  # every partition's consumer, or some: a change that did not finish
        known = [e for e in ends if e is not None]
        view.paused = (
            describe_until(min(known) if known else None)
            if len(ends) == len(plans)
            else "partly: pause or resume it again"
        )


def _short_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
