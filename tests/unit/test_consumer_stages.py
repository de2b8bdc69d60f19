"""The inbox consumer's stages on fakes (:mod:`tests.unit.consumer_fakes`): claim, decide,
settle, keep-alive, and the unordered path that runs them in sequence — assembled by the
composition root, without servers."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

import pytest

from services.inbox_consumer.claiming import CONTENDED_DELAY
from services.inbox_consumer.delivery import parse_delivery
from services.inbox_consumer.holding import Holder
from services.inbox_consumer.keepalive import KeepAlive
from shared.domain.ack import Ack, HandlerFailure, HandlerResponse, Nak
from shared.domain.ports import HandlerPort
from tests.unit.consumer_fakes import (
    FakeHandler,
    FakeMsg,
    FakePool,
    MemoryInbox,
    consumer,
    durable_spec,
    fake_msg,
)


def _ids(msgs: list[FakeMsg]) -> list[uuid.UUID]:
    return [uuid.UUID((m.headers or {})["Nats-Msg-Id"]) for m in msgs]


def test_the_fake_handler_is_a_handler_port() -> None:
    handler: HandlerPort = FakeHandler()
    assert handler is not None


async def test_an_unordered_batch_is_claimed_decided_and_settled_in_one_pass() -> None:
    handler, inbox = FakeHandler(), MemoryInbox()
    loop = consumer(durable_spec(), handler=handler, inbox=inbox)
    msgs = [fake_msg(seq) for seq in (1, 2, 3)]
    await loop.process_batch(cast(Any, msgs))
    assert [m.calls for m in msgs] == [["ack"]] * 3
    assert sorted(handler.calls) == sorted(str(mid) for mid in _ids(msgs))
    assert {inbox.row(mid).status for mid in _ids(msgs)} == {"processed"}
    assert loop.stats.processed == 3
    assert len(loop.keeper) == 0  # every message settled is let go


async def test_a_duplicate_is_acked_without_a_call_and_a_leased_copy_is_nakd() -> None:
    handler, inbox = FakeHandler(), MemoryInbox()
    done, leased = fake_msg(1), fake_msg(2)
    loop = consumer(durable_spec(), handler=handler, inbox=inbox)
    await loop.process_batch(cast(Any, [done]))
    other = consumer(durable_spec(), handler=handler, inbox=inbox, owner="another")
    inbox.lease(_ids([leased])[0], "me", 3.0)
    again = fake_msg(1, attempt=2, message_id=str(_ids([done])[0]))
    await other.process_batch(cast(Any, [again, leased]))
    assert again.calls == ["ack"] and other.stats.duplicates == 1
    assert leased.calls == ["nak"] and leased.delays == [3.0 + CONTENDED_DELAY]
    assert handler.calls == [str(_ids([done])[0])]  # the first delivery only


async def test_the_same_id_twice_in_one_batch_is_called_once() -> None:
    handler, inbox = FakeHandler(), MemoryInbox()
    first = fake_msg(1)
    twice = fake_msg(2, message_id=str(_ids([first])[0]))
    loop = consumer(durable_spec(), handler=handler, inbox=inbox)
    await loop.process_batch(cast(Any, [first, twice]))
    assert first.calls == ["ack"]
    assert twice.calls == ["nak"] and twice.delays == [CONTENDED_DELAY]
    assert len(handler.calls) == 1


async def test_a_retryable_answer_records_the_attempt_and_naks_with_the_back_off() -> None:
    msg = fake_msg(1)
    mid = str(_ids([msg])[0])
    handler = FakeHandler(script={mid: [HandlerResponse(503)]})
    inbox = MemoryInbox()
    loop = consumer(durable_spec(), handler=handler, inbox=inbox)
    await loop.process_batch(cast(Any, [msg]))
    assert msg.calls == ["nak"] and msg.delays == [0.5]
    assert inbox.retries == [uuid.UUID(mid)] and inbox.row(uuid.UUID(mid)).handler_status == 503
    assert loop.stats.retries == 1 and loop.stats.retries_by_reason == {"HTTP_503": 1}


async def test_decide_turns_the_handler_outcome_into_the_ack_decision() -> None:
    msg = fake_msg(1, attempt=1)
    mid = str(_ids([msg])[0])
    handler = FakeHandler(script={mid: [HandlerFailure("timeout", "slow")]})
    loop = consumer(durable_spec(), handler=handler, inbox=MemoryInbox())
    delivery = parse_delivery(cast(Any, msg))
    decision, status = await loop.decider.traced(delivery)
    assert isinstance(decision, Nak) and status is None
    decision, status = await loop.decider.traced(delivery)
    assert isinstance(decision, Ack) and status == 200
    assert loop.stats.handler_calls == 2


async def test_batch_calls_go_through_the_port_n_at_a_time() -> None:
    handler, inbox = FakeHandler(), MemoryInbox()
    spec = durable_spec()
    spec = spec.model_copy(update={"handler": spec.handler.model_copy(update={"batch": 2})})
    loop = consumer(spec, handler=handler, inbox=inbox)
    msgs = [fake_msg(seq) for seq in (1, 2, 3)]
    await loop.process_batch(cast(Any, msgs))
    assert sorted(len(call) for call in handler.batches) == [1, 2]
    assert handler.calls == []
    assert [m.calls for m in msgs] == [["ack"]] * 3


async def test_the_claim_holds_through_an_outage_then_goes_on() -> None:
    handler, inbox, pool = FakeHandler(), MemoryInbox(), FakePool(down=2)
    loop = consumer(durable_spec(), handler=handler, inbox=inbox, pool=pool)
    loop.holder.first_pause = loop.holder.longest_pause = 0.01
    msg = fake_msg(1)
    await loop.process_batch(cast(Any, [msg]))
    assert msg.calls == ["ack"]
    assert loop.stats.inbox_unavailable == 2  # counted through the holder's callback


async def test_a_stop_during_an_outage_naks_the_batch_for_later() -> None:
    handler, inbox = FakeHandler(), MemoryInbox()
    loop = consumer(durable_spec(), handler=handler, inbox=inbox, pool=FakePool(down=10**6))
    loop.holder.first_pause = loop.holder.longest_pause = 0.01
    loop.holder.stop.set()
    msg = fake_msg(1)
    await loop.process_batch(cast(Any, [msg]))
    assert msg.calls == ["nak"] and msg.delays == [CONTENDED_DELAY]
    assert handler.calls == []


async def test_the_holder_raises_a_refusal_after_its_tries() -> None:
    calls = 0

    async def refused(conn: object) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("not a database error")

    holder = Holder(cast(Any, FakePool()), first_pause=0.0, longest_pause=0.0)
    with pytest.raises(RuntimeError):
        await holder.run("work", refused)
    assert calls == 1  # only database errors are held


async def test_the_keep_alive_beats_held_messages_until_released() -> None:
    keeper = KeepAlive(every=0.01)
    held, released = fake_msg(1), fake_msg(2)
    keeper.hold(cast(Any, [held, released]))
    keeper.release(cast(Any, [released]))
    await keeper.beat()
    assert held.calls == ["in_progress"] and released.calls == []
    await held.ack()
    await keeper.beat()
    assert held.calls == ["in_progress", "ack"] and len(keeper) == 0
    keeper.fenced = True
    keeper.hold(cast(Any, [released]))
    beating = asyncio.create_task(keeper.run())
    await asyncio.sleep(0.05)
    beating.cancel()
    assert released.calls == []  # a fenced partition's messages are left to expire
