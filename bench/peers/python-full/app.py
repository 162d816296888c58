"""The hand-written "full" recipe in Python: FastAPI + asyncpg + stripe.

Per Stripe webhook one transaction: the dedup insert on the event id, then (if new) the
order marked paid, one invoice, one notification; 200 after the durable commit. A
duplicate answers 200 without the business write. Run with uvicorn, 2 workers:
    STRIPE_WEBHOOK_SECRET=… PGHOST=… uvicorn app:app --workers 2 --port 8080
"""
import os
from contextlib import asynccontextmanager

import asyncpg
import stripe
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

SECRET = os.environ["STRIPE_WEBHOOK_SECRET"]
POOL = int(os.environ.get("POOL", "16"))  # per worker: 2 x 16 backends for 64 clients

PAY_ORDER = """
INSERT INTO orders(id, payment_status, currency, total_minor, paid_minor, loyalty_points)
VALUES ($1, 'paid', upper($2), $3::bigint, $3::bigint, $3::bigint / 100)
ON CONFLICT (id) DO UPDATE SET payment_status = 'paid', paid_minor = EXCLUDED.paid_minor,
  loyalty_points = EXCLUDED.loyalty_points, updated_at = now()
WHERE orders.payment_status IN ('pending', 'failed')
"""


@asynccontextmanager
async def lifespan(app):
    # PGHOST/PGPORT/PGUSER/PGDATABASE from the environment.
    app.state.pool = await asyncpg.create_pool(min_size=POOL, max_size=POOL)
    yield
    await app.state.pool.close()


app = FastAPI(lifespan=lifespan)


@app.post("/webhooks/stripe/demo")
async def stripe_webhook(request: Request):
    payload = await request.body()  # the raw bytes: the signature is over them
    try:
        event = stripe.Webhook.construct_event(
            payload, request.headers.get("stripe-signature", ""), SECRET
        )
    except (ValueError, stripe.SignatureVerificationError):
        return JSONResponse({"error": "invalid signature"}, status_code=400)
    async with request.app.state.pool.acquire() as db:
        async with db.transaction():
            new = await db.execute(
                "INSERT INTO events(id, type) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                event.id, event.type,
            ) == "INSERT 0 1"
            if new and event.type == "payment_intent.succeeded":
                pi = event.data.object
                order = pi.metadata["order_id"]
                paid = await db.execute(PAY_ORDER, order, pi.currency, pi.amount)
                if paid == "INSERT 0 1":  # not already paid: one invoice, one notification
                    await db.execute(
                        "INSERT INTO invoices(id, order_id, amount_minor) VALUES ($1, $2, $3)"
                        " ON CONFLICT DO NOTHING",
                        f"inv-{order}-1", order, pi.amount,
                    )
                    await db.execute(
                        "INSERT INTO notifications(dedup_key, order_id, kind)"
                        " VALUES ($1, $2, 'payment_received') ON CONFLICT DO NOTHING",
                        f"{order}#paid", order,
                    )
    return {"duplicate": not new, "event_id": event.id, "status": "accepted"}
