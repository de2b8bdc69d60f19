"""A batch call's events applied in ONE transaction (``Handler(batch_transaction=True)``).

The events go in the order of their aggregates (a stable sort: one aggregate's events
keep their order), so concurrent batches take their locks in one order. First all at
once: every id claimed in one statement, then the routes, consecutive one-statement
routes of one SQL text as one pipelined ``executemany`` (:mod:`.routes`). Should an id
have been applied before or a route raise, that attempt is rolled back and the batch goes
again event by event, each under a savepoint: an event that fails rolls back to its
savepoint (its claim and effect only) and the others go on, one commit for all. A
duplicate is a 409 for that event only. Should the commit fail, or the connection drop,
nothing of the batch committed and the whole call is answered 503.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from shared.adapters.postgres import CONNECTION_ERRORS, LOST_RACE_ERRORS, Pool
from shared.domain.errors import PoisonError

from . import store
from .answers import UNAVAILABLE, answer_poison, failure_answer
from .outcomes import Outcome
from .request import CallIds
from .routes import (
    ACQUIRE_TIMEOUT,
    Hook,
    Prepared,
    aggregate_of,
    execute_run,
    run_route,
    statement_runs,
)

log = logging.getLogger("ferry.handlers")

#: Tries of a batch transaction all at once that lost a lock race (a deadlock between
#: two batches updating the same rows in another order) before going event by event.
AT_ONCE_TRIES = 3
#: What :func:`_apply_at_once` returns when it lost such a race.
LOST_RACE = "lost a lock race"
LOCK_RACES: tuple[type[BaseException], ...] = LOST_RACE_ERRORS


async def before_claim(hooks: Sequence[Hook], prepared: Prepared | PoisonError) -> Outcome | None:
    """The answer of an event decided before any claim (poison, a hook's), or None."""
    if isinstance(prepared, PoisonError):
        return answer_poison(prepared)
    for hook in hooks:
        forced = await hook.before(prepared.call)
        if forced is not None:
            return forced
    return None


async def apply_in_one_transaction(
    items: list[tuple[Prepared | PoisonError, CallIds]],
    *,
    pool: Pool,
    handler: str,
    ledger: bool,
    hooks: Sequence[Hook],
) -> list[Outcome] | Outcome:
    """The events' answers, their effects committed together; or the one answer to give
    the whole call when nothing could be committed."""
    answers: dict[int, Outcome] = {}
    applying: list[tuple[int, Prepared]] = []
    for index, (prepared, _) in enumerate(items):
        early = await before_claim(hooks, prepared)
        if early is not None:
            answers[index] = early
        else:
            assert isinstance(prepared, Prepared)
            applying.append((index, prepared))
    # One lock order for concurrent batches: by aggregate (a stable sort, so events of
    # one aggregate keep their stream order). Effects keyed by their aggregate then
    # wait for each other instead of deadlocking.
    applying.sort(key=lambda item: aggregate_of(item[1].call))
    try:
        async with pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
            batch = store.BatchTransaction(conn, handler=handler)
            try:
                at_once = None
                for _ in range(AT_ONCE_TRIES):
                    at_once = await _apply_at_once(batch, applying)
                    if at_once is not LOST_RACE:
                        break
                if isinstance(at_once, dict):
                    answers.update(at_once)
                else:  # a duplicate or a failing event: one savepoint per event
                    for index, prepared in applying:
                        answers[index] = await _apply_in_batch(batch, prepared)
                calls = [
                    (ids.message_id, ids.attempt, answers[index].status)
                    for index, (_, ids) in enumerate(items)
                ]
                await batch.commit(calls if ledger else [])
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


async def _apply_at_once(
    batch: store.BatchTransaction, applying: list[tuple[int, Prepared]]
) -> dict[int, Outcome] | str | None:
    """The common case in a few round trips: claim every id in one statement, run the
    routes (pipelined where they are one-statement routes of one SQL text), no
    savepoints. None (everything rolled back) when an id was applied before or a route
    raised: the caller then goes event by event under savepoints; :data:`LOST_RACE`
    (rolled back) when the transaction lost a lock race to another (a deadlock between
    two batches touching the same rows): the caller tries again."""
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
        for run in statement_runs([prepared for _, prepared in applying]):
            await execute_run(batch.conn, run)
    except CONNECTION_ERRORS:
        raise  # the transaction is gone: nothing of the batch commits
    except LOCK_RACES:
        await batch.abort()
        return LOST_RACE
    except Exception:
        await batch.abort()
        return None
    return {index: Outcome.processed(prepared.call.message_id) for index, prepared in applying}


async def _apply_in_batch(batch: store.BatchTransaction, prepared: Prepared) -> Outcome:
    """Claim and route one event under its savepoint; a failure rolls back to it."""
    message_id = prepared.call.message_id
    mid = uuid.UUID(message_id)
    if not await batch.claim(mid):
        moment = await store.applied_at(batch.conn, handler=batch.handler, message_id=mid)
        return Outcome.duplicate(message_id, moment)
    try:
        await run_route(batch.conn, prepared)
    except CONNECTION_ERRORS:
        raise  # the transaction is gone: nothing of the batch commits
    except Exception as exc:
        await batch.undo()
        return failure_answer(exc, message_id)
    return Outcome.processed(message_id)
