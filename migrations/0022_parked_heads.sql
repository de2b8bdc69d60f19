-- The ordered drainer finds its keys' heads without reading every parked row (issue 48).
--
-- Its rounds found the heads with DISTINCT ON (ordering_key) over every parked row of the
-- partition (every round; 100,000 events queued behind 1,000 held heads read each time),
-- and the partition's takeover listed its keys with DISTINCT over the same rows. Now:
--   next_attempt_at 'infinity'  an event waiting behind a held head (held_head, 0015) is
--                               due at 'infinity' until its key's head is itself again:
--                               when the head before it is released or discarded, the key's
--                               new head is made due then (a replayed head's followers
--                               one release at a time). The rounds walk idx_parked_due up
--                               to now: the due heads and the events behind retrying heads,
--                               never those behind held ones.
--   idx_parked_partition_key    a partition's keys, one probe each (a loose index scan):
--                               the takeover's blocked keys, and its check that no head
--                               waits at 'infinity' while not held.
-- The events already waiting behind a held head are set to 'infinity' here.
UPDATE parked_messages p SET next_attempt_at = 'infinity'
FROM parked_messages h
WHERE h.state = 'held' AND h.durable = p.durable AND h.ordering_key = p.ordering_key
  AND p.stream_seq > h.stream_seq AND p.state <> 'held' AND p.next_attempt_at <> 'infinity';

CREATE INDEX IF NOT EXISTS idx_parked_partition_key
  ON parked_messages (durable, partition, ordering_key);
