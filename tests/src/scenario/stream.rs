//! Yesterday's stream: a generated day of mixed Stripe/Shopify traffic (from a seeded
//! PRNG) with its expected outcome, computed from the documented rules.

use std::collections::BTreeMap;

use einmal::domain::reference::{
    order_key, sku_key, Invoice, LineItem, Notification, NotificationKind, Order, OrderStatus,
    Payment, PaymentStatus, Refund, Shipment, Sku, StockLine,
};
use einmal::domain::state::StateKey;
use serde_json::{json, Value};

use super::{
    charge_refunded, checkout, fulfillment, order_body, orders_cancelled, orders_create,
    orders_paid, orders_updated, paystack_charge, pi_failed, pi_succeeded, razorpay_payment,
    razorpay_refund, refund_created, restock_only_refund, shopify_event, shopify_refund,
    stripe_event, utc, worldline_event, Event, TENANT,
};
use super::{check_invariants, Backend, Subject};

/// A seeded PRNG (no external crate): xorshift64*.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

// ---------------------------------------------------------------------------
// Yesterday's stream: a generated day of traffic and its expected outcome

pub const STREAM_SKUS: [(&str, i64); 4] = [
    ("SKU-A", 1990),
    ("SKU-B", 2990),
    ("SKU-C", 4990),
    ("SKU-D", 990),
];
pub const STREAM_SEED_STOCK: i64 = 100;

pub struct Stream {
    /// In causal (clean) order: every prerequisite before what needs it.
    pub events: Vec<Event>,
    /// The expected final data of every order (key = order id).
    pub orders: BTreeMap<String, Order>,
    /// The expected final `on_hand` per SKU.
    pub on_hand: BTreeMap<String, i64>,
}

impl Stream {
    pub fn seeds(&self) -> Vec<(&'static str, i64)> {
        STREAM_SKUS
            .iter()
            .map(|(s, _)| (*s, STREAM_SEED_STOCK))
            .collect()
    }

    pub fn state_keys(&self) -> Vec<StateKey> {
        let mut keys: Vec<StateKey> = self.orders.keys().map(|id| order_key(TENANT, id)).collect();
        keys.extend(STREAM_SKUS.iter().map(|(s, _)| sku_key(TENANT, s)));
        keys
    }

    /// The expected business state (`data` per record pk).
    pub fn expected_data(&self) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        for (id, o) in &self.orders {
            out.insert(order_key(TENANT, id).pk(), serde_json::to_value(o).unwrap());
        }
        for (sku, on_hand) in &self.on_hand {
            out.insert(
                sku_key(TENANT, sku).pk(),
                serde_json::to_value(Sku {
                    sku: sku.clone(),
                    on_hand: *on_hand,
                })
                .unwrap(),
            );
        }
        out
    }
}

/// Nine Shopify orders (some paid through Stripe, Shopify or both; with payment
/// failures, 12–18 updates, fulfillments, Stripe and Shopify refunds, cancellations),
/// one Stripe-only order and three paid through Razorpay, Worldline and Paystack; the expected outcome is computed from the documented
/// rules, independently of the processor.
pub fn yesterday(seed: u64) -> Stream {
    let mut rng = Rng::new(seed);
    let mut timed: Vec<(i64, Event)> = Vec::new();
    let mut orders = BTreeMap::new();
    let mut on_hand: BTreeMap<String, i64> = STREAM_SKUS
        .iter()
        .map(|(s, _)| (s.to_string(), STREAM_SEED_STOCK))
        .collect();
    let day = 1_764_547_200; // 2025-12-01T00:00:00Z

    for k in 0..9u64 {
        let id = 3001 + k;
        let ids = id.to_string();
        let keys = einmal::domain::reference::EffectKeys::new(TENANT, &ids);
        let start = day + k as i64 * 3_000;
        // Line items: 1–3 distinct SKUs, 1–3 units each.
        let mut skus: Vec<(&str, i64)> = STREAM_SKUS.to_vec();
        rng.shuffle(&mut skus);
        let n_lines = rng.range(1, 3) as usize;
        let lines: Vec<(&str, i64)> = skus[..n_lines]
            .iter()
            .map(|(s, _)| (*s, rng.range(1, 3)))
            .collect();
        let total: i64 = lines
            .iter()
            .map(|(s, q)| q * STREAM_SKUS.iter().find(|(x, _)| x == s).unwrap().1)
            .sum();
        let pays = k != 8;
        let paid_at_create = k % 4 == 1;

        let mut o = Order::new(&ids);
        o.currency = Some("EUR".into());
        o.total_minor = total;
        o.shopify_created = true;
        let mut stock: Vec<StockLine> = lines
            .iter()
            .map(|(s, q)| StockLine {
                sku: s.to_string(),
                quantity: *q,
            })
            .collect();
        stock.sort_by(|a, b| a.sku.cmp(&b.sku));
        o.stock_reserved = stock;
        let as_items = |ls: &[(&str, i64)]| -> Vec<LineItem> {
            ls.iter()
                .map(|(s, q)| LineItem {
                    sku: Some(s.to_string()),
                    quantity: *q,
                })
                .collect()
        };
        // The newest snapshot so far: (time, line items).
        let mut newest = (start, lines.clone());

        let financial = if paid_at_create { "paid" } else { "pending" };
        timed.push((start, orders_create(id, start, &lines, total, financial)));

        // Card declines before the payment; one more decline after it (ignored).
        let pi = format!("pi_{id}");
        if k % 3 == 0 || !pays {
            timed.push((start + 30, pi_failed(&ids, &pi, total, start + 30)));
            timed.push((start + 35, pi_failed(&ids, &pi, total, start + 35)));
        }
        if k % 3 == 0 && pays {
            timed.push((start + 900, pi_failed(&ids, &pi, total, start + 900)));
        }

        // The payment, reported by one or two providers.
        if pays {
            match k % 4 {
                0 => {
                    timed.push((start + 60, orders_paid(id, start + 60, &lines, total)));
                    timed.push((start + 61, pi_succeeded(&ids, &pi, total, start + 61)));
                }
                1 => {
                    timed.push((start + 61, pi_succeeded(&ids, &pi, total, start + 61)));
                }
                2 => {
                    let cs = format!("cs_{id}");
                    timed.push((start + 60, checkout(&ids, &cs, total, true, start + 60)));
                }
                _ => {
                    timed.push((start + 60, orders_paid(id, start + 60, &lines, total)));
                }
            }
            o.invoices.push(Invoice {
                invoice_id: format!("inv-{ids}-1"),
                amount_minor: total,
                source_effect: keys.paid(),
            });
            o.notifications.push(Notification {
                kind: NotificationKind::PaymentReceived,
                dedup_key: keys.paid(),
            });
            // Each report of the payment is recorded (the paid total stays `total`).
            let reported = |provider: &str, payment_id: &str| Payment {
                provider: provider.into(),
                payment_id: payment_id.into(),
                amount_minor: total,
            };
            if k % 4 != 2 {
                if k % 4 != 3 {
                    o.payments.push(reported("stripe", &pi));
                }
                if k % 4 != 1 || paid_at_create {
                    o.payments.push(reported("shopify", "order"));
                }
            }
        } else {
            let key = keys.payment_failed(&pi, start + 35);
            o.payment_status = PaymentStatus::Failed;
            o.payment_event_at = Some(start + 35);
            o.notifications.push(Notification {
                kind: NotificationKind::PaymentFailed,
                dedup_key: key,
            });
        }

        // Updates: line item quantities change (display only; stock stays reserved).
        let cancel_at = match k % 4 {
            3 => Some(start + 2_000),
            _ if k == 6 => Some(start + 100 + 5 * 20 + 5), // in the middle of the updates
            _ => None,
        };
        let n_updates = rng.range(12, 18);
        for u in 0..n_updates {
            let at = start + 100 + u * 20;
            let items: Vec<(&str, i64)> =
                lines.iter().map(|(s, _)| (*s, rng.range(1, 4))).collect();
            timed.push((at, orders_updated(id, at, &items, total)));
            if at > newest.0 {
                newest = (at, items);
            }
        }

        // Fulfillments.
        if k % 2 == 0 {
            for f in 0..rng.range(1, 2) as u64 {
                let fid = 7000 + id * 10 + f;
                let tracking = format!("1Z{fid}");
                let at = start + 1_000 + f as i64;
                timed.push((at, fulfillment(id, fid, &tracking, at)));
                o.shipments.push(Shipment {
                    fulfillment_id: fid.to_string(),
                    tracking: Some(tracking),
                });
                o.notifications.push(Notification {
                    kind: NotificationKind::Shipped,
                    dedup_key: keys.fulfillment(&fid.to_string()),
                });
            }
        }

        // Refunds: Stripe (reported by charge.refunded and refund.created), Shopify.
        if pays {
            let mut stripe_refunds: Vec<(String, i64)> = Vec::new();
            if k % 3 == 1 || k == 0 {
                stripe_refunds.push((format!("re_{id}_1"), total / 4));
            }
            if k == 0 {
                stripe_refunds.push((format!("re_{id}_2"), total / 4));
            }
            let ch = format!("ch_{id}");
            for (i, (re, amount)) in stripe_refunds.iter().enumerate() {
                let at = start + 1_500 + i as i64 * 10;
                timed.push((at, refund_created(&ids, re, *amount, at)));
                let so_far: Vec<(&str, i64)> = stripe_refunds[..=i]
                    .iter()
                    .map(|(r, a)| (r.as_str(), *a))
                    .collect();
                timed.push((at + 1, charge_refunded(&ids, &ch, &so_far, at + 1)));
                o.refunds.push(Refund {
                    refund_id: re.clone(),
                    amount_minor: *amount,
                });
                o.notifications.push(Notification {
                    kind: NotificationKind::Refunded,
                    dedup_key: keys.refund(re),
                });
            }
            if k % 3 == 2 || k == 3 {
                let rid = 9000 + id;
                let amount = if k == 3 { total } else { total / 2 };
                let at = start + 1_600;
                timed.push((at, shopify_refund(id, rid, amount, at)));
                o.refunds.push(Refund {
                    refund_id: rid.to_string(),
                    amount_minor: amount,
                });
                o.notifications.push(Notification {
                    kind: NotificationKind::Refunded,
                    dedup_key: keys.refund(&rid.to_string()),
                });
            }
        }

        // Events that move nothing: a Stripe refund that failed, a restock-only
        // Shopify refund, event types the domain does not map.
        if k == 1 {
            let at = start + 1_700;
            let mut e = refund_created(&ids, &format!("re_{id}_failed"), 500, at);
            let mut body: Value = serde_json::from_slice(&e.body).unwrap();
            body["data"]["object"]["status"] = json!("failed");
            e.body = body.to_string().into_bytes();
            timed.push((at, e));
        }
        if k == 4 {
            let at = start + 1_700;
            timed.push((at, restock_only_refund(id, 9_500 + id, at)));
        }
        if k % 3 == 0 {
            let at = start + 62;
            timed.push((
                at,
                stripe_event(
                    "charge.succeeded",
                    &format!("evt_ch_{id}"),
                    at,
                    json!({"id": format!("ch_{id}"), "object": "charge", "amount": total,
                           "metadata": {"order_id": ids}}),
                ),
            ));
            timed.push((
                at + 1,
                shopify_event(
                    "orders/fulfilled",
                    &format!("fulfilled-{id}"),
                    order_body(id, at + 1, &lines, total, "paid"),
                ),
            ));
        }

        // Cancellation: restock what create reserved.
        if let Some(at) = cancel_at {
            let items: Vec<(&str, i64)> =
                lines.iter().map(|(s, _)| (*s, rng.range(1, 4))).collect();
            timed.push((at, orders_cancelled(id, at, &items, total)));
            if at > newest.0 {
                newest = (at, items);
            }
            o.status = OrderStatus::Cancelled;
            o.notifications.push(Notification {
                kind: NotificationKind::Cancelled,
                dedup_key: keys.cancelled(),
            });
        } else {
            for (s, q) in &lines {
                *on_hand.get_mut(*s).unwrap() -= q;
            }
        }

        o.line_items = as_items(&newest.1);
        o.shopify_updated_at = Some(utc(newest.0));
        o.normalize();
        orders.insert(ids, o);
    }

    // A Stripe-only order: checkout opens it unpaid, a decline, the payment, a refund.
    {
        let ids = "web-4001".to_string();
        let keys = einmal::domain::reference::EffectKeys::new(TENANT, &ids);
        let start = day + 40_000;
        let amount = 8_450;
        timed.push((start, checkout(&ids, "cs_web_4001", amount, false, start)));
        timed.push((
            start + 10,
            pi_failed(&ids, "pi_web_4001", amount, start + 10),
        ));
        timed.push((
            start + 40,
            pi_succeeded(&ids, "pi_web_4001", amount, start + 40),
        ));
        timed.push((
            start + 700,
            pi_failed(&ids, "pi_web_4001", amount, start + 700),
        ));
        timed.push((
            start + 800,
            refund_created(&ids, "re_web_4001", 2_000, start + 800),
        ));
        timed.push((
            start + 801,
            charge_refunded(&ids, "ch_web_4001", &[("re_web_4001", 2_000)], start + 801),
        ));
        let mut o = Order::new(&ids);
        o.currency = Some("EUR".into());
        o.total_minor = amount;
        o.invoices.push(Invoice {
            invoice_id: format!("inv-{ids}-1"),
            amount_minor: amount,
            source_effect: keys.paid(),
        });
        o.payments.push(Payment {
            provider: "stripe".into(),
            payment_id: "pi_web_4001".into(),
            amount_minor: amount,
        });
        o.refunds.push(Refund {
            refund_id: "re_web_4001".into(),
            amount_minor: 2_000,
        });
        o.notifications.push(Notification {
            kind: NotificationKind::PaymentReceived,
            dedup_key: keys.paid(),
        });
        o.notifications.push(Notification {
            kind: NotificationKind::Refunded,
            dedup_key: keys.refund("re_web_4001"),
        });
        o.normalize();
        orders.insert(ids, o);
    }

    // Three orders paid through the issue-28 payment providers, each with a failure
    // first, the payment, a refund reported twice (a provider retry under a new id
    // changes nothing), and for the Paystack order Stripe reporting the same payment:
    // one invoice per order, one refund per refund id, as for Stripe.
    for (n, provider) in ["razorpay", "worldline", "paystack"]
        .into_iter()
        .enumerate()
    {
        let ids = format!("web-{}", 4002 + n);
        let keys = einmal::domain::reference::EffectKeys::new(TENANT, &ids);
        let start = day + 41_000 + n as i64 * 1_000;
        let amount = 3_990 + n as i64 * 1_000;
        let (pay, refund) = (format!("{provider}_pay_{n}"), format!("{provider}_re_{n}"));
        let mut o = Order::new(&ids);
        let fail_at = start + 10;
        match provider {
            "razorpay" => {
                let failed =
                    razorpay_payment("payment.failed", &ids, &format!("{pay}_x"), amount, fail_at);
                let paid = razorpay_payment("payment.captured", &ids, &pay, amount, start + 40);
                let re = razorpay_refund(&ids, &pay, &refund, 1_000, start + 800);
                timed.push((fail_at, failed));
                timed.push((start + 40, paid));
                timed.push((
                    start + 801,
                    re.with_event_id(&format!("evt_rzp_{refund}_again")),
                ));
                timed.push((start + 800, re));
                o.currency = Some("INR".into());
            }
            "worldline" => {
                let failed = worldline_event(
                    "payment.rejected",
                    &ids,
                    &format!("{pay}_x"),
                    amount,
                    fail_at,
                    None,
                );
                let paid =
                    worldline_event("payment.captured", &ids, &pay, amount, start + 40, None);
                let re = worldline_event(
                    "refund.refunded",
                    &ids,
                    &refund,
                    1_000,
                    start + 800,
                    Some(&pay),
                );
                timed.push((fail_at, failed));
                timed.push((start + 40, paid));
                timed.push((start + 801, re.with_event_id("wl-refund-again")));
                timed.push((start + 800, re));
                o.currency = Some("EUR".into());
            }
            _ => {
                let pi = format!("pi_{ids}");
                timed.push((fail_at, pi_failed(&ids, &pi, amount, fail_at)));
                timed.push((
                    start + 40,
                    paystack_charge(&ids, 77_000 + n as u64, amount, start + 40),
                ));
                timed.push((start + 41, pi_succeeded(&ids, &pi, amount, start + 41)));
                timed.push((
                    start + 800,
                    refund_created(&ids, &refund, 1_000, start + 800),
                ));
                o.currency = Some("EUR".into());
                o.payments.push(Payment {
                    provider: "stripe".into(),
                    payment_id: pi.clone(),
                    amount_minor: amount,
                });
            }
        }
        let pay_id = if provider == "paystack" {
            (77_000 + n).to_string()
        } else {
            pay.clone()
        };
        o.total_minor = amount;
        o.invoices.push(Invoice {
            invoice_id: format!("inv-{ids}-1"),
            amount_minor: amount,
            source_effect: keys.paid(),
        });
        o.payments.push(Payment {
            provider: provider.into(),
            payment_id: pay_id,
            amount_minor: amount,
        });
        o.refunds.push(Refund {
            refund_id: refund.clone(),
            amount_minor: 1_000,
        });
        o.notifications.push(Notification {
            kind: NotificationKind::PaymentReceived,
            dedup_key: keys.paid(),
        });
        o.notifications.push(Notification {
            kind: NotificationKind::Refunded,
            dedup_key: keys.refund(&refund),
        });
        o.normalize();
        orders.insert(ids, o);
    }

    timed.sort_by_key(|(at, _)| *at);
    Stream {
        events: timed.into_iter().map(|(_, e)| e).collect(),
        orders,
        on_hand,
    }
}

/// The reference domain under the generic conformance scenarios (`suite`).
#[async_trait::async_trait]
impl Subject for Stream {
    fn domain(&self) -> std::sync::Arc<dyn einmal::domain::Domain> {
        std::sync::Arc::new(einmal::domain::reference::ReferenceDomain)
    }
    fn events(&self) -> Vec<Event> {
        self.events.clone()
    }
    async fn seed(&self, b: &Backend) {
        b.seed(&self.seeds()).await;
    }
    async fn check(&self, b: &Backend) -> BTreeMap<String, einmal::domain::state::StateRecord> {
        check_invariants(b, &self.seeds()).await
    }
    fn watched(&self) -> Vec<StateKey> {
        self.state_keys()
    }
    fn no_regression(
        &self,
        before: &BTreeMap<String, einmal::domain::state::StateRecord>,
        after: &BTreeMap<String, einmal::domain::state::StateRecord>,
    ) {
        super::assert_no_regression(before, after);
    }
}
