"""Per-role NATS users on a real nats-server: each credential does its job and nothing else.

The server runs the authorization block ``ferry nats-auth`` generates from the shipped
topologies (tests/conftest.py). A refused publish is dropped by the server, which reports
a permissions violation to the client; we check both the violation and, with the admin
credential, that nothing reached the stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeout

from devstack.nats import NatsServer, check_config
from shared.access.identities import NATS_ADMIN
from shared.access.nats_auth import (
    authorization_block,
    env_references,
    nats_users,
    password_variable,
)
from shared.access.streams import ROUTER_DURABLE, provision
from shared.contracts.loading import load_topology
from shared.domain.subjects import replay_subject
from tests.conftest import CAPS, PYTHON, ROOT, Env
from tests.helpers import eventually, stream_count

pytestmark = pytest.mark.integration

REPLAYER = "dlq-replayer-sea-vibespro"
SHIPPED = [
    load_topology(ROOT / "topologies/sea-vibespro.yaml"),
    load_topology(ROOT / "topologies/mediation.yaml"),
]


class Client:
    """A connection as one user, collecting the server's error reports."""

    def __init__(self, nc: NATS, errors: list[str]) -> None:
        self.nc, self.errors = nc, errors
        # Refused requests get no answer: wait less than the default five seconds for it.
        self.js = nc.jetstream(timeout=3)

    async def refused(self, action: Callable[[], Awaitable[Any]], subject: str) -> None:
        """``action`` gets no answer and the server reports a violation naming ``subject``."""
        with pytest.raises(NatsTimeout):
            await action()
        await eventually(
            lambda: _true(any(subject.lower() in e for e in self.errors)),
            timeout=5,
            what=f"a permissions violation for {subject}",
        )
        assert any("permissions violation" in e for e in self.errors)


async def _true(value: bool) -> bool:
    return value


@asynccontextmanager
async def connected(server: NatsServer, user: str) -> AsyncIterator[Client]:
    """A client of ``server`` authenticated as ``user``."""
    assert server.access is not None
    errors: list[str] = []

    async def error_cb(exc: Exception) -> None:
        errors.append(str(exc).lower())

    options = server.access.auth(user).options([server.url])
    nc = await nats.connect(server.url, error_cb=error_cb, allow_reconnect=False, **options)
    try:
        yield Client(nc, errors)
    finally:
        await nc.close()


@pytest.fixture
async def streams(env: Env, nc: NATS) -> Env:
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    return env


async def test_publisher_publishes_only_into_its_own_namespace(
    streams: Env, nats_server: NatsServer, nc: NATS
) -> None:
    admin = nc.jetstream()
    async with connected(nats_server, "outbox-publisher-sea") as pub:
        ack = await pub.js.publish("sea.event.vibe_created.v1", b"{}", timeout=2)
        assert ack.stream == "SEA_EVENTS"
        foreign = "vibespro.event.model_published.v1"
        await pub.refused(lambda: pub.js.publish(foreign, b"{}", timeout=1), foreign)
        replay = replay_subject("SEA_EVENTS", "vibespro__from_sea")
        await pub.refused(lambda: pub.js.publish(replay, b"{}", timeout=1), replay)
    assert await stream_count(admin, "SEA_EVENTS") == 1
    assert await stream_count(admin, "VIBESPRO_EVENTS") == 0


async def test_publisher_cannot_delete_purge_or_create_a_stream(
    streams: Env, nats_server: NatsServer, nc: NATS
) -> None:
    async with connected(nats_server, "outbox-publisher-sea") as pub:
        await pub.refused(
            lambda: pub.js.delete_stream("SEA_EVENTS"), "$JS.API.STREAM.DELETE.SEA_EVENTS"
        )
        await pub.refused(
            lambda: pub.js.purge_stream("SEA_EVENTS"), "$JS.API.STREAM.PURGE.SEA_EVENTS"
        )
        await pub.refused(
            lambda: pub.js.add_stream(name="ROGUE", subjects=["rogue.>"]),
            "$JS.API.STREAM.CREATE.ROGUE",
        )
    info = await nc.jetstream().stream_info("SEA_EVENTS")  # still there, as the admin sees
    assert info.config.name == "SEA_EVENTS"


async def test_consumer_pulls_and_acks_only_its_own_durable(
    streams: Env, nats_server: NatsServer, nc: NATS
) -> None:
    admin = nc.jetstream()
    await admin.publish("vibespro.event.vibe_created.v1", b"{}", headers={"Nats-Msg-Id": "a"})
    await admin.publish("sea.event.model_published.v1", b"{}", headers={"Nats-Msg-Id": "b"})
    async with connected(nats_server, "inbox-consumer-sea__from_vibespro") as con:
        own = await con.js.pull_subscribe_bind(
            durable="sea__from_vibespro", stream="VIBESPRO_EVENTS"
        )
        [msg] = await own.fetch(1, timeout=5)
        await msg.in_progress()
        await msg.ack()
        info = await con.js.consumer_info("VIBESPRO_EVENTS", "sea__from_vibespro")
        assert info.num_pending == 0
        await con.js.publish("sea.dlq.sea__from_vibespro", b"{}", timeout=2)  # its dead letters
        other = await con.js.pull_subscribe_bind(durable="vibespro__from_sea", stream="SEA_EVENTS")
        await con.refused(
            lambda: other.fetch(1, timeout=1),
            "$JS.API.CONSUMER.MSG.NEXT.SEA_EVENTS.vibespro__from_sea",
        )
        await con.refused(
            lambda: con.js.consumer_info("SEA_EVENTS", "vibespro__from_sea"),
            "$JS.API.CONSUMER.INFO.SEA_EVENTS.vibespro__from_sea",
        )
        await con.refused(
            lambda: con.js.delete_consumer("VIBESPRO_EVENTS", "sea__from_vibespro"),
            "$JS.API.CONSUMER.DELETE.VIBESPRO_EVENTS.sea__from_vibespro",
        )
        dlq = "vibespro.dlq.vibespro__from_sea"
        await con.refused(lambda: con.js.publish(dlq, b"{}", timeout=1), dlq)
    # The other durable still has its message: nobody took it.
    assert (await admin.consumer_info("SEA_EVENTS", "vibespro__from_sea")).num_pending == 1
    assert (await admin.consumer_info("VIBESPRO_EVENTS", "sea__from_vibespro")).num_pending == 0


async def test_no_role_can_listen_to_another_roles_replies(nats_server: NatsServer) -> None:
    async with connected(nats_server, "inbox-consumer-sea__from_vibespro") as con:
        await con.nc.subscribe("_INBOX.outbox-publisher-sea.>")
        await con.nc.subscribe("sea.event.>")
        await eventually(
            lambda: _true(sum("subscription" in e for e in con.errors) >= 2),
            timeout=5,
            what="two subscription violations",
        )


async def test_router_reads_advisories_and_originals_and_writes_dead_letters_only(
    streams: Env, nats_server: NatsServer, nc: NATS
) -> None:
    admin = nc.jetstream()
    await admin.publish("vibespro.event.vibe_created.v1", b"{}", headers={"Nats-Msg-Id": "a"})
    # A terminated delivery makes the advisory the router consumes.
    psub = await admin.pull_subscribe_bind(durable="sea__from_vibespro", stream="VIBESPRO_EVENTS")
    [msg] = await psub.fetch(1, timeout=5)
    await msg.term()
    advisories = streams.topology.advisory_stream
    async with connected(nats_server, "dlq-router-sea-vibespro") as router:
        sub = await router.js.pull_subscribe_bind(durable=ROUTER_DURABLE, stream=advisories)
        [advisory] = await sub.fetch(1, timeout=5)
        assert json.loads(advisory.data)["consumer"] == "sea__from_vibespro"
        await advisory.ack()
        original = await router.js.get_msg("VIBESPRO_EVENTS", 1)
        assert original.subject == "vibespro.event.vibe_created.v1"
        for subject in ("sea.dlq.sea__from_vibespro", "vibespro.dlq.vibespro__from_sea"):
            await router.js.publish(subject, b"{}", timeout=2)
        await router.refused(
            lambda: router.js.publish("sea.event.vibe_created.v1", b"{}", timeout=1),
            "sea.event.vibe_created.v1",
        )
        foreign = await router.js.pull_subscribe_bind(
            durable="sea__from_vibespro", stream="VIBESPRO_EVENTS"
        )
        await router.refused(
            lambda: foreign.fetch(1, timeout=1),
            "$JS.API.CONSUMER.MSG.NEXT.VIBESPRO_EVENTS.sea__from_vibespro",
        )
        # Another topology's streams are not its business.
        await router.refused(
            lambda: router.js.get_msg("MEDIATION_E_TO_F_EVENTS", 1),
            "$JS.API.STREAM.MSG.GET.MEDIATION_E_TO_F_EVENTS",
        )


async def test_replayer_publishes_replays_of_its_durables_only(
    streams: Env, nats_server: NatsServer, nc: NATS
) -> None:
    async with connected(nats_server, "dlq-replayer-sea-vibespro") as rep:
        for stream, durable in (
            ("VIBESPRO_EVENTS", "sea__from_vibespro"),
            ("SEA_EVENTS", "vibespro__from_sea"),
        ):
            ack = await rep.js.publish(replay_subject(stream, durable), b"{}", timeout=2)
            assert ack.stream == stream
        await rep.refused(
            lambda: rep.js.publish("sea.event.vibe_created.v1", b"{}", timeout=1),
            "sea.event.vibe_created.v1",
        )
        await rep.refused(
            lambda: rep.js.get_msg("SEA_EVENTS", 1), "$JS.API.STREAM.MSG.GET.SEA_EVENTS"
        )
        other = replay_subject("MEDIATION_REPLAY_JOBS", "cg_replay")
        await rep.refused(lambda: rep.js.publish(other, b"{}", timeout=1), other)
    assert await stream_count(nc.jetstream(), "SEA_EVENTS") == 1


def _output(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


async def test_wrong_password_exits_3_naming_server_and_violation_not_the_password(
    env: Env, nats_server: NatsServer, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password-Zq81x\n")
    argv = [PYTHON, "-m", "services.outbox_publisher", "--context", "sea"]
    child = env.settings_env(command=argv)
    real = await asyncio.to_thread(Path(child["FERRY_NATS_PASSWORD_FILE"]).read_text)
    child["FERRY_NATS_PASSWORD_FILE"] = str(wrong)
    proc = await asyncio.to_thread(
        subprocess.run, argv, cwd=ROOT, env=child, capture_output=True, text=True, timeout=60
    )
    out = _output(proc)
    assert proc.returncode == 3, out
    assert nats_server.url in out
    assert "authorization violation" in out
    assert "outbox-publisher-sea" in out
    assert "not-the-password-Zq81x" not in out
    assert real.strip() not in out


async def test_roles_connect_as_their_own_user(env: Env, nats_server: NatsServer, nc: NATS) -> None:
    """A role a test starts really is that user on the server (monitoring: /connz)."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    proc = await asyncio.to_thread(_spawn, env, [PYTHON, "-m", "services.dlq_replayer"])
    try:
        await eventually(
            lambda: _connected_as(nats_server, "dlq-replayer:sea-vibespro", REPLAYER),
            timeout=60,
            what="the replayer connected as its own user",
        )
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 20)


def _spawn(env: Env, argv: list[str]) -> subprocess.Popen[bytes]:
    with open(env.tmp_path / "role.log", "ab") as log:
        return subprocess.Popen(
            argv, cwd=ROOT, env=env.settings_env(command=argv), stdout=log, stderr=log
        )


async def _connected_as(server: NatsServer, name: str, user: str) -> bool:
    import urllib.request

    url = f"http://127.0.0.1:{server.monitor_port}/connz?auth=true"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=2).read())
    connections = json.loads(body).get("connections") or []
    return any(c.get("name") == name and c.get("authorized_user") == user for c in connections)


# --------------------------------------------------------------------------- the generator


def test_generated_block_is_a_valid_server_config_for_both_topologies(tmp_path: Path) -> None:
    users = nats_users(SHIPPED)
    block = authorization_block(users, env_references)
    config = tmp_path / "nats.conf"
    config.write_text(f'listen: "127.0.0.1:4222"\n{block}')
    variables = {password_variable(u): "x" for u in users}
    old = dict(os.environ)
    os.environ.update(variables)
    try:
        check_config(config)
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert NATS_ADMIN in users and users[NATS_ADMIN] is None
    # Every role of both topologies that talks to NATS has a user, and only those.
    assert sorted(u for u in users if u != NATS_ADMIN) == sorted(
        [f"outbox-publisher-{c}" for t in SHIPPED for c in t.contexts]
        + [f"inbox-consumer-{d}" for t in SHIPPED for d in t.durables]
        + [f"dlq-{kind}-{t.name}" for t in SHIPPED for kind in ("router", "replayer")]
        + [f"console-{t.name}" for t in SHIPPED]
        # The one handler that talks to NATS: the replay API's worker (cg_replay's).
        + ["handler-module_g"]
    )
    worker = users["handler-module_g"]
    assert worker is not None
    assert worker.publish and all(s.startswith("ferry.replay.") for s in worker.publish)
    assert worker.subscribe == ("_INBOX.handler-module_g.>",)


def test_cli_prints_no_password_and_writes_inlined_ones_privately(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    base = [PYTHON, "-m", "shared.cli", "nats-auth", "--topology", "topologies/mediation.yaml"]
    printed = subprocess.run(base, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert "password: $FERRY_NATS_PASSWORD_INBOX_CONSUMER_CG_F_INGEST" in printed.stdout
    refused = subprocess.run(
        [*base, "--passwords-dir", str(secrets), "--generate"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--output" in refused.stderr
    out = tmp_path / "auth.conf"
    wrote = subprocess.run(
        [*base, "--passwords-dir", str(secrets), "--generate", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrote.returncode == 0, wrote.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    password = (secrets / "nats-password-dlq-router-mediation").read_text().strip()
    assert json.dumps(password) in out.read_text()
    assert password not in wrote.stdout + wrote.stderr
    assert stat.S_IMODE((secrets / "nats-password-dlq-router-mediation").stat().st_mode) == 0o600


def test_same_role_name_in_two_topologies_is_refused(tmp_path: Path) -> None:
    from shared.domain.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="outbox-publisher-sea"):
        nats_users([SHIPPED[0], SHIPPED[0].model_copy(update={"name": "other"})])
