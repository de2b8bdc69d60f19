-- Replay jobs of the replay API's async mode (INFRA-005 §1.4, issue 26). The console
-- writes a job row and its `replay_job_requested` outbox row in ONE transaction in the
-- database of the context that hosts the replay lane (mediation: module_g); the handler
-- of that context (durable cg_replay) executes the job and records its progress here.
-- Every database has the table (migrations are the same everywhere); only the replay
-- lane's database holds rows.
--
--   id            the job id: the client's Idempotency-Key (a UUID, or uuid5 of the key),
--                 also the id of the outbox event that carries the job (its Nats-Msg-Id
--                 and inbox key: the inbox claim makes the job run once)
--   request       the request as normalised by the console; request_hash its sha256,
--                 so a second request under one id is recognised as the same or not
--   entries       the dead letters the job replays, resolved when it was accepted
--                 ([{"durable": ..., "message_id": ...}])
--   state         queued (accepted, not yet picked up) | running | done | failed
--   results       per entry: replayed, or refused with the reason
CREATE TABLE IF NOT EXISTS replay_jobs (
  id UUID PRIMARY KEY,
  idempotency_key TEXT NOT NULL,
  request JSONB NOT NULL,
  request_hash TEXT NOT NULL,
  entries JSONB NOT NULL,
  actor TEXT NOT NULL,
  reason TEXT NOT NULL,
  state TEXT NOT NULL DEFAULT 'queued',
  total INT NOT NULL,
  replayed INT NOT NULL DEFAULT 0,
  refused INT NOT NULL DEFAULT 0,
  results JSONB NOT NULL DEFAULT '[]'::jsonb,
  error TEXT,
  runs INT NOT NULL DEFAULT 0,
  created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  started_at TIMESTAMPTZ,
  finished_at TIMESTAMPTZ,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT chk_replay_jobs_state CHECK (state IN ('queued', 'running', 'done', 'failed')),
  CONSTRAINT chk_replay_jobs_counts CHECK (
    total >= 0 AND replayed >= 0 AND refused >= 0 AND replayed + refused <= total
  )
);

-- The console's job list: newest first.
CREATE INDEX IF NOT EXISTS idx_replay_jobs_created ON replay_jobs (created_at DESC);
