"""How a chaos world is tuned: the topology it runs (:func:`chaos_topology_doc`, the shipped
sea-vibespro one with the chaos clocks), the durable clocks, the roles' settings, and a
scenario's own changes to them (:class:`Tuning`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from chaos.engine.roles import ROOT

#: The topology whose roles the run exercises (both directions of SEA <-> VibesPro).
TOPOLOGY = ROOT / "topologies" / "sea-vibespro.yaml"
#: SIGKILLed, not power-cut: an acknowledged commit survives in the page cache.
CRASHABLE_PG = {"fsync": "off"}
#: Durable clocks short enough for a run measured in minutes. With 12 deliveries and this
#: ladder an event outlives any single fault of a schedule; ``replay: operator`` keeps
#: dead letters where they are (the replayer is not part of the run).
DURABLE_CLOCKS: dict[str, Any] = {
    "ack_wait": "6s",
    "max_deliver": 12,
    "backoff": ["500ms", "1s", "2s", "3s"],
    "replay": "operator",
}
#: Settings that compress the publisher's clocks (the scenarios that fail publishes): its own
#: back-off, its PubAck timeout and the attempt cap past which a row is set aside.
PUBLISHER_COMPRESSED = {
    "FERRY_RETRY_INITIAL": "0.05",
    "FERRY_RETRY_MAX": "0.3",
    "FERRY_PUBLISH_TIMEOUT": "1",
    "FERRY_MAX_PUBLISH_ATTEMPTS": "8",
}


def short_clocks(ack_wait: str, max_deliver: int, backoff: list[str]) -> dict[str, Any]:
    """Durable clocks shorter than :data:`DURABLE_CLOCKS` (``replay: operator`` too), for
    a scenario whose events must settle, or be spent, within seconds."""
    return {
        "ack_wait": ack_wait,
        "max_deliver": max_deliver,
        "backoff": backoff,
        "replay": "operator",
    }


#: Below the 5 s latency fault, so that fault opens the "200 sent, answer lost" window.
HANDLER_TIMEOUT = "3s"
#: Settings every role gets (a dead NATS link is noticed within ~3 s).
COMMON_SETTINGS = {
    "FERRY_MAX_STREAM_REPLICAS": "1",
    "FERRY_MAX_STREAM_BYTES": "256MB",
    "FERRY_LOG_LEVEL": "INFO",
    "FERRY_NATS_PING_INTERVAL": "1",
}
ROLE_SETTINGS: dict[str, dict[str, str]] = {
    "publisher": {
        "FERRY_POLL_INTERVAL": "0.2",
        "FERRY_PUBLISH_TIMEOUT": "2",
        "FERRY_BATCH_SIZE": "100",
        "FERRY_RETRY_MAX": "1",
    },
    "consumer": {
        "FERRY_FETCH_TIMEOUT": "0.5",
        "FERRY_LEASE_MARGIN": "2",
        "FERRY_CONCURRENCY": "32",
    },
    # The workload's fault classes are _ferry_test payload directives (chaos/workload.py),
    # obeyed only with this setting on.
    "handler": {"FERRY_HANDLER_FAULT_INJECTION": "true"},
    "router": {"FERRY_FETCH_TIMEOUT": "0.5"},
}


@dataclass(frozen=True)
class Tuning:
    """What a scenario changes in the world: clocks, role settings, handler fronts."""

    #: Set on every durable (see :data:`DURABLE_CLOCKS`).
    clocks: dict[str, Any] = field(default_factory=lambda: dict(DURABLE_CLOCKS))
    handler_timeout: str = HANDLER_TIMEOUT
    #: Extra settings per role kind (``publisher``, ``consumer``, ``handler``, ``router``).
    settings: dict[str, dict[str, str]] = field(default_factory=dict)
    #: durable -> ``python -m`` argv of a process put between its consumer and its
    #: handler; it is given ``--port P --upstream URL`` and runs as role ``front-<durable>``.
    fronts: dict[str, list[str]] = field(default_factory=dict)
    #: durable -> topology fields set on it after the clocks (``ordering``, ...).
    durables: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: context -> fields set on its stream (``partitions``, ...).
    streams: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Consumer processes planned per durable: ``consumer-<durable>``, then
    #: ``consumer-<durable>-r2`` ... (each with links of its own).
    consumer_replicas: int = 1
    #: How many of them start with the world (the others wait, held down, for the run to
    #: start them); None: all.
    replicas_at_start: int | None = None


def chaos_topology_doc(tuning: Tuning | None = None) -> dict[str, Any]:
    """The shipped sea-vibespro topology with the chaos clocks on its durables."""
    tuning = tuning or Tuning()
    doc: dict[str, Any] = yaml.safe_load(TOPOLOGY.read_text())
    for name, durable in doc["durables"].items():
        durable.update(tuning.clocks)
        durable["handler"]["timeout"] = tuning.handler_timeout
        durable.update(tuning.durables.get(name, {}))
    for name, fields_ in tuning.streams.items():
        doc["contexts"][name]["stream"].update(fields_)
    return doc
