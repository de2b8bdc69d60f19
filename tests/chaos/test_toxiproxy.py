"""The Toxiproxy-compatible proxy on real sockets, driven with ``toxiproxy-python``.

Each toxic's effect is shown on an echo server behind the proxy, by counting bytes, by
what the client sees (EOF, reset, nothing) and, for delays, by lower bounds only (a
delay can never be shorter than configured, however loaded the machine is).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.launcher import ROOT, running_toxiproxy
from tests.chaos.conftest import (
    IO_TIMEOUT,
    Api,
    EchoServer,
    connect,
    recv_exactly,
    recv_until_closed,
)


def _round_trip(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - start


def test_passes_bytes_through_intact_both_ways(toxiproxy: Api, echo: EchoServer) -> None:
    proxy = toxiproxy.proxy("echo", echo.address)
    payload = bytes(range(256)) * 4096  # 1 MiB
    with connect(proxy) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert recv_exactly(sock, len(payload)) == payload
        sender.join(IO_TIMEOUT)
    assert echo.received == len(payload)


def test_proxy_lifecycle_through_the_client(toxiproxy: Api, echo: EchoServer) -> None:
    assert toxiproxy.client.version()
    proxy = toxiproxy.proxy("life", echo.address)
    assert proxy.enabled is True and proxy.upstream == echo.address
    assert not proxy.listen.endswith(":0"), "the real port is reported"
    listed = toxiproxy.client.proxies()
    assert list(listed) == ["life"] and listed["life"].listen == proxy.listen
    status, shown = toxiproxy.call("GET", "/proxies/life")
    assert status == 200 and shown["toxics"] == [] and shown["listen"] == proxy.listen
    assert toxiproxy.client.destroy(proxy) is True
    assert toxiproxy.client.proxies() == {}
    with pytest.raises(ConnectionRefusedError):
        connect(proxy, timeout=2).close()


def test_latency_delays_each_direction_and_keeps_order(toxiproxy: Api, echo: EchoServer) -> None:
    proxy = toxiproxy.proxy("slow", echo.address)
    with connect(proxy) as sock:
        _round_trip(sock)  # the connection exists before the toxic: it applies anyway
        proxy.add_toxic(type="latency", attributes={"latency": 300, "jitter": 50})
        assert _round_trip(sock) >= 0.25
        proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 300})
        assert _round_trip(sock) >= 0.55
        sock.sendall(b"first")
        sock.sendall(b"second")
        assert recv_exactly(sock, 11) == b"firstsecond"


def test_removing_a_toxic_passes_on_what_it_held(toxiproxy: Api, echo: EchoServer) -> None:
    proxy = toxiproxy.proxy("held", echo.address)
    proxy.add_toxic(type="latency", attributes={"latency": 60_000})
    with connect(proxy) as sock:
        sock.sendall(b"in flight")
        time.sleep(0.2)  # the echo is now held by the 60 s latency
        proxy.destroy_toxic("latency_downstream")
        assert recv_exactly(sock, 9) == b"in flight"
        assert proxy.toxics() == {}


def test_timeout_zero_blackholes_until_removed_then_closes(
    toxiproxy: Api, echo: EchoServer
) -> None:
    proxy = toxiproxy.proxy("hole", echo.address)
    with connect(proxy) as sock:
        _round_trip(sock)
        proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
        sock.sendall(b"lost")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        assert echo.received == 4, "nothing past the blackhole reached the server"
        proxy.destroy_toxic("timeout_upstream")
        sock.settimeout(IO_TIMEOUT)
        assert recv_until_closed(sock)[0] == b"", "a connection that lost bytes is closed"
    with connect(proxy) as sock:
        _round_trip(sock)


def test_timeout_closes_the_connection_after_the_delay(toxiproxy: Api, echo: EchoServer) -> None:
    proxy = toxiproxy.proxy("cut", echo.address)
    proxy.add_toxic(type="timeout", attributes={"timeout": 300})
    with connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(b"echoed but dropped")
        assert recv_until_closed(sock) == (b"", 0)
        assert time.monotonic() - start >= 0.25


def test_reset_peer_resets_after_the_first_bytes(toxiproxy: Api, echo: EchoServer) -> None:
    proxy = toxiproxy.proxy("rst", echo.address)
    with connect(proxy) as sock:
        _round_trip(sock)
        proxy.add_toxic(type="reset_peer", stream="upstream", attributes={"timeout": 200})
        start = time.monotonic()
        sock.sendall(b"x")
        with pytest.raises(ConnectionResetError):
            recv_until_closed(sock)
        assert time.monotonic() - start >= 0.15


def test_bandwidth_caps_the_rate_without_losing_bytes(toxiproxy: Api, echo: EchoServer) -> None:
    proxy = toxiproxy.proxy("thin", echo.address)
    proxy.add_toxic(type="bandwidth", attributes={"rate": 100})  # 100 KB/s
    payload = b"b" * 200_000
    with connect(proxy) as sock:
        start = time.monotonic()
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert recv_exactly(sock, len(payload)) == payload
        sender.join(IO_TIMEOUT)
        assert time.monotonic() - start >= 1.5  # 200 KB at 100 KB/s takes 2 s


def test_slow_close_holds_the_end_of_the_stream(toxiproxy: Api) -> None:
    server = EchoServer(greeting=b"bye", close_after_greeting=True)
    try:
        proxy = toxiproxy.proxy("linger", server.address)
        proxy.add_toxic(type="slow_close", attributes={"delay": 400})
        with connect(proxy) as sock:
            assert recv_exactly(sock, 3) == b"bye"
            start = time.monotonic()
            assert recv_until_closed(sock) == (b"", 0)
            assert time.monotonic() - start >= 0.3
    finally:
        server.close()


def test_limit_data_closes_after_exactly_that_many_bytes(toxiproxy: Api, echo: EchoServer) -> None:
    proxy = toxiproxy.proxy("cap", echo.address)
    proxy.add_toxic(type="limit_data", attributes={"bytes": 100})
    with connect(proxy) as sock:
        sock.sendall(b"0123456789" * 30)
        data, _ = recv_until_closed(sock)
    assert data == (b"0123456789" * 10)


def test_slicer_delivers_every_byte_in_many_pieces(toxiproxy: Api, echo: EchoServer) -> None:
    proxy = toxiproxy.proxy("slices", echo.address)
    proxy.add_toxic(
        type="slicer", attributes={"average_size": 20, "size_variation": 10, "delay": 2000}
    )
    payload = bytes(range(200)) * 20
    with connect(proxy) as sock:
        sock.sendall(payload)
        parts, got = [], 0
        while got < len(payload):
            part = sock.recv(65536)
            assert part, "closed early"
            parts.append(part)
            got += len(part)
    assert b"".join(parts) == payload
    assert len(parts) > 1  # ~200 slices 2 ms apart cannot all arrive in one read


def test_toxicity_is_rolled_per_connection(toxiproxy: Api, echo: EchoServer) -> None:
    proxy = toxiproxy.proxy("dice", echo.address)
    proxy.add_toxic(type="timeout", attributes={"timeout": 0}, toxicity=0.0)
    with connect(proxy) as sock:
        _round_trip(sock)  # toxicity 0: never applied
    proxy.destroy_toxic("timeout_downstream")
    proxy.add_toxic(type="timeout", attributes={"timeout": 0}, toxicity=0.5)
    outcomes = []
    for _ in range(20):
        with connect(proxy, timeout=0.2) as sock:
            sock.sendall(b"?")
            try:
                outcomes.append(sock.recv(1) == b"?")
            except TimeoutError:
                outcomes.append(False)
    assert any(outcomes) and not all(outcomes), "some connections hit, some spared"


def test_direction_decides_which_side_loses_bytes(toxiproxy: Api, echo: EchoServer) -> None:
    proxy = toxiproxy.proxy("dir", echo.address)
    proxy.add_toxic(type="timeout", stream="downstream", attributes={"timeout": 0})
    with connect(proxy, timeout=0.5) as sock:
        sock.sendall(b"12345")
        with pytest.raises(TimeoutError):
            sock.recv(10)
    assert echo.received == 5, "downstream toxic: the server got the request"


def test_disabled_proxy_closes_connections_and_refuses_new_ones(
    toxiproxy: Api, echo: EchoServer
) -> None:
    proxy = toxiproxy.proxy("door", echo.address)
    with connect(proxy) as sock:
        _round_trip(sock)
        with proxy.down():
            try:
                data, _ = recv_until_closed(sock)
            except ConnectionResetError:
                data = b""
            assert data == b""
            with pytest.raises(ConnectionRefusedError):
                connect(proxy, timeout=2).close()
    with connect(proxy) as sock:  # enabled again, on the same port
        _round_trip(sock)


def test_reset_enables_everything_and_removes_toxics(toxiproxy: Api, echo: EchoServer) -> None:
    proxy = toxiproxy.proxy("r", echo.address)
    proxy.add_toxic(type="latency", attributes={"latency": 10_000})
    proxy.disable()
    assert toxiproxy.client.reset() is True
    assert proxy.toxics() == {}
    assert toxiproxy.client.proxies()["r"].enabled is True
    with connect(proxy) as sock:
        _round_trip(sock)


def test_updating_a_toxic_changes_live_connections(toxiproxy: Api, echo: EchoServer) -> None:
    proxy = toxiproxy.proxy("upd", echo.address)
    proxy.add_toxic(type="limit_data", attributes={"bytes": 1_000_000})
    with connect(proxy) as sock:
        _round_trip(sock, b"1234")
        status, body = toxiproxy.call(
            "POST", "/proxies/upd/toxics/limit_data_downstream", {"attributes": {"bytes": 10}}
        )
        assert status == 200 and body["attributes"]["bytes"] == 10
        sock.sendall(b"abcdefghij")
        data, _ = recv_until_closed(sock)
    assert data == b"abcdef", "4 bytes already counted on this connection, 6 more allowed"


def test_populate_creates_and_keeps_proxies(toxiproxy: Api, echo: EchoServer) -> None:
    if "in-process" not in toxiproxy.kind and "chaos" not in toxiproxy.kind:
        pytest.skip("checks our server's /populate body")
    docs = [{"name": "p1", "listen": "127.0.0.1:0", "upstream": echo.address}]
    status, body = toxiproxy.call("POST", "/populate", docs)
    assert status == 201 and [p["name"] for p in body["proxies"]] == ["p1"]
    docs[0]["listen"] = body["proxies"][0]["listen"]
    status, again = toxiproxy.call("POST", "/populate", docs)
    assert status == 201 and again["proxies"][0]["listen"] == docs[0]["listen"]


def test_api_errors_are_clear(toxiproxy: Api, echo: EchoServer) -> None:
    toxiproxy.proxy("known", echo.address)
    with pytest.raises(ProxyExists):
        toxiproxy.client.create(upstream=echo.address, name="known")
    status, body = toxiproxy.call("POST", "/proxies", {"name": "known", "upstream": echo.address})
    assert status == 409 and "already exists" in body["error"]
    status, body = toxiproxy.call("GET", "/proxies/ghost")
    assert status == 404 and "not found" in body["error"]
    status, body = toxiproxy.call("POST", "/proxies/ghost/toxics", {"type": "latency"})
    assert status == 404 and "ghost" in body["error"]
    status, body = toxiproxy.call("DELETE", "/proxies/known/toxics/ghost")
    assert status == 404 and "toxic not found" in body["error"]
    proxy = toxiproxy.client.get_proxy("known")
    with pytest.raises(InvalidToxic) as bad_type:
        proxy.add_toxic(type="explode")
    assert b"invalid toxic type" in bad_type.value.args[0]
    status, body = toxiproxy.call(
        "POST", "/proxies/known/toxics", {"type": "latency", "stream": "sideways"}
    )
    assert status == 400 and "upstream or downstream" in body["error"]
    proxy.add_toxic(type="latency", attributes={"latency": 1})
    status, body = toxiproxy.call("POST", "/proxies/known/toxics", {"type": "latency"})
    assert status == 409 and "latency_downstream" in body["error"]
    assert proxy.destroy() is True
    with pytest.raises(NotFound):
        proxy.destroy()


def test_our_server_names_what_is_wrong(toxiproxy: Api, echo: EchoServer) -> None:
    if "chaos" not in toxiproxy.kind:
        pytest.skip("stricter validation than upstream Toxiproxy")
    toxiproxy.proxy("v", echo.address)
    cases = [
        ({"type": "latency", "attributes": {"latncy": 5}}, "no attribute(s) latncy"),
        ({"type": "latency", "attributes": {"latency": -1}}, "attributes.latency"),
        ({"type": "bandwidth", "attributes": {"rate": "fast"}}, "attributes.rate"),
        ({"type": "latency", "toxicity": 2}, "toxicity must be a number between 0 and 1"),
        ({"type": "slicer", "attributes": {"average_size": 5, "size_variation": 5}}, "smaller"),
    ]
    for doc, message in cases:
        status, body = toxiproxy.call("POST", "/proxies/v/toxics", doc)
        assert (status, body["status"]) == (400, 400) and message in body["error"], doc
    status, body = toxiproxy.call("POST", "/proxies", b"{not json")
    assert status == 400 and "not JSON" in body["error"]
    status, body = toxiproxy.call("POST", "/proxies", {"name": "x"})
    assert status == 400 and "upstream" in body["error"]
    status, body = toxiproxy.call(
        "POST", "/proxies", {"name": "wide", "listen": "0.0.0.0:0", "upstream": echo.address}
    )
    assert status == 400 and "not a loopback address" in body["error"]
    assert toxiproxy.call("GET", "/proxies/v/toxics")[1] == []


def test_entry_point_serves_the_api_and_loads_a_config(tmp_path: Path, echo: EchoServer) -> None:
    with running_toxiproxy(tmp_path / "server.log", seed=3) as server:
        api = Api(server.host, server.port, server.kind)
        assert api.client.version()
        proxy = api.proxy("cli", echo.address)
        with connect(proxy) as sock:
            _round_trip(sock)
    config = tmp_path / "proxies.json"
    config.write_text('[{"name": "c", "listen": "10.1.2.3:0", "upstream": "127.0.0.1:1"}]')
    for args, message in [
        (["--host", "0.0.0.0"], b"'0.0.0.0:0' is not a loopback address"),
        (["--config", str(config)], b"proxies.json: listen address '10.1.2.3:0'"),
    ]:
        refused = subprocess.run(
            [sys.executable, "-m", "chaos.toxiproxy_server", "--port", "0", *args],
            cwd=ROOT,
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
