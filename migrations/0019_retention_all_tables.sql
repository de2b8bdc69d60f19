-- Retention of every table Ferry writes (issue 48): `ferry purge` deletes audit rows older
-- than their context's audit_retention, in batches found by age. The audit tables are
-- append-only and written in time order (`at` is clock_timestamp() at insert), so a BRIN
-- index finds the old rows without reading the table and costs the writers next to
-- nothing. durable_rewinds (durable, started_at), replay_jobs (created_at),
-- throttle_actions and pause_actions (durable, at) and partition_leases (its primary key)
-- already have the index their purge uses.
CREATE INDEX IF NOT EXISTS idx_outbox_actions_at_brin ON outbox_actions USING brin (at);
CREATE INDEX IF NOT EXISTS idx_dead_letter_actions_at_brin ON dead_letter_actions
  USING brin (at);
CREATE INDEX IF NOT EXISTS idx_dead_letter_edits_at_brin ON dead_letter_edits USING brin (at);
CREATE INDEX IF NOT EXISTS idx_parked_actions_at_brin ON parked_actions USING brin (at);
