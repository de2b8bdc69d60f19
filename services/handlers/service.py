"""The handler framework: a routing table, real idempotency and an effects ledger.

A :class:`HandlerService` owns an asyncpg pool on its *own* context's database. One
call runs like this:

1. parse and check the request (envelope, delivery, ``Idempotency-Key``), look up the
   route by ``(event_type, event_version)``, validate the payload against the
   topology's schema with the inbox-consumer's own validator (jsonschema, Draft 2020-12,
   reason ``SCHEMA_INVALID``), read the fault directives when fault injection is on
   (:mod:`services.handlers.faults`); anything wrong is a 422;
2. unless a fault directive answers instead, in ONE transaction: claim the id in
   ``handler_applied`` (a conflict means 409, already processed), run the route on
   the same connection, record the call in ``handler_calls`` with its answer, commit —
   200 (three round trips, see :mod:`services.handlers.store`). A route marked
   :func:`one_statement` returns its effect as a :class:`Statement` instead, and the
   claim, the effect and the ledger row go as one statement (one round trip);
3. a route that fails rolls everything back and the call is recorded with the status
   it answers; a poison or injected answer is recorded alone (autocommit). If the
   ledger row cannot be written, no effect commits: 503.

Every error is mapped to a status here and nowhere else: poison and unstorable data
→ 422, database unavailability and :class:`TransientError` → 503, anything else → 500
(still retried by the consumer, and logged with its traceback).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import asyncpg
from asyncpg.exceptions._base import DataError as ArgumentDataError

from shared.adapters.postgres import CONNECTION_ERRORS, Conn, Statement
from shared.contracts.events import ONE_STATEMENT_MARK, AcceptedEvents
from shared.contracts.topology import EventSpec, Topology
from shared.domain.envelope import format_timestamp
from shared.domain.errors import ConfigurationError, PoisonError, TransientError

from . import store
from .faults import NO_FAULTS, Faults, parse_faults
from .request import CallIds, HandleRequest, call_ids, parse_request

log = logging.getLogger("ferry.handlers")

#: A route applies one event's state change on ``conn``, inside the claiming transaction.
#: It raises :class:`PoisonError` for an event that can never be applied.
Route = Callable[[Conn, HandleRequest], Awaitable[None]]
RouteKey = tuple[str, int]


#: A route that builds its effect without a connection; it raises :class:`PoisonError`
#: for an event that can never be applied. Marked with :func:`one_statement`.
StatementRoute = Callable[[HandleRequest], Statement]
_ONE_STATEMENT = ONE_STATEMENT_MARK


def one_statement(route: StatementRoute) -> StatementRoute:
    """Mark ``route`` as giving its effect as one :class:`Statement`.

    The service then sends claim, effect and ledger row as ONE statement — one round trip
    and its own transaction — instead of a transaction of three round trips: the choice
    for a route whose effect is one statement (most are). A route that needs several
    statements, or reads before it writes, stays a :data:`Route`.
    """
    setattr(route, _ONE_STATEMENT, True)
    return route


def is_one_statement(route: Route | StatementRoute) -> bool:
    """Whether ``route`` was marked with :func:`one_statement`."""
    return bool(getattr(route, _ONE_STATEMENT, False))


#: Seconds to wait for a pooled connection; below the topology's handler timeouts (10s+)
#: so a saturated pool answers 503 instead of letting the consumer time out blind.
ACQUIRE_TIMEOUT = 5.0
#: Seconds /readyz allows for its ``SELECT 1``.
READY_TIMEOUT = 2.0

#: The payload (not the database) is at fault: a value no column can hold. Client-side
#: argument encoding errors subclass InterfaceError, so they must be caught first.
UNSTORABLE: tuple[type[BaseException], ...] = (asyncpg.exceptions.DataError, ArgumentDataError)
#: Worth retrying as is: the database is away, busy or lost a race.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    *CONNECTION_ERRORS,
    TransientError,
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.QueryCanceledError,
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a call answers: status, JSON body (None for none) and extra headers."""

    status: int
    body: dict[str, Any] | None
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def poison(cls, exc: PoisonError) -> Outcome:
        """422 naming what is wrong."""
        return cls(422, {"error": str(exc), "reason_code": exc.reason_code})

    @classmethod
    def unavailable(cls, detail: str) -> Outcome:
        """503: try again later."""
        return cls(503, {"error": detail})


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A concrete handler service: its context name, its own tables and its routes."""

    name: str
    tables: tuple[str, ...]
    routes: Mapping[RouteKey, Route | StatementRoute]


@dataclass(frozen=True, slots=True)
class _Call:
    """A call that passed every check and may change state."""

    request: HandleRequest
    route: Route | StatementRoute
    faults: Faults


class HandlerService:
    """Idempotent dispatch of handler calls to routes, on one context's database."""

    def __init__(
        self,
        *,
        name: str,
        pool: asyncpg.Pool,
        routes: Mapping[RouteKey, Route | StatementRoute],
        schemas: Mapping[RouteKey, Mapping[str, Any]] | None = None,
        tables: tuple[str, ...] = (),
        fault_injection: bool = False,
    ) -> None:
        if not store.IDENTIFIER.fullmatch(name):
            raise ConfigurationError(f"handler name {name!r} must be snake_case")
        self.name = name
        self._pool = pool
        self._routes = dict(routes)
        # The consumer's own validators (AcceptedEvents): one schema dialect, one reason
        # code, so the handler refuses exactly the payloads the consumer dead-letters.
        self._schemas = AcceptedEvents(dict(schemas or {}))
        self._tables = tables
        #: Whether ``_ferry_test`` directives are obeyed (off: the field is plain data).
        self.fault_injection = fault_injection
        self.installed = False

    async def install(self) -> None:
        """Create the bookkeeping tables and the service's own tables (idempotent)."""
        async with self._pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
            await store.install(conn, self._tables)
        self.installed = True

    async def ready(self) -> bool:
        """Whether the tables exist and the database answers."""
        if not self.installed:
            return False
        try:
            async with asyncio.timeout(READY_TIMEOUT):
                async with self._pool.acquire() as conn:
                    await conn.fetchval("SELECT 1")
        except UNAVAILABLE:
            return False
        return True

    async def handle(self, body: bytes, headers: Mapping[str, str]) -> Outcome:
        """Answer one ``POST /handle`` call (see the module docstring for the steps)."""
        call: _Call | PoisonError
        try:
            call = self._prepare(body, headers)
        except PoisonError as exc:
            call = exc
        if isinstance(call, _Call):
            await call.faults.pause()
            ids = CallIds(uuid.UUID(call.request.message_id), call.request.delivery.attempt)
        else:
            ids = call_ids(body, headers)
        try:
            async with self._pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
                outcome = await self._decide(conn, call, ids)
        except UNAVAILABLE as exc:
            # No connection, or the ledger row could not be written (and no effect may
            # happen without one), or the commit's answer was lost. A retry is safe in
            # every case: an effect that did commit answers the retry with 409.
            log.warning("database unavailable: %s", exc, extra={"message_id": ids.message_id})
            return Outcome.unavailable(f"database unavailable: {exc}")
        self._log(outcome, ids.message_id)
        return outcome

    def _prepare(self, body: bytes, headers: Mapping[str, str]) -> _Call:
        request = parse_request(body, headers)
        route = self._routes.get(request.route_key)
        if route is None:
            event_type, version = request.route_key
            raise PoisonError(
                "UNKNOWN_EVENT",
                f"unknown event type/version {event_type}.v{version} for handler {self.name!r}",
            )
        self.check_payload(request.route_key, request.payload)
        if not self.fault_injection:
            return _Call(request, route, NO_FAULTS)
        faults = parse_faults(request.payload)
        faults.check_poison()
        return _Call(dataclasses.replace(request, fault_injection=True), route, faults)

    def check_payload(self, key: RouteKey, payload: object) -> None:
        """Raise ``SCHEMA_INVALID`` (a 422) unless ``payload`` fits the schema of ``key``:
        the inbox-consumer's verdict and wording (:class:`AcceptedEvents`)."""
        problem = self._schemas.payload_error(key, payload)
        if problem is not None:
            raise PoisonError("SCHEMA_INVALID", problem)

    async def _decide(self, conn: Conn, call: _Call | PoisonError, ids: CallIds) -> Outcome:
        if isinstance(call, PoisonError):
            outcome = Outcome.poison(call)
        elif (forced := call.faults.forced(call.request.delivery.attempt)) is not None:
            outcome = Outcome(forced.status, {"error": forced.error}, forced.headers)
        else:
            return await self._apply(conn, call, ids)
        await store.log_call(
            conn,
            handler=self.name,
            message_id=ids.message_id,
            attempt=ids.attempt,
            status=outcome.status,
        )
        return outcome

    async def _apply(self, conn: Conn, call: _Call, ids: CallIds) -> Outcome:
        """Claim, route and record in one transaction; a failure rolls all three back."""
        if is_one_statement(call.route):
            return await self._apply_one_statement(conn, call, ids)
        route = cast(Route, call.route)
        message_id = call.request.message_id
        mid = uuid.UUID(message_id)
        try:
            if not await store.begin_and_claim(conn, handler=self.name, message_id=mid):
                outcome = await self._duplicate(conn, mid)
            else:
                await route(conn, call.request)
                outcome = Outcome(200, {"status": "processed", "message_id": message_id})
            await store.log_and_commit(
                conn,
                handler=self.name,
                message_id=mid,
                attempt=ids.attempt,
                status=outcome.status,
            )
            return outcome
        except Exception as exc:
            outcome = self._failed(exc, message_id)
        try:
            await store.rollback_and_log(
                conn,
                handler=self.name,
                message_id=mid,
                attempt=ids.attempt,
                status=outcome.status,
            )
        except UNAVAILABLE as exc:
            # Nothing committed; the answer stands. The ledger misses a call that had no effect.
            log.warning("call not recorded after rollback: %s", exc)
        return outcome

    async def _apply_one_statement(self, conn: Conn, call: _Call, ids: CallIds) -> Outcome:
        """Claim, effect and 200 ledger row as one statement; any other answer is
        recorded on its own afterwards (nothing else committed)."""
        route = cast(StatementRoute, call.route)
        message_id = call.request.message_id
        mid = uuid.UUID(message_id)
        try:
            statement = route(call.request)
            if await store.claim_apply_log(
                conn,
                statement.sql,
                statement.args,
                handler=self.name,
                message_id=mid,
                attempt=ids.attempt,
            ):
                return Outcome(200, {"status": "processed", "message_id": message_id})
            outcome = await self._duplicate(conn, mid)
        except Exception as exc:
            outcome = self._failed(exc, message_id)
        try:
            await store.log_call(
                conn, handler=self.name, message_id=mid, attempt=ids.attempt, status=outcome.status
            )
        except UNAVAILABLE as exc:
            if outcome.status == 409:
                raise  # a 409 always has its ledger row, as in the transaction's form
            log.warning("call not recorded: %s", exc)
        return outcome

    def _failed(self, exc: Exception, message_id: str) -> Outcome:
        """The answer to a route (or claim) that raised; nothing of it committed."""
        if isinstance(exc, PoisonError):
            return Outcome.poison(exc)
        if isinstance(exc, UNSTORABLE):
            unstorable = PoisonError("UNSTORABLE_VALUE", f"payload cannot be stored: {exc}")
            return Outcome.poison(unstorable)
        if isinstance(exc, UNAVAILABLE):
            return Outcome.unavailable(f"transient failure: {exc}")
        # The HTTP boundary: an unexpected error is still an answer (5xx, retried).
        log.error("route failed", exc_info=exc, extra={"message_id": message_id})
        return Outcome(500, {"error": f"{type(exc).__name__}: {exc}"})

    async def _duplicate(self, conn: Conn, message_id: uuid.UUID) -> Outcome:
        moment = await store.applied_at(conn, handler=self.name, message_id=message_id)
        body: dict[str, Any] = {"status": "already_processed", "message_id": str(message_id)}
        if moment is not None:
            body["applied_at"] = format_timestamp(moment)
        return Outcome(409, body)

    def _log(self, outcome: Outcome, message_id: object) -> None:
        if outcome.status == 200:
            return
        level = logging.WARNING if outcome.status >= 500 else logging.INFO
        detail = (outcome.body or {}).get("error") or (outcome.body or {}).get("status")
        log.log(
            level,
            "answered %s: %s",
            outcome.status,
            detail,
            extra={"message_id": str(message_id) if message_id else None, "handler": self.name},
        )


def handled_events(topology: Topology, context: str) -> dict[RouteKey, EventSpec]:
    """Events the topology sends to ``context`` (handled by a durable targeting it)."""
    durables = {name for name, d in topology.durables.items() if d.target == context}
    return {
        (event.type, event.version): event
        for event in topology.events
        if durables.intersection(event.handled_by)
    }


def build_service(
    spec: ServiceSpec, *, pool: asyncpg.Pool, topology: Topology, fault_injection: bool = False
) -> HandlerService:
    """A :class:`HandlerService` for ``spec``, checked against and schema-fed by ``topology``.

    Refuses (:class:`ConfigurationError`) a topology that sends this context an event the
    service has no route for. ``fault_injection`` turns the ``_ferry_test`` directives on.
    """
    topology.context(spec.name)
    expected = handled_events(topology, spec.name)
    missing = sorted(set(expected) - set(spec.routes))
    if missing:
        names = ", ".join(f"{event_type}.v{version}" for event_type, version in missing)
        raise ConfigurationError(
            f"topology {topology.name!r} sends {names} to context {spec.name!r}, "
            f"but the {spec.name} handler has no route for it"
        )
    schemas = {
        key: event.payload_schema
        for key, event in expected.items()
        if event.payload_schema is not None
    }
    return HandlerService(
        name=spec.name,
        pool=pool,
        routes=spec.routes,
        schemas=schemas,
        tables=spec.tables,
        fault_injection=fault_injection,
    )
