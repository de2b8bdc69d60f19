"""The age of a durable's oldest undelivered message (shared.adapters.lag), as the
consumer's lag gauge and the console's overview read it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from shared.adapters.lag import oldest_undelivered_age, stored_at


class FakeJs:
    """get_msg by filter subject: a stored time, or an error to raise."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int, str]] = []

    async def get_msg(self, stream: str, *, seq: int, subject: str, next: bool) -> Any:
        assert next
        self.asked.append((stream, seq, subject))
        answer = self.answers[subject]
        if isinstance(answer, BaseException):
            raise answer
        return SimpleNamespace(time=answer)


def info(filters: list[str], delivered: int | None) -> Any:
    return SimpleNamespace(
        stream_name="SEA_EVENTS",
        config=SimpleNamespace(filter_subjects=filters, filter_subject=None),
        delivered=None if delivered is None else SimpleNamespace(stream_seq=delivered),
    )


async def test_the_oldest_of_the_filters_counts_and_unreadable_ones_are_left_out() -> None:
    now = datetime.now(UTC)
    js = FakeJs({
        "a.>": now - timedelta(seconds=30),
        "b.>": (now - timedelta(seconds=90)).isoformat().replace("+00:00", "Z"),
        "c.>": TimeoutError(),
        "d.>": NotFoundError(),
    })  # fmt: skip
    age = await oldest_undelivered_age(js, info(["a.>", "b.>", "c.>", "d.>"], delivered=41))
    assert 89 <= age <= 95
    assert {seq for _, seq, _ in js.asked} == {42}  # the first after the last delivered
    assert {stream for stream, _, _ in js.asked} == {"SEA_EVENTS"}


async def test_nothing_readable_is_no_lag() -> None:
    js = FakeJs({">": NotFoundError()})
    assert await oldest_undelivered_age(js, info([], delivered=None)) == 0.0
    assert js.asked == [("SEA_EVENTS", 1, ">")]


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        (datetime(2026, 11, 27, 12, 0), datetime(2026, 11, 27, 12, 0, tzinfo=UTC)),
        ("2026-11-27T12:00:00.123456789Z", datetime(2026, 11, 27, 12, 0, 0, 123456, tzinfo=UTC)),
        ("not a time", None),
        (None, None),
    ],
)
def test_a_stored_time_is_read_timezone_aware(stamp: Any, expected: datetime | None) -> None:
    assert stored_at(SimpleNamespace(time=stamp)) == expected
