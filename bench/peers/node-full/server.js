// The hand-written "full" recipe: fastify + stripe-node + pg. Per Stripe webhook one
// transaction: the dedup insert on the event id, then (if new) the order marked paid,
// one invoice, one notification; 200 after the durable commit. A duplicate answers 200
// without the business write. Also a Shopify orders/create route for the hot-record run
// (the stock decremented in the same transaction). 2 workers through node's cluster.
//   PORT=8080 STRIPE_WEBHOOK_SECRET=… SHOPIFY_SECRET=… PGHOST=… node server.js
'use strict';
const cluster = require('node:cluster');
const crypto = require('node:crypto');

const WORKERS = Number(process.env.WORKERS || 2);
// Connections per worker: 2 workers x 16 = 32 PostgreSQL backends for 64 clients.
const POOL = Number(process.env.POOL || 16);

if (cluster.isPrimary) {
  for (let i = 0; i < WORKERS; i++) cluster.fork();
  cluster.on('exit', (w, code) => { if (code !== 0) { console.error(`worker ${w.process.pid} exited ${code}`); process.exit(1); } });
  process.on('SIGTERM', () => { for (const w of Object.values(cluster.workers)) w.kill('SIGTERM'); process.exit(0); });
} else {
  worker();
}

function worker() {
  const fastify = require('fastify')({ logger: false, bodyLimit: 1048576 });
  const Stripe = require('stripe');
  const { Pool } = require('pg');
  // constructEvent needs no API call; the key only satisfies the constructor.
  const stripe = new Stripe('sk_test_unused');
  const secret = process.env.STRIPE_WEBHOOK_SECRET;
  const shopifySecret = process.env.SHOPIFY_SECRET || '';
  const pool = new Pool({ max: POOL }); // PGHOST/PGPORT/PGUSER/PGDATABASE from the env

  // Keep the raw body: the signature is over the exact bytes.
  fastify.addContentTypeParser('application/json', { parseAs: 'buffer' }, (req, body, done) => done(null, body));

  const accepted = (id, duplicate) => ({ duplicate, event_id: id, status: 'accepted' });

  // One transaction; `work(client)` runs only for a new event.
  async function once(id, type, work) {
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      const r = await client.query('INSERT INTO events(id, type) VALUES ($1, $2) ON CONFLICT DO NOTHING', [id, type]);
      if (r.rowCount === 1) await work(client);
      await client.query('COMMIT');
      return r.rowCount === 0;
    } catch (e) {
      await client.query('ROLLBACK').catch(() => {});
      throw e;
    } finally {
      client.release();
    }
  }

  fastify.post('/webhooks/stripe/demo', async (req, reply) => {
    let event;
    try {
      event = stripe.webhooks.constructEvent(req.body, req.headers['stripe-signature'], secret);
    } catch (e) {
      return reply.code(400).send({ error: 'invalid signature' });
    }
    const duplicate = await once(event.id, event.type, async (db) => {
      if (event.type !== 'payment_intent.succeeded') return;
      const pi = event.data.object;
      const order = pi.metadata.order_id;
      // The order paid (created if Stripe reports it first), allowed from pending/failed.
      const paid = await db.query(
        `INSERT INTO orders(id, payment_status, currency, total_minor, paid_minor, loyalty_points)
         VALUES ($1, 'paid', upper($2), $3::bigint, $3::bigint, $3::bigint / 100)
         ON CONFLICT (id) DO UPDATE SET payment_status = 'paid', paid_minor = EXCLUDED.paid_minor,
           loyalty_points = EXCLUDED.loyalty_points, updated_at = now()
         WHERE orders.payment_status IN ('pending', 'failed')`,
        [order, pi.currency, pi.amount]);
      if (paid.rowCount === 0) return; // already paid: no second invoice
      await db.query('INSERT INTO invoices(id, order_id, amount_minor) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING',
        [`inv-${order}-1`, order, pi.amount]);
      await db.query(`INSERT INTO notifications(dedup_key, order_id, kind) VALUES ($1, $2, 'payment_received') ON CONFLICT DO NOTHING`,
        [`${order}#paid`, order]);
    });
    return accepted(event.id, duplicate);
  });

  // Shopify orders/create (hot-record run): HMAC-SHA256 of the raw body, base64.
  fastify.post('/webhooks/shopify/demo', async (req, reply) => {
    const mac = crypto.createHmac('sha256', shopifySecret).update(req.body).digest();
    const given = Buffer.from(String(req.headers['x-shopify-hmac-sha256'] || ''), 'base64');
    if (given.length !== mac.length || !crypto.timingSafeEqual(given, mac)) {
      return reply.code(401).send({ error: 'invalid signature' });
    }
    const id = String(req.headers['x-shopify-event-id']);
    const order = JSON.parse(req.body);
    const duplicate = await once(id, 'orders/create', async (db) => {
      await db.query(`INSERT INTO orders(id, currency, total_minor) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
        [String(order.id), order.currency, Math.round(Number(order.total_price) * 100)]);
      for (const item of order.line_items) {
        await db.query('UPDATE stock SET on_hand = on_hand - $2 WHERE sku = $1', [item.sku, item.quantity]);
      }
    });
    return accepted(id, duplicate);
  });

  fastify.listen({ port: Number(process.env.PORT || 8080), host: '127.0.0.1' }).catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
