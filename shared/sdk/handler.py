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
event runs as above, one after the other, in its own transaction; with
``batch_transaction=True`` the batch is applied in ONE transaction
(:mod:`.batch_transaction`). Routes and how a batch's effects are gathered are in
:mod:`.routes`; how an error becomes a status, in :mod:`.answers`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from pydantic import BaseModel

from shared.adapters.postgres import Conn, Pool
from shared.contracts.events import AcceptedEvents
from shared.domain.batch_call import (
    BATCH_HEADER,
    MalformedBatch,
    batch_answer_document,
    parse_batch_request,
)
from shared.domain.errors import ConfigurationError, PoisonError

from . import store
from .answers import (
    UNAVAILABLE,
    UNSTORABLE,
    answer_poison,
    batch_result,
    failure_answer,
    typed_payload,
)
from .batch_transaction import apply_in_one_transaction
from .outcomes import Outcome
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
from .routes import (
    ACQUIRE_TIMEOUT,
    AnyRoute,
    Hook,
    Prepared,
    R,
    Route,
    RouteKey,
    StatementRoute,
    is_one_statement,
    one_statement,
)

__all__ = [
    "ACQUIRE_TIMEOUT",
    "MAX_BATCH",
    "READY_TIMEOUT",
    "UNAVAILABLE",
    "UNSTORABLE",
    "AnyRoute",
    "Handler",
    "Hook",
    "Route",
    "RouteKey",
    "StatementRoute",
    "answer_poison",
    "batch_result",
    "is_one_statement",
    "one_statement",
    "typed_payload",
]

log = logging.getLogger("ferry.handlers")

#: Seconds :meth:`Handler.ready` allows for its ``SELECT 1``.
READY_TIMEOUT = 2.0
#: Most events one batch call may carry (the topology's ``handler.batch`` limit).
MAX_BATCH = 1000


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
        pool: Pool | None = None,
        schemas: Mapping[RouteKey, Mapping[str, Any] | None] | None = None,
        models: Mapping[RouteKey, type[BaseModel]] | None = None,
        tables: Sequence[str] = (),
        ledger: bool = False,
        hooks: Sequence[Hook] = (),
        batch_transaction: bool = False,
        purge_login: str | None = None,
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
        #: The retention role's login, granted the purge of old claims at :meth:`install`.
        self.purge_login = purge_login
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

    def bind(self, pool: Pool) -> None:
        """Use ``pool`` for the claims and the routes."""
        self._pool = pool

    @property
    def pool(self) -> Pool:
        """The pool (a :class:`ConfigurationError` until one is bound)."""
        if self._pool is None:
            raise ConfigurationError(f"handler {self.name!r} has no database pool: bind() one")
        return self._pool

    async def install(self) -> None:
        """Create the claim table (and the ledger) and :attr:`tables`, idempotently."""
        async with self.pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
            await store.install(conn, self.tables, ledger=self.ledger, purge_login=self.purge_login)
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
        prepared: Prepared | PoisonError
        try:
            prepared = self.prepare(body, headers)
        except PoisonError as exc:
            prepared = exc
        if isinstance(prepared, Prepared):
            call = prepared.call
            ids = CallIds(uuid.UUID(call.message_id), call.delivery.attempt)
        else:
            ids = call_ids(body, headers)
        return await self._answer_safely(prepared, ids)

    async def _answer_safely(self, prepared: Prepared | PoisonError, ids: CallIds) -> Outcome:
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

    def prepare(self, body: bytes, headers: Mapping[str, str]) -> Prepared:
        """Parse and check a call up to the claim; :class:`PoisonError` when it cannot
        be applied (:class:`MalformedRequest` when the request itself is wrong)."""
        return self._checked(parse_call(body, headers))

    def _checked(self, call: Call[dict[str, Any]]) -> Prepared:
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
        return Prepared(call, route)

    # --- a batch call ------------------------------------------------------------------

    async def handle_batch(self, body: bytes) -> Outcome:
        """Answer a batch call: 200 with one result per event (400 when the batch itself
        is malformed; 503 when a batch transaction could not commit)."""
        try:
            events = parse_batch_request(body, limit=MAX_BATCH)
        except MalformedBatch as exc:
            return Outcome.bad_request(exc.reason_code, exc.detail)
        items: list[tuple[Prepared | PoisonError, CallIds]] = []
        for doc in events:
            item = self._prepare_event(doc)
            if item[1].message_id is None:
                # No id to answer for: the consumer sees no result and retries it.
                log.warning("batch event without a readable message_id: no result")
                continue
            items.append(item)
        if self.batch_transaction:
            outcomes = await apply_in_one_transaction(
                items, pool=self.pool, handler=self.name, ledger=self.ledger, hooks=self.hooks
            )
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

    def _prepare_event(self, doc: Any) -> tuple[Prepared | PoisonError, CallIds]:
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

    def check_payload(self, key: RouteKey, payload: object) -> None:
        """Raise ``SCHEMA_INVALID`` (a 422) unless ``payload`` fits the schema of ``key``:
        the inbox-consumer's verdict and wording (:class:`AcceptedEvents`)."""
        problem = self._schemas.payload_error(key, payload)
        if problem is not None:
            raise PoisonError("SCHEMA_INVALID", problem)

    async def _answer(self, prepared: Prepared | PoisonError, ids: CallIds) -> Outcome:
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

    async def _apply(self, conn: Conn, prepared: Prepared, ids: CallIds) -> Outcome:
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
            await self._end_call(conn, mid, ids, outcome, commit=True)
            return outcome
        except Exception as exc:
            outcome = failure_answer(exc, message_id)
        try:
            await self._end_call(conn, mid, ids, outcome, commit=False)
        except UNAVAILABLE as exc:
            # Nothing committed; the answer stands. A ledger misses a call without effect.
            log.warning("call not recorded after rollback: %s", exc)
        return outcome

    async def _end_call(
        self, conn: Conn, mid: uuid.UUID, ids: CallIds, outcome: Outcome, *, commit: bool
    ) -> None:
        """End :meth:`_apply`'s transaction (commit or roll back) with the call's record."""
        await store.end_call(
            conn,
            commit=commit,
            handler=self.name,
            message_id=mid,
            attempt=ids.attempt,
            status=outcome.status,
            ledger=self.ledger,
        )

    async def _apply_one_statement(self, conn: Conn, prepared: Prepared, ids: CallIds) -> Outcome:
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
            outcome = failure_answer(exc, message_id)
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
