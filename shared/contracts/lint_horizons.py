"""The facts the lint's rules compare settings against: how long a message can still come back.

:class:`PublisherTiming` bounds when the outbox-publisher can publish a row again; the
horizons bound how long JetStream redelivery and dead-letter replay can deliver a message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from shared.contracts.topology import DurableSpec, Topology, subject_matches
from shared.domain import policy
from shared.domain.policy import ROW_RETRY_CAP_SECONDS


class _HasTiming(Protocol):
    """What :meth:`PublisherTiming.of` reads of ``PublisherSettings`` (runtime layer)."""

    @property
    def publish_timeout(self) -> float: ...
    @property
    def retry_max(self) -> float: ...
    @property
    def poll_interval(self) -> float: ...


@dataclass(frozen=True, slots=True)
class PublisherTiming:
    """The outbox-publisher settings that bound when it can publish a row again."""

    publish_timeout: float
    retry_max: float
    poll_interval: float

    @classmethod
    def of(cls, settings: _HasTiming) -> PublisherTiming:
        """The timing a running publisher uses (its ``PublisherSettings``)."""
        return cls(settings.publish_timeout, settings.retry_max, settings.poll_interval)

    @classmethod
    def defaults(cls) -> PublisherTiming:
        """The timing of a publisher on default settings (what other roles and CI assume)."""
        return cls(policy.PUBLISH_TIMEOUT, policy.RETRY_MAX, policy.POLL_INTERVAL)

    def republish_horizon(self) -> float:
        """Longest time from a row's first publish to its re-publish.

        A row whose PubAck is lost (the message may be stored) is marked failed after
        ``publish_timeout`` with ``last_attempt_at`` = its claim's start; it is claimable
        again at most ``ROW_RETRY_CAP_SECONDS`` later, and a worker claims within
        ``retry_max`` (pause after a failed batch) plus ``poll_interval``. A crash before
        the mark releases the claim with the session, so it is re-claimed sooner.
        """
        return self.publish_timeout + ROW_RETRY_CAP_SECONDS + self.retry_max + self.poll_interval


def redelivery_horizon(durable: DurableSpec) -> float:
    """Longest time from a message's first delivery to its last redelivery by ``durable``.

    Every one of ``max_deliver`` attempts may run to ``ack_wait`` (or the handler timeout
    if longer, with heartbeats), and attempt n waits the n-th back-off step before the next.
    """
    attempt = max(durable.ack_wait, durable.handler.timeout)
    ladder = durable.backoff
    delays = sum(ladder[min(n, len(ladder) - 1)] for n in range(durable.max_deliver - 1))
    return durable.max_deliver * attempt + delays


def automatic_replay_span(durable: DurableSpec) -> float:
    """Sum of the dlq-replayer's longest waits before each automatic replay."""
    limits = durable.replay_limits
    return sum(
        min(limits.max_delay, limits.base_delay * 2.0**n) for n in range(limits.max_attempts)
    )


def replay_horizon(topology: Topology, durable: DurableSpec) -> float:
    """Longest time from a message's first delivery to the last delivery of a replay of it.

    A message is dead-lettered at most one redelivery horizon after it first arrives; an
    operator can replay its dead letter as long as the dead-letter stream keeps it, and the
    automatic replayer spaces its attempts by the back-off schedule (each replay delivered
    with the full redelivery ladder); the replay itself can then be redelivered.
    """
    redelivery = redelivery_horizon(durable)
    kept = max(
        (
            s.max_age
            for s in topology.dead_letter_streams
            if any(subject_matches(p, durable.dead_letter_subject) for p in s.subjects)
        ),
        default=0.0,
    )
    automatic = 0.0
    if durable.replay == "automatic":
        automatic = automatic_replay_span(durable) + durable.replay_limits.max_attempts * redelivery
    return redelivery + max(kept, automatic) + redelivery


def copy_horizons(topology: Topology, context: str) -> list[tuple[float, str]]:
    """(seconds, what) of every way a copy of an event can still reach ``context``."""
    streams = topology.streams_by_name()
    needs: list[tuple[float, str]] = []
    for durable_name, durable in sorted(topology.durables.items()):
        if durable.target != context:
            continue
        stream = streams[durable.stream]
        needs += [
            (stream.max_age, f"max_age of stream {stream.name} read by durable {durable_name}"),
            (redelivery_horizon(durable), f"redelivery horizon of durable {durable_name}"),
            (replay_horizon(topology, durable), f"replay horizon of durable {durable_name}"),
        ]
    return needs
