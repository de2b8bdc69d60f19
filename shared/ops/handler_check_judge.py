"""Judging the answers of ``ferry handler-check`` (pure): does each keep the contract?

:class:`Answer` is what came back to one call; :func:`judge` gives its verdict (the
contract's answer per check: :data:`EXPECTED`) and :func:`consumer_action` what the
durable's inbox-consumer would do with it. The batch checks are judged in
:mod:`shared.ops.handler_check_batch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.contracts.topology import DurableSpec
from shared.domain.ack import (
    Ack,
    DeadLetter,
    HandlerFailure,
    HandlerResponse,
    Nak,
    Outcome,
    RetryPolicy,
    decide,
)
from shared.ops.handler_check_calls import AUTH_CHECKS

Verdict = Literal["conforms", "breach", "unverified"]
#: The contract's answer per check, as shown in the report.
EXPECTED = {
    **dict.fromkeys(AUTH_CHECKS, "401"),
    "normal": "2xx",
    "duplicate": "409, or 2xx with no second effect",
    "poison": "422",
    "unknown-version": "422",
    "unknown-type": "422",
}


@dataclass(frozen=True, slots=True)
class Answer:
    """What came back: a status (and body head), or why there was none."""

    status: int | None
    detail: str = ""
    failure: str | None = None
    #: ``Retry-After`` in seconds, as the consumer reads it (None: absent or invalid).
    retry_after: float | None = None
    #: The body's ``retryable`` flag (INFRA-005 §3.1), as the consumer reads it.
    retryable: bool | None = None

    def outcome(self) -> Outcome:
        """As the consumer sees it."""
        if self.status is None:
            return HandlerFailure(self.failure or "timeout", self.detail)
        return HandlerResponse(self.status, self.retry_after, self.detail, self.retryable)

    def shown(self) -> str:
        """The status, or the failure."""
        return str(self.status) if self.status is not None else (self.failure or "no answer")


def consumer_action(answer: Answer, durable: DurableSpec) -> str:
    """What the durable's inbox-consumer does with ``answer`` on a first delivery."""
    if answer.status in (401, 403):
        return "hold the message and alert (credentials refused), calling again until fixed"
    policy = RetryPolicy(tuple(durable.backoff), durable.max_deliver)
    decision = decide(answer.outcome(), attempt=1, policy=policy)
    if isinstance(decision, Ack):
        return f"ack it ({decision.reason})"
    if isinstance(decision, DeadLetter):
        return f"dead-letter it as {decision.reason_code}"
    assert isinstance(decision, Nak)
    alert = ", alerting" if decision.alert else ""
    return f"retry it in {decision.delay:g}s{alert} (dead-letter after {durable.max_deliver})"


def judge(
    check: str, answer: Answer, effect_changed: bool | None, consumer: str = ""
) -> tuple[Verdict, str]:
    """Whether ``answer`` to ``check`` keeps the contract, and why (empty when it plainly
    does). ``effect_changed`` is None without an effect query."""
    status = answer.status
    if status is None:
        return "breach", (
            f"no answer ({answer.failure}: {answer.detail}): the consumer retries until "
            "max_deliver, then dead-letters MAX_DELIVERIES_EXCEEDED"
        )
    if check == "normal":
        return _judge_normal(status, effect_changed)
    if check == "duplicate":
        verdict, why = _judge_duplicate(status, effect_changed)
    elif check in AUTH_CHECKS:
        verdict, why = _judge_auth(check, status)
    else:
        verdict, why = _judge_refusal(check, status, consumer)
    if not effect_changed:
        return verdict, why
    changed = (
        "the redelivery was applied a second time"
        if check == "duplicate"
        else "the call had an effect"
    )
    changed += " (the effect query's result changed)"
    return "breach", f"{why}; {changed}" if verdict == "breach" else changed


def _judge_normal(status: int, effect_changed: bool | None) -> tuple[Verdict, str]:
    if 200 <= status < 300:
        if effect_changed is False:
            return "unverified", (
                "answered 2xx but the effect query's result did not change: check the query"
            )
        return "conforms", ""
    if status == 409:
        return "breach", (
            "409 to a message id never sent before: the consumer acks it as already "
            "applied, so the event is lost"
        )
    return "breach", f"a valid event the durable accepts must be applied (2xx), not {status}"


def _judge_duplicate(status: int, effect_changed: bool | None) -> tuple[Verdict, str]:
    if status == 409:
        return "conforms", ""
    if 200 <= status < 300:
        if effect_changed:
            return "breach", "the redelivery was answered as a new message (the contract: 409)"
        if effect_changed is None:
            return "unverified", (
                "2xx to a redelivery keeps the contract only if it had no second effect; "
                "give --effect-sql to check it (the SDK and Ferry's handlers answer 409)"
            )
        return "conforms", "2xx with no second effect (the effect query did not change)"
    return "breach", f"a redelivered message must be answered 409 (already applied), not {status}"


def _judge_auth(check: str, status: int) -> tuple[Verdict, str]:
    if status == 401:
        return "conforms", ""
    if status == 403:
        return "conforms", "403: the consumer treats it as 401 (the contract says 401)"
    what = {
        "unsigned": "an unsigned call",
        "bad-signature": "a call signed with another secret",
        "altered-body": "a call whose body is not the one signed",
        "expired-timestamp": "a call signed outside the tolerance (a captured request replayed)",
    }[check]
    if 200 <= status < 300 or status == 409:
        return "breach", f"{what} was accepted: anyone reaching the handler can drive it"
    return "breach", f"{what} must be refused with 401, not {status}"


def _judge_refusal(check: str, status: int, consumer: str) -> tuple[Verdict, str]:
    what = {
        "poison": "a payload its schema refuses",
        "unknown-version": "an event version the durable does not accept",
        "unknown-type": "an event type no manifest declares",
    }[check]
    if status == 422:
        return "conforms", ""
    if 200 <= status < 300 or status == 409:
        return "breach", f"{what} was accepted as applied: it must be refused with 422"
    if consumer.startswith("dead-letter"):
        return "breach", (
            f"{what} must be answered 422 (HANDLER_REJECTED, a reason_code in the body); "
            f"with {status} the consumer would {consumer}"
        )
    return "breach", (
        f"{what} can never succeed: {status} makes the consumer retry it until max_deliver "
        "instead of dead-lettering it at once (422)"
    )
