"""The local stack runs TLS on every hop by default (issue 47), checked from outside as a
reviewer would: each hop refuses plaintext, answers TLS with the stack's own CA, and the
servers' own records say every role connection is encrypted.

The stack is started as ``./dev stack`` starts it (``python -m devstack.stack up``, no demo)
on a fresh data directory; what the roles do over those hops is the demo's business
(tests/e2e/test_demo.py runs it on the same TLS stack).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import nats
import pytest

from devstack.postgres import system_postgres
from shared.adapters.nats import NatsAuth
from tests.conftest import ROOT
from tests.security.probes import clear_text_attempt

pytestmark = pytest.mark.integration

#: Bounds, not expectations: start-up is about a minute on a loaded 2-core machine.
UP_WITHIN = 240.0
STOP_WITHIN = 120.0
_PLAIN = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Stack:
    var: Path
    env: dict[str, str]
    out: Path
    #: The NATS admin's password (the operator's shell, stack.env, acts as the admin).
    admin_password: str

    @property
    def ca(self) -> Path:
        return self.var / "tls" / "ca.crt"

    def port(self, name: str) -> int:
        return int(self.env[name])

    def pgpass(self, role: str) -> str:
        return (self.var / "secrets" / f"pgpass-{role}").read_text().strip()

    def trust(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def _exports(path: Path) -> dict[str, str]:
    found = re.findall(r"^export (\w+)=(.*)$", path.read_text(), re.MULTILINE)
    return dict(found)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # Nothing is skipped for want of a server: `./dev setup` installs Debian's PostgreSQL.
    assert system_postgres() is not None, "no PostgreSQL built with TLS (./dev setup)"
    base = Path(tempfile.mkdtemp(prefix="ferry-stack-tls-"))
    base.chmod(0o755)
    var, out = base / "var", base / "stack.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "devstack.stack", "up", "--var-dir", str(var)],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + UP_WITHIN
        while "Ferry is up." not in out.read_text(errors="replace"):
            assert proc.poll() is None, out.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, out.read_text(errors="replace")[-4000:]
            time.sleep(1.0)
        exports = _exports(var / "stack.env")
        password = Path(exports["FERRY_NATS_PASSWORD_FILE"]).read_text().strip()
        yield Stack(var, exports, out, password)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_WITHIN)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def test_the_banner_says_every_hop_is_tls(stack: Stack) -> None:
    banner = stack.out.read_text()
    assert "NATS        tls://127.0.0.1:" in banner, banner
    assert "sslmode=verify-full" in banner, banner
    assert "console     https://127.0.0.1:" in banner, banner
    assert "TLS         NATS, PostgreSQL, handler calls, consoles" in banner, banner
    assert "plaintext" not in banner, banner


async def test_nats_refuses_plaintext_and_every_role_connection_is_tls(stack: Stack) -> None:
    port = stack.port("FERRY_NATS_PORT")
    user = stack.env["FERRY_NATS_USER"]
    password = stack.admin_password
    # A client that does not speak TLS is closed on its CONNECT, never answered.
    answer = await clear_text_attempt(port)
    assert "PONG" not in answer and (answer == "" or "-ERR" in answer), answer
    auth = NatsAuth(user=user, password=password, tls_ca=stack.ca)
    urls = [f"tls://127.0.0.1:{port}"]
    nc = await nats.connect(urls[0], **auth.options(urls), allow_reconnect=False)
    try:
        info = await nc.jetstream().account_info()
        assert info.streams >= 2
    finally:
        await nc.close()
    monitor = stack.port("FERRY_NATS_MONITOR_PORT")
    with _PLAIN.open(f"http://127.0.0.1:{monitor}/connz?auth=true&limit=1024", timeout=10) as r:
        connections = json.load(r)["connections"]
    roles = [c for c in connections if c.get("authorized_user", "") != user]
    # Publishers, consumers, routers, replayers, consoles and a handler hold connections.
    assert len(roles) >= 15, [c.get("authorized_user") for c in connections]
    plain = [c.get("authorized_user") for c in roles if not c.get("tls_version")]
    assert plain == [], f"role connections without TLS: {plain}"


async def test_postgres_refuses_a_role_in_plaintext_and_every_role_session_is_tls(
    stack: Stack,
) -> None:
    port = stack.port("FERRY_PG_PORT")
    # A role's own login (its passfile line: host:port:database:login:password).
    fields = stack.pgpass("outbox-publisher-sea").split(":")
    login, password = fields[3], fields[4]
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="no encryption"):
        await asyncpg.connect(
            host="127.0.0.1", port=port, user=login, password=password, database="sea", ssl=False
        )
    conn = await asyncpg.connect(
        host="127.0.0.1",
        port=port,
        user=login,
        password=password,
        database="sea",
        ssl=stack.trust(),
    )
    try:
        assert await conn.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    finally:
        await conn.close()
    admin = await asyncpg.connect(
        stack.env["FERRY_DSN_TEMPLATE"].format(database="postgres"), timeout=10
    )
    try:
        rows = await admin.fetch(
            "SELECT a.usename, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)"
            " WHERE a.usename LIKE 'ferry\\_%'"
        )
        assert await admin.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"), (
            "the operator's own DSN asks for TLS too"
        )
    finally:
        await admin.close()
    assert len({r["usename"] for r in rows}) >= 15, rows
    assert [r["usename"] for r in rows if not r["ssl"]] == []


@pytest.mark.parametrize(
    ("port_name", "path"),
    [
        ("FERRY_PORT_HANDLER_SEA", "/metrics"),
        ("FERRY_PORT_HANDLER_MODULE_G", "/metrics"),
        ("FERRY_PORT_CONSOLE_SEA_VIBESPRO", "/readyz"),
        ("FERRY_PORT_CONSOLE_MEDIATION", "/readyz"),
    ],
)
def test_handlers_and_consoles_answer_https_only(stack: Stack, port_name: str, path: str) -> None:
    port = stack.port(port_name)
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        # A TLS server reading a plaintext request answers nothing HTTP can parse.
        _PLAIN.open(f"http://127.0.0.1:{port}{path}", timeout=10).read()
    https = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=stack.trust())
    )
    with https.open(f"https://127.0.0.1:{port}{path}", timeout=10) as resp:
        assert resp.status == 200
    untrusted = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        untrusted.open(f"https://127.0.0.1:{port}{path}", timeout=10)


def test_roles_are_ready_over_tls(stack: Stack) -> None:
    """A consumer's and a publisher's health ports (plain HTTP, documented) say their hops
    (NATS, PostgreSQL, the handler) are up: the roles reach them over TLS."""
    for name in ("FERRY_PORT_CON_SEA__FROM_VIBESPRO", "FERRY_PORT_PUB_SEA"):
        with _PLAIN.open(f"http://127.0.0.1:{stack.port(name)}/readyz", timeout=10) as resp:
            assert resp.status == 200, name
