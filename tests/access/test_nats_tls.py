"""TLS-first to NATS by settings (``tls_handshake_first``), on a real nats-server with a
certificate made here (openssl). The rest of TLS to NATS — the CA from settings, clear
text and unknown CAs refused, expiry, mutual TLS, rotation, clusters — is
tests/security/test_nats_tls.py's."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.nats import NatsServer
from shared.access.identities import NATS_ADMIN
from shared.adapters.nats import NatsAuth, connect_nats
from tests.conftest import nats_access

pytestmark = pytest.mark.integration


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a server certificate for 127.0.0.1 signed by it."""
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=ferry-test-ca", "-keyout", "ca.key", "-out", "ca.pem", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", "server.key", "-out", "server.csr", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.pem",
             cwd=d)  # fmt: skip
    return d


@pytest.fixture
def tls_server(tmp_path: Path, certs: Path) -> Iterator[NatsServer]:
    # handshake_first with a delay: TLS-first clients start TLS at once, others get the
    # greeting after 300 ms (and must still upgrade: TLS is required either way).
    block = (
        f'tls {{\n  cert_file: "{certs / "server.pem"}"\n  key_file: "{certs / "server.key"}"\n'
        '  handshake_first: "300ms"\n}'
    )
    server = NatsServer(tmp_path / "nats", extra=block, access=nats_access())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _admin(server: NatsServer, **tls: object) -> NatsAuth:
    assert server.access is not None
    return NatsAuth(user=NATS_ADMIN, password=server.access.password(NATS_ADMIN), **tls)  # type: ignore[arg-type]


async def test_a_tls_first_client_connects_where_the_server_waits_for_it(
    tls_server: NatsServer, certs: Path
) -> None:
    """The client starts TLS before the server's greeting (``handshake_first``, from
    settings) and the server, configured to take a TLS-first handshake, serves it."""
    url = tls_server.url.replace("nats://", "tls://")
    auth = _admin(tls_server, tls_ca=certs / "ca.pem", tls_handshake_first=True)
    nc = await connect_nats([url], name="tls-test", auth=auth, give_up_after=20)
    try:
        assert nc.is_connected
        await nc.flush(timeout=5)
    finally:
        await nc.close()
