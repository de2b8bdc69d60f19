-- The parked summary (the console overview, the consumer's metrics, `ferry parked`)
-- without reading every parked event (issue 48).
--
-- It counted keys, events and held heads and found the oldest with one pass over every
-- parked row of the durable: a sequential scan of 100,000 events behind 1,000 held heads,
-- at every overview and every metrics refresh. Now each figure has its own path:
--   keys    a loose scan of idx_parked_key, one probe per key;
--   events  idx_parked_key, index only (the events waiting are what it counts);
--   held    idx_parked_held, the held heads only;
--   oldest  idx_parked_age, one probe.
-- Both indexes are written when an event is parked, never on the consumer's path of an
-- unblocked key.
CREATE INDEX IF NOT EXISTS idx_parked_held ON parked_messages (durable) WHERE state = 'held';
CREATE INDEX IF NOT EXISTS idx_parked_age ON parked_messages (durable, parked_at);
