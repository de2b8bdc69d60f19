"""The SDK's outcomes meet the consumer's ACK table: what a handler means is what happens.

Each outcome is sent through the consumer's own reading of an answer (Retry-After by
:mod:`shared.domain.retry_after`, ``retryable`` by :func:`body_retryable`) and decided by
:func:`shared.domain.ack.decide`, for any attempt before the last and any policy.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.ack import (
    Ack,
    DeadLetter,
    Decision,
    HandlerResponse,
    Nak,
    RetryPolicy,
    body_retryable,
    decide,
)
from shared.domain.retry_after import parse_retry_after
from shared.sdk import GiveUp, Outcome, Retry
from shared.sdk.outcomes import retry_after_value

ID = "444321cf-d52c-4934-8921-402d0012ac37"
texts = st.text(max_size=600)
delays = st.one_of(st.none(), st.floats(min_value=0, max_value=1e6))
policies = st.builds(
    RetryPolicy,
    backoff=st.lists(st.floats(min_value=0, max_value=1e4), min_size=1, max_size=5).map(tuple),
    max_deliver=st.integers(min_value=2, max_value=50),
    retry_after_cap=st.floats(min_value=0, max_value=1e4),
)

#: (outcome, what the consumer must do with it)
cases = st.one_of(
    st.just((Outcome.processed(ID), "processed")),
    st.builds(lambda: (Outcome.duplicate(ID, datetime.now(UTC)), "already_processed")),
    st.builds(lambda c, d: (Outcome.reject(c, d), "HANDLER_REJECTED"), texts, texts),
    st.builds(lambda c, d: (Outcome.bad_request(c, d), "HANDLER_BAD_REQUEST"), texts, texts),
    st.builds(
        lambda d, a, s: (Outcome.retry(d, after=a, status=s), "retry"),
        texts,
        delays,
        st.sampled_from([503, 429]),
    ),
    st.builds(lambda d, a: (Retry(d, after=a).outcome, "retry"), texts, delays),
    st.builds(lambda d: (Outcome.give_up(d), "HANDLER_NOT_RETRYABLE"), texts),
    st.builds(lambda d: (GiveUp(d).outcome, "HANDLER_NOT_RETRYABLE"), texts),
    st.builds(lambda d: (Outcome.failed(d), "retry"), texts),
    st.builds(lambda d: (Outcome.unauthenticated(d), "held"), texts),
)


def as_the_consumer_reads_it(outcome: Outcome) -> HandlerResponse:
    """The answer as :mod:`services.inbox_consumer.dispatch` turns it into a response."""
    raw = json.dumps(outcome.body, ensure_ascii=False).encode() if outcome.body else b""
    head = raw[:2000]
    retry_after = parse_retry_after(outcome.headers.get("Retry-After"), now=datetime.now(UTC))
    retryable = body_retryable(head) if outcome.status >= 400 else None
    return HandlerResponse(outcome.status, retry_after, head.decode(errors="replace"), retryable)


def meaning(decision: Decision) -> str:
    if isinstance(decision, Ack):
        return decision.reason
    if isinstance(decision, DeadLetter):
        return decision.reason_code
    return "held" if decision.alert else "retry"


@given(cases, policies, st.data())
def test_every_outcome_does_what_it_says(
    case: tuple[Outcome, str], policy: RetryPolicy, data: st.DataObject
) -> None:
    outcome, expected = case
    attempt = data.draw(st.integers(min_value=1, max_value=policy.max_deliver - 1))
    response = as_the_consumer_reads_it(outcome)
    decision = decide(response, attempt=attempt, policy=policy)
    assert meaning(decision) == expected
    if outcome.status >= 400 and outcome.status != 409:  # 409 is a success
        assert isinstance(outcome.retryable, bool), "every error body says whether to retry"
        assert outcome.retryable == (expected in ("retry", "held"))
    if isinstance(decision, Nak) and response.retry_after is not None:
        wanted = min(response.retry_after, policy.retry_after_cap)
        assert decision.delay >= wanted, "Retry-After lengthens the wait"


@pytest.mark.parametrize(
    ("seconds", "header"), [(0, "0"), (7, "7"), (0.25, "1"), (1.5, "2"), (3600.0, "3600")]
)
def test_retry_after_is_whole_seconds_the_consumer_accepts(seconds: float, header: str) -> None:
    assert retry_after_value(seconds) == header
    assert parse_retry_after(header, now=datetime.now(UTC)) == float(header)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_an_impossible_retry_after_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="Retry-After"):
        Outcome.retry("x", after=bad)


def test_a_retry_answers_503_or_429_only() -> None:
    with pytest.raises(ValueError, match="429, 503"):
        Outcome.retry("x", status=500)
