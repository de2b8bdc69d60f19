"""The EventTransport contract (:class:`shared.domain.ports.EventTransport`).

Watermill's universal Pub/Sub tests are the model: publish/fetch order, redelivery of
what is not settled, no redelivery of what is, deduplication by message id, fan-out to
independent durables, and an empty fetch that is not an error.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from shared.domain.ports import Delivery
from tests.contracts.conftest import BOUND, TransportBackend

pytestmark = pytest.mark.integration


async def _publish(backend: TransportBackend, count: int) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(count)]
    for n, message_id in enumerate(ids):
        receipt = await backend.transport.publish(
            f"{backend.subject_prefix}.event.n{n}", f"m{n}".encode(), message_id=message_id
        )
        assert not receipt.duplicate
    return ids


async def _fetch_all(
    backend: TransportBackend, durable: str, count: int, *, timeout: float = 2.0
) -> list[Delivery]:
    """Fetch until ``count`` deliveries came (bounded), the order kept."""
    got: list[Delivery] = []

    async def loop() -> None:
        while len(got) < count:
            got.extend(await backend.transport.fetch(durable, count - len(got), timeout))

    await asyncio.wait_for(loop(), timeout=BOUND)
    return got


async def test_a_durable_receives_every_message_in_publish_order(
    transport_backend: TransportBackend,
) -> None:
    durable = await transport_backend.add_durable()
    ids = await _publish(transport_backend, 20)
    got = await _fetch_all(transport_backend, durable, 20)
    assert [d.message_id for d in got] == ids
    assert [d.data for d in got] == [f"m{n}".encode() for n in range(20)]
    assert [d.attempt for d in got] == [1] * 20
    seqs = [d.stream_seq for d in got]
    assert seqs == sorted(seqs)
    for delivery in got:
        await delivery.ack()


async def test_a_second_publish_of_one_message_id_is_stored_once(
    transport_backend: TransportBackend,
) -> None:
    durable = await transport_backend.add_durable()
    message_id = str(uuid.uuid4())
    subject = f"{transport_backend.subject_prefix}.event.dup"
    first = await transport_backend.transport.publish(subject, b"x", message_id=message_id)
    second = await transport_backend.transport.publish(subject, b"x", message_id=message_id)
    assert (first.duplicate, second.duplicate) == (False, True)
    assert second.seq == first.seq
    got = await _fetch_all(transport_backend, durable, 1)
    await got[0].ack()
    assert await transport_backend.transport.fetch(durable, 10, 0.5) == []


async def test_a_nak_redelivers_after_its_delay_with_one_more_attempt(
    transport_backend: TransportBackend,
) -> None:
    durable = await transport_backend.add_durable()
    (message_id,) = await _publish(transport_backend, 1)
    (first,) = await _fetch_all(transport_backend, durable, 1)
    await first.nak(delay=3.0)
    assert await transport_backend.transport.fetch(durable, 1, 0.3) == []  # not before
    (again,) = await _fetch_all(transport_backend, durable, 1, timeout=5.0)
    assert (again.message_id, again.attempt) == (message_id, 2)
    await again.ack()


async def test_an_unsettled_delivery_is_redelivered_after_the_ack_wait(
    transport_backend: TransportBackend,
) -> None:
    durable = await transport_backend.add_durable(ack_wait=1.0)
    (message_id,) = await _publish(transport_backend, 1)
    await _fetch_all(transport_backend, durable, 1)  # and never settled
    (again,) = await _fetch_all(transport_backend, durable, 1, timeout=3.0)
    assert (again.message_id, again.attempt) == (message_id, 2)
    await again.ack()


@pytest.mark.parametrize("settle", ["ack", "term"])
async def test_an_acked_or_terminated_delivery_is_not_redelivered(
    transport_backend: TransportBackend, settle: str
) -> None:
    durable = await transport_backend.add_durable(ack_wait=1.0)
    await _publish(transport_backend, 1)
    (delivery,) = await _fetch_all(transport_backend, durable, 1)
    await (delivery.ack() if settle == "ack" else delivery.term())
    await asyncio.sleep(1.5)  # past the ack wait
    assert await transport_backend.transport.fetch(durable, 1, 0.5) == []


async def test_an_empty_fetch_returns_nothing_within_its_timeout(
    transport_backend: TransportBackend,
) -> None:
    durable = await transport_backend.add_durable()
    fetched = transport_backend.transport.fetch(durable, 10, 0.5)
    assert await asyncio.wait_for(fetched, timeout=BOUND) == []


async def test_two_durables_each_receive_every_message(
    transport_backend: TransportBackend,
) -> None:
    first, second = await transport_backend.add_durable(), await transport_backend.add_durable()
    ids = await _publish(transport_backend, 5)
    for durable in (first, second):
        got = await _fetch_all(transport_backend, durable, 5)
        assert [d.message_id for d in got] == ids
        for delivery in got:
            await delivery.ack()
