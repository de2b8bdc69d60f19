-- Sequenced parking for durables with `ordering: key` (issue 23, INFRA-005 §5.3).
--
-- A key is blocked while it has parked rows. The row with the lowest stream_seq is the
-- key's head; the others wait behind it in stream order. A message of a blocked key is
-- parked here (in the transaction that decides so) and only then acked to JetStream, so
-- it is never lost; the consumer releases a key's parked messages one at a time, in order.
--
--   state  queued    waits behind the head (or is the next to go: next_attempt_at)
--          retrying  the head failed and is retried at next_attempt_at (attempts so far)
--          held      the head was dead-lettered under `on_dead_letter: hold`: the key waits
--                    for an operator to replay it (`ferry dlq replay`) or discard it
--                    (`ferry parked discard`)
CREATE TABLE IF NOT EXISTS parked_messages (
  durable TEXT NOT NULL,
  ordering_key TEXT NOT NULL,
  stream_seq BIGINT NOT NULL,
  message_id UUID NOT NULL,
  -- The stream sequence of its latest delivery (a replay of a held head arrives at a new
  -- one; the row keeps its place by stream_seq).
  delivered_seq BIGINT NOT NULL,
  partition INT NOT NULL DEFAULT 0,
  subject TEXT NOT NULL,
  headers JSONB NOT NULL DEFAULT '{}'::jsonb,
  data BYTEA NOT NULL,
  state TEXT NOT NULL DEFAULT 'queued',
  attempts INT NOT NULL DEFAULT 0,
  next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  reason TEXT,
  parked_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (durable, message_id),
  CONSTRAINT chk_parked_state CHECK (state IN ('queued', 'retrying', 'held'))
);

CREATE INDEX IF NOT EXISTS idx_parked_key ON parked_messages (durable, ordering_key, stream_seq);
CREATE INDEX IF NOT EXISTS idx_parked_due ON parked_messages (durable, partition, next_attempt_at)
  WHERE state <> 'held';

-- Operators' actions on parked keys (discard of a held head): who, when, why, what.
CREATE TABLE IF NOT EXISTS parked_actions (
  id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  durable TEXT NOT NULL,
  ordering_key TEXT NOT NULL,
  message_id UUID NOT NULL,
  action TEXT NOT NULL,
  actor TEXT NOT NULL,
  reason TEXT NOT NULL,
  at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
