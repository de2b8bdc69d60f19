-- Inbox with status (SDS-047 §9, REQ-051, INV-021).
--
-- The key is (durable, message_id), not message_id alone: a message consumed by two
-- durables in one database must be processed once by each. A row with a final status
-- ('processed'; 'failed' = dead-lettered, REQ-053) makes a redelivery a duplicate; a row
-- without one ('received', 'processing', 'retrying') makes it a retry that must be processed.
-- lease_owner/lease_until serialise concurrent deliveries of one id across replicas.
CREATE TABLE IF NOT EXISTS inbox_messages (
  message_id UUID NOT NULL,
  durable TEXT NOT NULL,
  subject TEXT NOT NULL,
  received_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
  processed_at TIMESTAMPTZ,
  attempts INT NOT NULL DEFAULT 0,
  last_error TEXT,

  status TEXT NOT NULL DEFAULT 'received',
  lease_owner TEXT,
  lease_until TIMESTAMPTZ,
  event_type TEXT,
  event_version INT,
  occurred_at TIMESTAMPTZ,
  stream_seq BIGINT,
  handler_status INT,
  reason_code TEXT,
  duplicates INT NOT NULL DEFAULT 0,
  retry_history JSONB NOT NULL DEFAULT '[]'::jsonb,
  dlq_metadata JSONB,
  traceparent TEXT,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),

  PRIMARY KEY (durable, message_id),
  CONSTRAINT chk_inbox_processed_after_received
    CHECK (processed_at IS NULL OR processed_at >= received_at),
  CONSTRAINT chk_inbox_status
    CHECK (status IN ('received', 'processing', 'retrying', 'processed', 'failed'))
);

CREATE INDEX IF NOT EXISTS idx_inbox_unprocessed ON inbox_messages (received_at)
  WHERE processed_at IS NULL;
CREATE INDEX IF NOT EXISTS idx_inbox_message_id ON inbox_messages (message_id);
CREATE INDEX IF NOT EXISTS idx_inbox_status ON inbox_messages (durable, status);
