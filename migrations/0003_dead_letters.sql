-- Dead letters (REQ-053, REQ-059, EVT-047-002, INFRA-005 §4) and operator actions.
--
-- One row per (durable, message_id), in the database of the durable's target context
-- (beside its inbox, so recording a dead letter and marking the inbox row failed are
-- one transaction). Whichever path dead-letters a message — the consumer's direct path
-- (422, malformed, digest mismatch) or the dlq-router (MAX_DELIVERIES / MSG_TERMINATED
-- advisories) — writes this row; a second path finds it and does nothing.
--
-- status:
--   dead       recorded; the replayer will replay it when next_replay_at passes
--              (automatic policy, retryable reason)
--   held       recorded; waits for an operator (operator policy, or not retryable)
--   replaying  a replay is published; the consumer's outcome decides what comes next
--   replayed   the replay was processed (terminal)
--   parked     automatic replays hit their cap; only an operator can replay it
--   discarded  an operator gave up on it, with a reason (terminal)
CREATE TABLE IF NOT EXISTS dead_letters (
  durable TEXT NOT NULL,
  message_id UUID NOT NULL,
  stream TEXT NOT NULL,
  stream_seq BIGINT,
  original_subject TEXT NOT NULL,
  event_type TEXT,
  event_version INT,
  reason_code TEXT NOT NULL,
  last_error TEXT NOT NULL DEFAULT '',
  attempts INT NOT NULL DEFAULT 0,
  -- The dead-letter record as published on the dead-letter subject (full document).
  record JSONB NOT NULL,
  dlq_subject TEXT NOT NULL,
  -- How it got here: 'consumer' (direct) or 'advisory:max_deliveries' / 'advisory:terminated'.
  source TEXT NOT NULL,
  traceparent TEXT,
  first_dead_lettered_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  dead_lettered_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  -- How many times this message was dead-lettered (1 + failed replays).
  generation INT NOT NULL DEFAULT 1,

  status TEXT NOT NULL,
  replay_attempts INT NOT NULL DEFAULT 0,
  next_replay_at TIMESTAMPTZ,
  last_replay_at TIMESTAMPTZ,
  -- Set when the replay's PubAck came back; NULL while 'replaying' means not confirmed.
  replay_published_at TIMESTAMPTZ,
  replayed_at TIMESTAMPTZ,
  replay_history JSONB NOT NULL DEFAULT '[]'::jsonb,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),

  PRIMARY KEY (durable, message_id),
  CONSTRAINT chk_dead_letters_status
    CHECK (status IN ('dead', 'held', 'replaying', 'replayed', 'parked', 'discarded'))
);

CREATE INDEX IF NOT EXISTS idx_dead_letters_due ON dead_letters (next_replay_at)
  WHERE status = 'dead';
CREATE INDEX IF NOT EXISTS idx_dead_letters_status ON dead_letters (durable, status);
CREATE INDEX IF NOT EXISTS idx_dead_letters_time ON dead_letters (dead_lettered_at);

-- Every operator (and replayer) action on a dead letter: who, when, why, what.
CREATE TABLE IF NOT EXISTS dead_letter_actions (
  id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  durable TEXT NOT NULL,
  message_id UUID NOT NULL,
  action TEXT NOT NULL,
  actor TEXT NOT NULL,
  reason TEXT NOT NULL,
  at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  details JSONB NOT NULL DEFAULT '{}'::jsonb,
  CONSTRAINT chk_dead_letter_actions_action
    CHECK (action IN ('replay', 'park', 'discard', 'auto_replay', 'auto_park')),
  CONSTRAINT chk_dead_letter_actions_reason CHECK (length(btrim(reason)) > 0)
);

CREATE INDEX IF NOT EXISTS idx_dead_letter_actions_key
  ON dead_letter_actions (durable, message_id, at);
