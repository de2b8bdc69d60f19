"""Fault schedules: which fault happens when, to whom, for how long — all from a seed.

``ci``     the bounded schedule CI runs on every change (ISSUE 6): publishers and consumers
           SIGKILLed every 10±5 s (the first of each inside its crash window), NATS killed
           twice, PostgreSQL crashed once, reset_peer on the NATS links, 5 s latency and a
           blackhole on a handler link; about 2,000 events over 60 s.
``soak``   50,000 events over 10 minutes, a random fault every 5 s, a quarter of the
           5-second periods quiet.

The ``--scenario`` runs have a ci and a soak size of their own, e.g. the PostgreSQL
failover drill's :data:`chaos.scenarios.pg_failover.plan.SIZES` (soak: 12,000 events over 10
minutes, five failovers, the lost server rejoining as the standby after each); the README
lists the long runs.

A schedule is a plan; :mod:`chaos.engine.faults` carries it out and records what really happened.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

#: Every fault kind, with what it does (docs/explanation/chaos.md repeats this table).
FAULT_KINDS: dict[str, str] = {
    "kill_publisher": "SIGKILL an outbox-publisher at a random moment, restart it",
    "kill_publisher_in_window": "SIGKILL a publisher between its PubAcks and mark-published",
    "kill_consumer": "SIGKILL an inbox-consumer at a random moment, restart it",
    "kill_consumer_in_window": "SIGKILL a consumer between a handler's 200 and the inbox update",
    "kill_router": "SIGKILL the dlq-router, restart it",
    "kill_nats": "SIGKILL nats-server, restart it on its store",
    "crash_postgres": "SIGKILL PostgreSQL (postmaster and backends), restart it",
    "nats_reset_peer": "reset_peer on every role's NATS link",
    "handler_latency": "5 s latency on a consumer's handler link (answers outlive the timeout)",
    "handler_blackhole": "blackhole (timeout 0) on a consumer's handler link",
    "handler_limit_data": "answers cut after 40 bytes on a consumer's handler link",
    "pg_latency": "300±200 ms latency on a role's PostgreSQL link",
    "pg_reset_peer": "reset_peer on a role's PostgreSQL link",
    "nats_slicer": "NATS traffic of a role sliced into 1-64 byte pieces",
    "nats_bandwidth": "a role's NATS link throttled to 20 KB/s",
    "nats_blackhole": "what the server sends a role swallowed, each connection closed after "
    "1 s (deliveries lost in transit)",
    "link_down": "one link of one role disabled (refused, connections closed)",
}
#: Kinds the soak draws from (with these weights).
SOAK_WEIGHTS: dict[str, int] = {
    "kill_publisher": 3,
    "kill_publisher_in_window": 2,
    "kill_consumer": 3,
    "kill_consumer_in_window": 2,
    "kill_router": 1,
    "kill_nats": 2,
    "crash_postgres": 1,
    "nats_reset_peer": 2,
    "handler_latency": 2,
    "handler_blackhole": 2,
    "handler_limit_data": 1,
    "pg_latency": 2,
    "pg_reset_peer": 2,
    "nats_slicer": 1,
    "nats_bandwidth": 1,
    "nats_blackhole": 1,
    "link_down": 2,
}


@dataclass(frozen=True)
class Targets:
    """What faults can be aimed at in a world."""

    publishers: tuple[str, ...]
    consumers: tuple[str, ...]
    #: Role names that have a link of each kind.
    nats_roles: tuple[str, ...]
    pg_roles: tuple[str, ...]
    #: Every proxied link name.
    links: tuple[str, ...]


@dataclass(frozen=True)
class PlannedFault:
    """One fault of a schedule."""

    at: float
    kind: str
    target: str
    duration: float

    def describe(self) -> str:
        """One line for the plan printout."""
        span = f" for {self.duration:.1f}s" if self.duration else ""
        target = f" {self.target}" if self.target else ""
        return f"t+{self.at:6.1f}s {self.kind}{target}{span}"


@dataclass(frozen=True)
class Schedule:
    """A whole run: how long faults last, how many events, which faults."""

    name: str
    seed: int
    seconds: float
    events: int
    faults: tuple[PlannedFault, ...]
    drain_timeout: float
    quiet_periods: int = 0
    periods: int = 0
    kinds: tuple[str, ...] = field(default_factory=tuple)


def _series(rng: random.Random, seconds: float, every: float, spread: float) -> list[float]:
    """Moments every ``every ± spread`` seconds, starting after one such gap."""
    moments, t = [], rng.uniform(every - spread, every + spread) * 0.6
    while t < seconds - 3:
        moments.append(t)
        t += rng.uniform(every - spread, every + spread)
    return moments


def ci_schedule(
    seed: int, targets: Targets, *, seconds: float = 60.0, events: int = 2000
) -> Schedule:
    """The CI schedule (see the module docstring), scaled to ``seconds``."""
    rng = random.Random(f"ci-{seed}")
    faults: list[PlannedFault] = []
    for index, at in enumerate(_series(rng, seconds, 10.0, 5.0)):
        kind = "kill_publisher_in_window" if index == 0 else "kill_publisher"
        faults.append(PlannedFault(at, kind, rng.choice(targets.publishers), 0.0))
    for index, at in enumerate(_series(rng, seconds, 10.0, 5.0)):
        kind = "kill_consumer_in_window" if index == 0 else "kill_consumer"
        faults.append(PlannedFault(at, kind, rng.choice(targets.consumers), 0.0))
    faults.append(PlannedFault(rng.uniform(0.10, 0.35) * seconds, "kill_nats", "", 0.0))
    faults.append(PlannedFault(rng.uniform(0.65, 0.85) * seconds, "kill_nats", "", 0.0))
    faults.append(PlannedFault(rng.uniform(0.40, 0.60) * seconds, "crash_postgres", "", 0.0))
    faults.append(PlannedFault(rng.uniform(0.1, 0.8) * seconds, "nats_reset_peer", "", 3.0))
    faults.append(
        PlannedFault(
            rng.uniform(0.1, 0.7) * seconds, "handler_latency", rng.choice(targets.consumers), 8.0
        )
    )
    faults.append(
        PlannedFault(
            rng.uniform(0.1, 0.7) * seconds,
            "handler_blackhole",
            rng.choice(targets.consumers),
            6.0,
        )
    )
    faults.sort(key=lambda f: f.at)
    kinds = tuple(sorted({f.kind for f in faults}))
    return Schedule("ci", seed, seconds, events, tuple(faults), drain_timeout=180.0, kinds=kinds)


def soak_schedule(
    seed: int,
    targets: Targets,
    *,
    seconds: float = 600.0,
    events: int = 50_000,
    period: float = 5.0,
    quiet_share: float = 0.25,
) -> Schedule:
    """A random fault every ``period`` seconds; ``quiet_share`` of the periods have none."""
    rng = random.Random(f"soak-{seed}")
    periods = int(seconds // period)
    quiet = set(rng.sample(range(periods), round(periods * quiet_share)))
    kinds, weights = zip(*SOAK_WEIGHTS.items(), strict=True)
    faults = []
    for index in range(periods):
        if index in quiet:
            continue
        kind = rng.choices(kinds, weights)[0]
        at = index * period + rng.uniform(0, period * 0.5)
        target, duration = _aim(rng, kind, targets)
        faults.append(PlannedFault(at, kind, target, duration))
    return Schedule(
        "soak",
        seed,
        seconds,
        events,
        tuple(faults),
        drain_timeout=300.0,
        quiet_periods=len(quiet),
        periods=periods,
        kinds=tuple(sorted(SOAK_WEIGHTS)),
    )


def _aim(rng: random.Random, kind: str, targets: Targets) -> tuple[str, float]:
    """A target and a duration for one random fault."""
    if kind.startswith("kill_publisher"):
        return rng.choice(targets.publishers), 0.0
    if kind.startswith("kill_consumer"):
        return rng.choice(targets.consumers), 0.0
    if kind in ("kill_router", "kill_nats", "crash_postgres"):
        return "", 0.0
    if kind == "nats_reset_peer":
        return "", rng.uniform(1.0, 3.0)
    if kind.startswith("handler_"):
        return rng.choice(targets.consumers), rng.uniform(3.0, 8.0)
    if kind.startswith("pg_"):
        return rng.choice(targets.pg_roles), rng.uniform(2.0, 5.0)
    if kind.startswith("nats_"):
        return rng.choice(targets.nats_roles), rng.uniform(2.0, 5.0)
    return rng.choice(targets.links), rng.uniform(1.0, 4.0)  # link_down


class FaultSpecError(ValueError):
    """A ``--fault`` argument that names no usable fault; the message says which part."""


def _valid_targets(kind: str, targets: Targets) -> tuple[str, ...]:
    """The targets a fault kind takes (empty: it takes none)."""
    if kind.startswith("kill_publisher"):
        return targets.publishers
    if kind.startswith("kill_consumer") or kind.startswith("handler_"):
        return targets.consumers
    if kind.startswith("pg_"):
        return targets.pg_roles
    if kind in ("nats_slicer", "nats_bandwidth"):
        return targets.nats_roles
    if kind == "link_down":
        return targets.links
    return ()


def parse_fault(text: str, targets: Targets, seconds: float) -> PlannedFault:
    """``AT:KIND[:TARGET[:DURATION]]``, e.g. ``10:link_down:consumer-sea__from_vibespro_pg:40``."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 4:
        raise FaultSpecError(f"--fault {text!r}: expected AT:KIND[:TARGET[:DURATION]]")
    at_text, kind, target, duration_text = (*parts, "", "")[:4]
    try:
        at, duration = float(at_text), float(duration_text or 0)
    except ValueError:
        raise FaultSpecError(f"--fault {text!r}: AT and DURATION are seconds") from None
    if kind not in FAULT_KINDS:
        raise FaultSpecError(
            f"--fault {text!r}: unknown kind {kind!r} (known: {', '.join(FAULT_KINDS)})"
        )
    if not 0 <= at < seconds:
        raise FaultSpecError(f"--fault {text!r}: AT must be within the {seconds:.0f}s fault phase")
    allowed = _valid_targets(kind, targets)
    if allowed and target not in allowed:
        raise FaultSpecError(f"--fault {text!r}: {kind} needs a target among {', '.join(allowed)}")
    if not allowed and target:
        raise FaultSpecError(f"--fault {text!r}: {kind} takes no target")
    return PlannedFault(at, kind, target, duration)


def custom_schedule(
    seed: int, faults: list[PlannedFault], *, seconds: float = 60.0, events: int = 2000
) -> Schedule:
    """Exactly the faults given (``--fault``), for reproducing one situation."""
    ordered = tuple(sorted(faults, key=lambda f: f.at))
    kinds = tuple(sorted({f.kind for f in ordered}))
    return Schedule("custom", seed, seconds, events, ordered, drain_timeout=180.0, kinds=kinds)
