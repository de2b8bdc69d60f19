"""Answers to JetStream that are not silently lost (shared.adapters.jetstream_answers).

A fake connection stands for JetStream: it refuses (no responders: no consumer leader
during a failover) a given number of tries and records what reached it. Against a real
server restart, see tests/consumer/test_answers.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats.errors
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg

from shared.adapters import jetstream_answers
from shared.adapters.jetstream_answers import Answers


class FakeClient:
    """Refuses the first ``refusals`` requests, then confirms; records every publish."""

    def __init__(self, refusals: int = 0) -> None:
        self.refusals, self.requests, self.published = refusals, 0, []

    async def request(self, subject: str, payload: bytes, timeout: float) -> Any:
        self.requests += 1
        if self.requests <= self.refusals:
            raise nats.errors.NoRespondersError
        self.published.append((subject, payload))
        return None

    async def publish(self, subject: str, payload: bytes = b"", **kw: Any) -> None:
        self.published.append((subject, payload))


def fetched(client: FakeClient, seq: int = 7) -> Msg:
    reply = f"$JS.ACK.S.D.1.{seq}.{seq}.1700000000000000000.0"
    return Msg(_client=client, subject="s.e.v1", reply=reply, data=b"{}")  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jetstream_answers, "FIRST_PAUSE", 0.01)
    monkeypatch.setattr(jetstream_answers, "LONGEST_PAUSE", 0.02)


async def test_a_nak_refused_during_a_failover_is_retried_until_confirmed() -> None:
    client = FakeClient(refusals=3)
    answers = Answers(confirm_within=5.0, remember_for=10.0)
    held = answers.hold(fetched(client))
    await held.nak(delay=1.5)
    assert held.is_acked
    assert client.requests == 4
    [(subject, payload)] = client.published
    assert subject.startswith("$JS.ACK.S.D.") and payload == b'-NAK {"delay": 1500000000}'
    assert answers.stats.confirmed_late == 1 and answers.stats.unconfirmed == 0


async def test_a_term_that_never_gets_through_is_given_up_and_counted() -> None:
    client = FakeClient(refusals=10**9)
    answers = Answers(confirm_within=0.2, remember_for=10.0)
    held = answers.hold(fetched(client))
    await asyncio.wait_for(held.term(), timeout=5)
    assert held.is_acked and client.published == []
    assert client.requests >= 2
    assert answers.stats.unconfirmed == 1 and answers.stats.confirmed_late == 0


async def test_a_second_final_answer_is_refused() -> None:
    held = Answers(confirm_within=1.0, remember_for=1.0).hold(fetched(FakeClient()))
    await held.nak()
    with pytest.raises(nats.errors.Error):
        await held.term()


async def test_acks_are_remembered_and_sent_again_after_a_leader_change() -> None:
    client = FakeClient()
    answers = Answers(confirm_within=1.0, remember_for=60.0)
    helds = [answers.hold(fetched(client, seq)) for seq in range(1, 6)]
    for held in helds:
        await held.ack()
    first = list(client.published)
    assert len(first) == 5 and client.requests == 0  # nats-py's own ack: fire-and-forget
    assert await answers.resend_acks("a leader change") == 5
    assert client.published[5:] == [(s, b"+ACK") for s, _ in first]
    assert answers.stats.acks_resent == 5


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 30), max_size=30), st.floats(1, 20))
def test_only_the_acks_of_the_last_remember_for_seconds_are_sent_again(
    ages: list[float], remember_for: float
) -> None:
    # Ages within a second of the bound are left out: the clock moves while the test runs.
    ages = [age for age in ages if abs(age - remember_for) > 1.0]
    client = FakeClient()
    answers = Answers(confirm_within=1.0, remember_for=remember_for)
    answers.hold(fetched(client))
    now = jetstream_answers.time.monotonic()
    for i, age in enumerate(sorted(ages, reverse=True)):  # oldest first, as they were sent
        answers._recent.append((now - age, f"reply.{i}"))
    sent = asyncio.run(answers.resend_acks("a test"))
    young = [f"reply.{i}" for i, age in enumerate(sorted(ages, reverse=True)) if age < remember_for]
    assert sent == len(young)
    assert [subject for subject, _ in client.published] == young


async def test_naks_during_one_outage_give_up_together_not_one_after_another() -> None:
    """Fifty naks of one batch while nothing answers: the first opens the outage's
    retrying window, the others end with it (or get one short try): the batch is not held
    fifty windows long. A confirmation afterwards ends the outage."""
    client = FakeClient(refusals=10**9)
    answers = Answers(confirm_within=0.3, remember_for=10.0)
    helds = [answers.hold(fetched(client, seq)) for seq in range(1, 51)]
    for held in helds:
        await held.nak(delay=1.0)
    # The first retries through the window (0.3 s at pauses of 0.01-0.02 s: at most ~30
    # tries); each later one tries once. Fifty windows would be well over a thousand.
    assert client.requests <= 30 + 49 + 5
    assert answers.stats.unconfirmed == 50
    client.refusals = 0
    later = answers.hold(fetched(client, 99))
    await later.term()
    assert client.published[-1][1] == b"+TERM" and answers._outage_ends is None
