"""The devstack launchers start real PostgreSQL and nats-server processes that keep data."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import nats
import pytest

from devstack.nats import NatsServer, check_config, write_config
from devstack.ports import free_port, free_ports
from devstack.postgres import PostgresServer, ServerError

REPO_ROOT = Path(__file__).resolve().parents[2]
# Durability does not matter for throwaway test clusters.
FAST_PG = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
WAIT = 30.0


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short scratch directory that an unprivileged account can traverse.

    Not pytest's tmp_path: that lives under /tmp/pytest-of-USER (mode 0700), which the
    unprivileged PostgreSQL account cannot enter when the tests run as root, and its
    long names push PostgreSQL's unix socket path towards the 107-byte limit.
    """
    path = Path(tempfile.mkdtemp(prefix="ferry-ds-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pg(workdir: Path) -> Iterator[PostgresServer]:
    """A running PostgreSQL with test-speed settings, stopped afterwards."""
    server = PostgresServer(workdir / "pg", extra_settings=FAST_PG)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def js(workdir: Path) -> Iterator[NatsServer]:
    """A running nats-server with JetStream and monitoring, stopped afterwards."""
    server = NatsServer(workdir / "nats")
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _refuses_connections(port: int) -> bool:
    """True if nothing accepts TCP connections on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` for at most WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _http_json(url: str) -> dict[str, object]:
    """GET a JSON document from a local monitoring endpoint, bypassing any proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as response:
        document: dict[str, object] = json.loads(response.read())
    return document


async def _fetch_notes(dsn: str) -> list[str]:
    """All rows of the notes table, in insertion order."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch("SELECT body FROM notes ORDER BY id")
    finally:
        await conn.close()
    return [str(row["body"]) for row in rows]


async def _create_notes(dsn: str, *bodies: str) -> None:
    """Create the notes table and insert ``bodies``."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute("CREATE TABLE notes (id serial PRIMARY KEY, body text NOT NULL)")
        await conn.executemany("INSERT INTO notes (body) VALUES ($1)", [(b,) for b in bodies])
    finally:
        await conn.close()


def test_a_port_handed_out_is_not_handed_out_again_soon() -> None:
    # One call after another, each probe socket closed in between: the OS would happily
    # offer a port again (it did: a nats-server's client and monitor ports collided).
    ports = [free_port() for _ in range(300)] + free_ports(50)
    assert len(set(ports)) == len(ports)


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))


async def test_postgres_runs_queries_in_created_database(pg: PostgresServer) -> None:
    pg.create_database("ferry_test")
    pg.create_database("ferry_test")  # idempotent

    await _create_notes(pg.dsn("ferry_test"), "hello", "wörld")

    assert await _fetch_notes(pg.dsn("ferry_test")) == ["hello", "wörld"]
    assert pg.dsn("ferry_test") == f"postgresql://postgres@127.0.0.1:{pg.port}/ferry_test"
    assert pg.log_path.exists()


async def test_postgres_data_survives_kill_and_restart(workdir: Path) -> None:
    # Keep synchronous_commit on: a commit must reach the WAL before a SIGKILL.
    server = PostgresServer(workdir / "pg", extra_settings={"fsync": "off"})
    try:
        server.start()
        server.create_database("ferry_test")
        await _create_notes(server.dsn("ferry_test"), "committed before the crash")
        old_pid = server.pid

        server.kill()
        assert not server.running
        assert _refuses_connections(server.port)

        server.restart()
        assert server.pid != old_pid
        assert await _fetch_notes(server.dsn("ferry_test")) == ["committed before the crash"]
    finally:
        server.stop()


def test_postgres_start_failure_reports_log_tail(workdir: Path) -> None:
    server = PostgresServer(workdir / "pg", extra_settings={"max_connections": "lots"})
    try:
        with pytest.raises(ServerError, match="max_connections"):
            server.start()
        assert not server.running
    finally:
        server.stop()


def test_nats_config_fsyncs_every_write(workdir: Path) -> None:
    config = write_config(
        workdir / "nats.conf",
        port=free_port(),
        store_dir=workdir / "js",
        monitor_port=free_port(),
        extra='authorization { token: "s3cret" }',
    )

    text = config.read_text()
    assert "sync_interval: always" in text
    assert text.rstrip().endswith('authorization { token: "s3cret" }')
    check_config(config)  # nats-server -t accepts it


def test_nats_server_applies_sync_always(js: NatsServer) -> None:
    jsz = _http_json(f"http://127.0.0.1:{js.monitor_port}/jsz")

    assert isinstance(jsz["config"], dict)
    assert jsz["config"]["sync_always"] is True
    assert jsz["config"]["store_dir"] == str(js.store_dir / "jetstream")


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_nats_jetstream_message_survives_restart(js: NatsServer, how: str) -> None:
    nc = await nats.connect(js.url, connect_timeout=5, allow_reconnect=False)
    try:
        jetstream = nc.jetstream(timeout=10)
        await jetstream.add_stream(name="FERRY_DEVSTACK", subjects=["ferry.devstack.>"])
        ack = await jetstream.publish("ferry.devstack.hello", b"persist me")
    finally:
        await nc.close()

    if how == "kill":
        js.kill()
    else:
        js.stop()
    assert _refuses_connections(js.port)
    js.restart()

    nc = await nats.connect(js.url, connect_timeout=5, allow_reconnect=False)
    try:
        stored = await nc.jetstream(timeout=10).get_msg("FERRY_DEVSTACK", ack.seq)
    finally:
        await nc.close()
    assert stored.data == b"persist me"
    assert stored.subject == "ferry.devstack.hello"


def _start_cli(*args: str) -> subprocess.Popen[bytes]:
    """Run ``python -m devstack ARGS`` from the repository root in its own process group."""
    return subprocess.Popen(
        [sys.executable, "-m", "devstack", *args],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stop_cli(proc: subprocess.Popen[bytes], sig: signal.Signals) -> int:
    """Signal the CLI process as supervisord would and return its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(WAIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(WAIT)
        raise


def _healthz_ok(monitor_port: int) -> bool:
    """JetStream reports healthy on the monitoring port."""
    try:
        return _http_json(f"http://127.0.0.1:{monitor_port}/healthz?js-enabled-only=true") == {
            "status": "ok"
        }
    except OSError:
        return False


def test_cli_nats_execs_server_that_takes_signals(workdir: Path) -> None:
    port, monitor_port = free_ports(2)
    proc = _start_cli(
        "nats", "--data-dir", str(workdir / "nats"), "--port", str(port),
        "--monitor-port", str(monitor_port),
    )  # fmt: skip
    try:
        _wait_for(lambda: _healthz_ok(monitor_port), "nats-server from the CLI")
    finally:
        code = _stop_cli(proc, signal.SIGTERM)
    # The signal reached nats-server itself (exec, no wrapper) and it exited cleanly.
    assert code == 0
    assert "sync_interval: always" in (workdir / "nats" / "nats-server.conf").read_text()


def _accepts_queries(server: PostgresServer) -> bool:
    """The server at ``server.port`` answers a catalog query."""
    try:
        return server.database_exists("postgres")
    except ServerError:
        return False


def test_cli_postgres_execs_server_that_takes_signals(workdir: Path) -> None:
    port = free_port()
    proc = _start_cli(
        "postgres", "--data-dir", str(workdir / "pg"), "--port", str(port),
        "--set", "fsync=off",
    )  # fmt: skip
    probe = PostgresServer(workdir / "pg", port=port)
    try:
        _wait_for(lambda: _accepts_queries(probe), "PostgreSQL from the CLI")
    finally:
        code = _stop_cli(proc, signal.SIGINT)
    assert code == 0
