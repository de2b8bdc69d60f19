"""Provisioning partitioned, ordered durables on a real nats-server: one consumer per
partition with narrowed filters, drift covers them, and a change of the partition count is
refused while messages wait (unless --repartition), never losing a message that waits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.aio.client import Client as NATS
from nats.js import api as js_api

from shared.access.streams import REPARTITION_PROCEDURE, Change, is_clean, provision
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology
from shared.domain.ordering import partition_of, partitioned_subject
from tests.conftest import CAPS, ROOT

pytestmark = pytest.mark.integration

STREAM = "MEDIATION_F_TO_G_ARCHIVE"
NS = "mediation.f_to_g.archive"
SUBJECT = f"{NS}.opportunity_archived.v1"


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies/mediation.yaml").read_text())
    return doc


def _load(tmp_path: Path, doc: dict[str, Any], name: str = "t.yaml") -> Topology:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_topology(path)


def _partitions(doc: dict[str, Any], count: int) -> dict[str, Any]:
    doc["contexts"]["module_f"]["stream"]["partitions"] = count
    return doc


def _by_name(changes: list[Change]) -> dict[str, Change]:
    """Consumers by name; a durable's layout change as ``durable:{name}``."""
    return {f"durable:{c.name}" if c.kind == "durable" else c.name: c for c in changes}


async def _publish(nc: NATS, key: str, partitions: int) -> int:
    subject = partitioned_subject(SUBJECT, partition_of(key, partitions))
    ack = await nc.jetstream().publish(subject, b"{}", stream=STREAM)
    return int(ack.seq)


async def test_ordered_durables_get_a_consumer_per_partition(tmp_path: Path, nc: NATS) -> None:
    js = nc.jetstream()
    topology = _load(tmp_path, _doc())
    first = _by_name(await provision(js, topology, caps=CAPS))
    assert {n for n, c in first.items() if c.action == "created"} >= {
        *(f"cg_g_archive_p{k}" for k in range(4)),
        "cg_h_publish_p0",
        "cg_h_publish_p1",
        "cg_f_ingest",
        "cg_replay",
    }
    assert "cg_g_archive" not in first
    info = await js.consumer_info(STREAM, "cg_g_archive_p2")
    assert info.config.filter_subjects == [
        f"{NS}.*.*.2",
        f"ferry.replay.{STREAM}.cg_g_archive.2",
    ]
    assert (info.config.metadata or {})["ferry.partition"] == "2"
    assert (info.config.metadata or {})["ferry.partitions"] == "4"
    stream = await js.stream_info(STREAM)
    assert f"ferry.replay.{STREAM}.*.*" in stream.config.subjects
    advisories = await js.stream_info(topology.advisory_stream)
    assert (
        f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{STREAM}.cg_g_archive_p3"
        in advisories.config.subjects
    )
    # Idempotent, and check mode finds nothing.
    again = await provision(js, topology, caps=CAPS)
    assert {c.action for c in again} == {"unchanged"}
    assert is_clean(await provision(js, topology, caps=CAPS, apply=False))

    # Each message reaches its key's partition consumer and no other.
    seq = await _publish(nc, "opportunity/o-1", 4)
    k = partition_of("opportunity/o-1", 4)
    for j in range(4):
        pending = (await js.consumer_info(STREAM, f"cg_g_archive_p{j}")).num_pending
        assert pending == (1 if j == k else 0), (j, k, seq)


async def test_drift_of_one_partition_consumer_is_reported(tmp_path: Path, nc: NATS) -> None:
    js = nc.jetstream()
    topology = _load(tmp_path, _doc())
    await provision(js, topology, caps=CAPS)
    info = await js.consumer_info(STREAM, "cg_g_archive_p1")
    changed = js_api.ConsumerConfig.from_response(info.config.as_dict())
    changed.ack_wait = 30.0
    await js.add_consumer(STREAM, changed)
    checked = _by_name(await provision(js, topology, caps=CAPS, apply=False))
    assert checked["cg_g_archive_p1"].action == "drift"
    shipped = topology.durables["cg_g_archive"].ack_wait  # what provisioning sets it back to
    assert checked["cg_g_archive_p1"].diffs == {"ack_wait": (30.0, shipped)}
    assert checked["cg_g_archive_p0"].action == "unchanged"
    applied = _by_name(await provision(js, topology, caps=CAPS))
    assert applied["cg_g_archive_p1"].action == "updated"


async def test_a_new_partition_count_waits_for_drained_consumers(tmp_path: Path, nc: NATS) -> None:
    js = nc.jetstream()
    await provision(js, _load(tmp_path, _doc()), caps=CAPS)
    keys = [f"opportunity/o-{n}" for n in range(40)]
    kept = [key for key in keys if partition_of(key, 4) < 2][:8]
    seqs = [await _publish(nc, key, 4) for key in kept]
    two = _load(tmp_path, _partitions(_doc(), 2), "two.yaml")

    refused = _by_name(await provision(js, two, caps=CAPS))
    change = refused["durable:cg_g_archive"]
    assert change.action == "refused"
    assert change.diffs == {"partitions": ("4", 2)}
    assert change.error is not None and change.error.endswith(REPARTITION_PROCEDURE)
    assert "cg_g_archive_p0 (" in change.error and " pending, 0 unacked)" in change.error
    # Nothing of the old layout was touched; stale consumers are only reported.
    assert {refused[f"cg_g_archive_p{k}"].action for k in (2, 3)} == {"stale"}
    for k in range(4):
        info = await js.consumer_info(STREAM, f"cg_g_archive_p{k}")
        assert (info.config.metadata or {})["ferry.partitions"] == "4"
    assert not is_clean(list(refused.values()))

    # Forced: the new consumers start at the first message an old one had not acked (none
    # was: the start of the stream), so no waiting message is lost; the old ones go.
    forced = _by_name(await provision(js, two, caps=CAPS, repartition=True))
    assert forced["durable:cg_g_archive"].action == "updated"
    assert {forced[f"cg_g_archive_p{k}"].action for k in (2, 3)} == {"deleted"}
    names = {c.name for c in await js.consumers_info(STREAM)}
    assert {n for n in names if n.startswith("cg_g_archive")} == {
        "cg_g_archive_p0",
        "cg_g_archive_p1",
    }
    pending = 0
    for k in range(2):
        info = await js.consumer_info(STREAM, f"cg_g_archive_p{k}")
        assert info.config.opt_start_seq == min(seqs)
        assert (info.config.metadata or {})["ferry.partitions"] == "2"
        pending += info.num_pending
    assert pending == len(seqs)
    # The start sequence they were created with is not drift.
    assert is_clean(await provision(js, two, caps=CAPS, apply=False))


async def test_messages_on_a_dropped_partition_block_even_a_forced_change(
    tmp_path: Path, nc: NATS
) -> None:
    js = nc.jetstream()
    await provision(js, _load(tmp_path, _doc()), caps=CAPS)
    key = next(
        f"opportunity/o-{n}" for n in range(100) if partition_of(f"opportunity/o-{n}", 4) == 3
    )
    await _publish(nc, key, 4)
    two = _load(tmp_path, _partitions(_doc(), 2), "two.yaml")
    for forced in (False, True):
        changes = await provision(js, two, caps=CAPS, repartition=forced)
        change = _by_name(changes)["durable:cg_g_archive"]
        assert change.action == "refused"
        assert change.error is not None and change.error.startswith(
            "cg_g_archive_p3 (1 pending, 0 unacked) still hold messages whose partition token "
            "the new layout does not read: no consumer would ever deliver them"
        )
        assert (await js.consumer_info(STREAM, "cg_g_archive_p3")).num_pending == 1


async def test_drained_consumers_repartition_without_the_flag(tmp_path: Path, nc: NATS) -> None:
    """Drained (nothing pending or unacked), the change goes ahead; the consumers it no
    longer needs are reported stale until --repartition deletes them."""
    js = nc.jetstream()
    doc = _doc()
    archive = doc["durables"]["cg_g_archive"]
    archive["ordering"] = "none"
    del archive["on_dead_letter"]
    unordered = _load(tmp_path, doc, "none.yaml")
    await provision(js, unordered, caps=CAPS)
    await _publish(nc, "opportunity/o-1", 4)
    sub = await js.pull_subscribe_bind("cg_g_archive", stream=STREAM)
    for msg in await sub.fetch(1, timeout=5):
        await msg.ack_sync()
    seq = await _publish(nc, "opportunity/o-2", 4)  # pending: the change must wait

    ordered = _load(tmp_path, _doc())
    refused = _by_name(await provision(js, ordered, caps=CAPS))
    assert refused["durable:cg_g_archive"].action == "refused"
    assert "cg_g_archive (1 pending, 0 unacked)" in (refused["durable:cg_g_archive"].error or "")
    for msg in await sub.fetch(1, timeout=5):
        await msg.ack_sync()
    await sub.unsubscribe()

    checked = _by_name(await provision(js, ordered, caps=CAPS, apply=False))
    assert checked["durable:cg_g_archive"].action == "drift"
    applied = _by_name(await provision(js, ordered, caps=CAPS))
    assert {applied[f"cg_g_archive_p{k}"].action for k in range(4)} == {"created"}
    assert applied["durable:cg_g_archive"].action == "updated"  # the layout change itself
    info = await js.consumer_info(STREAM, "cg_g_archive_p0")
    assert info.config.opt_start_seq == seq + 1  # after the old consumer's ack floor
    again = _by_name(await provision(js, ordered, caps=CAPS))
    assert again["cg_g_archive"].action == "stale"  # the unordered consumer, kept
    assert not is_clean(list(again.values()))
    cleaned = _by_name(await provision(js, ordered, caps=CAPS, repartition=True))
    assert cleaned["cg_g_archive"].action == "deleted"
    assert is_clean(await provision(js, ordered, caps=CAPS))


async def test_a_paused_durable_is_not_repartitioned(tmp_path: Path, nc: NATS) -> None:
    """A repartition recreates the durable's consumers, which would run unpaused: while the
    durable is paused (ferry durable pause) it is refused, naming the pause, even forced."""
    from datetime import UTC, datetime

    from shared.domain.pause import INDEFINITE
    from shared.ops.pause import _each

    js = nc.jetstream()
    await provision(js, _load(tmp_path, _doc()), caps=CAPS)
    names = [f"cg_g_archive_p{k}" for k in range(4)]
    assert await _each(js, STREAM, names, INDEFINITE) == {}
    two = _load(tmp_path, _partitions(_doc(), 2), "two.yaml")
    refused = _by_name(await provision(js, two, caps=CAPS, repartition=True))
    change = refused["durable:cg_g_archive"]
    assert change.action == "refused" and "is paused" in (change.error or "")
    for name in names:  # untouched: still there, still paused
        assert (await js.consumer_info(STREAM, name)).paused
    assert await _each(js, STREAM, names, datetime(1970, 1, 1, tzinfo=UTC)) == {}
    forced = _by_name(await provision(js, two, caps=CAPS, repartition=True))
    assert forced["durable:cg_g_archive"].action == "updated"
