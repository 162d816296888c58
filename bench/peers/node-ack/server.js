// The hand-written "ack-only" recipe: the node-full recipe without the business write.
// Per Stripe webhook: verify with stripe-node on the raw body, one durable
// `INSERT INTO events … ON CONFLICT DO NOTHING` (autocommit), 200. 2 cluster workers.
//   PORT=8080 STRIPE_WEBHOOK_SECRET=… PGHOST=… node server.js
'use strict';
const cluster = require('node:cluster');

const WORKERS = Number(process.env.WORKERS || 2);
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
  const stripe = new Stripe('sk_test_unused'); // constructEvent makes no API call
  const secret = process.env.STRIPE_WEBHOOK_SECRET;
  const pool = new Pool({ max: POOL });

  // Keep the raw body: the signature is over the exact bytes.
  fastify.addContentTypeParser('application/json', { parseAs: 'buffer' }, (req, body, done) => done(null, body));

  fastify.post('/webhooks/stripe/demo', async (req, reply) => {
    let event;
    try {
      event = stripe.webhooks.constructEvent(req.body, req.headers['stripe-signature'], secret);
    } catch (e) {
      return reply.code(400).send({ error: 'invalid signature' });
    }
    // A single statement commits on its own: no BEGIN/COMMIT round trips needed.
    const r = await pool.query('INSERT INTO events(id, type) VALUES ($1, $2) ON CONFLICT DO NOTHING', [event.id, event.type]);
    return { duplicate: r.rowCount === 0, event_id: event.id, status: 'accepted' };
  });

  fastify.listen({ port: Number(process.env.PORT || 8080), host: '127.0.0.1' }).catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
