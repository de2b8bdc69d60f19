-- Settled dead letters are purged after audit_retention, each with its dead-lettered inbox
-- row (issue 48).
--
-- A dead letter that was replayed or discarded changes no more; until now it and, for a
-- discarded one, the inbox row its consumer left 'failed' stayed for ever. `ferry purge`
-- now deletes a dead letter settled (its updated_at: when it was replayed or discarded)
-- more than its target context's audit_retention ago, and in the same statement that
-- message's inbox row if it is still 'failed' (a replayed one's is 'processed', the
-- inbox's own policy keeps it). An open dead letter (dead, held, replaying, parked) is
-- never deleted, however old.
--
--   idx_dead_letters_settled  the settled dead letters by when they were settled: the
--                             purge's batches and the oldest one's age, never the open ones.
--
-- The inbox backlog counts open dead letters now (idx_dead_letters_status), not the
-- dead-lettered inbox rows: idx_inbox_failed (0021) served only that count, and goes.
CREATE INDEX IF NOT EXISTS idx_dead_letters_settled ON dead_letters (updated_at)
  WHERE status IN ('replayed', 'discarded');
DROP INDEX IF EXISTS idx_inbox_failed;
