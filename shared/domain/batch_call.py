"""Batch handler calls (wire format 1): several events in one signed ``POST``, one result
per event in the answer, like SQS partial batch responses.

A durable opts in with ``handler: {batch: N}`` (N ≥ 2). The consumer then sends up to N
claimed events of one fetch in one request:

* headers: ``Content-Type: application/json``, ``Ferry-Batch: <number of events>`` (what
  tells a batch from a per-message call before the body is read), the usual signature
  headers over the exact body; no ``Idempotency-Key`` (each event carries its own id);
* body: ``{"ferry_batch": 1, "events": [<event>, ...]}`` where each event is exactly the
  per-message body (:func:`shared.domain.handler_call.request_body`) plus, when the
  message carried one, its ``traceparent``.

The handler answers **200** with ``{"ferry_batch": 1, "results": [<result>, ...]}``, one
result per event: ``{"id": <message_id>, "status": <HTTP status>, "retry_after":
<seconds>?, "retryable": <bool>?, "error": <any JSON>?}``. Each result is read as the
per-message answer with that status would be (:func:`shared.domain.ack.decide`; the
``error`` is its detail). :func:`read_batch_answer` parses such an answer strictly:

* any other status (or a timeout, a refused connection) applies to every event of the
  call, as that answer would to one message (``Retry-After`` and ``retryable`` too);
* a 200 whose body is not such a document (not JSON, no ``results``, a result without a
  valid ``id`` and ``status``, a ``retry_after`` that is not a finite number ≥ 0, a
  ``retryable`` that is not a boolean, another ``ferry_batch`` version, over
  :data:`ANSWER_LIMIT` bytes) is :class:`MalformedAnswer`: every event is retried;
* a result for an id the call did not carry is ignored (counted); an event with no result
  or with several is retried (counted) — never acknowledged on a guess.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.domain.ack import HandlerFailure, HandlerResponse
from shared.domain.envelope import MAX_PAYLOAD_DEPTH, parse_json_body, wire_json
from shared.domain.errors import PoisonError

#: The request header of a batch call; its value is the number of events.
BATCH_HEADER = "Ferry-Batch"
#: The version of the wire format (the ``ferry_batch`` member of request and answer).
BATCH_VERSION = 1
#: Most bytes of a batch answer read; a longer one is malformed (every event retried).
ANSWER_LIMIT = 1024 * 1024
#: Most characters of one result's ``error`` kept as its detail.
DETAIL_LIMIT = 500
#: HandlerFailure kinds of a batch answer that cannot be used for an event.
MALFORMED_KIND = "bad_batch_answer"
MISSING_KIND = "no_batch_result"


def batch_document(events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The body of a batch call carrying ``events`` (per-message bodies)."""
    return {"ferry_batch": BATCH_VERSION, "events": list(events)}


def batch_headers(count: int) -> dict[str, str]:
    """The batch call's own headers (before signing)."""
    return {BATCH_HEADER: str(count)}


class MalformedBatch(PoisonError):
    """A batch request that is not wire format 1 (the SDK answers it 400)."""


#: A batch body nests two levels above its events (the document, its ``events`` list),
#: and an event may nest as deep as a per-message body: held to this depth and to the
#: text rules as a whole, every event is held to its own (see :func:`parse_batch_request`).
BATCH_DEPTH = MAX_PAYLOAD_DEPTH + 3


def parse_batch_request(body: bytes, *, limit: int = 1000) -> list[Any]:
    """The ``events`` of a batch request body (each still to be parsed as a call);
    :class:`MalformedBatch` when the body is not a batch of 1 to ``limit`` events.

    The body is held to :data:`BATCH_DEPTH` and to the text rules of any body, so each
    event in it already meets what a per-message body must (an event at the deepest a
    payload may nest is not refused for travelling in a batch), and need not be walked
    again: :meth:`Envelope.from_json_body` takes it as it is."""
    try:
        doc = parse_json_body(body, max_depth=BATCH_DEPTH)
    except PoisonError as exc:
        raise MalformedBatch(exc.reason_code, exc.detail) from None
    if not isinstance(doc, dict):
        raise MalformedBatch("MALFORMED_BATCH", "a batch body is a JSON object")
    version = doc.get("ferry_batch")
    if version != BATCH_VERSION or isinstance(version, bool):
        raise MalformedBatch(
            "UNSUPPORTED_BATCH_VERSION",
            f"ferry_batch must be {BATCH_VERSION}, got {str(version)[:20]!r}",
        )
    events = doc.get("events")
    if not isinstance(events, list) or not 1 <= len(events) <= limit:
        raise MalformedBatch("MALFORMED_BATCH", f"events must be a list of 1 to {limit} events")
    return events


def batch_answer_document(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The body of a batch answer (results built by :func:`result_entry`)."""
    return {"ferry_batch": BATCH_VERSION, "results": list(results)}


def result_entry(
    message_id: str,
    status: int,
    *,
    retry_after: float | None = None,
    retryable: bool | None = None,
    error: Any = None,
) -> dict[str, Any]:
    """One event's result in a batch answer."""
    entry: dict[str, Any] = {"id": message_id, "status": status}
    optional = {"retry_after": retry_after, "retryable": retryable, "error": error}
    entry.update((key, value) for key, value in optional.items() if value is not None)
    return entry


@dataclass(frozen=True, slots=True)
class MalformedAnswer:
    """A 200 batch answer that cannot be read: every event of the call is retried."""

    detail: str


@dataclass(frozen=True, slots=True)
class BatchAnswer:
    """A well-formed batch answer: each event's outcome, and what did not fit."""

    #: The outcome of every event the call carried (a missing or duplicated result is a
    #: :class:`HandlerFailure` of kind :data:`MISSING_KIND`: retried, never acked).
    outcomes: dict[uuid.UUID, HandlerResponse | HandlerFailure]
    missing: list[uuid.UUID] = field(default_factory=list)
    duplicated: list[uuid.UUID] = field(default_factory=list)
    #: Result ids the call did not carry (ignored).
    unknown: list[str] = field(default_factory=list)


class _Bad(ValueError):
    """A batch answer that breaks wire format 1 (the message says where)."""


def read_batch_answer(body: bytes, expected: Sequence[uuid.UUID]) -> BatchAnswer | MalformedAnswer:
    """The 200 answer ``body`` to a batch call that carried ``expected`` (never raises)."""
    if len(body) > ANSWER_LIMIT:
        return MalformedAnswer(f"batch answer over {ANSWER_LIMIT} bytes")
    try:
        doc = parse_json_body(body)
    except PoisonError as exc:
        return MalformedAnswer(f"batch answer is not JSON: {exc.detail}"[:DETAIL_LIMIT])
    try:
        results = _results(doc)
        parsed = [_result(entry, index) for index, entry in enumerate(results)]
    except _Bad as exc:
        return MalformedAnswer(str(exc)[:DETAIL_LIMIT])
    wanted = set(expected)
    found: dict[uuid.UUID, list[HandlerResponse]] = {}
    unknown: list[str] = []
    for mid, response in parsed:
        if mid in wanted:
            found.setdefault(mid, []).append(response)
        else:
            unknown.append(str(mid))
    outcomes: dict[uuid.UUID, HandlerResponse | HandlerFailure] = {}
    missing, duplicated = [], []
    for mid in expected:
        answers = found.get(mid, [])
        if len(answers) == 1:
            outcomes[mid] = answers[0]
        elif not answers:
            missing.append(mid)
            outcomes[mid] = HandlerFailure(MISSING_KIND, "the batch answer has no result for it")
        else:
            duplicated.append(mid)
            outcomes[mid] = HandlerFailure(
                MISSING_KIND, f"the batch answer has {len(answers)} results for it"
            )
    return BatchAnswer(outcomes, missing, duplicated, unknown)


def _results(doc: Any) -> list[Any]:
    if not isinstance(doc, dict):
        raise _Bad("batch answer is not a JSON object")
    version = doc.get("ferry_batch", BATCH_VERSION)
    if version != BATCH_VERSION or isinstance(version, bool):
        raise _Bad(f"batch answer has ferry_batch {str(version)[:20]!r}, not {BATCH_VERSION}")
    results = doc.get("results")
    if not isinstance(results, list):
        raise _Bad("batch answer has no results list")
    return results


def _result(entry: Any, index: int) -> tuple[uuid.UUID, HandlerResponse]:
    where = f"results[{index}]"
    if not isinstance(entry, dict):
        raise _Bad(f"{where} is not an object")
    raw_id = entry.get("id")
    if not isinstance(raw_id, str):
        raise _Bad(f"{where}.id is not a string")
    try:
        mid = uuid.UUID(raw_id)
    except ValueError:
        raise _Bad(f"{where}.id is not a UUID") from None
    status = entry.get("status")
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise _Bad(f"{where}.status is not an HTTP status")
    retry_after = entry.get("retry_after")
    if retry_after is not None:
        usable = isinstance(retry_after, int | float) and not isinstance(retry_after, bool)
        if not usable or not math.isfinite(retry_after) or retry_after < 0:
            raise _Bad(f"{where}.retry_after is not a finite number of seconds >= 0")
        retry_after = float(retry_after)
    retryable = entry.get("retryable")
    if retryable is not None and not isinstance(retryable, bool):
        raise _Bad(f"{where}.retryable is not a boolean")
    error = entry.get("error")
    detail = "" if error is None else _detail(error)
    return mid, HandlerResponse(status, retry_after, detail, retryable)


def _detail(error: Any) -> str:
    text = error if isinstance(error, str) else wire_json(error).decode("utf-8", "replace")
    text = text.replace("\x00", "\ufffd")
    return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 1] + "…"
