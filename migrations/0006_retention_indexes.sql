-- Retention (ferry purge) finds rows by age: published outbox rows by published_at,
-- processed inbox rows by processed_at. Rows are written in roughly that order, so a BRIN
-- index (a summary per range of pages) finds the old ones without reading the table, and
-- costs the hot path next to nothing: a new page range is not summarized until VACUUM
-- reaches it, and since PostgreSQL 16 an update of a BRIN-only column can stay HOT.
CREATE INDEX IF NOT EXISTS idx_outbox_published_brin ON outbox_events
  USING brin (published_at);
CREATE INDEX IF NOT EXISTS idx_inbox_processed_brin ON inbox_messages
  USING brin (processed_at);
