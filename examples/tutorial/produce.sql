-- Place an order from plain SQL: the order row and the outbox row in one transaction.
--   psql "$SHOP_DSN" -v customer=c-2 -v amount=1500 -f produce.sql
-- (prints the event id). No Ferry code runs here: the outbox table's constraints check the
-- row, and the publisher takes it from there. The payload must fit the manifest's schema;
-- the table cannot check that (the consumer would dead-letter it as SCHEMA_INVALID).
BEGIN;
CREATE TABLE IF NOT EXISTS orders (
  order_id TEXT PRIMARY KEY, customer TEXT NOT NULL, amount_cents BIGINT NOT NULL,
  currency TEXT NOT NULL, placed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
WITH placed AS (
  INSERT INTO orders (order_id, customer, amount_cents, currency)
  VALUES ('o-' || substr(md5(gen_random_uuid()::text), 1, 12), :'customer', :amount, 'EUR')
  RETURNING order_id, customer, amount_cents, currency
)
INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, payload)
SELECT gen_random_uuid(), 'order', order_id, 'order_placed', 1,
       jsonb_build_object('order_id', order_id, 'customer', customer,
                          'amount_cents', amount_cents, 'currency', currency)
FROM placed
RETURNING id;
COMMIT;
