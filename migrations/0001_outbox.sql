-- Transactional outbox (SDS-047 §9, INV-022). Every SDS-047 column and constraint is
-- here, so any producer in any language can INSERT exactly those columns in its own
-- transaction and the row gets published.
--
-- Ferry's additions:
--   seq          commit-independent insertion order; claims walk it, and per-aggregate
--                order in the stream follows it (see services/outbox_publisher).
--   txid         the producing transaction (pg_current_xact_id()), the commit-order fence:
--                it tells which rows came from one transaction and lets an operator see a
--                long-open producer transaction holding rows back.
--   traceparent  W3C trace context of the producer's span, carried into NATS headers.
--   recorded_at  wall clock at INSERT (occurred_at may be set by the caller).
--   last_attempt_at  when the publisher last tried this row.
CREATE TABLE IF NOT EXISTS outbox_events (
  id UUID PRIMARY KEY,
  aggregate_type TEXT NOT NULL,
  aggregate_id TEXT NOT NULL,
  event_type TEXT NOT NULL,
  event_version INT NOT NULL DEFAULT 1,
  payload JSONB NOT NULL,
  occurred_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
  correlation_id UUID,
  causation_id UUID,
  published_at TIMESTAMPTZ,
  publish_attempts INT NOT NULL DEFAULT 0,
  publish_error TEXT,

  seq BIGINT GENERATED ALWAYS AS IDENTITY,
  txid xid8 NOT NULL DEFAULT pg_current_xact_id(),
  traceparent TEXT,
  tracestate TEXT,
  recorded_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  last_attempt_at TIMESTAMPTZ,

  CONSTRAINT chk_occurred_not_future CHECK (occurred_at <= NOW() + INTERVAL '1 minute'),
  -- The subject rule {namespace}.{snake_case}.v{n}: refuse at INSERT what could never be
  -- published, so a raw-SQL producer learns of its mistake in its own transaction.
  CONSTRAINT chk_event_type_snake_case CHECK (event_type ~ '^[a-z][a-z0-9]*(_[a-z0-9]+)*$'),
  CONSTRAINT chk_event_version_positive CHECK (event_version BETWEEN 1 AND 1000),
  CONSTRAINT chk_payload_object CHECK (jsonb_typeof(payload) = 'object'),
  CONSTRAINT uq_outbox_seq UNIQUE (seq)
);

CREATE INDEX IF NOT EXISTS idx_outbox_unpublished ON outbox_events (occurred_at)
  WHERE published_at IS NULL;
CREATE INDEX IF NOT EXISTS idx_outbox_correlation ON outbox_events (correlation_id);
-- The claim query walks unpublished rows in seq order ...
CREATE INDEX IF NOT EXISTS idx_outbox_pending_seq ON outbox_events (seq)
  WHERE published_at IS NULL;
-- ... and checks that no earlier row of the same aggregate is still pending.
CREATE INDEX IF NOT EXISTS idx_outbox_pending_aggregate
  ON outbox_events (aggregate_type, aggregate_id, seq) WHERE published_at IS NULL;

-- Wake the publisher as soon as a transaction with outbox rows commits (NOTIFY is
-- delivered at commit, never for a rolled-back transaction). One notification per
-- statement, not per row; the publisher still polls, because NOTIFY is a hint.
CREATE OR REPLACE FUNCTION ferry_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('ferry_outbox', '');
  RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS trg_outbox_notify ON outbox_events;
CREATE TRIGGER trg_outbox_notify AFTER INSERT ON outbox_events
  FOR EACH STATEMENT EXECUTE FUNCTION ferry_outbox_notify();
