"""Atomic batch helpers of the outbox-publisher: how a claim is cut and how an answer reads."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.js import errors as js_errors

from services.outbox_publisher.atomic import (
    ATOMIC_DISABLED,
    Message,
    chunks,
    read_ack,
)

messages = st.lists(
    st.tuples(
        st.sampled_from(["a.b", "sea.model.published.v1"]),
        st.binary(max_size=300),
        st.dictionaries(st.sampled_from(["Nats-Msg-Id", "traceparent"]), st.text(max_size=40)),
    ),
    max_size=60,
)


def _weight(message: Message) -> int:
    subject, body, headers = message
    return len(subject) + len(body) + sum(len(k) + len(v) + 4 for k, v in headers.items())


@given(messages, st.integers(1, 10), st.integers(1, 2000))
def test_chunks_cover_every_message_once_in_order_within_the_limits(
    batch: list[Message], max_messages: int, max_bytes: int
) -> None:
    parts = list(chunks(batch, max_messages=max_messages, max_bytes=max_bytes))
    assert [i for part in parts for i in part] == list(range(len(batch)))
    for part in parts:
        assert 1 <= len(part) <= max_messages
        if len(part) > 1:  # a message over the byte limit by itself goes alone
            assert sum(_weight(batch[i]) for i in part) <= max_bytes


def test_the_server_limit_cuts_a_large_claim_into_thousands() -> None:
    batch = [("s", b"{}", {"Nats-Msg-Id": str(i)}) for i in range(2500)]
    assert [len(part) for part in chunks(batch)] == [1000, 1000, 500]


def test_a_pub_ack_naming_the_batch_and_its_count_is_stored() -> None:
    ack = json.dumps({"stream": "S", "seq": 9, "batch": "b1", "count": 3}).encode()
    assert read_ack(ack, batch_id="b1", count=3) is None


@pytest.mark.parametrize(
    ("doc", "unsupported", "says"),
    [
        ({"stream": "S", "seq": 9}, True, "before 2.12"),
        ({"stream": "S", "seq": 9, "batch": "other", "count": 3}, True, "single message"),
        ({"stream": "S", "seq": 9, "batch": "b1", "count": 2}, True, "single message"),
        (
            {"error": {"code": 400, "err_code": 10201, "description": "duplicate message id"}},
            False,
            "duplicate message id (err_code 10201)",
        ),
        (
            {"error": {"code": 400, "err_code": ATOMIC_DISABLED, "description": "disabled"}},
            True,
            "disabled",
        ),
    ],
)
def test_an_answer_that_is_not_the_batch_pub_ack_is_a_refusal_naming_why(
    doc: object, unsupported: bool, says: str
) -> None:
    refused = read_ack(json.dumps(doc).encode(), batch_id="b1", count=3)
    assert refused is not None
    assert refused.unsupported is unsupported
    assert says in refused.reason


def test_jetstream_unavailable_is_an_outage_not_a_refusal() -> None:
    doc = {"error": {"code": 503, "err_code": 10008, "description": "JetStream not ready"}}
    with pytest.raises(js_errors.ServiceUnavailableError):
        read_ack(json.dumps(doc).encode(), batch_id="b1", count=1)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["error", "code", "err_code", "description", "batch", "count"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_answer_reads_as_stored_refused_or_outage_and_nothing_else(data: bytes) -> None:
    try:
        refused = read_ack(data, batch_id="b1", count=2)
    except js_errors.ServiceUnavailableError:
        return
    assert refused is None or refused.reason
