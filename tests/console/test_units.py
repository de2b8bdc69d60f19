"""The console's parts that need no server: passwords, sessions, CSRF, the search box, the
redirect target, sparklines, the span timeline, the thresholds drawn (= the alert rules)."""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from pathlib import Path

import asyncpg
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from services.console.auth import (
    Account,
    Authenticator,
    hash_password,
    load_accounts,
    verify_password,
)
from services.console.data import parse_search, predicted
from services.console.overview import THRESHOLDS
from services.console.svg import sparkline
from services.console.views import safe_next, timeline
from shared.domain.errors import ConfigurationError
from tests.conftest import ROOT

FAST = hash_password("correct horse")


def _auth(**kw: object) -> Authenticator:
    accounts = {
        "ops": Account("ops", "operator", FAST),
        "viewer": Account("viewer", "read-only", FAST),
    }
    return Authenticator(accounts, key=b"k" * 32, **kw)  # type: ignore[arg-type]


def test_passwords_are_salted_scrypt_and_checked() -> None:
    assert FAST.startswith("scrypt$16384$8$1$")
    assert hash_password("correct horse") != FAST  # a fresh salt each time
    assert verify_password("correct horse", FAST)
    assert not verify_password("correct hors", FAST)
    # Flip one bit of the stored key's first byte: always a different key, whatever the salt.
    head, key = FAST.rsplit("$", 1)
    raw = base64.urlsafe_b64decode(key + "=" * (-len(key) % 4))
    tampered = base64.urlsafe_b64encode(bytes([raw[0] ^ 1]) + raw[1:]).decode().rstrip("=")
    assert tampered != key
    assert not verify_password("correct horse", f"{head}${tampered}")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_any_stored_hash_is_a_refusal_never_an_error(encoded: str) -> None:
    assert verify_password("x", encoded) is False


def test_sessions_are_signed_expire_and_follow_the_accounts() -> None:
    auth = _auth()
    session = auth.sign_in("ops", "correct horse")
    assert session is not None and session.may_act and session.actor == "ops@console"
    cookie = auth.cookie(session)
    assert auth.from_cookie(cookie) == session
    body, mac = cookie.rsplit(".", 1)
    assert auth.from_cookie(body + "." + mac[::-1]) is None
    assert auth.from_cookie(("A" if body[0] != "A" else "B") + cookie[1:]) is None
    assert _auth().from_cookie(cookie) == session  # same key: still valid
    assert Authenticator({}, key=b"other" * 8).from_cookie(cookie) is None  # account gone
    expired = auth.cookie(type(session)(session.user, session.role, time.time() - 1, "n"))
    assert auth.from_cookie(expired) is None
    viewer = auth.sign_in("viewer", "correct horse")
    assert viewer is not None and not viewer.may_act
    assert auth.sign_in("ops", "wrong") is None and auth.sign_in("nobody", "x") is None


def test_csrf_tokens_are_per_session() -> None:
    auth = _auth()
    one, two = auth.sign_in("ops", "correct horse"), auth.sign_in("ops", "correct horse")
    assert one is not None and two is not None
    assert auth.check_csrf(one, auth.csrf_token(one))
    assert not auth.check_csrf(one, auth.csrf_token(two))
    assert not auth.check_csrf(one, None) and not auth.check_csrf(one, "")


def test_repeated_failures_lock_the_name_out() -> None:
    auth = _auth()
    for _ in range(5):
        assert auth.sign_in("ops", "wrong") is None
    assert auth.locked("ops")
    assert auth.sign_in("ops", "correct horse") is None  # even the right password, for now
    assert auth.sign_in("viewer", "correct horse") is not None


def test_bearer_token() -> None:
    auth = _auth(token="s3cret-token", token_role="operator")
    session = auth.from_bearer("Bearer s3cret-token")
    assert session is not None and session.may_act and session.via == "token"
    assert auth.check_csrf(session, None)  # no cookie, no cross-site forgery
    for header in (None, "", "Bearer wrong", "Basic s3cret-token", "s3cret-token"):
        assert auth.from_bearer(header) is None
    assert _auth().from_bearer("Bearer s3cret-token") is None


def test_accounts_file_errors_name_the_file_never_a_hash(tmp_path: Path) -> None:
    path = tmp_path / "accounts.json"
    path.write_text('{"ops": {"role": "operator", "password": "' + FAST + '"}}')
    assert load_accounts(path)["ops"].role == "operator"
    for text in ("nope", "[]", '{"ops": {"role": "admin", "password": "x"}}',
                 '{"ops": {"role": "operator", "password": "md5$abc"}}'):  # fmt: skip
        path.write_text(text)
        with pytest.raises(ConfigurationError) as info:
            load_accounts(path)
        assert str(path) in str(info.value) and FAST not in str(info.value)


def test_search_box() -> None:
    ident = uuid.uuid4()
    assert parse_search(f" {ident} ") == ("id", ident)
    assert parse_search("vibe/v-17") == ("aggregate", ("vibe", "v-17"))
    assert parse_search("vibespro.event.vibe_created.v1") == (
        "subject",
        "vibespro.event.vibe_created.v1",
    )
    assert parse_search("sea.event.>") == ("subject", "sea.event.>")
    for bad in ("", "hello", "a b", "%%"):
        with pytest.raises(ValueError, match="search for a message or correlation id"):
            parse_search(bad)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_search_box_meets_any_text(text: str) -> None:
    try:
        kind, _ = parse_search(text)
    except ValueError:
        return
    assert kind in ("id", "aggregate", "subject")


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=60)))
def test_redirect_after_sign_in_stays_on_the_console(target: str | None) -> None:
    found = safe_next(target)
    assert found.startswith("/") and not found.startswith("//") and "\\" not in found


def test_predicted_actions_follow_the_domain_rules() -> None:
    assert predicted("replay", "held")[0] and predicted("replay", "parked")[0]
    ok, words = predicted("replay", "replayed")
    assert not ok and "refused: it is replayed" in words
    assert not predicted("park", "discarded")[0]


def test_sparkline_draws_the_threshold_and_escapes_its_label() -> None:
    now = time.time()
    svg = sparkline(
        [(now - 120, 10.0), (now - 60, 500.0), (now, 20.0)],
        span=3600,
        now=now,
        threshold=300.0,
        label="<b>lag</b>",
    )
    assert svg.startswith("<svg") and 'class="threshold"' in svg and "<polyline" in svg
    assert "<b>" not in svg and "&lt;b&gt;lag" in svg
    assert "no samples" in sparkline([], span=3600, now=now)


def test_thresholds_drawn_are_the_alert_rules() -> None:
    rules = yaml.safe_load((ROOT / "k8s/base/alerts/ferry-alerts.rules.yaml").read_text())
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}

    def number(alert: str, op: str) -> float:
        found = re.search(rf"\){{0,2}}\s*{re.escape(op)}\s*([0-9.]+)", exprs[alert])
        assert found, exprs[alert]
        return float(found.group(1))

    assert THRESHOLDS["outbox_oldest_age"] == number("FerryOutboxLagHigh", ">")
    assert THRESHOLDS["lag_seconds"] == number("FerryConsumerLagHigh", ">")
    assert THRESHOLDS["parked_oldest_age"] == number("FerryParkedKeyStuck", ">")
    assert THRESHOLDS["success_ratio"] == number("FerrySuccessRatioLow", "<")


def test_timeline_nests_spans_under_their_parents() -> None:
    def span(name: str, sid: str, parent: str | None, start: str, end: str) -> dict[str, object]:
        return {
            "name": name,
            "context": {"trace_id": "0xabc", "span_id": sid},
            "parent_id": parent,
            "start_time": f"2026-01-01T00:00:{start}Z",
            "end_time": f"2026-01-01T00:00:{end}Z",
            "resource": {"attributes": {"service.name": "svc"}},
        }

    rows = timeline(
        [
            span("child", "0x2", "0x1", "00.500000", "01.000000"),
            span("root", "0x1", None, "00.000000", "02.000000"),
            {"name": "broken"},
        ]
    )
    assert [(r["name"], r["depth"]) for r in rows] == [("root", 0), ("child", 1)]
    assert rows[1]["offset"] == pytest.approx(25.0) and rows[1]["width"] == pytest.approx(25.0)


class _DroppedPool:
    """A pool that cannot give a connection for a reason asyncpg reports as InterfaceError
    (not a PostgresError): a closing pool, a connection released under its user."""

    def acquire(self, timeout: float | None = None) -> _DroppedPool:
        return self

    async def __aenter__(self) -> None:
        raise asyncpg.exceptions.InterfaceError("cannot call Pool.acquire(): the pool is closing")

    async def __aexit__(self, *exc: object) -> None:
        return None


async def test_readiness_reports_a_dropped_database_connection_as_failing() -> None:
    from services.console.app import Console
    from services.console.settings import ConsoleSettings
    from shared.contracts.loading import load_topology
    from shared.runtime.metrics import RoleMetrics

    topology = load_topology(ROOT / "topologies" / "sea-vibespro.yaml")
    console = Console(
        ConsoleSettings(), topology, {"sea": _DroppedPool()},  # type: ignore[dict-item]
        lambda: None, _auth(), RoleMetrics("console"),
    )  # fmt: skip
    console.ready = True
    response = await console.readyz(None)  # type: ignore[arg-type]
    assert response.status == 503
    assert json.loads(response.body)["failing"] == ["nats", "postgres:sea"]  # type: ignore[arg-type]


def test_an_error_repeats_a_long_input_capped() -> None:
    from services.console.views import capped_message

    message = capped_message(f"no durable '{'x' * 5000}' in topology t")
    assert message == f"no durable '{'x' * 199}… (5,002 characters) in topology t"
    assert capped_message("short words stay") == "short words stay"
    assert len(capped_message("word " * 1000)) < 1100


async def test_two_consoles_on_one_host_set_different_session_cookies() -> None:
    """Cookies are not per port: each console's session cookie has its own name, and a
    one-time note is read back only with the key that sealed it."""
    from aiohttp.test_utils import TestClient, TestServer

    from services.console.app import Console
    from services.console.settings import ConsoleSettings
    from shared.contracts.loading import load_topology
    from shared.runtime.metrics import RoleMetrics

    names = []
    for topology, port in (("sea-vibespro", 8090), ("mediation", 8091)):
        loaded = load_topology(ROOT / "topologies" / f"{topology}.yaml")
        console = Console(
            ConsoleSettings(console_port=port), loaded, {}, lambda: None, _auth(),
            RoleMetrics("console"),
        )  # fmt: skip
        console.ready = True
        async with TestClient(TestServer(console.app())) as client:
            resp = await client.post(
                "/login",
                data={"user": "viewer", "password": "correct horse", "next": "/"},
                allow_redirects=False,
            )
            assert resp.status == 303
            names.append(next(iter(resp.cookies)))
    assert names == ["ferry_console_sea-vibespro_8090", "ferry_console_mediation_8091"]
    named = ConsoleSettings(console_cookie_name="ops_console")
    assert named.console_cookie_name == "ops_console"
    sealed = _auth().seal("replayed on x")
    assert _auth().unseal(sealed) == "replayed on x"
    assert _auth().unseal(sealed[:-2] + "xx") is None


def test_the_trace_link_is_set_by_ferry_trace_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.console.settings import ConsoleSettings
    from shared.runtime.settings import CommonSettings

    monkeypatch.setenv("FERRY_TRACE_URL", "http://jaeger:16686/trace/{trace_id}")
    for cls in (CommonSettings, ConsoleSettings):
        assert cls().trace_url_template == "http://jaeger:16686/trace/{trace_id}"
