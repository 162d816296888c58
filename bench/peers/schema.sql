-- Tables shared by the hand-written peer recipes (bench/peers/*), loaded into the fresh
-- PostgreSQL that bench/compare.sh starts. The business tables mirror what einmal's
-- reference domain records for a Stripe payment (docs/domain.md): the order marked paid
-- (with its paid amount and loyalty points), one invoice `inv-{order}-1`, one
-- `payment_received` notification keyed on the effect `{order}#paid`. einmal keeps these
-- inside one order record; a hand-written recipe typically uses a table each.

-- Dedup: one row per provider event id, inserted first in each webhook's transaction.
CREATE TABLE events (
  id          text PRIMARY KEY,
  type        text NOT NULL,
  received_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE orders (
  id             text PRIMARY KEY,
  status         text NOT NULL DEFAULT 'open',
  payment_status text NOT NULL DEFAULT 'pending',
  currency       text,
  total_minor    bigint NOT NULL DEFAULT 0,
  paid_minor     bigint NOT NULL DEFAULT 0,
  loyalty_points bigint NOT NULL DEFAULT 0,
  updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE invoices (
  id           text PRIMARY KEY,
  order_id     text NOT NULL UNIQUE REFERENCES orders(id),
  amount_minor bigint NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now()
);

-- The customer-notification outbox; dedup_key = the effect that caused it.
CREATE TABLE notifications (
  dedup_key  text PRIMARY KEY,
  order_id   text NOT NULL REFERENCES orders(id),
  kind       text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);

-- Stock per SKU, for the hot-record run (Shopify orders/create of one SKU).
CREATE TABLE stock (
  sku     text PRIMARY KEY,
  on_hand bigint NOT NULL
);
