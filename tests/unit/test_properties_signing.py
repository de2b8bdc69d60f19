"""Signature verification (the handler side of signed calls): any headers and any body
give the authenticated durable or :class:`SignatureError`, never another exception; a
signed call verifies, and any change to its body, durable or time is refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.domain.errors import FerryError
from shared.domain.signing import (
    DURABLE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SignatureError,
    sign,
    verify,
)
from tests.unit.hostile_values import hostile_text

PROPERTY = settings(max_examples=200, deadline=None)
NOW = 1_764_000_000.0
SECRETS = {"sea__from_vibespro": b"s3cret", "vibespro__from_sea": b"other"}
durables = st.sampled_from(sorted(SECRETS))
header_values = st.one_of(
    hostile_text,
    st.sampled_from(sorted(SECRETS)),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["9" * 4000, " 1764000000 ", "+1764000000", "1_764_000_000", "١٧٦٤٠٠٠٠٠٠"]),
    st.text(alphabet="v1=0123456789abcdef", max_size=70),
)


def _signed(durable: str, body: bytes) -> dict[str, str]:
    return sign(SECRETS[durable], durable, body, NOW)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (TIMESTAMP_HEADER, "9" * 400),  # OverflowError subtracting it from a float
        (TIMESTAMP_HEADER, "١٧٦٤٠٠٠٠٠٠"),  # int() reads other scripts' digits
        (TIMESTAMP_HEADER, "1_764_000_000"),
        (SIGNATURE_HEADER, "v1=é"),  # compare_digest: TypeError on non-ASCII text
        (SIGNATURE_HEADER, "v1=\udcff"),  # a header byte decoded with surrogateescape
    ],
)
def test_odd_header_values_are_a_signature_error(header: str, value: str) -> None:
    headers = {**_signed("sea__from_vibespro", b"{}"), header: value}
    with pytest.raises(SignatureError) as refused:
        verify(SECRETS, headers, b"{}", now=NOW)
    assert isinstance(refused.value, FerryError) and len(str(refused.value)) < 200


@PROPERTY
@given(
    headers=st.dictionaries(
        st.sampled_from([DURABLE_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER, "Other"]),
        header_values,
    ),
    body=st.binary(max_size=200),
    tolerance=st.floats(min_value=0, max_value=1e12),
)
def test_any_headers_and_body_verify_or_raise_signature_error(
    headers: dict[str, str], body: bytes, tolerance: float
) -> None:
    try:
        durable = verify(SECRETS, headers, body, now=NOW, tolerance=tolerance)
    except SignatureError as exc:
        assert len(str(exc)) < 200
    else:
        # Guessing a valid HMAC is not something a fuzzer does: only known durables pass.
        assert durable in SECRETS


@PROPERTY
@given(
    durable=durables,
    body=st.binary(max_size=500),
    skew=st.floats(min_value=-299, max_value=299),
)
def test_a_signed_call_verifies_within_the_tolerance(
    durable: str, body: bytes, skew: float
) -> None:
    assert verify(SECRETS, _signed(durable, body), body, now=NOW + skew) == durable


@PROPERTY
@given(durable=durables, body=st.binary(max_size=200), other=st.binary(max_size=200))
def test_a_changed_body_is_refused(durable: str, body: bytes, other: bytes) -> None:
    if other == body:
        return
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRETS, _signed(durable, body), other, now=NOW)


@PROPERTY
@given(body=st.binary(max_size=200), skew=st.floats(min_value=302, max_value=1e9))
def test_a_call_outside_the_tolerance_is_refused(body: bytes, skew: float) -> None:
    headers = _signed("sea__from_vibespro", body)
    for now in (NOW + skew, NOW - skew):
        with pytest.raises(SignatureError, match="stale"):
            verify(SECRETS, headers, body, now=now)


def test_a_signature_for_another_durable_is_refused() -> None:
    headers = {**_signed("sea__from_vibespro", b"{}"), DURABLE_HEADER: "vibespro__from_sea"}
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRETS, headers, b"{}", now=NOW)
