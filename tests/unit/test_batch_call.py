"""The batch answer parser (:func:`shared.domain.batch_call.read_batch_answer`) and the
batch request parser the SDK uses: any bytes give a value, never an exception; no event
is ever acknowledged unless exactly one well-formed result for it says so."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.domain.ack import Ack, HandlerFailure, HandlerResponse, RetryPolicy, decide
from shared.domain.batch_call import (
    ANSWER_LIMIT,
    MISSING_KIND,
    BatchAnswer,
    MalformedAnswer,
    MalformedBatch,
    batch_answer_document,
    parse_batch_request,
    read_batch_answer,
    result_entry,
)
from shared.domain.envelope import MAX_PAYLOAD_DEPTH, parse_json_body
from shared.domain.errors import PoisonError

POLICY = RetryPolicy((0.2, 1.0), 5)
IDS = [uuid.UUID(int=i + 1) for i in range(4)]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)
result_ids = st.sampled_from([str(i) for i in IDS]) | st.text(max_size=40)
results = st.fixed_dictionaries(
    {"id": result_ids, "status": st.integers(0, 700) | json_values},
    optional={
        "retry_after": json_values | st.floats(allow_nan=True, allow_infinity=True),
        "retryable": json_values,
        "error": json_values,
    },
)
answers = st.fixed_dictionaries(
    {"results": st.lists(results, max_size=8) | json_values},
    optional={"ferry_batch": st.integers(0, 3) | json_values},
)


def _bytes(doc: Any) -> bytes:
    return json.dumps(doc).encode()


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_value(body: bytes) -> None:
    answer = read_batch_answer(body, IDS)
    assert isinstance(answer, BatchAnswer | MalformedAnswer)


@settings(max_examples=400)
@given(answers)
def test_only_exactly_one_wellformed_result_can_ack(doc: dict[str, Any]) -> None:
    answer = read_batch_answer(_bytes(doc), IDS)
    if isinstance(answer, MalformedAnswer):
        return  # every event retried
    assert set(answer.outcomes) == set(IDS)
    entries = doc["results"]
    for mid in IDS:
        mine = [e for e in entries if _same(e.get("id"), mid)]
        outcome = answer.outcomes[mid]
        decision = decide(outcome, attempt=1, policy=POLICY)
        if len(mine) != 1:
            assert isinstance(outcome, HandlerFailure) and outcome.kind == MISSING_KIND
            assert not isinstance(decision, Ack)
        else:
            assert isinstance(outcome, HandlerResponse)
            assert outcome.status == mine[0]["status"]
    assert len(answer.missing) + len(answer.duplicated) <= len(IDS)


def _same(raw: Any, mid: uuid.UUID) -> bool:
    try:
        return isinstance(raw, str) and uuid.UUID(raw) == mid
    except ValueError:
        return False


@given(
    st.lists(
        st.tuples(
            st.sampled_from([200, 409, 422, 429, 500, 503]),
            st.none() | st.integers(0, 10**6),
            st.none() | st.booleans(),
        ),
        min_size=len(IDS),
        max_size=len(IDS),
    )
)
def test_what_the_sdk_writes_reads_back_unchanged(spec: list[Any]) -> None:
    entries = [
        result_entry(str(mid), status, retry_after=after, retryable=flag, error={"e": 1})
        for mid, (status, after, flag) in zip(IDS, spec, strict=True)
    ]
    answer = read_batch_answer(_bytes(batch_answer_document(entries)), IDS)
    assert isinstance(answer, BatchAnswer)
    assert not answer.missing and not answer.duplicated and not answer.unknown
    for mid, (status, after, flag) in zip(IDS, spec, strict=True):
        outcome = answer.outcomes[mid]
        assert isinstance(outcome, HandlerResponse)
        assert (outcome.status, outcome.retry_after, outcome.retryable) == (
            status,
            None if after is None else float(after),
            flag,
        )
        assert outcome.detail == '{"e":1}'


def test_the_edges() -> None:
    good = {"id": str(IDS[0]), "status": 200}
    assert isinstance(read_batch_answer(b" " * (ANSWER_LIMIT + 1), IDS), MalformedAnswer)
    for bad in (
        {"results": [{**good, "status": True}]},
        {"results": [{**good, "retry_after": -1}]},
        {"results": [{**good, "retryable": "yes"}]},
        {"results": [{**good, "id": "not-a-uuid"}]},
        {"results": [good], "ferry_batch": 2},
        {"results": {"0": good}},
        [good],
    ):
        assert isinstance(read_batch_answer(_bytes(bad), IDS), MalformedAnswer), bad
    answer = read_batch_answer(_bytes({"results": [good, good, {**good, "id": str(IDS[1])}]}), IDS)
    assert isinstance(answer, BatchAnswer)
    assert answer.duplicated == [IDS[0]] and answer.missing == [IDS[2], IDS[3]]
    unknown = read_batch_answer(_bytes({"results": [{**good, "id": str(uuid.uuid4())}]}), IDS)
    assert isinstance(unknown, BatchAnswer) and len(unknown.unknown) == 1
    assert read_batch_answer(b'{"results": []}', []) == BatchAnswer({})


@settings(max_examples=300)
@given(st.binary(max_size=200) | answers.map(_bytes))
def test_the_request_parser_gives_events_or_its_own_error(body: bytes) -> None:
    try:
        events = parse_batch_request(body, limit=5)
    except MalformedBatch as exc:
        assert exc.reason_code
        return
    assert isinstance(events, list) and 1 <= len(events) <= 5


def test_the_request_parser_takes_version_1() -> None:
    assert parse_batch_request(b'{"ferry_batch": 1, "events": [{}]}') == [{}]
    for body in (b'{"ferry_batch": true, "events": [{}]}', b'{"events": [{}]}'):
        try:
            parse_batch_request(body)
        except MalformedBatch as exc:
            assert exc.reason_code == "UNSUPPORTED_BATCH_VERSION"
        else:
            raise AssertionError(body)


@pytest.mark.parametrize(
    "levels", [1, MAX_PAYLOAD_DEPTH - 1, MAX_PAYLOAD_DEPTH, MAX_PAYLOAD_DEPTH + 1]
)
def test_a_batch_takes_exactly_the_events_a_body_of_their_own_would_by_depth(levels: int) -> None:
    """An event in a batch is two levels further down than in a body of its own: the
    batch is held to the same limit for each event, no tighter (a payload at the deepest
    allowed once made the whole batch MALFORMED_JSON) and no looser."""
    payload: dict[str, Any] = {}
    inner = payload
    for _ in range(levels - 1):
        inner["a"] = {}
        inner = inner["a"]
    event = {"message_id": str(uuid.uuid4()), "payload": payload}
    alone = _accepted(lambda: parse_json_body(json.dumps(event).encode()))
    in_batch = _accepted(
        lambda: parse_batch_request(json.dumps({"ferry_batch": 1, "events": [event]}).encode())
    )
    assert alone is (levels <= MAX_PAYLOAD_DEPTH)
    assert in_batch is alone


def _accepted(parse: Any) -> bool:
    try:
        parse()
    except PoisonError:
        return False
    return True
