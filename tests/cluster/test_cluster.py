"""The 3-node JetStream cluster: what tests, the chaos suite and ``./dev stack --cluster`` rely on.

Real nats-server processes throughout: provisioning keeps the topology's 3 replicas on
the cluster, a publish JetStream acknowledged survives the SIGKILL of the stream's leader
(``sync_interval: always`` on every node), and a role given the seed list connects while
the first server of the list is down.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.js.errors import NoStreamResponseError

from devstack.nats_cluster import NatsCluster, cluster_block, seed_list
from devstack.postgres import PostgresServer
from devstack.stack import stack_environment
from shared.access.streams import Caps, is_clean, provision
from shared.adapters.nats import connect_nats
from shared.contracts.loading import load_topology
from shared.runtime.settings import CommonSettings
from tests.cluster.conftest import cluster_admin
from tests.conftest import ROOT, Env, sea_vibespro_doc

TOPOLOGY = ROOT / "topologies" / "sea-vibespro.yaml"


async def _leader(nc: NATS, stream: str, *, not_: str | None = None, timeout: float = 30) -> str:
    """The server leading ``stream`` (another than ``not_``), waiting out an election."""
    js = nc.jetstream(timeout=2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = await js.stream_info(stream)
        except Exception:  # an election in progress, a reconnect
            info = None
        if (
            info is not None
            and info.cluster is not None
            and info.cluster.leader not in (None, not_)
        ):
            return info.cluster.leader
        await asyncio.sleep(0.2)
    raise AssertionError(f"{stream}: no leader other than {not_} within {timeout}s")


@given(
    st.lists(
        st.from_regex(r"nats://127\.0\.0\.1:[1-9][0-9]{0,4}", fullmatch=True),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from(["", " ", "  "]),
)
def test_the_nats_url_setting_takes_the_seed_list_comma_separated(
    urls: list[str], pad: str
) -> None:
    text = ",".join(f"{pad}{url}{pad}" for url in urls) + ("," if pad else "")
    settings = CommonSettings(nats_url=text)
    assert settings.nats_servers() == urls
    assert CommonSettings(nats_url=seed_list(urls)).nats_servers() == urls


def test_each_node_is_configured_with_routes_to_the_others(tmp_path: Path) -> None:
    cluster = NatsCluster(tmp_path / "c")
    for index, node in enumerate(cluster.nodes):
        config = node.write_config().read_text()
        assert "sync_interval: always" in config and f'"{cluster.node_name(index)}"' in config
        others = [p for i, p in enumerate(cluster.cluster_ports) if i != index]
        for port in others:
            assert f"nats://127.0.0.1:{port}" in config
        assert f"127.0.0.1:{cluster.cluster_ports[index]}" in config
    block = cluster_block(name="x", listen="127.0.0.1:1", routes=["nats://a:1"], advertise="b:2")
    assert 'advertise: "b:2"' in block and "no_advertise: true" in block


def test_the_dev_stack_on_a_cluster_keeps_its_nats_server_down_and_3_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("FERRY_NATS_URL", "FERRY_DSN_TEMPLATE", "FERRY_MAX_STREAM_REPLICAS"):
        monkeypatch.delenv(name, raising=False)
    seeds = "nats://127.0.0.1:4001,nats://127.0.0.1:4002,nats://127.0.0.1:4003"
    env = stack_environment(tmp_path, seeds)
    assert env["FERRY_NATS_URL"] == seeds and env["FERRY_MAX_STREAM_REPLICAS"] == "3"
    assert env["FERRY_EMBEDDED_NATS"] == "false" and env["FERRY_EMBEDDED"] == "true"
    single = stack_environment(tmp_path)
    assert single["FERRY_EMBEDDED_NATS"] == "true" and single["FERRY_MAX_STREAM_REPLICAS"] == "1"


@pytest.mark.integration
async def test_provisioning_on_the_cluster_keeps_three_replicas(
    nats_cluster: NatsCluster, cluster_nc: NATS
) -> None:
    assert nats_cluster.meta_leader() in {nats_cluster.node_name(i) for i in range(3)}
    topology = load_topology(TOPOLOGY)
    js = cluster_nc.jetstream(timeout=10)
    changes = await provision(js, topology, caps=Caps(max_replicas=3))
    assert is_clean(changes), [c.describe() for c in changes]
    for context in topology.contexts.values():
        assert context.stream is not None
        info = await js.stream_info(context.stream.name)
        assert info.config.num_replicas == 3
        assert info.cluster is not None and info.cluster.leader is not None
        assert info.cluster.replicas is not None and len(info.cluster.replicas) == 2
    # Provisioning again finds nothing to change (replicas are not "drift").
    assert is_clean(await provision(js, topology, caps=Caps(max_replicas=3)))


@pytest.mark.integration
async def test_acknowledged_publishes_survive_the_stream_leader_killed(
    nats_cluster: NatsCluster, cluster_nc: NATS
) -> None:
    js = cluster_nc.jetstream(timeout=5)
    await js.add_stream(name="PROBE", subjects=["probe.>"], num_replicas=3)
    acked: dict[int, str] = {}

    async def publish(first: int, count: int) -> None:
        for n in range(first, first + count):
            for _ in range(50):  # through the election: an unacknowledged publish is retried
                try:
                    ack = await js.publish(
                        "probe.x", json.dumps(n).encode(), headers={"Nats-Msg-Id": f"m{n}"}
                    )
                except Exception:
                    await asyncio.sleep(0.2)
                    continue
                acked[ack.seq] = f"m{n}"
                break

    await publish(0, 50)
    leader = await _leader(cluster_nc, "PROBE")
    index = nats_cluster.index_of(leader)
    await asyncio.to_thread(nats_cluster.kill_node, index)
    await publish(50, 50)  # the two others elect a leader and go on
    assert await _leader(cluster_nc, "PROBE", not_=leader) != leader
    await asyncio.to_thread(nats_cluster.start_node, index)  # on its store; waits until current

    assert len(acked) == 100 and len(set(acked.values())) == 100  # dedup: each id once
    for seq, msg_id in acked.items():
        msg = await js.get_msg("PROBE", seq)
        assert (msg.headers or {}).get("Nats-Msg-Id") == msg_id
    info = await js.stream_info("PROBE")
    assert info.state.messages == 100
    # The restarted node catches up: every replica current again (as its leader sees it).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = await js.stream_info("PROBE")
        assert info.cluster is not None and info.cluster.replicas is not None
        if len(info.cluster.replicas) == 2 and all(p.current for p in info.cluster.replicas):
            break
        await asyncio.sleep(0.3)
    else:
        raise AssertionError(f"replicas not current after 30s: {info.cluster}")


@pytest.mark.integration
async def test_a_role_connects_with_the_seed_list_while_the_first_node_is_down(
    nats_cluster: NatsCluster,
) -> None:
    settings = CommonSettings(nats_url=nats_cluster.url)
    assert settings.nats_servers() == nats_cluster.urls
    first = await connect_nats(
        settings.nats_servers(), name="setup", auth=cluster_admin(nats_cluster), give_up_after=15
    )
    try:
        await first.jetstream(timeout=10).add_stream(
            name="SEEDS", subjects=["seeds.>"], num_replicas=3
        )
    finally:
        await first.close()
    await asyncio.to_thread(nats_cluster.kill_node, 0)
    nc = await connect_nats(
        settings.nats_servers(),
        name="seed-list-test",
        auth=cluster_admin(nats_cluster),
        give_up_after=15,
    )
    try:
        assert nc.connected_url is not None
        assert nc.connected_url.port in nats_cluster.client_ports[1:]
        js, ack = nc.jetstream(timeout=2), None
        deadline = time.monotonic() + 30
        while ack is None:  # the stream's leader may have been the node killed: an election
            try:
                ack = await js.publish("seeds.x", b"1", headers={"Nats-Msg-Id": "one"})
            except (NoRespondersError, TimeoutError, NoStreamResponseError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)
        assert ack.stream == "SEEDS" and ack.seq == 1
    finally:
        await nc.close()


@pytest.mark.integration
async def test_ferry_provision_with_the_seed_list_creates_every_stream_at_3_replicas(
    tmp_path: Path, pg_server: PostgresServer, nats_cluster: NatsCluster, cluster_nc: NATS
) -> None:
    env = Env(tmp_path, pg_server, nats_cluster.url, sea_vibespro_doc("c"))
    settings = env.settings_env()
    assert settings["FERRY_NATS_URL"] == nats_cluster.url
    assert settings["FERRY_MAX_STREAM_REPLICAS"] == "3"
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "shared.cli", "provision"],
        cwd=ROOT,
        env=settings,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    js = cluster_nc.jetstream(timeout=10)
    streams = [c.stream.name for c in env.topology.contexts.values() if c.stream is not None]
    streams += [s.name for s in env.topology.dead_letter_streams]
    for name in streams:
        info = await js.stream_info(name)
        assert info.config.num_replicas == 3, name
