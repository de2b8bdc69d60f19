"""The ACK rules, exhaustively: every status code, every failure kind, every attempt."""

from __future__ import annotations

import pytest

from shared.domain.ack import (
    Ack,
    DeadLetter,
    HandlerFailure,
    HandlerResponse,
    Nak,
    RetryPolicy,
    decide,
)

POLICY = RetryPolicy(backoff=(1.0, 5.0, 30.0, 120.0, 600.0), max_deliver=6, retry_after_cap=60.0)


@pytest.mark.parametrize("status", range(200, 300))
def test_every_2xx_acks_as_processed(status: int) -> None:
    assert decide(HandlerResponse(status), attempt=1, policy=POLICY) == Ack("processed")


def test_409_acks_as_already_processed() -> None:
    assert decide(HandlerResponse(409), attempt=3, policy=POLICY) == Ack("already_processed")


def test_422_dead_letters_with_the_handlers_words() -> None:
    decision = decide(HandlerResponse(422, detail="title missing"), attempt=1, policy=POLICY)
    assert decision == DeadLetter("HANDLER_REJECTED", "title missing")


@pytest.mark.parametrize("status", [400, 402, 406, 410, 411, 412, 413, 414, 415, 418, 451])
def test_other_permanent_4xx_dead_letter(status: int) -> None:
    decision = decide(HandlerResponse(status), attempt=1, policy=POLICY)
    assert isinstance(decision, DeadLetter) and decision.reason_code == "HANDLER_BAD_REQUEST"


@pytest.mark.parametrize("status", [401, 403, 404, 405, 301, 302, 307])
def test_configuration_problems_retry_and_alert(status: int) -> None:
    decision = decide(HandlerResponse(status), attempt=1, policy=POLICY)
    assert isinstance(decision, Nak) and decision.alert


@pytest.mark.parametrize("status", [408, 425, 429, *range(500, 600)])
def test_transient_statuses_nak_with_the_ladder(status: int) -> None:
    for attempt, delay in [(1, 1.0), (2, 5.0), (3, 30.0), (4, 120.0), (5, 600.0)]:
        decision = decide(HandlerResponse(status), attempt=attempt, policy=POLICY)
        assert isinstance(decision, Nak) and decision.delay == delay and not decision.alert


def test_ladder_repeats_its_last_step() -> None:
    policy = RetryPolicy(backoff=(1.0, 2.0), max_deliver=10)
    assert decide(HandlerFailure("timeout"), attempt=7, policy=policy) == Nak(
        2.0, "handler timeout"
    )


@pytest.mark.parametrize(
    ("retry_after", "delay"),
    [(0.0, 1.0), (0.5, 1.0), (10.0, 10.0), (3600.0, 60.0), (-5.0, 1.0), (float("nan"), 1.0)],
)
def test_retry_after_lengthens_the_ladder_step_up_to_the_cap(
    retry_after: float, delay: float
) -> None:
    decision = decide(HandlerResponse(503, retry_after=retry_after), attempt=1, policy=POLICY)
    assert isinstance(decision, Nak) and decision.delay == delay


@pytest.mark.parametrize("kind", ["timeout", "unreachable"])
def test_failures_to_answer_nak(kind: str) -> None:
    decision = decide(HandlerFailure(kind, "boom"), attempt=2, policy=POLICY)
    assert decision == Nak(5.0, f"handler {kind}: boom")


@pytest.mark.parametrize(
    "outcome",
    [
        HandlerResponse(500),
        HandlerResponse(429),
        HandlerResponse(401),
        HandlerFailure("timeout"),
        HandlerFailure("unreachable"),
    ],
)
def test_last_delivery_dead_letters_instead_of_nak(
    outcome: HandlerResponse | HandlerFailure,
) -> None:
    assert isinstance(decide(outcome, attempt=5, policy=POLICY), Nak)
    decision = decide(outcome, attempt=6, policy=POLICY)
    assert isinstance(decision, DeadLetter) and decision.reason_code == "MAX_DELIVERIES_EXCEEDED"
    assert "6 of 6" in decision.detail


@pytest.mark.parametrize("outcome", [HandlerResponse(200), HandlerResponse(409)])
def test_success_on_the_last_delivery_still_acks(outcome: HandlerResponse) -> None:
    assert isinstance(decide(outcome, attempt=6, policy=POLICY), Ack)
