"""The NATS hop over TLS (issue 47): a real nats-server whose clients must use TLS, with
certificates from a local CA made by the test (devstack/tls.py).

A role with the CA (``FERRY_NATS_TLS_CA``) connects over TLS and JetStream answers; with
``verify_and_map``-free mutual TLS (``verify: true``) it must also show a certificate from
the CA. Refused, each naming the server and OpenSSL's or the server's reason: a client that
does not speak TLS, a server certificate from another CA, for another host name, expired;
a client without a certificate where one is required. The server's certificate is rotated
with a reload (SIGHUP), no restart: new connections get the new certificate while an open
one goes on publishing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from devstack.nats import NatsServer, tls_block
from devstack.nats_cluster import NatsCluster, RouteTLS
from devstack.tls import Issued, LocalCA
from shared.adapters.nats import NatsAuth, connect_nats
from shared.domain.errors import TransientError
from tests.security.probes import clear_text_attempt

pytestmark = pytest.mark.integration


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ferry-ntls-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _install(issued: Issued, ca: Path, folder: Path) -> None:
    """The server's files at fixed paths (what its config names; a rotation rewrites them)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(issued.cert, folder / "server.crt")
    shutil.copyfile(issued.key, folder / "server.key")
    shutil.copyfile(ca, folder / "ca.crt")


def _server(workdir: Path, *, mutual: bool = False, plaintext_too: bool = False) -> NatsServer:
    """A nats-server requiring TLS (``plaintext_too``: taking both, ``allow_non_tls``)."""
    files = workdir / "server-tls"
    block = tls_block(files / "server.crt", files / "server.key", files / "ca.crt", verify=mutual)
    if plaintext_too:
        block += "\nallow_non_tls: true"
    return NatsServer(workdir / "nats", extra=block)


def _url(server: NatsServer, host: str = "127.0.0.1") -> str:
    return f"tls://{host}:{server.port}"


async def _round_trip(nc: object) -> int:
    js = nc.jetstream()  # type: ignore[attr-defined]
    await js.add_stream(name="T", subjects=["t.>"])
    ack = await js.publish("t.one", b"x")
    return int(ack.seq)


def _peer_serial(nc: object) -> int:
    transport = nc._transport  # type: ignore[attr-defined]
    ssl_object = transport._io_writer.get_extra_info("ssl_object")
    return int(x509.load_der_x509_certificate(ssl_object.getpeercert(True)).serial_number)


def _route_peers(url: str) -> set[str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return {r.get("remote_name") for r in json.load(resp)["routes"] or []}


def _connections(url: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return list(json.load(resp)["connections"])


async def _refused(url: str, auth: NatsAuth) -> str:
    with pytest.raises(TransientError) as refused:
        await connect_nats([url], name="tls-test", auth=auth, give_up_after=3)
    return str(refused.value)


async def test_a_role_connects_over_tls_and_clear_text_or_strangers_are_refused(
    workdir: Path,
) -> None:
    ca, stranger = LocalCA(workdir / "ca"), LocalCA(workdir / "other", "Another CA")
    _install(ca.issue("nats", hosts=["127.0.0.1"]), ca.cert_path, workdir / "server-tls")
    with _server(workdir) as server:
        nc = await connect_nats([_url(server)], name="t", auth=NatsAuth(tls_ca=ca.cert_path))
        try:
            assert await _round_trip(nc) == 1
        finally:
            await nc.close()
        # A client speaking clear text: the server asks for TLS in its greeting and closes
        # the connection on the clear-text CONNECT, never answering its PING.
        answer = await clear_text_attempt(server.port)
        assert "PONG" not in answer and (answer == "" or "-ERR" in answer), answer
        # Ours, given no CA, upgrades as the server asks and refuses the unknown CA.
        plain = await _refused(f"nats://127.0.0.1:{server.port}", NatsAuth())
        assert f"127.0.0.1:{server.port}" in plain and "certificate verify failed" in plain
        wrong = await _refused(_url(server), NatsAuth(tls_ca=stranger.cert_path))
        assert "certificate verify failed" in wrong, wrong
        # "localhost" is this machine too, but the certificate names 127.0.0.1 only.
        mismatch = await _refused(_url(server, "localhost"), NatsAuth(tls_ca=ca.cert_path))
        assert "mismatch" in mismatch, mismatch


async def test_expired_certificates_and_mutual_tls(workdir: Path) -> None:
    ca = LocalCA(workdir / "ca")
    files = workdir / "server-tls"
    _install(ca.issue("nats", hosts=["127.0.0.1"], expired=True), ca.cert_path, files)
    with _server(workdir) as server:
        expired = await _refused(_url(server), NatsAuth(tls_ca=ca.cert_path))
        assert "certificate has expired" in expired, expired
    _install(ca.issue("nats", hosts=["127.0.0.1"]), ca.cert_path, files)
    with _server(workdir, mutual=True) as server:
        anonymous = await _refused(_url(server), NatsAuth(tls_ca=ca.cert_path))
        assert f"127.0.0.1:{server.port}" in anonymous
        role = ca.issue("inbox-consumer-x", client=True)
        nc = await connect_nats(
            [_url(server)],
            name="t",
            auth=NatsAuth(tls_ca=ca.cert_path, tls_cert=role.cert, tls_key=role.key),
        )
        try:
            assert await _round_trip(nc) == 1
        finally:
            await nc.close()


async def test_the_servers_certificate_is_rotated_by_a_reload_without_a_restart(
    workdir: Path,
) -> None:
    ca = LocalCA(workdir / "ca")
    files = workdir / "server-tls"
    _install(ca.issue("nats", hosts=["127.0.0.1"]), ca.cert_path, files)
    with _server(workdir) as server:
        auth = NatsAuth(tls_ca=ca.cert_path)
        old = await connect_nats([_url(server)], name="old", auth=auth)
        try:
            before = _peer_serial(old)
            assert await _round_trip(old) == 1
            _install(ca.issue("nats-renewed", hosts=["127.0.0.1"]), ca.cert_path, files)
            pid = server._spawned.proc.pid  # type: ignore[union-attr]
            os.kill(pid, signal.SIGHUP)
            await asyncio.sleep(1.0)
            new = await connect_nats([_url(server)], name="new", auth=auth)
            try:
                assert _peer_serial(new) != before
            finally:
                await new.close()
            # The connection made under the old certificate goes on.
            ack = await old.jetstream().publish("t.two", b"y")
            assert ack.seq == 2 and _peer_serial(old) == before
            assert server._spawned.proc.pid == pid and server.running  # type: ignore[union-attr]
        finally:
            await old.close()


async def test_a_three_node_cluster_with_tls_routes_and_clients_replicates(
    workdir: Path,
) -> None:
    """Routes between the nodes are TLS, each side verifying the other's certificate;
    clients use TLS too. A stream of three replicas takes a publish, and a node whose route
    certificate comes from another CA is not let into the cluster."""
    ca, stranger = LocalCA(workdir / "ca"), LocalCA(workdir / "other", "Another CA")
    routes = [ca.issue(f"route-{k}", hosts=["127.0.0.1"], peer=True) for k in range(3)]
    client = ca.issue("nats-clients", hosts=["127.0.0.1"])
    block = "\n".join(
        ["tls {", f'  cert_file: "{client.cert}"', f'  key_file: "{client.key}"', "}"]
    )
    cluster = NatsCluster(
        workdir / "cluster",
        extra=block,
        route_tls=[RouteTLS(r.cert, r.key, ca.cert_path) for r in routes],
    )
    cluster.start()
    try:
        urls = [u.replace("nats://", "tls://") for u in cluster.urls]
        nc = await connect_nats(urls, name="t", auth=NatsAuth(tls_ca=ca.cert_path))
        try:
            js = nc.jetstream()
            await js.add_stream(name="R3", subjects=["r3.>"], num_replicas=3)
            ack = await js.publish("r3.one", b"x")
            assert ack.seq == 1
            info = await js.stream_info("R3")
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2
        finally:
            await nc.close()
    finally:
        cluster.stop()
    # Node 3's route certificate from another CA: the others refuse its routes.
    bad = stranger.issue("route-2", hosts=["127.0.0.1"], peer=True)
    cluster.route_tls = [RouteTLS(r.cert, r.key, ca.cert_path) for r in routes[:2]] + [
        RouteTLS(bad.cert, bad.key, ca.cert_path)
    ]
    cluster._build_nodes()
    for node in cluster.nodes[:2]:
        node.start()
    try:
        cluster.nodes[2].start()
        await asyncio.sleep(3.0)
        peers = await asyncio.to_thread(_route_peers, cluster.monitor_url(0, "routez"))
        assert cluster.node_name(1) in peers and cluster.node_name(2) not in peers, peers
    finally:
        for node in cluster.nodes:
            if node.running:
                node.stop()


async def test_with_tls_configured_a_server_that_takes_plaintext_too_gets_tls(
    workdir: Path,
) -> None:
    """nats-py upgrades only when the server's INFO says TLS is required; a server that
    also takes plaintext (``allow_non_tls``), or anyone in the middle who strips the flag,
    would get the CONNECT and its password in clear. Ours, with TLS configured, upgrades
    all the same: the server's own /connz says the connection is TLS."""
    ca = LocalCA(workdir / "ca")
    _install(ca.issue("nats", hosts=["127.0.0.1"]), ca.cert_path, workdir / "server-tls")
    with _server(workdir, plaintext_too=True) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        info = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        assert b'"tls_required"' not in info, info  # the server does not ask for it
        for url in (_url(server), f"nats://127.0.0.1:{server.port}"):
            nc = await connect_nats([url], name="tls-only", auth=NatsAuth(tls_ca=ca.cert_path))
            try:
                assert _peer_serial(nc) > 0  # a TLS session, the server's certificate
                assert await _round_trip(nc) >= 1
                monitor = f"http://127.0.0.1:{server.monitor_port}/connz"
                connections = await asyncio.to_thread(_connections, monitor)
                (conn,) = [c for c in connections if c["name"] == "tls-only"]
                assert conn.get("tls_version"), conn
            finally:
                await nc.close()
