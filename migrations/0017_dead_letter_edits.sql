-- Edit-and-retry of a dead letter (issue 45): an operator replaces the payload of a dead
-- letter and replays it (`ferry dlq edit`, the console). The edited envelope keeps the
-- message id (the inbox key), so the inbox claim still guards against a double apply;
-- the producer's outbox row keeps the original payload. This table is the link between
-- the two: both versions, who, when and why, one row per edit.
--
-- original_payload  the payload as it was before this edit (for a second edit, the first
--                   edit's payload)
-- edited_payload    the payload replayed
-- changed           the paths that differ (payload.title, payload.owner.id ...)
-- replay_attempt    the replay that carried the edited payload (dead_letters.replay_attempts)
--
-- The edit is also an action of dead_letter_actions ('edit', details: edit_id, attempt,
-- changed), so every list of actions (`ferry dlq show`, `ferry where`, the console) shows it.
CREATE TABLE IF NOT EXISTS dead_letter_edits (
  id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  durable TEXT NOT NULL,
  message_id UUID NOT NULL,
  event_type TEXT,
  event_version INT,
  replay_attempt INT NOT NULL,
  original_payload JSONB NOT NULL,
  edited_payload JSONB NOT NULL,
  changed TEXT[] NOT NULL,
  actor TEXT NOT NULL,
  reason TEXT NOT NULL,
  at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT chk_dead_letter_edits_reason CHECK (length(btrim(reason)) > 0)
);

CREATE INDEX IF NOT EXISTS idx_dead_letter_edits_key
  ON dead_letter_edits (durable, message_id, at);

ALTER TABLE dead_letter_actions DROP CONSTRAINT IF EXISTS chk_dead_letter_actions_action;
ALTER TABLE dead_letter_actions ADD CONSTRAINT chk_dead_letter_actions_action
  CHECK (action IN ('replay', 'park', 'discard', 'auto_replay', 'auto_park', 'edit'));
