-- Rewinds of one durable (`ferry durable rewind`, shared/ops/rewind.py, issue 26): a range
-- of the durable's stream re-delivered to it alone, through its replay subject.
--
-- One row per rewind, in the database of the durable's target context (beside its inbox,
-- which makes the re-delivery safe). Written when the rewind starts (finished_at NULL,
-- outcome 'running') and completed when it ends: a rewind that was interrupted stays
-- visible as unfinished.
--
-- range asked:   since / from_seq (one of them), until / until_seq (either, or none)
-- first/last_seq the first and last stream sequences selected (NULL: nothing selected)
-- stop_seq       the stream's last sequence when the rewind started (or until_seq): the
--                rewind never reads past it
-- selected       messages of the range the durable's filters take
-- published      copies published on the replay subject (0 for a dry run)
-- outcome        running | done | failed | interrupted
CREATE TABLE IF NOT EXISTS durable_rewinds (
  id UUID PRIMARY KEY,
  durable TEXT NOT NULL,
  stream TEXT NOT NULL,
  since TIMESTAMPTZ,
  from_seq BIGINT,
  until TIMESTAMPTZ,
  until_seq BIGINT,
  stop_seq BIGINT,
  first_seq BIGINT,
  last_seq BIGINT,
  selected BIGINT NOT NULL DEFAULT 0,
  published BIGINT NOT NULL DEFAULT 0,
  skipped BIGINT NOT NULL DEFAULT 0,
  by_subject JSONB NOT NULL DEFAULT '{}'::jsonb,
  dry_run BOOLEAN NOT NULL,
  actor TEXT NOT NULL,
  reason TEXT NOT NULL,
  started_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  finished_at TIMESTAMPTZ,
  outcome TEXT NOT NULL DEFAULT 'running',
  error TEXT,
  CONSTRAINT chk_durable_rewinds_outcome
    CHECK (outcome IN ('running', 'done', 'failed', 'interrupted')),
  CONSTRAINT chk_durable_rewinds_reason CHECK (length(btrim(reason)) > 0),
  CONSTRAINT chk_durable_rewinds_start CHECK ((since IS NULL) <> (from_seq IS NULL))
);

CREATE INDEX IF NOT EXISTS idx_durable_rewinds_durable ON durable_rewinds (durable, started_at);
