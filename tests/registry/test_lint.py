"""The configuration lint: for each rule a failing case with its exact message, and a passing one.

Every topology here is a shipped one with one setting changed, loaded the way a role loads
it (events from the generated registry) and linted with the publisher's default timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.contracts.lint import (
    PublisherTiming,
    format_duration,
    lint_topology,
    redelivery_horizon,
    replay_horizon,
)
from shared.contracts.loading import load_topology
from shared.domain.errors import ConfigurationError
from tests.conftest import ROOT

from .conftest import MEDIATION, SEA_VIBESPRO, lint_doc, lint_loaded, load_doc, shipped

F = SEA_VIBESPRO
SEA_DURABLE = "sea__from_vibespro"


def _durable(doc: dict[str, Any], name: str = SEA_DURABLE) -> dict[str, Any]:
    durable: dict[str, Any] = doc["durables"][name]
    return durable


@pytest.mark.parametrize("relative", [SEA_VIBESPRO, MEDIATION])
def test_both_shipped_topologies_pass(relative: str) -> None:
    topology = load_topology(ROOT / relative)
    assert lint_topology(topology, source=relative) == []


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0.2, 5, 71, 120, 7 * 86400, 2615112)] == [
        "200ms", "5s", "1m 11s", "2m", "7d", "30d 6h 25m 12s",
    ]  # fmt: skip


# --- duplicate-window ---------------------------------------------------------------------


def test_duplicate_window_shorter_than_the_republish_horizon(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["contexts"]["sea"]["stream"]["duplicate_window"] = "30s"
    assert lint_doc(tmp_path, doc) == [
        f"{F}: contexts.sea.stream.duplicate_window: 30s is shorter than the "
        "outbox-publisher's re-publish horizon (1m 11s = publish timeout 5s + row back-off "
        "cap 1m + retry_max 5s + poll interval 1s): a row re-published after a lost PubAck "
        "would be stored twice [duplicate-window]"
    ]


def test_duplicate_window_uses_the_publishers_own_timing(tmp_path: Path) -> None:
    """The shipped 2m window covers the default publisher, not one with a 60 s PubAck wait."""
    topology = load_doc(tmp_path, shipped(SEA_VIBESPRO))
    slow = PublisherTiming(publish_timeout=60.0, retry_max=5.0, poll_interval=1.0)
    assert lint_loaded(topology, publisher=PublisherTiming(5.0, 5.0, 1.0)) == []
    found = [str(p) for p in lint_loaded(topology, publisher=slow)]
    assert found == [
        f"{F}: contexts.{ctx}.stream.duplicate_window: 2m is shorter than the "
        "outbox-publisher's re-publish horizon (2m 6s = publish timeout 1m + row back-off "
        "cap 1m + retry_max 5s + poll interval 1s): a row re-published after a lost PubAck "
        "would be stored twice [duplicate-window]"
        for ctx in ("sea", "vibespro")
    ]


# --- inbox-retention ----------------------------------------------------------------------


def test_inbox_retention_shorter_than_the_replay_horizon(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["contexts"]["sea"]["inbox_retention"] = "8d"
    assert lint_doc(tmp_path, doc) == [
        f"{F}: contexts.sea.inbox_retention: 8d is shorter than the replay horizon of "
        "durable sea__from_vibespro (30d 6h 25m 12s): a copy arriving after its inbox row is "
        "purged would be processed twice [inbox-retention]"
    ]


def test_inbox_retention_shorter_than_the_stream_max_age(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    for stream in doc["dead_letter_streams"]:
        stream["max_age"] = "1d"
    doc["contexts"]["sea"]["inbox_retention"] = "6d"
    assert lint_doc(tmp_path, doc) == [
        f"{F}: contexts.sea.inbox_retention: 6d is shorter than the max_age of stream "
        "VIBESPRO_EVENTS read by durable sea__from_vibespro (7d): a copy arriving after its "
        "inbox row is purged would be processed twice [inbox-retention]"
    ]
    doc["contexts"]["sea"]["inbox_retention"] = "7d"
    assert lint_doc(tmp_path, doc) == []


def test_horizons_add_up_every_attempt_and_back_off() -> None:
    durable = load_topology(ROOT / SEA_VIBESPRO).durables[SEA_DURABLE]
    # 20 attempts of 120 s, then the delays after attempts 1..19: 1+5+30+120 and 15 x 600.
    assert redelivery_horizon(durable) == 20 * 120 + 1 + 5 + 30 + 120 + 15 * 600
    topology = load_topology(ROOT / SEA_VIBESPRO)
    # Dead letters are kept 30 days; the replay itself is then redelivered.
    assert replay_horizon(topology, durable) == 30 * 86400 + 2 * redelivery_horizon(durable)


# --- handler-timeout ----------------------------------------------------------------------


def test_handler_timeout_not_below_ack_wait_without_heartbeats(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    _durable(doc)["handler"]["timeout"] = "130s"
    _durable(doc)["heartbeats"] = False
    assert lint_doc(tmp_path, doc) == [
        f"{F}: durables.sea__from_vibespro.handler.timeout: 2m 10s is not below ack_wait 2m "
        "and heartbeats are off: JetStream would redeliver a message whose handler is still "
        "running [handler-timeout]"
    ]


@pytest.mark.parametrize(("timeout", "heartbeats"), [("130s", True), ("100s", False)])
def test_handler_timeout_passes_with_heartbeats_or_below_ack_wait(
    tmp_path: Path, timeout: str, heartbeats: bool
) -> None:
    doc = shipped(SEA_VIBESPRO)
    _durable(doc)["handler"]["timeout"] = timeout
    _durable(doc)["heartbeats"] = heartbeats
    assert lint_doc(tmp_path, doc) == []


# --- max-deliver --------------------------------------------------------------------------


def test_max_deliver_shorter_than_the_ladder(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    _durable(doc)["max_deliver"] = 3
    assert lint_doc(tmp_path, doc) == [
        f"{F}: durables.sea__from_vibespro.max_deliver: 3 is shorter than the back-off "
        "ladder (5 steps): messages are dead-lettered before the ladder's last steps are "
        "ever used [max-deliver]"
    ]
    _durable(doc)["max_deliver"] = 5
    assert lint_doc(tmp_path, doc) == []


# --- ack-pending --------------------------------------------------------------------------


def test_max_ack_pending_must_hold_two_batches(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    _durable(doc)["max_ack_pending"] = 50
    _durable(doc)["batch_size"] = 50
    assert lint_doc(tmp_path, doc) == [
        f"{F}: durables.sea__from_vibespro.max_ack_pending: 50 holds fewer than two batches "
        "of 50: the next batch (or a second replica) cannot be pulled while one is in "
        "process; give max_ack_pending >= 100 or a smaller batch_size [ack-pending]"
    ]
    _durable(doc)["batch_size"] = 25
    assert lint_doc(tmp_path, doc) == []


def test_max_deliver_unlimited_is_refused(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    _durable(doc)["max_deliver"] = -1
    with pytest.raises(ConfigurationError) as refused:
        load_doc(tmp_path, doc)
    assert str(refused.value) == (
        f"{tmp_path / 'topology.yaml'}: durables.sea__from_vibespro.max_deliver: "
        "Input should be greater than or equal to 1"
    )
    # A topology built in code skips the file's validation; the lint still catches it.
    topology = load_topology(ROOT / SEA_VIBESPRO)
    unlimited = topology.durables[SEA_DURABLE].model_copy(update={"max_deliver": -1})
    built = topology.model_copy(update={"durables": {**topology.durables, SEA_DURABLE: unlimited}})
    assert [str(p) for p in lint_loaded(built)] == [
        f"{F}: durables.sea__from_vibespro.max_deliver: -1 means unlimited redelivery: a "
        "poison message would be retried forever; give a finite count [max-deliver]"
    ]


# --- dead-letter-stream -------------------------------------------------------------------


def test_dead_letter_subject_no_stream_captures(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["dead_letter_streams"] = [s for s in doc["dead_letter_streams"] if s["name"] != "SEA_DLQ"]
    assert lint_doc(tmp_path, doc) == [
        f"{F}: durables.sea__from_vibespro.dead_letter_subject: no dead-letter stream "
        "captures 'sea.dlq.sea__from_vibespro': a dead letter could not be stored and its "
        "message would be retried forever [dead-letter-stream]"
    ]


def test_dead_letter_subject_inside_an_event_stream(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    _durable(doc, "vibespro__from_sea")["dead_letter_subject"] = "vibespro.event.dlq.v1"
    assert (
        f"{F}: durables.vibespro__from_sea.dead_letter_subject: 'vibespro.event.dlq.v1' is "
        "captured by event stream VIBESPRO_EVENTS: dead letters must go to a dead-letter "
        "stream, not be mixed with events [dead-letter-stream]"
    ) in lint_doc(tmp_path, doc)


def test_dead_letter_stream_must_keep_limits_retention(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["dead_letter_streams"][0]["retention"] = "workqueue"
    with pytest.raises(ConfigurationError) as refused:
        load_doc(tmp_path, doc)
    assert str(refused.value) == (
        f"{tmp_path / 'topology.yaml'}: dead_letter_streams.0.retention: Input should be 'limits'"
    )


# --- naming -------------------------------------------------------------------------------


def test_durable_name_breaks_the_convention(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    durable = doc["durables"].pop(SEA_DURABLE)
    durable["dead_letter_subject"] = "sea.dlq.sea_from_vibespro"
    doc["durables"]["sea_from_vibespro"] = durable
    assert lint_doc(tmp_path, doc) == [
        f"{F}: durables.sea_from_vibespro: name 'sea_from_vibespro' breaks the convention: "
        "expected 'sea__from_vibespro' ({target}__from_{source}) or an INFRA-005 consumer "
        "group cg_<stage> [naming]"
    ]


def test_consumer_group_names_pass(tmp_path: Path) -> None:
    doc = shipped(MEDIATION)
    assert all(name.startswith("cg_") for name in doc["durables"])
    assert lint_doc(tmp_path, doc, MEDIATION) == []


def test_filter_subject_breaks_the_convention(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    _durable(doc)["filter_subjects"] = ["vibespro.event.vibe_created.v1", "vibespro.event.*.2"]
    assert (
        f"{F}: durables.sea__from_vibespro.filter_subjects[1]: 'vibespro.event.*.2' is not a "
        "conventional filter: use vibespro.event.> or vibespro.event.<event_type|*>.<vN|*> "
        "[naming]"
    ) in lint_doc(tmp_path, doc)
    _durable(doc)["filter_subjects"] = ["vibespro.event.vibe_created.v1", "vibespro.event.*.v2"]
    assert lint_doc(tmp_path, doc) == []


def test_dead_letter_subject_breaks_the_convention(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    _durable(doc)["dead_letter_subject"] = "sea.dlq.elsewhere"
    assert lint_doc(tmp_path, doc) == [
        f"{F}: durables.sea__from_vibespro.dead_letter_subject: 'sea.dlq.elsewhere' breaks "
        "the convention: expected 'sea.dlq' or 'sea.dlq.sea__from_vibespro' (the target "
        "context's dead_letter_subject) [naming]"
    ]


def test_stream_subject_outside_the_namespace(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["contexts"]["sea"]["stream"]["subjects"] = ["sea.event.>", "sea.audit.>"]
    assert lint_doc(tmp_path, doc) == [
        f"{F}: contexts.sea.stream.subjects[1]: 'sea.audit.>' reaches outside the context's "
        "namespace: a context's stream captures sea.event.> only [naming]"
    ]
