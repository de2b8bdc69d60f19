"""NATS permissions of partitioned, ordered durables on a real nats-server (the mediation
topology: cg_g_archive has four partition consumers): the consumer's user pulls from each
of its partitions and no other durable's, the replayer publishes each partition's replay
subject and the router reads each partition consumer's info.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from devstack.nats import NatsServer
from shared.access.identities import identity_named
from shared.access.nats_auth import permissions_of
from shared.access.streams import provision
from shared.contracts.loading import load_topology
from shared.domain.ordering import partition_of, partitioned_subject
from tests.conftest import CAPS, ROOT
from tests.helpers import stream_count

from .test_nats_permissions import connected

pytestmark = pytest.mark.integration

STREAM = "MEDIATION_F_TO_G_ARCHIVE"
MEDIATION = load_topology(ROOT / "topologies/mediation.yaml")


def test_permissions_name_every_partition_consumer() -> None:
    consumer = permissions_of(identity_named([MEDIATION], "inbox-consumer-cg_g_archive"), MEDIATION)
    assert consumer is not None
    for k in range(4):
        assert f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.cg_g_archive_p{k}" in consumer.publish
        assert f"$JS.ACK.{STREAM}.cg_g_archive_p{k}.>" in consumer.publish
    assert f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.cg_g_archive" not in consumer.publish
    replayer = permissions_of(identity_named([MEDIATION], "dlq-replayer-mediation"), MEDIATION)
    assert replayer is not None
    assert f"ferry.replay.{STREAM}.cg_g_archive.3" in replayer.publish
    assert "ferry.replay.MEDIATION_E_TO_F_EVENTS.cg_f_ingest" in replayer.publish
    router = permissions_of(identity_named([MEDIATION], "dlq-router-mediation"), MEDIATION)
    assert router is not None
    assert f"$JS.API.CONSUMER.INFO.{STREAM}.cg_g_archive_p2" in router.publish


async def test_partition_consumers_and_replays_work_as_their_roles(
    tmp_path: Path, nats_server: NatsServer, nc: NATS
) -> None:
    admin = nc.jetstream()
    await provision(admin, MEDIATION, caps=CAPS)
    key = "opportunity/o-7"
    k = partition_of(key, 4)
    subject = partitioned_subject("mediation.f_to_g.archive.opportunity_archived.v1", k)
    async with connected(nats_server, "outbox-publisher-module_f") as pub:
        await pub.js.publish(subject, b"{}", timeout=2)
    async with connected(nats_server, "dlq-replayer-mediation") as rep:
        await rep.js.publish(f"ferry.replay.{STREAM}.cg_g_archive.{k}", b"{}", timeout=2)
    assert await stream_count(admin, STREAM) == 2
    async with connected(nats_server, "inbox-consumer-cg_g_archive") as con:
        sub = await con.js.pull_subscribe_bind(durable=f"cg_g_archive_p{k}", stream=STREAM)
        msgs = await sub.fetch(2, timeout=5)
        assert sorted(m.subject for m in msgs) == sorted(
            [subject, f"ferry.replay.{STREAM}.cg_g_archive.{k}"]
        )
        for msg in msgs:
            await msg.ack_sync()
        other = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.cg_g_archive"
        await con.refused(lambda: con.nc.request(other, b'{"batch": 1}', timeout=1), other)
