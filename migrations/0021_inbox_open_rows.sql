-- The inbox's unfinished rows, found without reading the year behind them (issue 48).
--
-- idx_inbox_unprocessed (received_at) WHERE processed_at IS NULL held the dead-lettered
-- rows too (status 'failed' has no processed_at, and they are never purged: their dead
-- letter governs them), so every backlog count read a year of dead letters heap row by
-- heap row (6.5 s per console overview at 200,000 dead letters), and nothing served the
-- dlq-router's sweep (status IN received/processing/retrying, every 15 s): it read the
-- whole inbox. In its place:
--   idx_inbox_open    the rows still in play, by durable in the order the sweep takes
--                     them: the backlog, the retrying count and the sweep read only them;
--   idx_inbox_failed  the dead-lettered rows by durable: their count, index only.
-- The write path pays what it paid: one entry per claimed row in idx_inbox_open instead
-- of idx_inbox_unprocessed, and one in idx_inbox_failed per dead letter.
CREATE INDEX IF NOT EXISTS idx_inbox_open ON inbox_messages (durable, updated_at)
  WHERE status IN ('received', 'processing', 'retrying');
CREATE INDEX IF NOT EXISTS idx_inbox_failed ON inbox_messages (durable)
  WHERE status = 'failed';
DROP INDEX IF EXISTS idx_inbox_unprocessed;
