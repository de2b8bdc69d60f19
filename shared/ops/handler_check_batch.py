"""The batch checks of ``ferry handler-check --batch`` (:mod:`shared.domain.batch_call`):
the events of the batch calls, and judging a batch answer. The calls are sent by
:func:`shared.ops.handler_check.run_batch_checks`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from shared.contracts.samples import poison_payload
from shared.domain.ack import HandlerResponse
from shared.domain.batch_call import (
    BatchAnswer,
    MalformedAnswer,
    batch_document,
    read_batch_answer,
)
from shared.ops.handler_check_calls import Plan
from shared.ops.handler_check_judge import Verdict

#: The contract's answer per batch check (``--batch``, judged by :func:`judge_batch`).
BATCH_EXPECTED = {
    "batch-unsigned": "401",
    "batch": "200, one result per event: 2xx for each valid event, 422 for the poison",
    "batch-duplicate": "200, one result per event: 409 (or 2xx with no second effect) for "
    "each valid event, 422 for the poison",
}


@dataclass(frozen=True, slots=True)
class BatchProbe:
    """The events of the batch checks: (label, body, poison) each."""

    events: list[tuple[str, dict[str, Any], bool]]

    def document(self, attempt: int) -> dict[str, Any]:
        """The batch body, every event at delivery ``attempt``."""
        bodies = []
        for _, body, _ in self.events:
            again = {**body, "delivery": {**body["delivery"], "attempt": attempt}}
            again.update(retryCount=attempt - 1)
            bodies.append(again)
        return batch_document(bodies)

    def sent(self, how: str) -> str:
        """What was sent, in words."""
        return f"a batch of {len(self.events)} ({', '.join(e[0] for e in self.events)}), {how}"


def batch_probe(plan: Plan) -> BatchProbe:
    """A valid event of every type the plan checks, and the first poison one."""
    events: list[tuple[str, dict[str, Any], bool]] = []
    poisoned = False
    for event in plan.events:
        events.append((event.name, plan.body(event, plan.valid_payload(event)), False))
        poison = poison_payload(event.payload_schema or {}, plan.valid_payload(event))
        if poison is not None and not poisoned:
            events.append((f"poison {event.name}", plan.body(event, poison), True))
            poisoned = True
    return BatchProbe(events)


def judge_batch(
    check: str, probe: BatchProbe, status: int | None, head: bytes, effect_changed: bool | None
) -> tuple[Verdict, str, str]:
    """The verdict of a batch check, why, and each event's answer in words."""
    if check == "batch-unsigned":
        return _judge_unsigned_batch(status)
    if status != 200:
        return "breach", f"a batch call is answered 200 with one result per event, not {status}", ""
    ids = [uuid.UUID(body["message_id"]) for _, body, _ in probe.events]
    answer = read_batch_answer(head, ids)
    if isinstance(answer, MalformedAnswer):
        return "breach", f"the batch answer is malformed: {answer.detail}", ""
    problems, shown, unseen = _judge_results(check, probe, answer, effect_changed)
    if check == "batch" and effect_changed is False:
        problems.append("the batch's valid events changed nothing (--effect-sql)")
    if problems:
        return "breach", "; ".join(problems), ", ".join(shown)
    if unseen:
        return (
            "unverified",
            "a 2xx to a redelivery is unverified without --effect-sql",
            ", ".join(shown),
        )
    return "conforms", "", ", ".join(shown)


def _judge_results(
    check: str, probe: BatchProbe, answer: BatchAnswer, effect_changed: bool | None
) -> tuple[list[str], list[str], bool]:
    """Each event's result judged: the problems, each answer in words, and whether a 2xx
    to a redelivery went unverified (no effect query)."""
    problems, shown, unseen = [], [], False
    for label, body, poison in probe.events:
        outcome = answer.outcomes[uuid.UUID(body["message_id"])]
        if not isinstance(outcome, HandlerResponse):
            problems.append(f"{label}: {outcome.detail}")
            shown.append(f"{label}: no result")
            continue
        shown.append(f"{label}: {outcome.status}")
        wanted = _batch_expected(check, poison, outcome.status, effect_changed)
        if wanted:
            problems.append(f"{label} answered {outcome.status}: {wanted}")
        elif check == "batch-duplicate" and not poison and outcome.status != 409:
            unseen = unseen or effect_changed is None
    return problems, shown, unseen


def _judge_unsigned_batch(status: int | None) -> tuple[Verdict, str, str]:
    if status in (401, 403):
        return "conforms", "", ""
    return "breach", "an unsigned batch must be refused 401", ""


def _batch_expected(check: str, poison: bool, status: int, effect_changed: bool | None) -> str:
    """What is wrong with one event's status (empty: nothing)."""
    if poison:
        return "" if status == 422 else "expected 422"
    if check == "batch":
        return "" if 200 <= status < 300 else "expected 2xx"
    if status == 409 or (200 <= status < 300 and effect_changed is not True):
        return ""
    return "expected 409 (or 2xx with no second effect)"
