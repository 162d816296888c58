//! The business-invariant checker every scenario ends with, and the check that nothing
//! regresses between two observations of the same records.

use std::collections::{BTreeMap, BTreeSet};

use einmal::domain::reference::{
    NotificationKind, Order, OrderStatus, PaymentStatus, Sku, ORDER, SKU,
};
use einmal::domain::state::StateRecord;

use super::{Backend, TENANT};

/// Checks what must hold after any sequence of deliveries, whatever the order,
/// duplicates or crashes: no second invoice, refund, shipment, stock movement or
/// notification, derived numbers consistent with the facts, and stock equal to
/// `seeded − reserved + restocked`. Also: every inbox item is terminal. Returns the
/// business state it checked.
pub async fn check_invariants(b: &Backend, seeds: &[(&str, i64)]) -> BTreeMap<String, StateRecord> {
    let state = b.business_state().await;
    let mut orders: Vec<(&StateRecord, Order)> = Vec::new();
    let mut skus: BTreeMap<String, (&StateRecord, Sku)> = BTreeMap::new();
    for record in state.values() {
        match record.key.kind.as_str() {
            ORDER => {
                let order: Order = serde_json::from_value(record.data.clone())
                    .unwrap_or_else(|e| panic!("{}: order does not parse: {e}", record.key.pk()));
                assert_eq!(order.order_id, record.key.id);
                orders.push((record, order));
            }
            SKU => {
                let sku: Sku = serde_json::from_value(record.data.clone())
                    .unwrap_or_else(|e| panic!("{}: sku does not parse: {e}", record.key.pk()));
                skus.insert(sku.sku.clone(), (record, sku));
            }
            other => panic!("unexpected record kind {other}"),
        }
    }
    for (record, o) in &orders {
        check_order(record, o);
    }

    // Stock: exactly seeded − reserved + restocked, and one movement per order.
    let seeded: BTreeSet<&str> = seeds.iter().map(|(s, _)| *s).collect();
    let found: BTreeSet<&str> = skus.keys().map(String::as_str).collect();
    assert_eq!(found, seeded, "SKU records are exactly the seeded ones");
    for (sku, seed) in seeds {
        let (record, data) = &skus[*sku];
        let mut expected = *seed;
        let mut takers = BTreeSet::new();
        let mut restockers = BTreeSet::new();
        for (_, o) in &orders {
            for line in o.stock_reserved.iter().filter(|l| l.sku == *sku) {
                expected -= line.quantity;
                takers.insert(format!("{TENANT}#order-{}#stock#{sku}", o.order_id));
                if o.status == OrderStatus::Cancelled {
                    expected += line.quantity;
                    restockers.insert(format!("{TENANT}#order-{}#restock#{sku}", o.order_id));
                }
            }
        }
        assert_eq!(
            data.on_hand, expected,
            "{}: on_hand must be seeded {seed} − reserved + restocked",
            sku
        );
        // The movements' keys live on the orders; the SKU record carries none of them
        // (it must not grow with the number of orders).
        let keys_of = |kind: &str| -> BTreeSet<String> {
            orders
                .iter()
                .flat_map(|(r, _)| r.applied.iter())
                .filter(|k| k.contains(kind) && k.ends_with(&format!("#{sku}")))
                .cloned()
                .collect()
        };
        assert_eq!(
            keys_of("#stock#"),
            takers,
            "{sku}: one stock movement per order"
        );
        assert_eq!(
            keys_of("#restock#"),
            restockers,
            "{sku}: one restock per cancel"
        );
        assert!(
            record.applied.iter().all(|k| k.ends_with("#seed")),
            "{sku}: only the seed key on the SKU record: {:?}",
            record.applied
        );
    }

    // Every inbox item is finished.
    let items = b.items().await;
    let open: Vec<String> = items
        .iter()
        .filter(|i| !i.state.is_terminal())
        .map(|i| format!("{} {}", i.key, i.state))
        .collect();
    assert!(
        open.is_empty(),
        "{}: inbox items not terminal: {open:?}",
        b.name
    );
    state
}

fn check_order(record: &StateRecord, o: &Order) {
    let id = &o.order_id;
    let keys = einmal::domain::reference::EffectKeys::new(TENANT, id);
    let unique = |what: &str, ids: Vec<&str>| {
        let set: BTreeSet<&str> = ids.iter().copied().collect();
        assert_eq!(
            set.len(),
            ids.len(),
            "order {id}: duplicate {what}: {ids:?}"
        );
    };
    assert!(
        o.invoices.len() <= 1,
        "order {id}: {} invoices",
        o.invoices.len()
    );
    if let Some(inv) = o.invoices.first() {
        assert_eq!(inv.invoice_id, format!("inv-{id}-1"));
        assert_eq!(inv.source_effect, keys.paid());
        assert!(
            record.applied.contains(&keys.paid()),
            "order {id}: #paid not recorded"
        );
    } else {
        assert!(
            !record.applied.contains(&keys.paid()),
            "order {id}: #paid without invoice"
        );
    }
    unique(
        "refunds",
        o.refunds.iter().map(|r| r.refund_id.as_str()).collect(),
    );
    unique(
        "shipments",
        o.shipments
            .iter()
            .map(|s| s.fulfillment_id.as_str())
            .collect(),
    );
    unique(
        "notifications",
        o.notifications
            .iter()
            .map(|n| n.dedup_key.as_str())
            .collect(),
    );
    for r in &o.refunds {
        assert!(r.amount_minor > 0);
        assert!(record.applied.contains(&keys.refund(&r.refund_id)));
    }
    for s in &o.shipments {
        assert!(record
            .applied
            .contains(&keys.fulfillment(&s.fulfillment_id)));
    }
    let refunded: i64 = o.refunds.iter().map(|r| r.amount_minor).sum();
    assert_eq!(o.refunded_minor, refunded, "order {id}: refunded_minor");
    assert!(
        refunded <= o.paid_minor(),
        "order {id}: refunded more than paid"
    );
    if !o.refunds.is_empty() {
        assert!(o.is_paid(), "order {id}: refund on an unpaid order");
    }
    let count = |kind| o.notifications.iter().filter(|n| n.kind == kind).count();
    assert_eq!(
        count(NotificationKind::PaymentReceived),
        o.invoices.len(),
        "order {id}"
    );
    assert_eq!(
        count(NotificationKind::Refunded),
        o.refunds.len(),
        "order {id}"
    );
    assert_eq!(
        count(NotificationKind::Shipped),
        o.shipments.len(),
        "order {id}"
    );
    assert_eq!(
        count(NotificationKind::Cancelled),
        usize::from(o.status == OrderStatus::Cancelled),
        "order {id}"
    );
    let failures = count(NotificationKind::PaymentFailed);
    if o.is_paid() {
        assert_eq!(failures, 0, "order {id}: failure notice on a paid order");
        assert_eq!(o.payment_event_at, None);
        let paid = o.paid_minor();
        let expected = if refunded == 0 {
            PaymentStatus::Paid
        } else if refunded >= paid {
            PaymentStatus::Refunded
        } else {
            PaymentStatus::PartiallyRefunded
        };
        assert_eq!(o.payment_status, expected, "order {id}");
        assert_eq!(o.loyalty_points, (paid - refunded) / 100, "order {id}");
    } else {
        assert!(failures <= 1, "order {id}: several failure notices");
        let expected = if failures == 1 {
            PaymentStatus::Failed
        } else {
            PaymentStatus::Pending
        };
        assert_eq!(o.payment_status, expected, "order {id}");
        assert_eq!(o.loyalty_points, 0);
    }
    assert_eq!(
        o.shopify_created,
        record.applied.contains(&keys.created()),
        "order {id}: created flag vs effect"
    );
    if !o.shopify_created {
        assert!(
            o.stock_reserved.is_empty(),
            "order {id}: stock without create"
        );
    }
}

/// What may never happen between two observations of the same records: a version
/// going back, an effect key disappearing, a fact (invoice, refund, shipment,
/// notification other than a withdrawn payment-failure notice) disappearing, a paid
/// order becoming unpaid, a cancelled order reopening, an older Shopify version
/// replacing a newer one.
pub fn assert_no_regression(
    before: &BTreeMap<String, StateRecord>,
    after: &BTreeMap<String, StateRecord>,
) {
    for (pk, old) in before {
        let new = after
            .get(pk)
            .unwrap_or_else(|| panic!("record {pk} disappeared"));
        assert!(
            new.version >= old.version,
            "{pk}: version went back from {} to {}",
            old.version,
            new.version
        );
        if new.version == old.version {
            assert_eq!(
                new.data, old.data,
                "{pk}: data changed without a new version"
            );
            continue;
        }
        assert!(
            old.applied.is_subset(&new.applied),
            "{pk}: effect keys disappeared: {:?}",
            old.applied.difference(&new.applied).collect::<Vec<_>>()
        );
        if old.key.kind != ORDER {
            continue;
        }
        let (o, n): (Order, Order) = (
            serde_json::from_value(old.data.clone()).expect("order"),
            serde_json::from_value(new.data.clone()).expect("order"),
        );
        let kept = |what: &str, a: Vec<String>, b: Vec<String>| {
            let b: BTreeSet<String> = b.into_iter().collect();
            for x in a {
                assert!(b.contains(&x), "{pk}: {what} {x} disappeared");
            }
        };
        kept(
            "invoice",
            o.invoices.iter().map(|i| format!("{i:?}")).collect(),
            n.invoices.iter().map(|i| format!("{i:?}")).collect(),
        );
        kept(
            "refund",
            o.refunds.iter().map(|r| format!("{r:?}")).collect(),
            n.refunds.iter().map(|r| format!("{r:?}")).collect(),
        );
        kept(
            "shipment",
            o.shipments.iter().map(|s| format!("{s:?}")).collect(),
            n.shipments.iter().map(|s| format!("{s:?}")).collect(),
        );
        kept(
            "notification",
            o.notifications
                .iter()
                .filter(|x| x.kind != NotificationKind::PaymentFailed)
                .map(|x| x.dedup_key.clone())
                .collect(),
            n.notifications
                .iter()
                .map(|x| x.dedup_key.clone())
                .collect(),
        );
        kept(
            "stock reservation",
            o.stock_reserved.iter().map(|s| format!("{s:?}")).collect(),
            n.stock_reserved.iter().map(|s| format!("{s:?}")).collect(),
        );
        assert!(
            !o.is_paid() || n.is_paid(),
            "{pk}: paid order became unpaid"
        );
        assert!(
            o.status != OrderStatus::Cancelled || n.status == OrderStatus::Cancelled,
            "{pk}: cancelled order reopened"
        );
        assert!(!o.shopify_created || n.shopify_created, "{pk}: un-created");
        // Canonical UTC text orders like time.
        assert!(
            o.shopify_updated_at <= n.shopify_updated_at,
            "{pk}: version went back from {:?} to {:?}",
            o.shopify_updated_at,
            n.shopify_updated_at
        );
    }
}
