"""The ACK decision for any outcome and any attempt: always a valid Decision.

Every nak delay is finite, at least the ladder's step and at most the larger of the step
and the configured Retry-After cap (a handler can lengthen a wait, never shorten it).
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

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

steps = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
policies = st.builds(
    RetryPolicy,
    backoff=st.lists(steps, min_size=1, max_size=8).map(tuple),
    max_deliver=st.integers(min_value=1, max_value=1000),
    retry_after_cap=steps,
)
outcomes: st.SearchStrategy[Outcome] = st.one_of(
    st.builds(
        HandlerResponse,
        status=st.integers(min_value=-1000, max_value=10_000),
        retry_after=st.one_of(st.none(), st.floats()),
        detail=st.text(max_size=50),
        retryable=st.one_of(st.none(), st.booleans()),
    ),
    st.builds(HandlerFailure, kind=st.sampled_from(["timeout", "unreachable"]), detail=st.text()),
)
attempts = st.integers(min_value=-(2**63), max_value=2**63)


@given(outcomes, attempts, policies)
def test_decide_always_returns_a_valid_decision(
    outcome: Outcome, attempt: int, policy: RetryPolicy
) -> None:
    decision = decide(outcome, attempt=attempt, policy=policy)
    assert isinstance(decision, Ack | Nak | DeadLetter)
    if isinstance(decision, Nak):
        step = policy.delay(attempt)
        assert math.isfinite(decision.delay)
        assert step <= decision.delay <= max(step, policy.retry_after_cap)
        assert attempt < policy.max_deliver
    if isinstance(decision, DeadLetter):
        assert decision.reason_code in {
            "HANDLER_REJECTED",
            "HANDLER_BAD_REQUEST",
            "HANDLER_NOT_RETRYABLE",
            "MAX_DELIVERIES_EXCEEDED",
        }


@given(st.sampled_from([408, 425, 429, 500, 503]), st.floats(), policies)
def test_retry_after_never_shortens_the_ladder(
    status: int, retry_after: float, policy: RetryPolicy
) -> None:
    decision = decide(HandlerResponse(status, retry_after), attempt=1, policy=policy)
    if isinstance(decision, Nak):
        assert decision.delay >= policy.delay(1)
        if math.isfinite(retry_after) and retry_after >= 0:
            expected = max(policy.delay(1), min(retry_after, policy.retry_after_cap))
            assert decision.delay == expected
