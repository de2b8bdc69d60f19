"""What the handler answers: an error as a status, a batch event's result, a typed payload.

Every error a route, the claim or the payload raises becomes a status here
(:func:`failure_answer`, :func:`answer_poison`) and nowhere else.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from pydantic import BaseModel, ValidationError

from shared.adapters.postgres import (
    BUSY_ERRORS,
    CONNECTION_ERRORS,
    LOST_RACE_ERRORS,
    UNSTORABLE_ERRORS,
)
from shared.contracts.events import MAX_REPORTED
from shared.domain.batch_call import result_entry
from shared.domain.errors import PoisonError, TransientError

from .outcomes import GiveUp, Outcome, Retry
from .request import MalformedRequest
from .routes import RouteKey

log = logging.getLogger("ferry.handlers")

#: The payload (not the database) is at fault: a value no column can hold. Client-side
#: argument encoding errors subclass InterfaceError, so they must be caught first.
UNSTORABLE: tuple[type[BaseException], ...] = UNSTORABLE_ERRORS
#: Worth retrying as is: the database is away, busy or lost a race.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    *CONNECTION_ERRORS,
    TransientError,
    *LOST_RACE_ERRORS,
    *BUSY_ERRORS,
)


def failure_answer(exc: Exception, message_id: str) -> Outcome:
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


def answer_poison(exc: PoisonError) -> Outcome:
    """400 for a malformed request, 422 for an event that can never be applied."""
    if isinstance(exc, MalformedRequest):
        return Outcome.bad_request(exc.reason_code, exc.detail)
    return Outcome.reject(exc.reason_code, exc.detail)


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
