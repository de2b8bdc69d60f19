"""The handler contract as a dispatcher: routes by event, the claim, statuses.

A :class:`Handler` owns an asyncpg pool on the handler's *own* database. One call runs:

1. parse the request (envelope, ``delivery``, ``Idempotency-Key``) — a malformed one is
   400; look up the route by ``(event_type, event_version)`` — none is 422
   ``UNKNOWN_EVENT``; check the payload against its JSON Schema with the inbox-consumer's
   own validator (jsonschema, Draft 2020-12) and build the route's typed model — a
   failure is 422 ``SCHEMA_INVALID``; run the hooks (a hook may answer instead);
2. in ONE transaction: claim the message id in ``handler_applied`` (taken: 409, nothing
   changed), run the route on the same connection, commit — 200. A route marked
   :func:`one_statement` returns its effect as a :class:`Statement` instead, and the
   claim and the effect go as one statement (one round trip);
3. a route that raises rolls everything back, claim included, and its exception picks the
   answer: :class:`~shared.sdk.outcomes.Reject` (any ``PoisonError``) and a value no
   column can hold → 422; :class:`~shared.sdk.outcomes.Retry`, a lost connection, a
   serialization failure or a deadlock → 503; :class:`~shared.sdk.outcomes.GiveUp` →
   500 ``retryable: false``; anything else → 500 (retried, logged with its traceback).

With ``ledger=True`` every decided call is also recorded in ``handler_calls`` with its
answer (:mod:`shared.sdk.store`). Every error becomes a status here and nowhere else.

A batch call (header ``Ferry-Batch``, :mod:`shared.domain.batch_call`) is answered 200
with one result per event, each the status its event would get alone. By default each
event runs as above, one after the other, in its own transaction. With
``batch_transaction=True`` the batch is applied in ONE transaction, its events in the order
of their aggregates (stable: one aggregate's events keep their order), so concurrent batches
take their locks in one order: first all at once
(every id claimed in one statement, then the routes: consecutive one-statement routes of
one SQL text travel as one pipelined ``executemany``, so a batch of one event type takes
about 3 round trips in all, however many events it carries); should an
id have been applied before or a route raise, that attempt is rolled back and the batch
goes again event by event, each under a savepoint (claim and route; an event that fails
rolls back to its savepoint, its claim and effect only, and the others go on), one commit
for all. A duplicate is a 409 for that event
only. Should the commit fail (or the connection drop), nothing of the batch committed and
the whole call is answered 503: every event is retried.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import asyncpg
from asyncpg.exceptions._base import DataError as ArgumentDataError
from pydantic import BaseModel, ValidationError

from shared.adapters.postgres import CONNECTION_ERRORS, Conn, Statement
from shared.contracts.events import MAX_REPORTED, ONE_STATEMENT_MARK, AcceptedEvents
from shared.contracts.topology import EventSpec, Topology
from shared.domain.batch_call import (
    BATCH_HEADER,
    MalformedBatch,
    batch_answer_document,
    parse_batch_request,
    result_entry,
)
from shared.domain.errors import ConfigurationError, PoisonError, TransientError

from . import store
from .outcomes import GiveUp, Outcome, Retry
from .request import (
    IDEMPOTENCY_HEADER,
    TRACEPARENT_HEADER,
    Call,
    CallIds,
    MalformedRequest,
    call_ids,
    document_ids,
    parse_call,
    parse_call_document,
)

log = logging.getLogger("ferry.handlers")

RouteKey = tuple[str, int]
#: A route applies one event's state change on ``conn``, inside the claiming transaction.
Route = Callable[[Conn, Call[Any]], Awaitable[None]]
#: A route that builds its effect without a connection, marked with :func:`one_statement`.
StatementRoute = Callable[[Call[Any]], Statement]
AnyRoute = Route | StatementRoute
R = TypeVar("R", bound=Callable[..., Any])

#: Seconds to wait for a pooled connection; below the consumer's handler timeouts (10 s+)
#: so a saturated pool answers 503 instead of letting the consumer time out blind.
ACQUIRE_TIMEOUT = 5.0
#: Seconds :meth:`Handler.ready` allows for its ``SELECT 1``.
READY_TIMEOUT = 2.0
#: Most events one batch call may carry (the topology's ``handler.batch`` limit).
MAX_BATCH = 1000
#: Tries of a batch transaction all at once that lost a lock race (a deadlock between
#: two batches updating the same rows in another order) before going event by event.
AT_ONCE_TRIES = 3
#: What :meth:`Handler._apply_at_once` returns when it lost such a race.
LOST_RACE = "lost a lock race"
LOCK_RACES: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
)

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


def one_statement(route: R) -> R:
    """Mark ``route`` (``def f(call) -> Statement``) as giving its effect as one statement.

    The handler then sends claim and effect as ONE statement — one round trip and its own
    transaction — instead of a transaction of several round trips: the choice for a route
    whose effect is one statement. One that needs several, or reads before it writes,
    stays an ``async def f(conn, call)``.
    """
    setattr(route, ONE_STATEMENT_MARK, True)
    return route


def is_one_statement(route: Callable[..., Any]) -> bool:
    """Whether ``route`` was marked with :func:`one_statement`."""
    return bool(getattr(route, ONE_STATEMENT_MARK, False))


class Hook(Protocol):
    """Runs on every well-formed call before the claim (Ferry's fault injection is one)."""

    def prepare(self, call: Call[Any]) -> Call[Any]:
        """The call to process (maybe another view of its payload); may raise ``Reject``."""

    async def before(self, call: Call[Any]) -> Outcome | None:
        """An answer to give instead of processing the call, or None to process it."""


@dataclass(frozen=True, slots=True)
class _Prepared:
    call: Call[Any]
    route: AnyRoute


class Handler:
    """Idempotent dispatch of ``POST /handle`` calls to routes, on one database.

    ``name`` keys the claims (two handlers may share a database). ``schemas`` maps
    ``(event_type, version)`` to the payload's JSON Schema; ``models`` to its pydantic
    model (both are in the module :mod:`shared.sdk.models` generates). ``tables`` is DDL
    :meth:`install` runs after the claim table. ``pool`` may be given later
    (:meth:`bind`), e.g. in an ASGI lifespan.
    """

    def __init__(
        self,
        name: str,
        *,
        pool: asyncpg.Pool | None = None,
        schemas: Mapping[RouteKey, Mapping[str, Any] | None] | None = None,
        models: Mapping[RouteKey, type[BaseModel]] | None = None,
        tables: Sequence[str] = (),
        ledger: bool = False,
        hooks: Sequence[Hook] = (),
        batch_transaction: bool = False,
    ) -> None:
        if not store.IDENTIFIER.fullmatch(name):
            raise ConfigurationError(f"handler name {name!r} must be snake_case")
        self.name = name
        self._pool = pool
        self._routes: dict[RouteKey, AnyRoute] = {}
        self._models: dict[RouteKey, type[BaseModel]] = dict(models or {})
        # The consumer's own validators: one schema dialect, one reason code, so the
        # handler refuses exactly the payloads the consumer dead-letters.
        self._schemas = AcceptedEvents(dict(schemas or {}))
        self.tables = tuple(tables)
        self.ledger = ledger
        self.hooks = tuple(hooks)
        #: Apply a batch call's events in one transaction (a savepoint each).
        self.batch_transaction = batch_transaction
        self.installed = False

    # --- configuration ----------------------------------------------------------------

    def route(
        self, event_type: str, version: int, *, model: type[BaseModel] | None = None
    ) -> Callable[[R], R]:
        """Decorator: ``fn`` handles ``event_type`` v``version`` (payload typed by ``model``)."""

        def register(fn: R) -> R:
            self.add_route((event_type, version), fn, model=model)
            return fn

        return register

    def add_route(
        self, key: RouteKey, fn: Callable[..., Any], *, model: type[BaseModel] | None = None
    ) -> None:
        """Route ``key`` to ``fn``; a second route for one key is a configuration error."""
        if key in self._routes and self._routes[key] is not fn:
            raise ConfigurationError(f"{key[0]}.v{key[1]} already has a route in {self.name!r}")
        self._routes[key] = cast(AnyRoute, fn)
        if model is not None:
            self._models[key] = model

    @property
    def routes(self) -> Mapping[RouteKey, AnyRoute]:
        """The routing table."""
        return dict(self._routes)

    def bind(self, pool: asyncpg.Pool) -> None:
        """Use ``pool`` for the claims and the routes."""
        self._pool = pool

    @property
    def pool(self) -> asyncpg.Pool:
        """The pool (a :class:`ConfigurationError` until one is bound)."""
        if self._pool is None:
            raise ConfigurationError(f"handler {self.name!r} has no database pool: bind() one")
        return self._pool

    async def install(self) -> None:
        """Create the claim table (and the ledger) and :attr:`tables`, idempotently."""
        async with self.pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
            await store.install(conn, self.tables, ledger=self.ledger)
        self.installed = True

    async def ready(self) -> bool:
        """Whether the database answers (and :meth:`install` ran, if it is ever run)."""
        if self._pool is None:
            return False
        try:
            async with asyncio.timeout(READY_TIMEOUT):
                async with self._pool.acquire() as conn:
                    await conn.fetchval("SELECT 1")
        except UNAVAILABLE:
            return False
        return True

    # --- one call ---------------------------------------------------------------------

    async def handle(self, body: bytes, headers: Mapping[str, str]) -> Outcome:
        """Answer one ``POST /handle`` (the signature is the adapter's to check first)."""
        if headers.get(BATCH_HEADER) is not None:
            return await self.handle_batch(body)
        prepared: _Prepared | PoisonError
        try:
            prepared = self.prepare(body, headers)
        except PoisonError as exc:
            prepared = exc
        if isinstance(prepared, _Prepared):
            call = prepared.call
            ids = CallIds(uuid.UUID(call.message_id), call.delivery.attempt)
        else:
            ids = call_ids(body, headers)
        return await self._answer_safely(prepared, ids)

    async def _answer_safely(self, prepared: _Prepared | PoisonError, ids: CallIds) -> Outcome:
        """:meth:`_answer`, a database that is away answered 503 (retried)."""
        try:
            outcome = await self._answer(prepared, ids)
        except UNAVAILABLE as exc:
            # No connection, or the ledger row could not be written (and no effect may
            # happen without one), or the commit's answer was lost. A retry is safe in
            # every case: an effect that did commit answers the retry with 409.
            log.warning("database unavailable: %s", exc, extra={"message_id": ids.message_id})
            return Outcome.retry(f"database unavailable: {exc}")
        self._log(outcome, ids.message_id)
        return outcome

    def prepare(self, body: bytes, headers: Mapping[str, str]) -> _Prepared:
        """Parse and check a call up to the claim; :class:`PoisonError` when it cannot
        be applied (:class:`MalformedRequest` when the request itself is wrong)."""
        return self._checked(parse_call(body, headers))

    def _checked(self, call: Call[dict[str, Any]]) -> _Prepared:
        route = self._routes.get(call.route_key)
        if route is None:
            event_type, version = call.route_key
            raise PoisonError(
                "UNKNOWN_EVENT",
                f"unknown event type/version {event_type}.v{version} for handler {self.name!r}",
            )
        self.check_payload(call.route_key, call.payload)
        for hook in self.hooks:
            call = hook.prepare(call)
        model = self._models.get(call.route_key)
        if model is not None:
            call = call.with_payload(typed_payload(model, call.route_key, call.payload))
        return _Prepared(call, route)

    # --- a batch call ------------------------------------------------------------------

    async def handle_batch(self, body: bytes) -> Outcome:
        """Answer a batch call: 200 with one result per event (400 when the batch itself
        is malformed; 503 when a batch transaction could not commit)."""
        try:
            events = parse_batch_request(body, limit=MAX_BATCH)
        except MalformedBatch as exc:
            return Outcome.bad_request(exc.reason_code, exc.detail)
        items: list[tuple[_Prepared | PoisonError, CallIds]] = []
        for doc in events:
            item = self._prepare_event(doc)
            if item[1].message_id is None:
                # No id to answer for: the consumer sees no result and retries it.
                log.warning("batch event without a readable message_id: no result")
                continue
            items.append(item)
        if self.batch_transaction:
            outcomes = await self._batch_in_one_transaction(items)
            if isinstance(outcomes, Outcome):
                return outcomes  # nothing committed: the whole call is retried
        else:
            outcomes = [await self._answer_safely(prepared, ids) for prepared, ids in items]
        results = []
        for (_, ids), outcome in zip(items, outcomes, strict=True):
            if self.batch_transaction:
                self._log(outcome, ids.message_id)
            results.append(batch_result(str(ids.message_id), outcome))
        return Outcome(200, batch_answer_document(results))

    def _prepare_event(self, doc: Any) -> tuple[_Prepared | PoisonError, CallIds]:
        """One event of a batch (from :func:`parse_batch_request`), checked as a call of
        its own would be."""
        headers: dict[str, str] = {}
        if isinstance(doc, dict):
            if isinstance(doc.get("message_id"), str):
                headers[IDEMPOTENCY_HEADER] = doc["message_id"]
            if isinstance(doc.get("traceparent"), str):
                headers[TRACEPARENT_HEADER] = doc["traceparent"]
        ids = document_ids(doc, headers)
        try:
            if not isinstance(doc, dict):
                raise MalformedRequest("MALFORMED_ENVELOPE", "a batch event is a JSON object")
            prepared = self._checked(parse_call_document(doc, headers, sound=True))
        except PoisonError as exc:
            return exc, ids
        call = prepared.call
        return prepared, CallIds(uuid.UUID(call.message_id), call.delivery.attempt)

    async def _batch_in_one_transaction(
        self, items: list[tuple[_Prepared | PoisonError, CallIds]]
    ) -> list[Outcome] | Outcome:
        """The events' answers, their effects committed together; or the one answer to
        give the whole call when nothing could be committed."""
        answers: dict[int, Outcome] = {}
        applying: list[tuple[int, _Prepared]] = []
        for index, (prepared, _) in enumerate(items):
            early = await self._before_claim(prepared)
            if early is not None:
                answers[index] = early
            else:
                assert isinstance(prepared, _Prepared)
                applying.append((index, prepared))
        # One lock order for concurrent batches: by aggregate (a stable sort, so events of
        # one aggregate keep their stream order). Effects keyed by their aggregate then
        # wait for each other instead of deadlocking.
        applying.sort(key=lambda item: _aggregate(item[1].call))
        try:
            async with self.pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
                batch = store.BatchTransaction(conn, handler=self.name)
                try:
                    at_once = None
                    for _ in range(AT_ONCE_TRIES):
                        at_once = await self._apply_at_once(batch, applying)
                        if at_once is not LOST_RACE:
                            break
                    if isinstance(at_once, dict):
                        answers.update(at_once)
                    else:  # a duplicate or a failing event: one savepoint per event
                        for index, prepared in applying:
                            answers[index] = await self._apply_in_batch(batch, prepared)
                    calls = [
                        (ids.message_id, ids.attempt, answers[index].status)
                        for index, (_, ids) in enumerate(items)
                    ]
                    await batch.commit(calls if self.ledger else [])
                except BaseException:
                    await batch.abort()
                    raise
        except UNAVAILABLE as exc:
            log.warning("batch not committed, database unavailable: %s", exc)
            return Outcome.retry(f"database unavailable: {exc}")
        except Exception as exc:
            log.error("batch not committed", exc_info=exc)
            return Outcome.failed(f"batch not committed: {type(exc).__name__}: {exc}")
        return [answers[index] for index in range(len(items))]

    async def _before_claim(self, prepared: _Prepared | PoisonError) -> Outcome | None:
        """The answer of an event decided before any claim (poison, a hook's), or None."""
        if isinstance(prepared, PoisonError):
            return answer_poison(prepared)
        for hook in self.hooks:
            forced = await hook.before(prepared.call)
            if forced is not None:
                return forced
        return None

    async def _apply_at_once(
        self, batch: store.BatchTransaction, applying: list[tuple[int, _Prepared]]
    ) -> dict[int, Outcome] | str | None:
        """The common case in a few round trips: claim every id in one statement, run the
        routes (pipelined where they are one-statement routes of one SQL text), no
        savepoints. None (everything rolled back) when an id was applied before or a route
        raised: the caller then goes event by event under savepoints;
        :data:`LOST_RACE` (rolled back) when the transaction lost a lock race to another
        (a deadlock between two batches touching the same rows): the caller tries again."""
        if not applying:
            return {}
        ids = [uuid.UUID(prepared.call.message_id) for _, prepared in applying]
        try:
            claimed = await batch.claim_all(ids)
        except LOCK_RACES:
            await batch.abort()
            return LOST_RACE
        if not claimed:
            await batch.abort()
            return None
        try:
            for run in _statement_runs([prepared for _, prepared in applying]):
                await _execute_run(batch.conn, run)
        except CONNECTION_ERRORS:
            raise  # the transaction is gone: nothing of the batch commits
        except LOCK_RACES:
            await batch.abort()
            return LOST_RACE
        except Exception:
            await batch.abort()
            return None
        return {index: Outcome.processed(prepared.call.message_id) for index, prepared in applying}

    async def _run_route(self, conn: Conn, prepared: _Prepared) -> None:
        """The route's effect on ``conn`` (a one-statement route's statement, executed)."""
        if is_one_statement(prepared.route):
            statement = cast(StatementRoute, prepared.route)(prepared.call)
            await conn.execute(statement.sql, *statement.args)
        else:
            await cast(Route, prepared.route)(conn, prepared.call)

    async def _apply_in_batch(self, batch: store.BatchTransaction, prepared: _Prepared) -> Outcome:
        """Claim and route one event under its savepoint; a failure rolls back to it."""
        message_id = prepared.call.message_id
        mid = uuid.UUID(message_id)
        if not await batch.claim(mid):
            moment = await store.applied_at(batch.conn, handler=self.name, message_id=mid)
            return Outcome.duplicate(message_id, moment)
        try:
            await self._run_route(batch.conn, prepared)
        except CONNECTION_ERRORS:
            raise  # the transaction is gone: nothing of the batch commits
        except Exception as exc:
            await batch.undo()
            return self._failed(exc, message_id)
        return Outcome.processed(message_id)

    def check_payload(self, key: RouteKey, payload: object) -> None:
        """Raise ``SCHEMA_INVALID`` (a 422) unless ``payload`` fits the schema of ``key``:
        the inbox-consumer's verdict and wording (:class:`AcceptedEvents`)."""
        problem = self._schemas.payload_error(key, payload)
        if problem is not None:
            raise PoisonError("SCHEMA_INVALID", problem)

    async def _answer(self, prepared: _Prepared | PoisonError, ids: CallIds) -> Outcome:
        if isinstance(prepared, PoisonError):
            return await self._without_effect(answer_poison(prepared), ids)
        for hook in self.hooks:
            forced = await hook.before(prepared.call)
            if forced is not None:
                return await self._without_effect(forced, ids)
        async with self.pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
            if is_one_statement(prepared.route):
                return await self._apply_one_statement(conn, prepared, ids)
            return await self._apply(conn, prepared, ids)

    async def _without_effect(self, outcome: Outcome, ids: CallIds) -> Outcome:
        """An answer decided before any claim; recorded alone when there is a ledger."""
        if self.ledger:
            async with self.pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
                await store.log_call(
                    conn,
                    handler=self.name,
                    message_id=ids.message_id,
                    attempt=ids.attempt,
                    status=outcome.status,
                )
        return outcome

    async def _apply(self, conn: Conn, prepared: _Prepared, ids: CallIds) -> Outcome:
        """Claim, route (and record) in one transaction; a failure rolls all back."""
        route = cast(Route, prepared.route)
        message_id = prepared.call.message_id
        mid = uuid.UUID(message_id)
        try:
            if not await store.begin_and_claim(conn, handler=self.name, message_id=mid):
                outcome = await self._duplicate(conn, mid)
            else:
                await route(conn, prepared.call)
                outcome = Outcome.processed(message_id)
            await store.log_and_commit(
                conn,
                handler=self.name,
                message_id=mid,
                attempt=ids.attempt,
                status=outcome.status,
                ledger=self.ledger,
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
                ledger=self.ledger,
            )
        except UNAVAILABLE as exc:
            # Nothing committed; the answer stands. A ledger misses a call without effect.
            log.warning("call not recorded after rollback: %s", exc)
        return outcome

    async def _apply_one_statement(self, conn: Conn, prepared: _Prepared, ids: CallIds) -> Outcome:
        """Claim, effect (and 200 ledger row) as one statement; any other answer is
        recorded on its own afterwards (nothing else committed)."""
        route = cast(StatementRoute, prepared.route)
        message_id = prepared.call.message_id
        mid = uuid.UUID(message_id)
        try:
            statement = route(prepared.call)
            if await store.claim_apply_log(
                conn,
                statement.sql,
                statement.args,
                handler=self.name,
                message_id=mid,
                attempt=ids.attempt,
                ledger=self.ledger,
            ):
                return Outcome.processed(message_id)
            outcome = await self._duplicate(conn, mid)
        except Exception as exc:
            outcome = self._failed(exc, message_id)
        if not self.ledger:
            return outcome
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
            return answer_poison(exc)
        if isinstance(exc, Retry | GiveUp):
            return exc.outcome
        if isinstance(exc, UNSTORABLE):
            return Outcome.reject("UNSTORABLE_VALUE", f"payload cannot be stored: {exc}")
        if isinstance(exc, UNAVAILABLE):
            return Outcome.retry(f"transient failure: {exc}")
        # The HTTP boundary: an unexpected error is still an answer (5xx, retried).
        log.error("route failed", exc_info=exc, extra={"message_id": message_id})
        return Outcome.failed(f"{type(exc).__name__}: {exc}")

    async def _duplicate(self, conn: Conn, message_id: uuid.UUID) -> Outcome:
        moment = await store.applied_at(conn, handler=self.name, message_id=message_id)
        return Outcome.duplicate(str(message_id), moment)

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


#: A stretch of a batch's effects, in order: one-statement routes' statements sharing one
#: SQL text (executed as one pipelined ``executemany``), or one route of another kind.
EffectRun = list[Statement] | _Prepared


def _statement_runs(prepared: Sequence[_Prepared]) -> list[EffectRun]:
    """The batch's effects in their order, consecutive statements of one SQL text gathered.

    Building a statement may raise (a route refusing its payload): it raises here, before
    anything of the batch ran, and the caller goes event by event.
    """
    runs: list[EffectRun] = []
    for item in prepared:
        if not is_one_statement(item.route):
            runs.append(item)
            continue
        statement = cast(StatementRoute, item.route)(item.call)
        last = runs[-1] if runs else None
        if isinstance(last, list) and last[0].sql == statement.sql:
            last.append(statement)
        else:
            runs.append([statement])
    return runs


async def _execute_run(conn: Conn, run: EffectRun) -> None:
    """Execute one stretch: N statements of one SQL text in one round trip (asyncpg
    pipelines ``executemany``'s executions and stops at the first error), or a route."""
    if isinstance(run, _Prepared):
        await cast(Route, run.route)(conn, run.call)
    elif len(run) == 1:
        await conn.execute(run[0].sql, *run[0].args)
    else:
        await conn.executemany(run[0].sql, [statement.args for statement in run])


def _aggregate(call: Call[Any]) -> tuple[str, str]:
    return call.envelope.aggregate_type, call.envelope.aggregate_id


def batch_result(message_id: str, outcome: Outcome) -> dict[str, Any]:
    """``outcome`` as one event's result in a batch answer (the error body for a 4xx or
    5xx, ``Retry-After`` as ``retry_after`` seconds, ``retryable``)."""
    retry_after = None
    raw = outcome.headers.get("Retry-After")
    if raw is not None:
        try:
            retry_after = float(raw)
        except ValueError:
            retry_after = None
        if retry_after is not None and not (math.isfinite(retry_after) and retry_after >= 0):
            retry_after = None
    return result_entry(
        message_id,
        outcome.status,
        retry_after=retry_after,
        retryable=outcome.retryable,
        error=outcome.body if outcome.status >= 400 else None,
    )


def answer_poison(exc: PoisonError) -> Outcome:
    """400 for a malformed request, 422 for an event that can never be applied."""
    if isinstance(exc, MalformedRequest):
        return Outcome.bad_request(exc.reason_code, exc.detail)
    return Outcome.reject(exc.reason_code, exc.detail)


def typed_payload(model: type[BaseModel], key: RouteKey, payload: object) -> BaseModel:
    """``payload`` as ``model``; a payload the model refuses is ``SCHEMA_INVALID``."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        problems = [
            "payload"
            + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"])
            + f": {e['msg']}"
            for e in exc.errors()
        ]
        shown = "; ".join(problems[:MAX_REPORTED])
        raise PoisonError("SCHEMA_INVALID", f"{key[0]}.v{key[1]}: {shown}") from None


def handled_events(topology: Topology, context: str) -> dict[RouteKey, EventSpec]:
    """Events ``topology`` sends to ``context`` (handled by a durable targeting it)."""
    durables = {name for name, d in topology.durables.items() if d.target == context}
    return {
        (event.type, event.version): event
        for event in topology.events
        if durables.intersection(event.handled_by)
    }


def topology_schemas(topology: Topology, context: str) -> dict[RouteKey, Mapping[str, Any]]:
    """The payload schemas of the events ``topology`` sends to ``context``."""
    return {
        key: event.payload_schema
        for key, event in handled_events(topology, context).items()
        if event.payload_schema is not None
    }
