"""The replay API's request parser (services/console/replay_api.py) meets hypothesis:
any body is either a request or an ApiError naming what is wrong with a 4xx — never
another exception — and a request survives its own normalisation unchanged."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.console.replay_api import (
    KEY_NAMESPACE,
    MAX_IDS,
    ApiError,
    ReplayRequest,
    job_id_of,
    parse_request,
)

DURABLES = ("cg_f_ingest", "cg_replay")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                 max_size=4),
    max_leaves=12,
)  # fmt: skip
fields = st.sampled_from(["durable", "message_ids", "group", "limit", "reason", "job_id", "other"])
bodies = st.dictionaries(fields, json_values, max_size=6)
ids = st.lists(st.uuids(), min_size=1, max_size=MAX_IDS)
reasons = st.text(min_size=1, max_size=100).filter(lambda t: t.strip() != "")


def _parse(body: Any) -> ReplayRequest | ApiError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        return parse_request(raw, DURABLES)
    except ApiError as exc:
        return exc


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200) | bodies.map(lambda d: json.dumps(d).encode()))
def test_any_body_is_a_request_or_a_4xx_in_words(body: bytes) -> None:
    found = _parse(body)
    if isinstance(found, ApiError):
        assert 400 <= found.status < 500 and str(found)
    else:
        assert found.reason.strip() and found.durable in DURABLES


@settings(max_examples=200, deadline=None)
@given(ids, reasons, st.sampled_from(DURABLES))
def test_a_list_request_reads_back_normalised(
    message_ids: list[uuid.UUID], reason: str, durable: str
) -> None:
    body = {"durable": durable, "message_ids": [str(m) for m in message_ids], "reason": reason}
    found = _parse(body)
    assert isinstance(found, ReplayRequest), found
    normal = found.normalised()
    # Order and repeats do not make another request; its own normal form parses to itself.
    assert normal["message_ids"] == sorted({str(m) for m in message_ids})
    again = _parse({**body, "message_ids": list(reversed(body["message_ids"])) * 2})
    assert isinstance(again, ReplayRequest) and again.normalised() == normal
    assert _parse(normal) == found


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet="0123456789abcdef", min_size=12, max_size=12),
    st.text(min_size=1, max_size=40).filter(lambda t: t.strip() != ""),
    st.none() | st.integers(min_value=-5, max_value=MAX_IDS + 5),
    reasons,
)
def test_a_group_request(fingerprint: str, code: str, limit: int | None, reason: str) -> None:
    group = {"durable": "cg_f_ingest", "reason_code": code, "fingerprint": fingerprint}
    body: dict[str, Any] = {"group": group, "reason": reason}
    if limit is not None:
        body["limit"] = limit
    found = _parse(body)
    if limit is not None and not 1 <= limit <= MAX_IDS:
        assert isinstance(found, ApiError) and found.status == 400 and "limit" in str(found)
        return
    assert isinstance(found, ReplayRequest), found
    assert found.group is not None and found.group.fingerprint == fingerprint
    assert found.limit == (limit or MAX_IDS)
    assert _parse(found.normalised()) == found


@given(st.text(max_size=220))
def test_idempotency_keys(key: str) -> None:
    try:
        job_id = job_id_of(key)
    except ApiError as exc:
        assert exc.status == 400 and "Idempotency-Key" in str(exc)
        assert not key or len(key) > 200 or any(not 0x21 <= ord(c) <= 0x7E for c in key)
        return
    assert job_id == job_id_of(key)  # a key always names the same job
    try:
        assert job_id == uuid.UUID(key)
    except ValueError:
        assert job_id == uuid.uuid5(KEY_NAMESPACE, key)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"", 400, "not JSON"),
        (b"{", 400, "not JSON"),
        (b"\xff", 400, "UTF-8"),
        (b"[]", 400, "JSON object"),
        (b"x" * 70_000, 413, "over"),
        ({"reason": " ", "durable": "cg_f_ingest", "message_ids": []}, 400, "reason"),
        ({"reason": "r" * 501, "durable": "cg_f_ingest", "message_ids": []}, 400, "longer than"),
        ({"reason": "r", "durable": "nope", "message_ids": [str(uuid.uuid4())]}, 422,
         "unknown durable 'nope' (known: cg_f_ingest, cg_replay)"),
        ({"reason": "r", "durable": "cg_f_ingest",
          "message_ids": [str(uuid.uuid4()) for _ in range(MAX_IDS + 1)]}, 422, "too many"),
        ({"reason": "r", "durable": "cg_f_ingest", "message_ids": "abc"}, 400, "must be a list"),
        ({"reason": "r", "durable": "cg_f_ingest", "message_ids": [1]}, 400, "1 is not"),
        ({"reason": "r", "durable": "cg_f_ingest", "message_ids": [str(uuid.uuid4())],
          "limit": 3}, 400, "group request only"),
        ({"reason": "r", "durable": "cg_f_ingest", "group": {}}, 400, "durable goes inside"),
        ({"reason": "r", "message_ids": [], "group": {}}, 400, "not both"),
        ({"reason": "r", "group": {"durable": "cg_f_ingest", "reason_code": "X",
                                   "fingerprint": "XYZ"}}, 400, "12 hex digits"),
        ({"reason": "r", "group": {"durable": "cg_f_ingest", "reason_code": "X",
                                   "fingerprint": "0123456789ab", "extra": 1}}, 400, "extra"),
        ({"reason": "r", "group": ["cg_f_ingest"]}, 400, "group must be an object"),
        ({"reason": "r", "job_id": "", "group": {}}, 400, "job_id"),
    ],
)  # fmt: skip
def test_refusals_name_the_problem(body: Any, status: int, words: str) -> None:
    found = _parse(body)
    assert isinstance(found, ApiError), found
    assert found.status == status and words in str(found), str(found)
