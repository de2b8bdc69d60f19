"""The gatherer of an ordered durable's batch calls (:class:`BatchGatherer`): when a call
leaves, what it carries, and what a cancelled waiter does — against a recording caller
(the wire and the ACK table are :class:`BatchCaller`'s, tested end to end elsewhere)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.inbox_consumer.batching import BatchCaller, BatchGatherer, Decided
from services.inbox_consumer.delivery import Delivery
from shared.domain.ack import Ack, DeadLetter


@dataclass
class _Event:
    """Stands in for a delivery: its name, and poison (decided without a call) or not."""

    name: str
    poison: bool = False


@dataclass
class _Decider:
    slots: asyncio.Semaphore

    def without_call(self, delivery: Any) -> DeadLetter | None:
        return DeadLetter("POISON", delivery.name) if delivery.poison else None


@dataclass
class _Caller:
    """Records each call's events; answers each event Ack, after ``gate`` opens."""

    size: int
    decider: _Decider
    calls: list[list[str]] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    unexpected_seen: list[BaseException] = field(default_factory=list)

    async def call(self, group: list[Any], *, in_slot: bool = False) -> list[Decided]:
        assert in_slot
        self.calls.append([d.name for d in group])
        await self.gate.wait()
        return [(Ack("ok"), 200) for _ in group]

    def unexpected(self, stage: str, exc: BaseException, delivery: Any = None) -> None:
        self.unexpected_seen.append(exc)


def _gatherer(size: int, slots: int = 4) -> tuple[BatchGatherer, _Caller]:
    caller = _Caller(size, _Decider(asyncio.Semaphore(slots)))
    return BatchGatherer(cast(BatchCaller, caller)), caller


def _decide(gatherer: BatchGatherer, name: str, poison: bool = False) -> asyncio.Task[Decided]:
    return asyncio.ensure_future(gatherer.decide(cast(Delivery, _Event(name, poison))))


async def _turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_requests_of_one_loop_turn_share_a_call() -> None:
    gatherer, caller = _gatherer(size=10)
    tasks = [_decide(gatherer, f"e{i}") for i in range(4)]
    await _turns()
    assert caller.calls == [["e0", "e1", "e2", "e3"]]
    caller.gate.set()
    assert await asyncio.gather(*tasks) == [(Ack("ok"), 200)] * 4


async def test_a_full_call_leaves_at_once_and_the_rest_at_the_next_turn() -> None:
    gatherer, caller = _gatherer(size=3)
    tasks = [_decide(gatherer, f"e{i}") for i in range(7)]
    await _turns()
    assert caller.calls == [["e0", "e1", "e2"], ["e3", "e4", "e5"], ["e6"]]
    caller.gate.set()
    await asyncio.gather(*tasks)
    assert (gatherer.calls, gatherer.sent) == (3, 7)


async def test_a_later_request_goes_in_a_later_call() -> None:
    gatherer, caller = _gatherer(size=10)
    caller.gate.set()
    first = _decide(gatherer, "a")
    await first
    second = _decide(gatherer, "b")
    await second
    assert caller.calls == [["a"], ["b"]]


async def test_while_every_slot_is_busy_waiting_events_gather_into_one_call() -> None:
    gatherer, caller = _gatherer(size=10, slots=1)
    busy = _decide(gatherer, "busy")
    await _turns()
    waiting = []
    for name in ("x", "y", "z"):  # each in a turn of its own, while the slot is taken
        waiting.append(_decide(gatherer, name))
        await _turns()
    caller.gate.set()
    await asyncio.gather(busy, *waiting)
    assert caller.calls == [["busy"], ["x", "y", "z"]]


async def test_an_event_decided_without_a_call_never_waits() -> None:
    gatherer, caller = _gatherer(size=10)
    decision, status = await _decide(gatherer, "bad", poison=True)
    assert decision == DeadLetter("POISON", "bad") and status is None
    assert caller.calls == []


async def test_a_waiter_cancelled_before_its_call_leaves_it() -> None:
    gatherer, caller = _gatherer(size=10)
    kept, cancelled = _decide(gatherer, "kept"), _decide(gatherer, "gone")
    await asyncio.sleep(0)  # both wait; their call leaves at the next turn
    cancelled.cancel()
    await _turns()
    assert caller.calls == [["kept"]]
    caller.gate.set()
    assert await kept == (Ack("ok"), 200)
    with pytest.raises(asyncio.CancelledError):
        await cancelled


async def test_a_waiter_cancelled_during_its_call_leaves_the_call_to_the_others() -> None:
    gatherer, caller = _gatherer(size=10)
    kept, cancelled = _decide(gatherer, "kept"), _decide(gatherer, "gone")
    await _turns()
    assert caller.calls == [["kept", "gone"]]
    cancelled.cancel()
    await asyncio.sleep(0)
    caller.gate.set()
    assert await kept == (Ack("ok"), 200)
    assert cancelled.cancelled()


async def test_a_sender_cancelled_before_its_slot_leaves_its_events_to_another() -> None:
    gatherer, caller = _gatherer(size=10, slots=1)
    busy = _decide(gatherer, "busy")
    await _turns()
    calling = set(gatherer._tasks)
    late = _decide(gatherer, "late")
    await _turns()  # its sender waits for the slot "busy" holds
    [waiting_sender] = gatherer._tasks - calling
    waiting_sender.cancel()
    await _turns()
    caller.gate.set()
    assert await late == (Ack("ok"), 200)
    await busy
    assert caller.calls == [["busy"], ["late"]]


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(min_value=1, max_value=6),
    slots=st.integers(min_value=1, max_value=3),
    waves=st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=5),
)
def test_every_event_is_sent_once_in_calls_of_at_most_size(
    size: int, slots: int, waves: list[int]
) -> None:
    async def run() -> None:
        gatherer, caller = _gatherer(size=size, slots=slots)
        caller.gate.set()
        tasks = []
        for wave, count in enumerate(waves):  # each wave in a loop turn of its own
            tasks += [_decide(gatherer, f"w{wave}e{i}") for i in range(count)]
            await asyncio.sleep(0)
        results = await asyncio.gather(*tasks)
        assert results == [(Ack("ok"), 200)] * len(tasks)
        sent = [name for call in caller.calls for name in call]
        assert sorted(sent) == sorted(f"w{w}e{i}" for w, c in enumerate(waves) for i in range(c))
        assert all(1 <= len(call) <= size for call in caller.calls)
        assert (gatherer.calls, gatherer.sent) == (len(caller.calls), len(sent))

    asyncio.run(run())
