"""The signature of handler calls, as a pure function: what passes and what is refused."""

from __future__ import annotations

import pytest

from shared.domain.signing import SignatureError, sign, verify

SECRETS = {"sea__from_vibespro": b"s3cret-one", "cg_f_ingest": b"s3cret-two"}
BODY = b'{"message_id":"m1","payload":{}}'
NOW = 1_800_000_000.0


def test_a_signed_body_verifies_as_its_durable() -> None:
    headers = sign(SECRETS["sea__from_vibespro"], "sea__from_vibespro", BODY, NOW)
    assert verify(SECRETS, headers, BODY, now=NOW + 10) == "sea__from_vibespro"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda h, b: ({}, b), "unsigned request: missing Ferry-Durable, Ferry-Timestamp"),
        (lambda h, b: (h, b + b" "), "signature does not match the body"),
        (lambda h, b: ({**h, "Ferry-Durable": "cg_f_ingest"}, b), "does not match"),
        (lambda h, b: ({**h, "Ferry-Durable": "intruder"}, b), "no secret for durable 'intruder'"),
        (lambda h, b: ({**h, "Ferry-Timestamp": "soon"}, b), "is not Unix seconds"),
        (lambda h, b: ({**h, "Ferry-Signature": "v1=" + "0" * 64}, b), "does not match"),
    ],
)
def test_forged_or_unsigned_requests_are_refused(change: object, message: str) -> None:
    headers = sign(SECRETS["sea__from_vibespro"], "sea__from_vibespro", BODY, NOW)
    forged_headers, forged_body = change(headers, BODY)  # type: ignore[operator]
    with pytest.raises(SignatureError, match=message):
        verify(SECRETS, forged_headers, forged_body, now=NOW)


@pytest.mark.parametrize("age", [301.0, -301.0, 86400.0])
def test_stale_and_future_signatures_are_refused(age: float) -> None:
    headers = sign(SECRETS["cg_f_ingest"], "cg_f_ingest", BODY, NOW)
    with pytest.raises(SignatureError, match="stale request"):
        verify(SECRETS, headers, BODY, now=NOW + age, tolerance=300)


def test_the_error_never_contains_the_secret() -> None:
    headers = sign(b"wrong", "sea__from_vibespro", BODY, NOW)
    with pytest.raises(SignatureError) as caught:
        verify(SECRETS, headers, BODY, now=NOW)
    assert all(secret.decode() not in str(caught.value) for secret in SECRETS.values())
