-- Exclusive ownership of the partitions of an `ordering: key` durable across consumer
-- replicas (issue 23, INFRA-005 §5.3, §7). Replicas talk only through these tables (and
-- JetStream); every time is the database's clock (clock_timestamp()).
--
-- partition_leases: one row per (durable, partition), kept forever (N rows per durable).
--   A lease is held by `owner` while NOT released AND expires_at > clock_timestamp().
--   released     the owner stopped its work and settled what it had: the next owner may
--                start at once
--   expired      (not released, expires_at passed) the owner died, lost the database, or
--                gave the partition up without settling: the next owner waits until
--                JetStream has made the old owner's unacked messages redeliverable
--   previous_*   the lease the current owner took over (NULL: the row was new), so the
--                new owner knows how it got the partition and from when to count ack_wait
CREATE TABLE IF NOT EXISTS partition_leases (
  durable TEXT NOT NULL,
  partition INT NOT NULL,
  owner TEXT NOT NULL,
  acquired_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  expires_at TIMESTAMPTZ NOT NULL,
  released BOOLEAN NOT NULL DEFAULT false,
  previous_owner TEXT,
  previous_expires_at TIMESTAMPTZ,
  previous_released BOOLEAN,
  PRIMARY KEY (durable, partition),
  CONSTRAINT chk_partition_leases_partition CHECK (partition >= 0)
);

-- The replicas of a durable that are alive: each one upserts its row at every renewal;
-- a member not seen within the lease ttl no longer counts toward the fair share.
CREATE TABLE IF NOT EXISTS partition_members (
  durable TEXT NOT NULL,
  owner TEXT NOT NULL,
  seen_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (durable, owner)
);
