-- Rows waiting behind a set-aside row leave the publisher's walk (issue 48).
--
-- A set-aside row (0008) holds back every later row of its aggregate until an operator
-- republishes it. Those rows stayed pending, so every claim walked them in seq order from
-- the oldest, probing idx_outbox_failing for each, before it reached a claimable row:
-- about 250 ms per claim with 50,000 rows behind one set-aside row.
--
--   waiting_behind  the seq of the set-aside row this row waits behind (the first one of
--                   its aggregate). Set by the publisher when it sets a row aside and by
--                   its sweep for rows committed later; cleared by `ferry outbox
--                   republish` in the transaction that makes the row pending again, and by
--                   the sweep when the row it names is no longer set aside. It only keeps
--                   rows out of the claim's walk: whether a row may be published is still
--                   decided by the claim's own check of the rows before it.
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS waiting_behind BIGINT;

-- The claim walks the pending rows not known to wait behind a set-aside row, in seq order.
-- It replaces idx_outbox_pending_seq (the same walk, every pending row): the write path
-- keeps one entry per pending row. The predicate is repeated word for word by the claim
-- (shared/adapters/outbox.py).
CREATE INDEX IF NOT EXISTS idx_outbox_claimable ON outbox_events (seq)
  WHERE published_at IS NULL AND waiting_behind IS NULL;
DROP INDEX IF EXISTS idx_outbox_pending_seq;

-- The waiting rows by the row they wait behind: the sweep's high-water mark per set-aside
-- row, the republish's release, the check for rows naming a row no longer set aside.
-- Empty while nothing is set aside.
CREATE INDEX IF NOT EXISTS idx_outbox_waiting ON outbox_events (waiting_behind, seq)
  WHERE waiting_behind IS NOT NULL;
