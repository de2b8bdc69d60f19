-- Outbox rows that cannot be published are set aside (issue 22), and operators' actions on
-- them are audited.
--
--   set_aside_at      when the publisher gave up on the row: its payload cannot be built
--                     into a message, the message is over the size JetStream accepts, or
--                     it was refused FERRY_MAX_PUBLISH_ATTEMPTS times. A set-aside row is
--                     never claimed; the later rows of its aggregate wait behind it (order
--                     holds) until an operator republishes it (`ferry outbox republish`).
--   set_aside_reason  the reason code: PAYLOAD_INVALID, MESSAGE_TOO_LARGE, PUBLISH_REFUSED.
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS set_aside_at TIMESTAMPTZ;
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS set_aside_reason TEXT;

-- The claim excludes rows behind a failing (backing-off) or set-aside row of their
-- aggregate. Such rows are few (only an aggregate's head is ever attempted), so this
-- index is small and finds them without reading the pending rows. The predicate is
-- repeated word for word in the queries that use it (shared/adapters/outbox.py).
CREATE INDEX IF NOT EXISTS idx_outbox_failing
  ON outbox_events (aggregate_type, aggregate_id, seq)
  WHERE published_at IS NULL AND (publish_attempts <> 0 OR set_aside_at IS NOT NULL);

-- Every set-aside (by the publisher) and republish (by an operator): who, when, why, what.
CREATE TABLE IF NOT EXISTS outbox_actions (
  id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  event_id UUID NOT NULL,
  seq BIGINT NOT NULL,
  action TEXT NOT NULL,
  actor TEXT NOT NULL,
  reason TEXT NOT NULL,
  at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  details JSONB NOT NULL DEFAULT '{}'::jsonb,
  CONSTRAINT chk_outbox_actions_action CHECK (action IN ('set_aside', 'republish')),
  CONSTRAINT chk_outbox_actions_reason CHECK (length(btrim(reason)) > 0)
);

CREATE INDEX IF NOT EXISTS idx_outbox_actions_event ON outbox_actions (event_id, at);
