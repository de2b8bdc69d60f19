-- Every index on inbox_messages is written twice per message: by the claim's insert and
-- by the update that marks the row processed (never a HOT update: status and the partial
-- index's processed_at change). idx_inbox_status (durable, status) served no query on
-- the hot path; the queries that filter by durable and status (the dlq-router's replay
-- settlement, operator counts) use the primary key (durable, message_id) instead.
-- Measured in the benchmark's statement profile (python -m bench --statements).
DROP INDEX IF EXISTS idx_inbox_status;
