-- Producers NOTIFY only while no publisher watches the outbox by itself (issue 29).
--
-- A NOTIFY is not free: at commit, PostgreSQL takes one lock for the whole cluster and
-- holds it until the commit is flushed, so every notifying commit of every database of
-- the cluster waits for the one before it, and group commit is lost. Measured on the
-- project's VM (one-row state+outbox transactions over 16 connections): 2,600 txn/s and
-- 330 us of server CPU each with the NOTIFY, 5,000 txn/s and 175 us without.
--
-- Under steady traffic the publisher claims every few milliseconds anyway, so the
-- NOTIFYs tell it nothing. It then "watches": it writes a row here promising to claim at
-- least every `period_ms` by itself until `watch_until`, and renews it while rows keep
-- coming. The trigger below sends the NOTIFY only when no such promise holds, so a quiet
-- outbox is still woken at once by its first commit.
--
-- The check runs when the INSERT does, not at commit. A transaction that inserts while a
-- promise holds and commits after the publisher stopped watching is found by the claims
-- the publisher keeps making for a while after each watch (its period, then doubling up
-- to FERRY_POLL_INTERVAL) or, at the latest, by its poll every FERRY_POLL_INTERVAL.
--
-- UNLOGGED: a promise means nothing after a crash; the table then comes back empty and
-- every commit notifies. Readable by every role (the trigger runs as the producer); it
-- holds publisher instance names and times only. Written by outbox-publisher roles.
CREATE UNLOGGED TABLE IF NOT EXISTS outbox_watch (
  publisher TEXT PRIMARY KEY,
  watch_until TIMESTAMPTZ NOT NULL,
  period_ms INT NOT NULL,
  since TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT chk_outbox_watch_period CHECK (period_ms BETWEEN 1 AND 60000)
);
GRANT SELECT ON outbox_watch TO PUBLIC;

-- The table's schema is written into the function, so the trigger finds it whatever the
-- producer's search_path (a producer may name outbox_events with its schema).
DO $do$
BEGIN
  EXECUTE format($fn$
    CREATE OR REPLACE FUNCTION ferry_outbox_notify() RETURNS trigger
    LANGUAGE plpgsql AS $body$
    BEGIN
      IF NOT EXISTS (
        SELECT 1 FROM %I.outbox_watch WHERE watch_until > pg_catalog.clock_timestamp()
      ) THEN
        PERFORM pg_catalog.pg_notify('ferry_outbox', '');
      END IF;
      RETURN NULL;
    END;
    $body$
  $fn$, current_schema());
END
$do$;
