-- Operator pauses of a durable (`ferry durable pause|resume`, the console; issue 45), in
-- the database of the durable's target context. The pause itself is JetStream's: every
-- consumer of the durable (each partition's, for an ordered durable) is paused until a time
-- (`pause_until` in its config), so nothing is delivered, redelivered or counted as a
-- delivery while it lasts; messages keep arriving in the stream. This table is the audit:
-- who paused or resumed which durable, when, until when and why. The pause in force is
-- JetStream's; the latest row says who set it.
CREATE TABLE IF NOT EXISTS pause_actions (
  id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  durable TEXT NOT NULL,
  action TEXT NOT NULL,
  -- pause: the moment JetStream resumes on its own (far future: until resumed).
  until TIMESTAMPTZ,
  actor TEXT NOT NULL,
  reason TEXT NOT NULL,
  at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT chk_pause_actions_action CHECK (action IN ('pause', 'resume')),
  CONSTRAINT chk_pause_actions_until CHECK ((action = 'pause') = (until IS NOT NULL)),
  CONSTRAINT chk_pause_actions_reason CHECK (length(btrim(reason)) > 0)
);

CREATE INDEX IF NOT EXISTS idx_pause_actions_durable ON pause_actions (durable, at);

-- Each live consumer process reports its circuit breaker's state with its heartbeat in
-- throttle_members (the durable's live processes), so the console can show it.
ALTER TABLE throttle_members ADD COLUMN IF NOT EXISTS circuit TEXT;
ALTER TABLE throttle_members ADD COLUMN IF NOT EXISTS circuit_since TIMESTAMPTZ;
