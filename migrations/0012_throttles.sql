-- Operator overrides of a durable's processing rate limit (`ferry durable throttle`,
-- shared/ops/throttle.py, INFRA-005 §7.3, issue 26), in the database of the durable's
-- target context. The topology's `throttle:` is the default; a row here replaces it while
-- it exists, and the durable's running consumers pick it up within a few seconds (they
-- poll it: FERRY_THROTTLE_POLL_INTERVAL). Clearing deletes the row: the topology's value
-- is in force again. A limit is the durable's, shared by its live consumer processes.
--
-- throttle_overrides: one row per overridden durable.
--   rate   messages per second; NULL = no limit (the topology's throttle lifted)
--   burst  tokens the bucket holds; NULL = one second's worth of the rate
CREATE TABLE IF NOT EXISTS throttle_overrides (
  durable TEXT PRIMARY KEY,
  rate DOUBLE PRECISION,
  burst INT,
  actor TEXT NOT NULL,
  reason TEXT NOT NULL,
  set_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT chk_throttle_overrides_rate CHECK (rate IS NULL OR (rate > 0 AND rate <= 100000)),
  CONSTRAINT chk_throttle_overrides_burst CHECK (burst IS NULL OR (burst >= 1 AND burst <= 100000)),
  CONSTRAINT chk_throttle_overrides_reason CHECK (length(btrim(reason)) > 0)
);

-- The live consumer processes of each durable: each one upserts its row every poll, so
-- the durable's limit is shared among the processes seen lately (a durable's rate holds
-- whatever its replica count, KEDA's scaling included). Rows of dead processes age out.
CREATE TABLE IF NOT EXISTS throttle_members (
  durable TEXT NOT NULL,
  owner TEXT NOT NULL,
  seen_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (durable, owner)
);

-- Every set and clear, kept: who, when, why, and the limit set (the audit).
CREATE TABLE IF NOT EXISTS throttle_actions (
  id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  durable TEXT NOT NULL,
  action TEXT NOT NULL,
  rate DOUBLE PRECISION,
  burst INT,
  actor TEXT NOT NULL,
  reason TEXT NOT NULL,
  at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT chk_throttle_actions_action CHECK (action IN ('set', 'clear')),
  CONSTRAINT chk_throttle_actions_reason CHECK (length(btrim(reason)) > 0)
);

CREATE INDEX IF NOT EXISTS idx_throttle_actions_durable ON throttle_actions (durable, at);
