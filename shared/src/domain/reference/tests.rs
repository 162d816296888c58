//! Decision tests per event type, swapped arrival orders, idempotence, and a
//! permutation test: many arrival orders of the same events converge to the same data.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{json, Value};

use super::*;
use crate::domain::state::StateWrite;
use crate::domain::Change;
use crate::envelope::Envelope;

const T: &str = "t1";

// ---- Events -----------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Ev {
    env: Envelope,
    body: Vec<u8>,
}

impl Ev {
    fn view(&self) -> DomainEvent<'_> {
        DomainEvent {
            envelope: &self.env,
            body: &self.body,
        }
    }

    /// The same event as redelivered: another delivery id, same everything else.
    fn redelivered(&self, n: usize) -> Ev {
        let mut e = self.clone();
        e.env.delivery_id = Some(format!("delivery-{n}"));
        e
    }
}

fn stripe(ty: &str, event_id: &str, created: i64, object: Value) -> Ev {
    let body = json!({
        "id": event_id, "object": "event", "type": ty, "created": created,
        "data": {"object": object}
    });
    Ev {
        env: Envelope {
            provider: "stripe".into(),
            tenant: T.into(),
            event_id: event_id.into(),
            event_type: ty.into(),
            object_id: body["data"]["object"]["id"].as_str().map(str::to_owned),
            object_version: None,
            occurred_at: Some(created),
            delivery_id: None,
        },
        body: serde_json::to_vec(&body).unwrap(),
    }
}

fn shopify(topic: &str, event_id: &str, body: Value) -> Ev {
    Ev {
        env: Envelope {
            provider: "shopify".into(),
            tenant: T.into(),
            event_id: format!("shop-1.myshopify.com:{topic}:{event_id}"),
            event_type: topic.into(),
            object_id: id_text(body.get("id")),
            object_version: body
                .get("updated_at")
                .and_then(Value::as_str)
                .map(str::to_owned),
            occurred_at: Some(1_764_400_000),
            delivery_id: None,
        },
        body: serde_json::to_vec(&body).unwrap(),
    }
}

fn pi_succeeded(order: &str, pi: &str, amount: i64, created: i64) -> Ev {
    stripe(
        "payment_intent.succeeded",
        &format!("evt_ps_{pi}"),
        created,
        json!({"id": pi, "object": "payment_intent", "amount": amount, "amount_received": amount,
               "currency": "eur", "status": "succeeded", "metadata": {"order_id": order}}),
    )
}

fn pi_failed(order: &str, pi: &str, amount: i64, created: i64) -> Ev {
    stripe(
        "payment_intent.payment_failed",
        &format!("evt_pf_{pi}_{created}"),
        created,
        json!({"id": pi, "object": "payment_intent", "amount": amount, "amount_received": 0,
               "currency": "eur", "metadata": {"order_id": order}}),
    )
}

fn checkout(order: &str, cs: &str, amount: i64, paid: bool, created: i64) -> Ev {
    stripe(
        "checkout.session.completed",
        &format!("evt_cs_{cs}"),
        created,
        json!({"id": cs, "object": "checkout.session", "amount_total": amount, "currency": "eur",
               "payment_status": if paid { "paid" } else { "unpaid" }, "metadata": {"order_id": order},
               "payment_intent": format!("pi_{}", cs.trim_start_matches("cs_"))}),
    )
}

fn charge_refunded(order: &str, ch: &str, refunds: &[(&str, i64)], created: i64) -> Ev {
    let data: Vec<Value> = refunds
        .iter()
        .map(|(id, amount)| json!({"id": id, "object": "refund", "amount": amount, "charge": ch, "status": "succeeded"}))
        .collect();
    stripe(
        "charge.refunded",
        &format!("evt_cr_{ch}_{created}"),
        created,
        json!({"id": ch, "object": "charge", "metadata": {"order_id": order},
               "refunds": {"object": "list", "data": data}}),
    )
}

fn refund_created(order: &str, re: &str, amount: i64, created: i64) -> Ev {
    stripe(
        "refund.created",
        &format!("evt_rc_{re}"),
        created,
        json!({"id": re, "object": "refund", "amount": amount, "status": "succeeded",
               "metadata": {"order_id": order}}),
    )
}

/// A Stripe refund that names its payment intent (Stripe always sends it).
fn refund_of(order: &str, re: &str, pi: &str, amount: i64, created: i64) -> Ev {
    stripe(
        "refund.created",
        &format!("evt_rc_{re}"),
        created,
        json!({"id": re, "object": "refund", "amount": amount, "status": "succeeded",
               "payment_intent": pi, "metadata": {"order_id": order}}),
    )
}

/// A Shopify refund processed by the Stripe gateway: its refund transaction carries
/// the Stripe refund id (`authorization`, `receipt.id`); `manual`: a further manual
/// refund transaction of that amount in the same refund.
fn shopify_refund_via_stripe(
    order: u64,
    id: u64,
    re: &str,
    amount: &str,
    manual: Option<&str>,
) -> Ev {
    let mut transactions = vec![
        json!({"id": id * 10, "order_id": order, "kind": "refund", "status": "success",
               "gateway": "stripe", "amount": amount, "authorization": re,
               "receipt": {"id": re, "object": "refund", "charge": "ch_x"}}),
        json!({"id": id * 10 + 1, "order_id": order, "kind": "refund", "status": "failure",
               "gateway": "stripe", "amount": "999.00", "authorization": "re_failed"}),
    ];
    if let Some(m) = manual {
        transactions.push(
            json!({"id": id * 10 + 2, "kind": "refund", "status": "success",
                                 "gateway": "manual", "amount": m}),
        );
    }
    shopify(
        "refunds/create",
        &format!("r{id}"),
        json!({"id": id, "order_id": order, "transactions": transactions}),
    )
}

fn order_body(
    order: u64,
    updated_at: &str,
    items: &[(&str, i64)],
    total: &str,
    financial: &str,
) -> Value {
    let items: Vec<Value> = items
        .iter()
        .map(|(sku, q)| json!({"sku": sku, "quantity": q, "title": "T-shirt"}))
        .collect();
    json!({"id": order, "updated_at": updated_at, "currency": "EUR", "total_price": total,
           "financial_status": financial, "line_items": items, "email": "jon@example.com"})
}

fn orders_create(
    order: u64,
    updated_at: &str,
    items: &[(&str, i64)],
    total: &str,
    financial: &str,
) -> Ev {
    shopify(
        "orders/create",
        &format!("c{order}"),
        order_body(order, updated_at, items, total, financial),
    )
}

fn orders_paid(order: u64, updated_at: &str, items: &[(&str, i64)], total: &str) -> Ev {
    shopify(
        "orders/paid",
        &format!("p{order}"),
        order_body(order, updated_at, items, total, "paid"),
    )
}

fn orders_updated(order: u64, updated_at: &str, items: &[(&str, i64)], total: &str) -> Ev {
    shopify(
        "orders/updated",
        &format!("u{order}{updated_at}"),
        order_body(order, updated_at, items, total, "paid"),
    )
}

fn orders_cancelled(order: u64, updated_at: &str, items: &[(&str, i64)], total: &str) -> Ev {
    let mut body = order_body(order, updated_at, items, total, "paid");
    body["cancelled_at"] = json!(updated_at);
    shopify("orders/cancelled", &format!("x{order}"), body)
}

fn shopify_refund(order: u64, id: u64, amount: &str) -> Ev {
    shopify(
        "refunds/create",
        &format!("r{id}"),
        json!({"id": id, "order_id": order, "transactions": [
            {"kind": "refund", "status": "success", "amount": amount},
            {"kind": "refund", "status": "failure", "amount": "999.00"}
        ]}),
    )
}

fn fulfillment(order: u64, id: u64, tracking: &str) -> Ev {
    shopify(
        "fulfillments/create",
        &format!("f{id}"),
        json!({"id": id, "order_id": order, "status": "success", "tracking_number": tracking}),
    )
}

// ---- A tiny store with the framework's guard ---------------------------------------

#[derive(Debug, Clone, Default)]
struct World {
    records: BTreeMap<StateKey, StateRecord>,
}

impl World {
    fn new() -> World {
        let mut w = World::default();
        w.write(seed_sku(T, "SKU-RED-M", 10));
        w.write(seed_sku(T, "SKU-BLUE-L", 5));
        w
    }

    fn write(&mut self, w: StateWrite) {
        assert_eq!(self.version(&w.record.key), w.expected_version);
        self.records.insert(w.record.key.clone(), w.record);
    }

    fn version(&self, key: &StateKey) -> u64 {
        self.records.get(key).map_or(0, |r| r.version)
    }

    fn load(&self, keys: &[StateKey]) -> Vec<StateRecord> {
        keys.iter()
            .map(|k| {
                self.records
                    .get(k)
                    .cloned()
                    .unwrap_or_else(|| StateRecord::missing(k.clone()))
            })
            .collect()
    }

    fn decide(&self, ev: &Ev) -> Result<Decision, DomainError> {
        let d = ReferenceDomain;
        let keys = d.targets(&ev.view())?;
        d.decide(&ev.view(), &self.load(&keys))
    }

    /// What the framework does: drop changes whose effect key is already applied on
    /// the record that holds it or on their own record (as loaded); the rest become one
    /// write per record (new data, version + 1), each effect key added to its holder
    /// (`Change::keyed_on`, else the record itself). Returns the number of records
    /// written.
    fn apply(&mut self, decision: &Decision) -> usize {
        let Decision::Apply { changes, .. } = decision else {
            return 0;
        };
        let loaded = self.records.clone();
        let before = |k: &StateKey| {
            loaded
                .get(k)
                .cloned()
                .unwrap_or_else(|| StateRecord::missing(k.clone()))
        };
        let mut written: BTreeMap<StateKey, StateRecord> = BTreeMap::new();
        let write = |k: &StateKey| -> StateRecord {
            let b = before(k);
            StateRecord {
                version: b.version + 1,
                ..b
            }
        };
        for c in changes {
            if before(c.key_holder()).applied.contains(&c.effect_key)
                || before(&c.key).applied.contains(&c.effect_key)
            {
                continue;
            }
            written
                .entry(c.key.clone())
                .or_insert_with(|| write(&c.key))
                .data = c.data.clone();
            written
                .entry(c.key_holder().clone())
                .or_insert_with(|| write(c.key_holder()))
                .applied
                .insert(c.effect_key.clone());
        }
        let n = written.len();
        self.records.extend(written);
        n
    }

    fn deliver(&mut self, ev: &Ev) -> Result<Decision, DomainError> {
        let d = self.decide(ev)?;
        self.apply(&d);
        Ok(d)
    }

    fn ok(&mut self, ev: &Ev) -> Decision {
        self.deliver(ev)
            .unwrap_or_else(|e| panic!("{}: {e}", ev.env.event_type))
    }

    fn order(&self, id: &str) -> Order {
        let r = &self.records[&order_key(T, id)];
        serde_json::from_value(r.data.clone()).unwrap()
    }

    fn has_order(&self, id: &str) -> bool {
        self.records.contains_key(&order_key(T, id))
    }

    fn on_hand(&self, sku: &str) -> i64 {
        let r = &self.records[&sku_key(T, sku)];
        serde_json::from_value::<Sku>(r.data.clone())
            .unwrap()
            .on_hand
    }

    fn applied(&self, key: &StateKey) -> Vec<String> {
        self.records
            .get(key)
            .map(|r| r.applied.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn data(&self) -> BTreeMap<String, Value> {
        self.records
            .iter()
            .map(|(k, r)| (k.pk(), r.data.clone()))
            .collect()
    }
}

fn changes(d: &Decision) -> &[Change] {
    match d {
        Decision::Apply { changes, .. } => changes,
        Decision::Ignore { reason } => panic!("expected Apply, got Ignore({reason})"),
    }
}

fn effect_keys(d: &Decision) -> Vec<&str> {
    changes(d).iter().map(|c| c.effect_key.as_str()).collect()
}

fn result(d: &Decision) -> &str {
    match d {
        Decision::Apply { result, .. } => result,
        Decision::Ignore { reason } => panic!("expected Apply, got Ignore({reason})"),
    }
}

fn ignored(d: &Decision) -> &str {
    match d {
        Decision::Ignore { reason } => reason,
        Decision::Apply { changes, result } => {
            panic!("expected Ignore, got Apply({result}, {changes:?})")
        }
    }
}

fn waits(r: Result<Decision, DomainError>) -> String {
    match r {
        Err(DomainError::Wait(m)) => m,
        other => panic!("expected Wait, got {other:?}"),
    }
}

fn permanent(r: Result<Decision, DomainError>) -> String {
    match r {
        Err(DomainError::Permanent(m)) => m,
        other => panic!("expected Permanent, got {other:?}"),
    }
}

/// Redelivering after applying changes nothing: only already-applied keys, or Ignore.
fn assert_idempotent(w: &mut World, ev: &Ev) {
    let before = w.clone().records;
    let again = w.decide(&ev.redelivered(2)).unwrap();
    if let Decision::Apply { changes, .. } = &again {
        for c in changes {
            assert!(
                w.records[c.key_holder()].applied.contains(&c.effect_key),
                "{}: re-decide produced a new effect {}",
                ev.env.event_type,
                c.effect_key
            );
        }
    }
    assert_eq!(w.apply(&again), 0);
    assert_eq!(w.records, before);
}

const RED: &str = "SKU-RED-M";
const BLUE: &str = "SKU-BLUE-L";

// ---- Scope and errors ---------------------------------------------------------------

#[test]
fn unsupported_types_are_ignored_without_reading_the_body() {
    let d = ReferenceDomain;
    for (provider, ty) in [
        ("stripe", "customer.created"),
        ("shopify", "products/update"),
        ("github", "push"),
    ] {
        let mut ev = pi_succeeded("1", "pi_1", 100, 1);
        ev.env.provider = provider.into();
        ev.env.event_type = ty.into();
        ev.body = b"not json".to_vec();
        assert!(d.targets(&ev.view()).unwrap().is_empty());
        assert_eq!(
            d.decide(&ev.view(), &[]).unwrap(),
            Decision::Ignore {
                reason: format!("unsupported event type {provider} {ty}")
            }
        );
    }
    // A Shopify topic under the Stripe provider is not a Stripe type.
    let mut ev = orders_create(1, "2025-01-01T00:00:00Z", &[], "1.00", "paid");
    ev.env.provider = "stripe".into();
    assert!(d.targets(&ev.view()).unwrap().is_empty());
}

#[test]
fn malformed_supported_events_are_permanent() {
    let w = World::new();
    let mut ev = pi_succeeded("1001", "pi_1", 100, 1);
    ev.body = b"{not json".to_vec();
    assert_eq!(
        permanent(w.decide(&ev)),
        "payment_intent.succeeded: body is not valid JSON"
    );

    let ev = stripe(
        "payment_intent.succeeded",
        "evt_x",
        1,
        json!({"id": "pi_1", "amount": 5, "metadata": {}}),
    );
    assert_eq!(permanent(w.decide(&ev)), "no metadata.order_id");
    let ev = stripe(
        "refund.created",
        "evt_x",
        1,
        json!({"id": "re_1", "amount": 5}),
    );
    assert_eq!(permanent(w.decide(&ev)), "no metadata.order_id");
    let ev = stripe(
        "payment_intent.succeeded",
        "evt_x",
        1,
        json!({"id": "pi_1", "amount": 5, "metadata": {"order_id": "a#b"}}),
    );
    assert!(permanent(w.decide(&ev)).contains("invalid order id"));
    let ev = stripe(
        "payment_intent.succeeded",
        "evt_x",
        1,
        json!({"id": "pi_1", "amount": "5", "metadata": {"order_id": "1"}}),
    );
    assert!(permanent(w.decide(&ev)).contains("amount_received"));
    let ev = stripe(
        "charge.refunded",
        "evt_x",
        1,
        json!({"id": "ch_1", "metadata": {"order_id": "1"}}),
    );
    assert!(permanent(w.decide(&ev)).contains("refunds.data"));

    let mut body = order_body(1001, "2025-01-01T00:00:00Z", &[(RED, 1)], "49.90", "paid");
    body["total_price"] = json!("49.999");
    assert_eq!(
        permanent(w.decide(&shopify("orders/create", "e", body))),
        "orders/create: missing or invalid `total_price`"
    );
    let mut body = order_body(1001, "yesterday", &[(RED, 1)], "49.90", "paid");
    body["updated_at"] = json!("yesterday");
    assert!(permanent(w.decide(&shopify("orders/updated", "e", body))).contains("updated_at"));
    let body = json!({"id": 5, "transactions": []});
    assert!(permanent(w.decide(&shopify("refunds/create", "e", body))).contains("order_id"));
    // No payload content in the reason beyond field names.
    let ev = shopify(
        "fulfillments/create",
        "e",
        json!({"order_id": 1001, "email": "jon@example.com"}),
    );
    let msg = permanent(w.decide(&ev));
    assert!(!msg.contains("jon"), "{msg}");
}

#[test]
fn unreadable_records_and_mismatched_records_are_permanent() {
    let mut w = World::new();
    let ev = pi_succeeded("1001", "pi_1", 4990, 10);
    let key = order_key(T, "1001");
    w.records.insert(
        key.clone(),
        StateRecord {
            version: 3,
            data: json!({"order_id": "1001"}),
            ..StateRecord::missing(key.clone())
        },
    );
    assert!(permanent(w.decide(&ev)).contains("unreadable data"));
    w.records.get_mut(&key).unwrap().data = Value::Null;
    assert!(permanent(w.decide(&ev)).contains("unreadable data"));

    let d = ReferenceDomain;
    let wrong = [StateRecord::missing(order_key(T, "other"))];
    assert!(permanent(d.decide(&ev.view(), &wrong)).contains("do not match"));
    assert!(permanent(d.decide(&ev.view(), &[])).contains("do not match"));
}

#[test]
fn delivery_id_does_not_matter() {
    let w = World::new();
    let ev = orders_create(1001, "2025-01-01T00:00:00Z", &[(RED, 1)], "49.90", "paid");
    assert_eq!(
        w.decide(&ev.redelivered(1)).unwrap(),
        w.decide(&ev.redelivered(2)).unwrap()
    );
}

// ---- Stripe -------------------------------------------------------------------------

#[test]
fn payment_succeeded_creates_a_minimal_order_paid_once() {
    let mut w = World::new();
    let ev = pi_succeeded("1001", "pi_1", 12_970, 100);
    let d = w.ok(&ev);
    assert_eq!(
        effect_keys(&d),
        ["t1#order-1001#paid", "t1#order-1001#payment#stripe#pi_1"]
    );
    assert_eq!(result(&d), "order 1001 paid; invoice inv-1001-1");
    let o = w.order("1001");
    assert_eq!(o.payment_status, PaymentStatus::Paid);
    assert_eq!(
        (o.total_minor, o.currency.as_deref()),
        (12_970, Some("EUR"))
    );
    assert_eq!(
        o.invoices,
        [Invoice {
            invoice_id: "inv-1001-1".into(),
            amount_minor: 12_970,
            source_effect: "t1#order-1001#paid".into()
        }]
    );
    assert_eq!(
        o.notifications,
        [Notification {
            kind: NotificationKind::PaymentReceived,
            dedup_key: "t1#order-1001#paid".into()
        }]
    );
    assert_eq!(o.loyalty_points, 129);
    assert!(!o.shopify_created);
    assert_idempotent(&mut w, &ev);
    // A second payment intent for the same order is a second payment: counted, and
    // still one invoice (its amount is the paid total) and one notification.
    let d = w.ok(&pi_succeeded("1001", "pi_2", 12_970, 200));
    assert_eq!(effect_keys(&d), ["t1#order-1001#payment#stripe#pi_2"]);
    assert_eq!(
        result(&d),
        "order 1001 payment stripe pi_2 of 12970; paid 25940"
    );
    let o = w.order("1001");
    assert_eq!((o.invoices.len(), o.paid_minor()), (1, 25_940));
    assert_eq!((o.total_minor, o.notifications.len()), (25_940, 1));
}

#[test]
fn checkout_session_opens_the_order_and_may_pay_it() {
    let mut w = World::new();
    let d = w.ok(&checkout("1002", "cs_1", 2500, false, 10));
    assert_eq!(effect_keys(&d), ["t1#order-1002#checkout#cs_1"]);
    let o = w.order("1002");
    assert_eq!(
        (o.payment_status, o.total_minor),
        (PaymentStatus::Pending, 2500)
    );
    // Existing order, unpaid session: nothing to do.
    assert!(ignored(
        &w.decide(&checkout("1002", "cs_2", 2500, false, 11))
            .unwrap()
    )
    .contains("already exists"));

    let ev = checkout("1003", "cs_3", 4990, true, 10);
    let d = w.ok(&ev);
    assert_eq!(
        effect_keys(&d),
        [
            "t1#order-1003#checkout#cs_3",
            "t1#order-1003#paid",
            "t1#order-1003#payment#stripe#pi_3"
        ]
    );
    assert_eq!(
        result(&d),
        "order 1003 opened by checkout cs_3; order 1003 paid; invoice inv-1003-1"
    );
    assert_eq!(w.order("1003").payment_status, PaymentStatus::Paid);
    assert_idempotent(&mut w, &ev);
    // The payment intent of that session: both its keys applied (by the checkout,
    // which names the intent) → skipped.
    let d = w.decide(&pi_succeeded("1003", "pi_3", 4990, 11)).unwrap();
    assert_eq!(
        result(&d),
        "already applied: t1#order-1003#paid, t1#order-1003#payment#stripe#pi_3"
    );
    assert_eq!(w.apply(&d), 0);

    // client_reference_id works when metadata is absent.
    let ev = stripe(
        "checkout.session.completed",
        "evt_cs_4",
        1,
        json!({"id": "cs_4", "amount_total": 100, "currency": "usd", "payment_status": "unpaid",
               "client_reference_id": "1004"}),
    );
    w.ok(&ev);
    assert_eq!(w.order("1004").currency.as_deref(), Some("USD"));
}

#[test]
fn payment_failures_before_and_after_success() {
    let mut w = World::new();
    let ev = pi_failed("1001", "pi_1", 4990, 100);
    let d = w.ok(&ev);
    assert_eq!(effect_keys(&d), ["t1#order-1001#payment_failed#pi_1#100"]);
    let o = w.order("1001");
    assert_eq!(
        (o.payment_status, o.payment_event_at),
        (PaymentStatus::Failed, Some(100))
    );
    assert_eq!(o.notifications[0].kind, NotificationKind::PaymentFailed);
    assert_idempotent(&mut w, &ev);
    // An older failure arriving late is superseded; a newer one replaces the notice.
    assert!(ignored(&w.ok(&pi_failed("1001", "pi_0", 4990, 90))).starts_with("superseded:"));
    w.ok(&pi_failed("1001", "pi_2", 4990, 120));
    let o = w.order("1001");
    assert_eq!(o.payment_event_at, Some(120));
    assert_eq!(o.notifications.len(), 1);
    assert_eq!(
        o.notifications[0].dedup_key,
        "t1#order-1001#payment_failed#pi_2#120"
    );
    // Success from failed: the failure notice is withdrawn.
    w.ok(&pi_succeeded("1001", "pi_2", 4990, 130));
    let o = w.order("1001");
    assert_eq!(
        (o.payment_status, o.payment_event_at),
        (PaymentStatus::Paid, None)
    );
    assert_eq!(
        o.notifications.iter().map(|n| n.kind).collect::<Vec<_>>(),
        [NotificationKind::PaymentReceived]
    );
    // A late failure (old or even newer) after the payment: superseded.
    for at in [110, 140] {
        let d = w.ok(&pi_failed("1001", "pi_9", 4990, at));
        assert_eq!(ignored(&d), "superseded: order 1001 already paid");
    }
}

#[test]
fn failure_after_success_equals_success_after_failure() {
    let (mut a, mut b) = (World::new(), World::new());
    let (fail, ok) = (
        pi_failed("1001", "pi_1", 4990, 100),
        pi_succeeded("1001", "pi_1", 4990, 110),
    );
    a.ok(&fail);
    a.ok(&ok);
    b.ok(&ok);
    b.ok(&fail);
    assert_eq!(a.data(), b.data());
}

#[test]
fn refund_events_for_one_refund_share_one_effect() {
    let mut w = World::new();
    w.ok(&pi_succeeded("1001", "pi_1", 10_000, 100));
    let by_charge = charge_refunded("1001", "ch_1", &[("re_1", 2500)], 200);
    let d = w.ok(&by_charge);
    assert_eq!(effect_keys(&d), ["t1#order-1001#refund#re_1"]);
    assert_eq!(result(&d), "order 1001 refund re_1 of 2500");
    let by_refund = refund_created("1001", "re_1", 2500, 201);
    let d = w.decide(&by_refund).unwrap();
    assert_eq!(effect_keys(&d), ["t1#order-1001#refund#re_1"]);
    assert_eq!(w.apply(&d), 0);
    let o = w.order("1001");
    assert_eq!(
        (o.refunded_minor, o.payment_status, o.loyalty_points),
        (2500, PaymentStatus::PartiallyRefunded, 75)
    );
    assert_idempotent(&mut w, &by_charge);

    // A later charge.refunded lists both refunds: only the new one is applied.
    let d = w.ok(&charge_refunded(
        "1001",
        "ch_1",
        &[("re_1", 2500), ("re_2", 7500)],
        300,
    ));
    assert_eq!(effect_keys(&d), ["t1#order-1001#refund#re_2"]);
    let o = w.order("1001");
    assert_eq!(
        (o.refunded_minor, o.payment_status, o.loyalty_points),
        (10_000, PaymentStatus::Refunded, 0)
    );
    assert_eq!(
        o.refunds
            .iter()
            .map(|r| r.refund_id.as_str())
            .collect::<Vec<_>>(),
        ["re_1", "re_2"]
    );
    // re_2 reported again by refund.created: its key is applied → the framework skips it.
    let d = w
        .decide(&refund_created("1001", "re_2", 7500, 301))
        .unwrap();
    assert_eq!(effect_keys(&d), ["t1#order-1001#refund#re_2"]);
    assert_eq!(w.apply(&d), 0);
    // Anything beyond the paid amount is a permanent error.
    assert!(permanent(w.deliver(&refund_created("1001", "re_3", 1, 400))).contains("exceeds"));
}

#[test]
fn charge_refunded_with_two_new_refunds_is_one_write() {
    let mut w = World::new();
    w.ok(&pi_succeeded("1001", "pi_1", 10_000, 100));
    let d = w.ok(&charge_refunded(
        "1001",
        "ch_1",
        &[("re_2", 100), ("re_1", 200)],
        200,
    ));
    // One change per refund, both with the same full data: one write.
    assert_eq!(
        effect_keys(&d),
        ["t1#order-1001#refund#re_2", "t1#order-1001#refund#re_1"]
    );
    assert_eq!(changes(&d)[0].data, changes(&d)[1].data);
    assert_eq!(w.records[&order_key(T, "1001")].version, 2);
    assert_eq!(w.order("1001").refunded_minor, 300);
    // Each refund is still recognised by its key afterwards.
    let d = w.decide(&refund_created("1001", "re_1", 200, 201)).unwrap();
    assert_eq!(effect_keys(&d), ["t1#order-1001#refund#re_1"]);
    assert_eq!(w.apply(&d), 0);
    // Failed refunds move no money.
    let failed = stripe(
        "refund.created",
        "evt_rf",
        300,
        json!({"id": "re_9", "amount": 100, "status": "failed", "metadata": {"order_id": "1001"}}),
    );
    assert_eq!(
        ignored(&w.ok(&failed)),
        "no refund of order 1001 moves money"
    );
}

#[test]
fn refund_before_payment_waits() {
    let mut w = World::new();
    let refund = refund_created("1001", "re_1", 100, 200);
    assert!(waits(w.deliver(&refund)).starts_with("refund before payment"));
    w.ok(&pi_failed("1001", "pi_1", 4990, 100));
    assert!(waits(w.deliver(&refund)).starts_with("refund before payment"));
    w.ok(&pi_succeeded("1001", "pi_1", 4990, 110));
    assert_eq!(effect_keys(&w.ok(&refund)), ["t1#order-1001#refund#re_1"]);
}

// ---- Shopify ------------------------------------------------------------------------

#[test]
fn orders_create_reserves_stock_per_sku() {
    let mut w = World::new();
    let ev = orders_create(
        1001,
        "2025-11-29T02:00:05-05:00",
        &[(RED, 1), (BLUE, 2), (RED, 1)],
        "139.60",
        "pending",
    );
    assert_eq!(
        ReferenceDomain.targets(&ev.view()).unwrap(),
        [order_key(T, "1001"), sku_key(T, BLUE), sku_key(T, RED)]
    );
    let d = w.ok(&ev);
    assert_eq!(
        effect_keys(&d),
        [
            "t1#order-1001#created",
            "t1#order-1001#stock#SKU-BLUE-L",
            "t1#order-1001#stock#SKU-RED-M"
        ]
    );
    assert_eq!(
        result(&d),
        "order 1001 created; SKU-BLUE-L -2; SKU-RED-M -2"
    );
    assert_eq!((w.on_hand(RED), w.on_hand(BLUE)), (8, 3));
    // The stock moves' keys live on the order: a SKU record keeps only its seed key,
    // however many orders took from it.
    assert_eq!(
        w.applied(&order_key(T, "1001")),
        [
            "t1#order-1001#created",
            "t1#order-1001#stock#SKU-BLUE-L",
            "t1#order-1001#stock#SKU-RED-M"
        ]
    );
    assert_eq!(w.applied(&sku_key(T, RED)), ["t1#sku-SKU-RED-M#seed"]);
    let o = w.order("1001");
    assert_eq!(
        (o.total_minor, o.payment_status, o.line_items.len()),
        (13_960, PaymentStatus::Pending, 3)
    );
    assert_eq!(
        o.shopify_updated_at.as_deref(),
        Some("2025-11-29T07:00:05Z")
    );
    assert!(o.shopify_created && o.invoices.is_empty());
    assert_idempotent(&mut w, &ev);
    assert_eq!((w.on_hand(RED), w.on_hand(BLUE)), (8, 3));
}

#[test]
fn orders_create_paid_issues_the_invoice_and_later_payments_are_skipped() {
    let mut w = World::new();
    let ev = orders_create(1001, "2025-01-01T00:00:00Z", &[(RED, 1)], "49.90", "paid");
    let d = w.ok(&ev);
    assert_eq!(
        effect_keys(&d),
        [
            "t1#order-1001#created",
            "t1#order-1001#paid",
            "t1#order-1001#payment#shopify#order",
            "t1#order-1001#stock#SKU-RED-M"
        ]
    );
    assert_eq!(
        result(&d),
        "order 1001 created; SKU-RED-M -1; order 1001 paid; invoice inv-1001-1"
    );
    let o = w.order("1001");
    assert_eq!(
        (
            o.payment_status,
            o.loyalty_points,
            o.invoices[0].amount_minor
        ),
        (PaymentStatus::Paid, 49, 4990)
    );
    assert_idempotent(&mut w, &ev);
    let d = w
        .decide(&orders_paid(
            1001,
            "2025-01-01T00:01:00Z",
            &[(RED, 1)],
            "49.90",
        ))
        .unwrap();
    assert_eq!(w.apply(&d), 0);
    // Stripe's report of the same payment is recorded, and the paid total stays.
    let d = w.ok(&pi_succeeded("1001", "pi_1", 4990, 5));
    assert_eq!(
        result(&d),
        "order 1001 payment stripe pi_1 recorded (paid total unchanged)"
    );
    let o = w.order("1001");
    assert_eq!((o.invoices.len(), o.paid_minor()), (1, 4990));
}

#[test]
fn unknown_sku_is_permanent() {
    let w = World::new();
    let ev = orders_create(
        1001,
        "2025-01-01T00:00:00Z",
        &[(RED, 1), ("SKU-NOPE", 1)],
        "49.90",
        "paid",
    );
    assert_eq!(permanent(w.decide(&ev)), "unknown SKU SKU-NOPE");
}

#[test]
fn stripe_payment_before_shopify_create_merges() {
    let pay = pi_succeeded("1001", "pi_1", 12_970, 100);
    let create = orders_create(
        1001,
        "2025-11-29T02:00:05-05:00",
        &[(RED, 1), (BLUE, 2)],
        "129.70",
        "paid",
    );
    let paid = orders_paid(
        1001,
        "2025-11-29T02:06:41-05:00",
        &[(RED, 1), (BLUE, 2)],
        "129.70",
    );

    let mut a = World::new();
    assert!(waits(a.deliver(&paid)).starts_with("orders/paid before the order exists"));
    a.ok(&pay);
    let d = a.ok(&create);
    // The order exists (minimal, paid): created + stock, no second invoice; Shopify's
    // report of the payment is recorded and does not raise the paid total.
    assert_eq!(
        effect_keys(&d),
        [
            "t1#order-1001#created",
            "t1#order-1001#payment#shopify#order",
            "t1#order-1001#stock#SKU-BLUE-L",
            "t1#order-1001#stock#SKU-RED-M"
        ]
    );
    assert_eq!(
        result(&d),
        "order 1001 created; SKU-BLUE-L -2; SKU-RED-M -1; order 1001 payment shopify order recorded (paid total unchanged)"
    );
    // orders/paid: its keys are applied already → the framework skips them.
    let d = a.ok(&paid);
    assert!(result(&d).starts_with("already applied"));
    assert_eq!(
        a.applied(&order_key(T, "1001")),
        [
            "t1#order-1001#created",
            "t1#order-1001#paid",
            "t1#order-1001#payment#shopify#order",
            "t1#order-1001#payment#stripe#pi_1",
            "t1#order-1001#stock#SKU-BLUE-L",
            "t1#order-1001#stock#SKU-RED-M"
        ]
    );

    let mut b = World::new();
    b.ok(&create);
    b.ok(&paid);
    b.ok(&pay);
    assert_eq!(a.data(), b.data());
    let o = a.order("1001");
    assert_eq!(
        (o.line_items.len(), o.total_minor, o.invoices.len()),
        (2, 12_970, 1)
    );
    assert_eq!((a.on_hand(RED), a.on_hand(BLUE)), (9, 3));
}

#[test]
fn orders_paid_applies_the_payment() {
    let mut w = World::new();
    w.ok(&orders_create(
        1001,
        "2025-01-01T00:00:00Z",
        &[(RED, 1)],
        "49.90",
        "pending",
    ));
    let ev = orders_paid(1001, "2025-01-01T00:01:00Z", &[(RED, 1)], "49.90");
    let d = w.ok(&ev);
    assert_eq!(
        effect_keys(&d),
        ["t1#order-1001#paid", "t1#order-1001#payment#shopify#order"]
    );
    assert_eq!(w.order("1001").payment_status, PaymentStatus::Paid);
    assert_idempotent(&mut w, &ev);
    // The Stripe report of the same payment: `#paid` skipped by the framework; the
    // payment is recorded and the paid total stays (one payment, one invoice).
    let d = w.ok(&pi_succeeded("1001", "pi_1", 4990, 5));
    assert_eq!(effect_keys(&d), ["t1#order-1001#payment#stripe#pi_1"]);
    let o = w.order("1001");
    assert_eq!((o.invoices.len(), o.paid_minor()), (1, 4990));
}

#[test]
fn orders_updated_is_version_guarded_and_never_moves_stock() {
    let mut w = World::new();
    let v2 = orders_updated(1001, "2025-01-01T01:00:00Z", &[(RED, 3)], "149.70");
    assert!(waits(w.deliver(&v2)).starts_with("update before create"));
    // An order known only from Stripe is not created yet either.
    w.ok(&pi_succeeded("1001", "pi_1", 4990, 5));
    assert!(waits(w.deliver(&v2)).starts_with("update before create"));
    w.ok(&orders_create(
        1001,
        "2025-01-01T00:00:00Z",
        &[(RED, 1)],
        "49.90",
        "paid",
    ));
    let d = w.ok(&v2);
    assert_eq!(
        effect_keys(&d),
        ["t1#order-1001#updated#2025-01-01T01:00:00Z"]
    );
    let o = w.order("1001");
    assert_eq!((o.total_minor, o.line_items[0].quantity), (14_970, 3));
    assert_eq!(w.on_hand(RED), 9);
    assert_idempotent(&mut w, &v2);
    // Same instant written with another offset: same version, same effect key.
    let same = orders_updated(1001, "2025-01-01T02:00:00+01:00", &[(RED, 3)], "149.70");
    assert_eq!(
        effect_keys(&w.decide(&same).unwrap()),
        ["t1#order-1001#updated#2025-01-01T01:00:00Z"]
    );
    let older = orders_updated(1001, "2025-01-01T00:30:00Z", &[(RED, 2)], "99.80");
    assert_eq!(
        ignored(&w.ok(&older)),
        "superseded: older version 2025-01-01T00:30:00Z of order 1001"
    );
    assert_eq!(w.order("1001").total_minor, 14_970);
}

#[test]
fn orders_cancelled_restocks_once_and_supersedes_older_updates() {
    let items = [(RED, 2), (BLUE, 1)];
    let mut w = World::new();
    let cancel = orders_cancelled(1001, "2025-01-02T00:00:00Z", &items, "139.70");
    assert!(waits(w.deliver(&cancel)).starts_with("cancel before create"));
    w.ok(&orders_create(
        1001,
        "2025-01-01T00:00:00Z",
        &items,
        "139.70",
        "paid",
    ));
    assert_eq!((w.on_hand(RED), w.on_hand(BLUE)), (8, 4));
    let d = w.ok(&cancel);
    assert_eq!(
        effect_keys(&d),
        [
            "t1#order-1001#cancelled",
            "t1#order-1001#restock#SKU-BLUE-L",
            "t1#order-1001#restock#SKU-RED-M"
        ]
    );
    assert_eq!((w.on_hand(RED), w.on_hand(BLUE)), (10, 5));
    let o = w.order("1001");
    assert_eq!(o.status, OrderStatus::Cancelled);
    assert!(o
        .notifications
        .iter()
        .any(|n| n.kind == NotificationKind::Cancelled));
    assert_eq!(
        o.shopify_updated_at.as_deref(),
        Some("2025-01-02T00:00:00Z")
    );
    assert_idempotent(&mut w, &cancel);
    assert_eq!((w.on_hand(RED), w.on_hand(BLUE)), (10, 5));
    // A late update from before the cancel: superseded, status stays cancelled.
    let late = orders_updated(1001, "2025-01-01T12:00:00Z", &items, "1.00");
    assert!(ignored(&w.ok(&late)).starts_with("superseded: older version"));
    // A newer update changes display fields only.
    w.ok(&orders_updated(
        1001,
        "2025-01-03T00:00:00Z",
        &items,
        "139.70",
    ));
    assert_eq!(w.order("1001").status, OrderStatus::Cancelled);
    assert_eq!((w.on_hand(RED), w.on_hand(BLUE)), (10, 5));
}

#[test]
fn cancel_must_list_the_reserved_skus() {
    let mut w = World::new();
    w.ok(&orders_create(
        1001,
        "2025-01-01T00:00:00Z",
        &[(RED, 2), (BLUE, 1)],
        "139.70",
        "paid",
    ));
    let cancel = orders_cancelled(1001, "2025-01-02T00:00:00Z", &[(RED, 2)], "99.80");
    assert!(permanent(w.deliver(&cancel)).contains("reserved SKU SKU-BLUE-L"));
}

#[test]
fn shopify_refunds_sum_successful_refund_transactions() {
    let mut w = World::new();
    let refund = shopify_refund(1001, 9001, "19.90");
    assert!(waits(w.deliver(&refund)).starts_with("refund before payment"));
    w.ok(&orders_create(
        1001,
        "2025-01-01T00:00:00Z",
        &[(RED, 1)],
        "49.90",
        "pending",
    ));
    assert!(waits(w.deliver(&refund)).starts_with("refund before payment"));
    w.ok(&orders_paid(
        1001,
        "2025-01-01T00:01:00Z",
        &[(RED, 1)],
        "49.90",
    ));
    let d = w.ok(&refund);
    assert_eq!(effect_keys(&d), ["t1#order-1001#refund#9001"]);
    let o = w.order("1001");
    assert_eq!(
        (o.refunded_minor, o.payment_status, o.loyalty_points),
        (1990, PaymentStatus::PartiallyRefunded, 30)
    );
    assert_eq!(
        o.notifications
            .iter()
            .filter(|n| n.kind == NotificationKind::Refunded)
            .count(),
        1
    );
    assert_idempotent(&mut w, &refund);
    let restock_only = shopify(
        "refunds/create",
        "r0",
        json!({"id": 9002, "order_id": 1001, "transactions": []}),
    );
    assert_eq!(ignored(&w.ok(&restock_only)), "refund 9002 moves no money");
}

#[test]
fn one_refund_reported_by_shopify_and_stripe_is_one_refund() {
    let create = orders_create(1001, "2025-01-01T00:00:00Z", &[(RED, 1)], "129.70", "paid");
    let shop = shopify_refund_via_stripe(1001, 9001, "re_1", "49.90", None);
    let stripe = refund_of("1001", "re_1", "pi_1", 4990, 20);
    let charge = charge_refunded("1001", "ch_1", &[("re_1", 4990)], 21);
    let (mut a, mut b) = (World::new(), World::new());
    for w in [&mut a, &mut b] {
        w.ok(&create);
    }
    let d = a.ok(&shop);
    assert_eq!(effect_keys(&d), ["t1#order-1001#refund#re_1"]);
    assert_eq!(result(&d), "order 1001 refund re_1 of 4990");
    for ev in [&stripe, &charge] {
        assert!(result(&a.ok(ev)).starts_with("already applied"));
    }
    b.ok(&stripe);
    assert!(result(&b.ok(&shop)).starts_with("already applied"));
    assert_eq!(a.data(), b.data());
    let o = a.order("1001");
    assert_eq!(
        (o.refunds.len(), o.refunded_minor, o.loyalty_points),
        (1, 4990, 79)
    );
    assert_eq!(o.refunds[0].refund_id, "re_1");
    let refunded = |o: &Order| {
        o.notifications
            .iter()
            .filter(|n| n.kind == NotificationKind::Refunded)
            .count()
    };
    assert_eq!(refunded(&o), 1);

    // A Shopify refund that moved money through Stripe and by hand: the Stripe part
    // is Stripe's refund, the manual part is Shopify's refund id.
    let mixed = shopify_refund_via_stripe(1001, 9002, "re_2", "10.00", Some("5.00"));
    let d = a.ok(&mixed);
    assert_eq!(
        effect_keys(&d),
        ["t1#order-1001#refund#re_2", "t1#order-1001#refund#9002"]
    );
    assert!(
        result(&a.ok(&refund_of("1001", "re_2", "pi_1", 1000, 30))).starts_with("already applied")
    );
    let o = a.order("1001");
    assert_eq!((o.refunds.len(), o.refunded_minor), (3, 4990 + 1000 + 500));

    // Without a common reference (a manual Shopify refund and a Stripe refund) they
    // are two refunds, and the amount paid still bounds them.
    let mut c = World::new();
    c.ok(&orders_create(
        1002,
        "2025-01-01T00:00:00Z",
        &[(RED, 1)],
        "49.90",
        "paid",
    ));
    c.ok(&shopify_refund(1002, 9003, "49.90"));
    assert!(
        permanent(c.deliver(&refund_of("1002", "re_3", "pi_2", 4990, 40)))
            .contains("exceeds the amount paid")
    );
    assert_eq!(c.order("1002").refunded_minor, 4990);
}

#[test]
fn deposit_and_balance_are_both_counted_and_the_balance_can_be_refunded() {
    let create = orders_create(
        1001,
        "2025-01-01T00:00:00Z",
        &[(RED, 1)],
        "129.70",
        "pending",
    );
    let deposit = pi_succeeded("1001", "pi_dep", 3000, 10);
    let balance = pi_succeeded("1001", "pi_bal", 9970, 20);
    let shop_paid = orders_paid(1001, "2025-01-01T00:05:00Z", &[(RED, 1)], "129.70");
    let refund = refund_of("1001", "re_bal", "pi_bal", 9970, 30);

    let mut w = World::new();
    w.ok(&create);
    let d = w.ok(&deposit);
    assert_eq!(result(&d), "order 1001 paid; invoice inv-1001-1");
    // The balance's refund before the balance: within the order's total, it waits
    // for the rest of the payment.
    assert!(waits(w.deliver(&refund)).contains("exceeds the amount paid so far"));
    let d = w.ok(&balance);
    assert_eq!(effect_keys(&d), ["t1#order-1001#payment#stripe#pi_bal"]);
    assert_eq!(
        result(&d),
        "order 1001 payment stripe pi_bal of 9970; paid 12970"
    );
    // Shopify's report of the order paid in full is the same money.
    w.ok(&shop_paid);
    let o = w.order("1001");
    assert_eq!(
        (o.invoices.len(), o.paid_minor(), o.invoices[0].amount_minor),
        (1, 12_970, 12_970)
    );
    assert_eq!((o.total_minor, o.loyalty_points), (12_970, 129));
    assert_eq!(o.payments.len(), 3);
    let d = w.ok(&refund);
    assert_eq!(result(&d), "order 1001 refund re_bal of 9970");
    let o = w.order("1001");
    assert_eq!(
        (o.payment_status, o.refunded_minor, o.loyalty_points),
        (PaymentStatus::PartiallyRefunded, 9970, 30)
    );
    // One payment_received notification, one refunded.
    assert_eq!(o.notifications.len(), 2);
    // Redelivering any of them changes nothing.
    for ev in [&create, &deposit, &balance, &shop_paid, &refund] {
        assert_idempotent(&mut w, ev);
    }

    // Every arrival order ends in the same data.
    let events = [create, deposit, balance, shop_paid, refund];
    let in_order: Vec<usize> = (0..events.len()).collect();
    let clean = run(&events, &in_order, 1);
    for seed in 0..60 {
        let got = run(
            &events,
            &permutation(events.len(), seed),
            1 + (seed as usize % 2),
        );
        assert_eq!(got.data(), clean.data(), "seed {seed}");
    }

    // A record written before payments were recorded: its invoice's amount counts.
    let mut legacy = World::new();
    legacy.ok(&pi_succeeded("1004", "pi_old", 5000, 10));
    let key = order_key(T, "1004");
    let mut record = legacy.records[&key].clone();
    record.data.as_object_mut().unwrap().remove("payments");
    record.applied.retain(|k| !k.contains("#payment#"));
    legacy.records.insert(key, record);
    let o = legacy.order("1004");
    assert_eq!((o.payments.len(), o.paid_minor()), (0, 5000));
    // The same payment redelivered: the total stays; a second payment adds to it.
    legacy.ok(&pi_succeeded("1004", "pi_old", 5000, 10));
    assert_eq!(legacy.order("1004").paid_minor(), 5000);
    legacy.ok(&pi_succeeded("1004", "pi_new", 2000, 20));
    assert_eq!(legacy.order("1004").paid_minor(), 7000);

    // A Stripe-only order: the deposit and the balance make its total.
    let mut s = World::new();
    s.ok(&pi_succeeded("1002", "pi_b", 7000, 20));
    s.ok(&pi_succeeded("1002", "pi_a", 3000, 10));
    let o = s.order("1002");
    assert_eq!((o.total_minor, o.paid_minor()), (10_000, 10_000));
    // There a refund of a payment not recorded yet waits for it.
    let mut s = World::new();
    s.ok(&pi_succeeded("1003", "pi_a", 3000, 10));
    let refund = refund_of("1003", "re_b", "pi_b", 7000, 30);
    assert!(waits(s.deliver(&refund)).contains("until payment pi_b is recorded"));
    s.ok(&pi_succeeded("1003", "pi_b", 7000, 20));
    s.ok(&refund);
    assert_eq!(s.order("1003").refunded_minor, 7000);
}

#[test]
fn fulfillment_records_a_shipment_and_notifies() {
    let mut w = World::new();
    let ev = fulfillment(1001, 7001, "1Z999");
    assert!(waits(w.deliver(&ev)).starts_with("fulfillment before order"));
    w.ok(&orders_create(
        1001,
        "2025-01-01T00:00:00Z",
        &[(RED, 1)],
        "49.90",
        "paid",
    ));
    let d = w.ok(&ev);
    assert_eq!(effect_keys(&d), ["t1#order-1001#fulfillment#7001"]);
    let o = w.order("1001");
    assert_eq!(
        o.shipments,
        [Shipment {
            fulfillment_id: "7001".into(),
            tracking: Some("1Z999".into())
        }]
    );
    assert!(o
        .notifications
        .iter()
        .any(|n| n.kind == NotificationKind::Shipped
            && n.dedup_key == "t1#order-1001#fulfillment#7001"));
    assert_idempotent(&mut w, &ev);
}

// ---- Order independence -------------------------------------------------------------

/// A chronological story of four orders (about 30 events).
fn story() -> Vec<Ev> {
    let o1 = [(RED, 1), (BLUE, 2)];
    let o3 = [(RED, 2)];
    vec![
        // 1001: Shopify order, paid through Stripe (reported by both), one failure first.
        orders_create(1001, "2025-11-29T02:00:05-05:00", &o1, "129.70", "pending"),
        pi_failed("1001", "pi_1001", 12_970, 1_000),
        pi_succeeded("1001", "pi_1001", 12_970, 1_010),
        orders_paid(1001, "2025-11-29T02:06:41-05:00", &o1, "129.70"),
        orders_updated(1001, "2025-11-29T03:00:00-05:00", &o1, "129.70"),
        fulfillment(1001, 7001, "1Z1"),
        fulfillment(1001, 7002, "1Z2"),
        charge_refunded("1001", "ch_1001", &[("re_1001_a", 4990)], 2_000),
        refund_created("1001", "re_1001_a", 4990, 2_001),
        // 1002: Stripe only: checkout, two failed attempts, success, two refunds.
        checkout("1002", "cs_1002", 2500, false, 1_100),
        pi_failed("1002", "pi_1002a", 2500, 1_110),
        pi_failed("1002", "pi_1002b", 2500, 1_120),
        pi_succeeded("1002", "pi_1002b", 2500, 1_130),
        refund_created("1002", "re_1002_a", 1000, 2_100),
        charge_refunded("1002", "ch_1002", &[("re_1002_a", 1000)], 2_101),
        charge_refunded(
            "1002",
            "ch_1002",
            &[("re_1002_a", 1000), ("re_1002_b", 500)],
            2_200,
        ),
        refund_created("1002", "re_1002_b", 500, 2_201),
        // 1003: Shopify only, created paid, updated, shipped, cancelled (restock).
        orders_create(1003, "2025-12-01T10:00:00Z", &o3, "99.80", "paid"),
        orders_updated(1003, "2025-12-01T11:00:00Z", &o3, "89.80"),
        fulfillment(1003, 7003, "1Z3"),
        orders_updated(1003, "2025-12-01T12:00:00Z", &o3, "79.80"),
        orders_cancelled(1003, "2025-12-02T09:00:00Z", &o3, "79.80"),
        orders_updated(1003, "2025-12-02T09:00:00Z", &o3, "79.80"),
        orders_updated(1003, "2025-12-03T09:00:00Z", &o3, "0.00"),
        // 1004: Shopify order paid on Shopify, refunded in two parts.
        orders_create(
            1004,
            "2025-12-05T10:00:00Z",
            &[(BLUE, 1)],
            "39.90",
            "pending",
        ),
        orders_paid(1004, "2025-12-05T10:05:00Z", &[(BLUE, 1)], "39.90"),
        shopify_refund(1004, 9401, "9.90"),
        shopify_refund(1004, 9402, "30.00"),
        fulfillment(1004, 7004, "1Z4"),
        // 1005: checkout paid, then the intent's own success report.
        checkout("1005", "cs_1005", 1999, true, 1_200),
        pi_succeeded("1005", "pi_1005", 1999, 1_201),
        // 1006: Shopify order paid through Stripe in two parts (deposit + balance),
        // the balance refunded, reported by Shopify and by Stripe.
        orders_create(1006, "2025-12-06T10:00:00Z", &o3, "99.80", "pending"),
        pi_succeeded("1006", "pi_1006_dep", 2000, 1_300),
        pi_succeeded("1006", "pi_1006_bal", 7980, 1_310),
        orders_paid(1006, "2025-12-06T10:10:00Z", &o3, "99.80"),
        shopify_refund_via_stripe(1006, 9601, "re_1006_bal", "79.80", None),
        refund_of("1006", "re_1006_bal", "pi_1006_bal", 7980, 2_300),
    ]
}

/// Deliver every event (each `copies` times), in `order`; a Wait goes to the back.
fn run(events: &[Ev], order: &[usize], copies: usize) -> World {
    let mut w = World::new();
    let mut queue: VecDeque<Ev> = VecDeque::new();
    for c in 0..copies {
        for &i in order {
            queue.push_back(events[i].redelivered(c));
        }
    }
    let mut waits_in_a_row = 0;
    while let Some(ev) = queue.pop_front() {
        match w.deliver(&ev) {
            Ok(_) => waits_in_a_row = 0,
            Err(DomainError::Wait(_)) => {
                waits_in_a_row += 1;
                assert!(
                    waits_in_a_row <= queue.len() + 1,
                    "nothing can make progress: {:?}",
                    ev.env.event_type
                );
                queue.push_back(ev);
            }
            Err(e) => panic!("{} {}: {e}", ev.env.event_type, ev.env.event_id),
        }
    }
    w
}

/// Deterministic Fisher-Yates with a 64-bit LCG.
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut s = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    for i in (1..n).rev() {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let j = ((s >> 33) as usize) % (i + 1);
        order.swap(i, j);
    }
    order
}

#[test]
fn every_arrival_order_converges_to_the_same_data() {
    let events = story();
    let n = events.len();
    assert!(n >= 30);
    let in_order: Vec<usize> = (0..n).collect();
    let clean = run(&events, &in_order, 1);

    // The clean pass is what the business expects.
    let o1 = clean.order("1001");
    assert_eq!(
        (o1.payment_status, o1.refunded_minor, o1.loyalty_points),
        (PaymentStatus::PartiallyRefunded, 4990, 79)
    );
    assert_eq!((o1.invoices.len(), o1.shipments.len()), (1, 2));
    assert!(o1
        .notifications
        .iter()
        .all(|n| n.kind != NotificationKind::PaymentFailed));
    let o2 = clean.order("1002");
    assert_eq!(
        (o2.payment_status, o2.refunded_minor, o2.refunds.len()),
        (PaymentStatus::PartiallyRefunded, 1500, 2)
    );
    let o3 = clean.order("1003");
    assert_eq!((o3.status, o3.total_minor), (OrderStatus::Cancelled, 0));
    let o4 = clean.order("1004");
    assert_eq!(
        (o4.payment_status, o4.loyalty_points),
        (PaymentStatus::Refunded, 0)
    );
    assert_eq!(clean.order("1005").invoices.len(), 1);
    let o6 = clean.order("1006");
    assert_eq!(
        (o6.paid_minor(), o6.refunded_minor, o6.refunds.len()),
        (9980, 7980, 1)
    );
    assert_eq!((clean.on_hand(RED), clean.on_hand(BLUE)), (7, 2));

    let reversed: Vec<usize> = (0..n).rev().collect();
    let mut orders = vec![
        reversed,
        permutation(n, 1),
        permutation(n, 2),
        permutation(n, 3),
    ];
    orders.extend((10..210).map(|seed| permutation(n, seed)));
    for (i, order) in orders.iter().enumerate() {
        let copies = if i % 2 == 0 { 2 } else { 1 };
        let got = run(&events, order, copies);
        assert_eq!(
            got.data(),
            clean.data(),
            "permutation #{i} {order:?} diverged"
        );
    }
    // Each pass over the events twice in order changes nothing more than once.
    assert_eq!(run(&events, &in_order, 2).data(), clean.data());
}

#[test]
fn every_event_is_idempotent_in_the_story() {
    let mut w = World::new();
    for ev in story() {
        w.ok(&ev);
        assert_idempotent(&mut w, &ev);
    }
    assert!(!w.has_order("9999"));
}

// ---- Samples ------------------------------------------------------------------------

fn sample(name: &str) -> Ev {
    let path = format!(
        "{}/../events/samples/domain/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let body: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    match name.split_once('-').unwrap() {
        ("stripe", ty) => {
            assert_eq!(body["type"], ty, "{name}");
            stripe(
                ty,
                body["id"].as_str().unwrap(),
                body["created"].as_i64().unwrap(),
                body["data"]["object"].clone(),
            )
        }
        ("shopify", topic) => shopify(&topic.replacen('-', "/", 1), name, body),
        _ => unreachable!(),
    }
}

#[test]
fn samples_tell_one_consistent_story() {
    let names = [
        "shopify-orders-create",
        "stripe-payment_intent.payment_failed",
        "stripe-checkout.session.completed",
        "stripe-payment_intent.succeeded",
        "shopify-orders-paid",
        "shopify-orders-updated",
        "shopify-fulfillments-create",
        "stripe-charge.refunded",
        "stripe-refund.created",
        "shopify-refunds-create",
        "shopify-orders-cancelled",
    ];
    let events: Vec<Ev> = names.iter().map(|n| sample(n)).collect();
    for (name, ev) in names.iter().zip(&events) {
        assert!(
            ReferenceDomain::supports(&ev.env.provider, &ev.env.event_type),
            "{name}"
        );
        assert_eq!(
            ReferenceDomain.targets(&ev.view()).unwrap()[0],
            order_key(T, "1001"),
            "{name}"
        );
    }
    let in_order: Vec<usize> = (0..events.len()).collect();
    let w = run(&events, &in_order, 1);
    let o = w.order("1001");
    assert_eq!(o.status, OrderStatus::Cancelled);
    assert_eq!(
        (o.total_minor, o.currency.as_deref()),
        (12_970, Some("EUR"))
    );
    assert_eq!(
        (o.payment_status, o.refunded_minor, o.loyalty_points),
        (PaymentStatus::Refunded, 12_970, 0)
    );
    assert_eq!(
        (o.invoices.len(), o.refunds.len(), o.shipments.len()),
        (1, 2, 1)
    );
    assert_eq!((w.on_hand(RED), w.on_hand(BLUE)), (10, 5));
    for seed in 0..20 {
        let got = run(&events, &permutation(events.len(), seed), 2);
        assert_eq!(got.data(), w.data(), "seed {seed}");
    }
}

mod providers;

// ---- Shopify: the unsigned topic only selects; the signed body decides -------------

#[test]
fn shopify_bodies_under_a_topic_they_contradict_are_ignored() {
    let w = World::new();
    let create = order_body(
        1001,
        "2025-01-01T00:00:00Z",
        &[(RED, 1)],
        "49.90",
        "pending",
    );
    let refund = json!({"id": 9001, "order_id": 1001, "refund_line_items": [],
                        "transactions": [{"kind": "refund", "status": "success", "amount": "1.00"}]});
    let ship = json!({"id": 7001, "order_id": 1001, "tracking_number": "1Z"});
    let cases = [
        ("orders/paid", create.clone(), "orders/paid: the signed order's financial_status is pending, not paid (the topic header is not signed)"),
        ("orders/cancelled", create.clone(), "orders/cancelled: the signed order has no cancelled_at (the topic header is not signed)"),
        ("refunds/create", create.clone(), "refunds/create: the signed body is an order, not a refund (the topic header is not signed)"),
        ("fulfillments/create", create.clone(), "fulfillments/create: the signed body is an order, not a fulfillment (the topic header is not signed)"),
        ("orders/create", refund.clone(), "orders/create: the signed body is a refund, not an order (the topic header is not signed)"),
        ("orders/paid", ship.clone(), "orders/paid: the signed body is a fulfillment, not an order (the topic header is not signed)"),
        ("fulfillments/create", refund.clone(), "fulfillments/create: the signed body is a refund, not a fulfillment (the topic header is not signed)"),
        ("refunds/create", ship.clone(), "refunds/create: the signed body is a fulfillment, not a refund (the topic header is not signed)"),
    ];
    for (topic, body, reason) in cases {
        let d = w.decide(&shopify(topic, "replay", body)).unwrap();
        assert_eq!(ignored(&d), reason, "{topic}");
    }
    // Unknown financial statuses are not echoed into the reason.
    let mut odd = create.clone();
    odd["financial_status"] = json!("jon@example.com");
    let d = w.decide(&shopify("orders/paid", "replay", odd)).unwrap();
    assert!(!ignored(&d).contains("jon"), "{}", ignored(&d));
    // A refund under its own topic is not refused (it waits for the paid order).
    assert!(matches!(
        w.decide(&shopify("refunds/create", "r", refund)),
        Err(DomainError::Wait(_))
    ));
    // The genuine bodies under their own topics map as before.
    let paid = order_body(1001, "2025-01-01T00:00:00Z", &[(RED, 1)], "49.90", "paid");
    assert!(matches!(
        w.decide(&shopify("orders/paid", "p", paid)),
        Err(DomainError::Wait(_))
    ));
}

#[test]
fn notifications_become_outputs_once_per_dedup_key_also_on_a_rerun() {
    let mut w = World::new();
    let ev = pi_succeeded("1001", "pi_1", 12_970, 100);
    let d = w.ok(&ev);
    let outputs = ReferenceDomain.outputs(&ev.view(), changes(&d));
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    let o = &outputs[0];
    assert_eq!(o.kind, "notification.payment_received");
    assert_eq!(o.key, "t1#order-1001#paid");
    assert_eq!(o.object_id.as_deref(), Some("1001"));
    assert_eq!(o.data["payment_status"], "paid");
    // The crash between commit and finish: the re-run decides "already applied" and
    // finds the same output.
    let again = w.decide(&ev).unwrap();
    assert_eq!(
        ReferenceDomain.outputs(&ev.view(), changes(&again)),
        outputs
    );
    // A later event of the order (a refund) yields only its own notification.
    let refund = refund_created("1001", "re_1", 12_970, 200);
    let d = w.ok(&refund);
    let kinds: Vec<String> = ReferenceDomain
        .outputs(&refund.view(), changes(&d))
        .into_iter()
        .map(|o| o.kind)
        .collect();
    assert_eq!(kinds, ["notification.refunded"]);
}
