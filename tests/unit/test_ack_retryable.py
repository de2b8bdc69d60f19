"""INFRA-005 §3.1, "retry only when retryable=true": a handler's ``retryable`` flag.

``retryable: false`` in a 4xx/5xx JSON body makes an answer the table would retry final at
once (HANDLER_NOT_RETRYABLE); ``retryable: true`` makes a 4xx the table would dead-letter
a retry (issue 26). Neither touches a credentials refusal (held) or a success.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.ack import (
    Ack,
    DeadLetter,
    HandlerResponse,
    Nak,
    RetryPolicy,
    body_retryable,
    decide,
)

POLICY = RetryPolicy(backoff=(1.0, 5.0), max_deliver=6)


@pytest.mark.parametrize("status", [404, 405, 408, 425, 429, 500, 502, 503, 599])
def test_retryable_false_makes_a_retry_final(status: int) -> None:
    response = HandlerResponse(status, 30.0, '{"error": "quota gone"}', retryable=False)
    decision = decide(response, attempt=1, policy=POLICY)
    assert isinstance(decision, DeadLetter)
    assert decision.reason_code == "HANDLER_NOT_RETRYABLE"
    assert f"handler answered {status}" in decision.detail and "quota gone" in decision.detail


@pytest.mark.parametrize("status", [503, 429, 404])
def test_retryable_true_or_absent_retries_as_before(status: int) -> None:
    for flag in (True, None):
        decision = decide(HandlerResponse(status, retryable=flag), attempt=1, policy=POLICY)
        assert isinstance(decision, Nak)


@pytest.mark.parametrize("status", [401, 403])
def test_a_credentials_refusal_is_held_whatever_the_body_says(status: int) -> None:
    decision = decide(HandlerResponse(status, retryable=False), attempt=1, policy=POLICY)
    assert isinstance(decision, Nak) and decision.alert


def test_the_flag_changes_no_success_and_no_redirect() -> None:
    for flag in (True, False):
        assert decide(HandlerResponse(200, retryable=flag), attempt=1, policy=POLICY) == Ack(
            "processed"
        )
        assert decide(HandlerResponse(409, retryable=flag), attempt=1, policy=POLICY) == Ack(
            "already_processed"
        )
    redirect = decide(HandlerResponse(307, retryable=False), attempt=1, policy=POLICY)
    assert isinstance(redirect, Nak), "a redirect is the URL's fault: retried and alerted"


@pytest.mark.parametrize("status", [400, 410, 413, 415, 422, 451])
def test_retryable_true_makes_a_4xx_dead_letter_a_retry(status: int) -> None:
    response = HandlerResponse(status, 20.0, "not yet", retryable=True)
    decision = decide(response, attempt=1, policy=POLICY)
    assert decision == Nak(20.0, f"handler answered {status} with retryable: true")
    last = decide(response, attempt=POLICY.max_deliver, policy=POLICY)
    assert isinstance(last, DeadLetter) and last.reason_code == "MAX_DELIVERIES_EXCEEDED"


@pytest.mark.parametrize("status", [400, 422])
def test_without_the_flag_a_4xx_dead_letters_as_before(status: int) -> None:
    for flag in (None, False):
        decision = decide(HandlerResponse(status, retryable=flag), attempt=1, policy=POLICY)
        assert isinstance(decision, DeadLetter)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"retryable": false}', False),
        (b'{"error": "x", "retryable": true}', True),
        (b'{"retryable": "false"}', None),
        (b'{"retryable": 0}', None),
        (b'[{"retryable": false}]', None),
        (b'{"retryable": false', None),  # cut short
        (b"busy", None),
        (b"", None),
        (b"\xff\xfe", None),
        (b'{"a":' * 5000 + b"1" + b"}" * 5000, None),
        (b'{"n": ' + b"9" * 5000 + b', "retryable": false}', None),
    ],
)
def test_body_retryable_reads_only_a_boolean_member_of_an_object(
    body: bytes, expected: bool | None
) -> None:
    assert body_retryable(body) is expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)


@given(st.binary(max_size=300))
def test_body_retryable_never_raises_on_bytes(body: bytes) -> None:
    assert body_retryable(body) in (True, False, None)


@given(st.dictionaries(st.text(), json_values, max_size=5), json_values)
def test_body_retryable_is_the_member_when_it_is_a_boolean(
    doc: dict[str, object], value: object
) -> None:
    doc["retryable"] = value
    found = body_retryable(json.dumps(doc).encode())
    assert found is (value if isinstance(value, bool) else None)
