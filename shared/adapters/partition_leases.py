"""Partition leases on PostgreSQL (migrations/0010_partition_leases.sql): which consumer
replica owns which partition of an ``ordering: key`` durable.

Every statement is one round trip and reads the database's clock (``clock_timestamp()``),
never a replica's. The ownership loop that uses them is
``services/inbox_consumer/partitions.py``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from shared.adapters.postgres import Conn

# The renewal round: the member's heartbeat, the pruning of long-gone members (never our
# own row: the upsert touches it in the same statement), the conditional renewal of the
# leases we hold, and what the acquisition step needs to know — in one statement. The
# SELECT sees the snapshot from before the statement's own changes: our member row may be
# missing from `members` (the caller adds itself) and our leases show their old expiry.
_HEARTBEAT = """
WITH seen AS (
  INSERT INTO partition_members (durable, owner, seen_at) VALUES ($1, $2, clock_timestamp())
  ON CONFLICT (durable, owner) DO UPDATE SET seen_at = EXCLUDED.seen_at
  RETURNING owner
), pruned AS (
  DELETE FROM partition_members
  WHERE durable = $1 AND owner <> $2
    AND seen_at < clock_timestamp() - $5::float8 * interval '1 second'
  RETURNING owner
), renewed AS (
  UPDATE partition_leases SET expires_at = clock_timestamp() + $3::float8 * interval '1 second'
  WHERE durable = $1 AND owner = $2 AND partition = ANY($4::int[])
    AND NOT released AND expires_at > clock_timestamp()
  RETURNING partition
)
SELECT ARRAY(SELECT partition FROM renewed) AS renewed,
       ARRAY(SELECT owner FROM partition_members
             WHERE durable = $1
               AND seen_at > clock_timestamp() - $3::float8 * interval '1 second') AS members,
       (SELECT coalesce(jsonb_object_agg(partition, owner), '{}'::jsonb) FROM partition_leases
        WHERE durable = $1 AND NOT released AND expires_at > clock_timestamp()) AS taken,
       (SELECT extract(epoch FROM min(expires_at) - clock_timestamp())::float8
        FROM partition_leases
        WHERE durable = $1 AND owner <> $2 AND NOT released
          AND expires_at > clock_timestamp()) AS next_expiry
"""

# Take the partitions that are free: never leased, released, or expired. ON CONFLICT
# locks the row and re-checks the WHERE on its latest version, so of two replicas racing
# for one partition exactly one gets it. The row keeps what it replaced in previous_*.
_ACQUIRE = """
INSERT INTO partition_leases AS l (durable, partition, owner, acquired_at, expires_at)
SELECT $1, p, $2, clock_timestamp(), clock_timestamp() + $3::float8 * interval '1 second'
FROM unnest($4::int[]) AS p
ON CONFLICT (durable, partition) DO UPDATE
  SET owner = EXCLUDED.owner, acquired_at = EXCLUDED.acquired_at,
      expires_at = EXCLUDED.expires_at, released = false,
      previous_owner = l.owner, previous_expires_at = l.expires_at,
      previous_released = l.released
  WHERE l.released OR l.expires_at <= clock_timestamp()
RETURNING l.partition, l.previous_owner, l.previous_released,
          extract(epoch FROM clock_timestamp() - l.previous_expires_at)::float8 AS expired_for
"""

# Give a lease up. Clean (released): the work stopped and settled what it fetched, the
# next owner starts at once. Unclean: the lease expires $5 seconds from now (the time
# JetStream needs to make what we left unacked redeliverable; sooner if it expires sooner
# anyway), so that an expiry always means "what the owner held is redeliverable" (see
# services/inbox_consumer/partitions.py).
_RELEASE = """
UPDATE partition_leases
SET released = $4,
    expires_at = CASE WHEN $4 THEN expires_at
                 ELSE least(expires_at, clock_timestamp() + $5::float8 * interval '1 second')
                 END
WHERE durable = $1 AND partition = $2 AND owner = $3 AND NOT released
"""

_LEAVE = "DELETE FROM partition_members WHERE durable = $1 AND owner = $2"

_LEASES = """
SELECT partition, owner, acquired_at, expires_at, released,
       NOT released AND expires_at > clock_timestamp() AS held,
       previous_owner, previous_expires_at, previous_released
FROM partition_leases WHERE durable = $1 ORDER BY partition
"""


@dataclass(frozen=True, slots=True)
class Round:
    """What one heartbeat learnt."""

    #: The partitions whose lease was renewed (held by us, not released, not expired).
    renewed: frozenset[int]
    #: Live members (seen within the ttl), sorted, the caller included.
    members: tuple[str, ...]
    #: Partitions with a live lease, and their owner (ours included), before the renewal.
    taken: dict[int, str]
    #: Seconds until the earliest expiry of another owner's live lease (None: none).
    next_expiry: float | None = None


@dataclass(frozen=True, slots=True)
class Acquired:
    """A lease just taken, and how the partition was left by its previous owner."""

    partition: int
    #: None: the partition was never leased.
    previous_owner: str | None
    previous_released: bool | None
    #: Seconds since the previous lease expired (negative: it would still have run that
    #: long; only for a released lease). None for a new row.
    expired_for: float | None

    @property
    def clean(self) -> bool:
        """The previous owner released it (or there was none): nothing of its is in flight."""
        return self.previous_owner is None or bool(self.previous_released)


@dataclass(frozen=True, slots=True)
class Lease:
    """One row of ``partition_leases``, for tools and tests."""

    partition: int
    owner: str
    acquired_at: datetime
    expires_at: datetime
    released: bool
    #: Not released and not expired, by the database's clock.
    held: bool
    previous_owner: str | None
    previous_expires_at: datetime | None
    previous_released: bool | None


async def heartbeat(
    conn: Conn,
    *,
    durable: str,
    owner: str,
    ttl: float,
    held: Collection[int],
    forget_after: float,
) -> Round:
    """Record ``owner`` as a live member of ``durable``, renew its leases of ``held`` for
    ``ttl`` seconds, forget members not seen for ``forget_after`` seconds."""
    row = await conn.fetchrow(_HEARTBEAT, durable, owner, ttl, sorted(held), forget_after)
    assert row is not None
    taken = json.loads(row["taken"])
    return Round(
        renewed=frozenset(row["renewed"]),
        members=tuple(sorted({*row["members"], owner})),
        taken={int(partition): str(who) for partition, who in taken.items()},
        next_expiry=row["next_expiry"],
    )


async def acquire(
    conn: Conn, *, durable: str, owner: str, ttl: float, partitions: Sequence[int]
) -> list[Acquired]:
    """Take those of ``partitions`` that are free for ``ttl`` seconds; the ones taken."""
    rows = await conn.fetch(_ACQUIRE, durable, owner, ttl, list(partitions))
    return sorted(
        (
            Acquired(
                partition=row["partition"],
                previous_owner=row["previous_owner"],
                previous_released=row["previous_released"],
                expired_for=row["expired_for"],
            )
            for row in rows
        ),
        key=lambda acquired: acquired.partition,
    )


async def release(
    conn: Conn, *, durable: str, owner: str, partition: int, clean: bool, hold: float = 0.0
) -> bool:
    """Give the lease up (``clean``: released, else expiring ``hold`` seconds from now);
    False if it was not ours."""
    status = await conn.execute(_RELEASE, durable, partition, owner, clean, hold)
    return bool(status == "UPDATE 1")


async def leave(conn: Conn, *, durable: str, owner: str) -> None:
    """Remove ``owner`` from the live members at once (a clean stop)."""
    await conn.execute(_LEAVE, durable, owner)


async def leases(conn: Conn, durable: str) -> list[Lease]:
    """Every partition lease of ``durable``, by partition."""
    return [Lease(**dict(row)) for row in await conn.fetch(_LEASES, durable)]
