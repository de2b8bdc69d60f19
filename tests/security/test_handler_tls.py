"""The handler hop over HTTPS (issue 47), with the consumer's own client
(:class:`services.inbox_consumer.dispatch.HttpHandler`) and the server context the handler
services use (:func:`shared.runtime.tls.server_context`), certificates from a local CA.

A call over HTTPS is answered; refused, each as a failed call whose detail gives OpenSSL's
reason (so the message is nak'ed and retried, and the breaker holds the lane while it
lasts): a clear-text call to the HTTPS port, a certificate from another CA, for another
host, expired, and — with mutual TLS — a caller without a client certificate. A renewed
certificate is loaded when its files change: a new connection gets it, the caller's
kept-alive connection goes on.
"""

from __future__ import annotations

import shutil
import ssl
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509

from devstack.ports import free_port
from devstack.tls import Issued, LocalCA
from services.handlers.__main__ import _tls
from services.handlers.settings import HandlerSettings
from services.inbox_consumer.dispatch import HttpHandler
from shared.domain.ack import HandlerFailure, HandlerResponse
from shared.domain.errors import ConfigurationError
from shared.runtime.tls import Reloading, client_context, server_context
from shared.telemetry import hops

pytestmark = pytest.mark.integration


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ferry-htls-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _install(issued: Issued, folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(issued.cert, folder / "server.crt")
    shutil.copyfile(issued.key, folder / "server.key")
    return folder / "server.crt", folder / "server.key"


@asynccontextmanager
async def serving(tls: Reloading) -> AsyncIterator[int]:
    """A handler answering 200 with the serial of the certificate it was reached with."""

    async def handle(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/handle", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls.context).start()
    try:
        yield port
    finally:
        await runner.cleanup()


async def _call(url: str, tls: ssl.SSLContext | None) -> HandlerResponse | HandlerFailure:
    handler = HttpHandler(url, timeout=5, connections=2, tls=tls)
    try:
        return await handler.handle({"message_id": "m"}, {})  # type: ignore[return-value]
    finally:
        await handler.close()


def _serial(cert: Path) -> int:
    return int(x509.load_pem_x509_certificate(cert.read_bytes()).serial_number)


async def test_https_calls_are_answered_and_strangers_refused(workdir: Path) -> None:
    ca, stranger = LocalCA(workdir / "ca"), LocalCA(workdir / "other", "Another CA")
    cert, key = _install(ca.issue("handler", hosts=["127.0.0.1"]), workdir / "srv")
    server = server_context(cert, key, what="test handler")
    async with serving(server) as port:
        url = f"https://127.0.0.1:{port}/handle"
        trusted = client_context(ca.cert_path, what="test").context
        ok = await _call(url, trusted)
        assert isinstance(ok, HandlerResponse) and ok.status == 200
        clear = await _call(f"http://127.0.0.1:{port}/handle", None)
        assert isinstance(clear, HandlerFailure) and clear.kind == "unreachable"
        wrong = await _call(url, client_context(stranger.cert_path, what="t").context)
        assert isinstance(wrong, HandlerFailure) and "certificate verify failed" in wrong.detail
        # /readyz says which hop fails and why until a call gets through again.
        assert "certificate verify failed" in hops.failing()["handler"]["why"]  # type: ignore[operator]
        assert isinstance(await _call(url, trusted), HandlerResponse)
        other_host = await _call(f"https://localhost:{port}/handle", trusted)
        assert isinstance(other_host, HandlerFailure) and "mismatch" in other_host.detail


async def test_an_expired_certificate_and_mutual_tls(workdir: Path) -> None:
    ca = LocalCA(workdir / "ca")
    cert, key = _install(ca.issue("handler", hosts=["127.0.0.1"], expired=True), workdir / "a")
    async with serving(server_context(cert, key, what="expired")) as port:
        expired = await _call(
            f"https://127.0.0.1:{port}/handle", client_context(ca.cert_path, what="t").context
        )
        assert isinstance(expired, HandlerFailure) and "certificate has expired" in expired.detail
    cert, key = _install(ca.issue("handler", hosts=["127.0.0.1"]), workdir / "b")
    mutual = server_context(cert, key, client_ca=ca.cert_path, what="mutual")
    async with serving(mutual) as port:
        url = f"https://127.0.0.1:{port}/handle"
        anonymous = await _call(url, client_context(ca.cert_path, what="t").context)
        assert isinstance(anonymous, HandlerFailure)
        role = ca.issue("inbox-consumer-x", client=True)
        shown = client_context(ca.cert_path, cert=role.cert, key=role.key, what="t").context
        answered = await _call(url, shown)
        assert isinstance(answered, HandlerResponse) and answered.status == 200


async def test_a_renewed_certificate_is_loaded_without_a_restart(workdir: Path) -> None:
    ca = LocalCA(workdir / "ca")
    cert, key = _install(ca.issue("handler", hosts=["127.0.0.1"]), workdir / "srv")
    first = _serial(cert)
    server = server_context(cert, key, what="rotating")
    seen: list[int] = []

    def peer(handler: HttpHandler) -> int:
        connector = handler._session.connector
        assert connector is not None
        for conns in connector._conns.values():  # type: ignore[attr-defined]
            for proto, _ in conns:
                der = proto.transport.get_extra_info("ssl_object").getpeercert(True)
                return int(x509.load_der_x509_certificate(der).serial_number)
        raise AssertionError("no kept-alive connection")

    async with serving(server) as port:
        url = f"https://127.0.0.1:{port}/handle"
        trusted = client_context(ca.cert_path, what="t").context
        kept = HttpHandler(url, timeout=5, connections=1, tls=trusted)
        try:
            assert isinstance(await kept.handle({"message_id": "a"}, {}), HandlerResponse)
            seen.append(peer(kept))
            assert not server.reload_if_changed()  # nothing changed yet
            renewed = ca.issue("handler-renewed", hosts=["127.0.0.1"])
            _install(renewed, workdir / "srv")
            assert server.reload_if_changed()
            fresh = HttpHandler(url, timeout=5, connections=1, tls=trusted)
            try:
                assert isinstance(await fresh.handle({"message_id": "b"}, {}), HandlerResponse)
                assert peer(fresh) == _serial(renewed.cert) != first
            finally:
                await fresh.close()
            # The kept-alive connection made under the first certificate goes on.
            assert isinstance(await kept.handle({"message_id": "c"}, {}), HandlerResponse)
            assert peer(kept) == first == seen[0]
        finally:
            await kept.close()
        # A new certificate beside the old key (the two files written apart), then a
        # half-written key: neither is taken, the certificate in force keeps answering.
        other = ca.issue("handler-other", hosts=["127.0.0.1"])
        shutil.copyfile(other.cert, workdir / "srv" / "server.crt")
        assert not server.reload_if_changed()
        again = await _call(url, client_context(ca.cert_path, what="t").context)
        assert isinstance(again, HandlerResponse) and again.status == 200
        (workdir / "srv" / "server.key").write_text("not a key")
        assert not server.reload_if_changed()
        again = await _call(url, client_context(ca.cert_path, what="t").context)
        assert isinstance(again, HandlerResponse) and again.status == 200


def test_settings_that_cannot_work_are_refused(workdir: Path) -> None:
    ca = LocalCA(workdir / "ca")
    with pytest.raises(ConfigurationError, match="go together"):
        _tls(HandlerSettings(handler_tls_cert=ca.cert_path))
    with pytest.raises(ConfigurationError, match="without FERRY_HANDLER_TLS_CERT"):
        _tls(HandlerSettings(handler_tls_client_ca=ca.cert_path))
    with pytest.raises(ConfigurationError, match="certificate"):
        server_context(ca.cert_path, workdir / "missing.key", what="handler service HTTPS")


def test_the_consumer_calls_https_only_where_its_url_says_so(workdir: Path) -> None:
    from services.inbox_consumer.wiring import _handler_tls
    from shared.runtime.settings import ConsumerSettings

    ca = LocalCA(workdir / "ca")
    assert _handler_tls(ConsumerSettings(), "http://h:1/handle") is None
    with pytest.raises(ConfigurationError, match="is not https://"):
        _handler_tls(ConsumerSettings(handler_tls_ca=ca.cert_path), "http://h:1/handle")
    tls = _handler_tls(ConsumerSettings(handler_tls_ca=ca.cert_path), "https://h:1/handle")
    assert tls is not None and tls.context.check_hostname
    assert tls.context.verify_mode == ssl.CERT_REQUIRED
    # Its own CA alone: not the system's CAs as well.
    assert len(tls.context.get_ca_certs()) == 1
