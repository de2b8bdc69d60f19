"""How replicas share an ordered durable's partitions, in numbers: each one's fair share,
the order a replica reaches for free partitions, and how long a lease counts as ours
(the loop that uses them: :mod:`services.inbox_consumer.partitions`)."""

from __future__ import annotations

import math

#: Share of the ttl (at most :data:`FENCE_MARGIN_MAX` seconds) by which a lease counts as
#: lost locally before ``last renewal + ttl - hold``: room for the work to stop, for the
#: network and for JetStream's redelivery timer.
FENCE_MARGIN = 0.1
FENCE_MARGIN_MAX = 1.0


def fence_margin(ttl: float) -> float:
    """Seconds a lease of ``ttl`` counts as lost locally before it could still be used."""
    return min(ttl * FENCE_MARGIN, FENCE_MARGIN_MAX)


def lease_validity(ttl: float, hold: float) -> float:
    """How long after the start of a renewal a lease of ``ttl`` seconds counts as ours
    locally, when what its owner fetched takes up to ``hold`` seconds to become
    redeliverable after the owner stops (ack_wait plus the pull requests' lifetime); not
    positive: the lease is too short for the durable."""
    return ttl - hold - fence_margin(ttl)


def fair_share(partitions: int, members: int) -> int:
    """How many partitions one of ``members`` live replicas may hold."""
    return math.ceil(partitions / max(members, 1))


def preference(partitions: int, members: int, rank: int) -> list[int]:
    """Every partition, in the order the member of ``rank`` (0-based, among ``members``)
    reaches for them: its own stripe ``p ≡ rank (mod members)`` first, then the others
    from ``rank`` on. The stripes of the ranks are disjoint and cover every partition."""
    members = max(members, 1)
    return sorted(
        range(partitions),
        key=lambda p: ((p - rank) % members != 0, (p - rank) % partitions),
    )
