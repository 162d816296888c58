//! From an [`Event`] and the loaded records to a [`Decision`].
//!
//! An event is a list of business effects, each with its effect key and its record.
//! For every effect: if its key is already in the record's `applied` set it is *done*
//! (the framework will skip it); otherwise it is applied to the typed data, where it
//! either changes the data (*new*) or finds it already reflected / not allowed
//! (*skipped*, with a reason). Each new effect becomes one [`Change`] tagged with its
//! own key; all changes of one record carry the same, full new data of that record
//! (the framework merges them into one write and records every key, so each business
//! effect is in `applied` whichever event brought it).
//!
//! Decision: any new effect → `Apply` with the changed records; else, any done effect
//! → `Apply` restating the already-applied keys with unchanged data (a pure duplicate:
//! the framework drops them); else `Ignore` with the reasons.

use serde::Serialize;

use super::model::{
    parse_data, to_data, EffectKeys, Invoice, NotificationKind, Order, OrderStatus, Payment,
    PaymentStatus, Refund, Shipment, Sku, INVOICE_PAYMENT, SHOPIFY_ORDER_PAYMENT,
};
use super::{shopify, Event, PaymentRef, RefundFact, Snapshot};
use crate::domain::state::{StateKey, StateRecord};
use crate::domain::{Change, Decision, DomainError};

enum Step {
    /// The data changed; a short summary for the result.
    Changed(String),
    /// Nothing to change: already reflected, superseded, or not allowed (the reason).
    Skipped(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Done,
    Changed,
    Skipped,
}

#[derive(Default)]
struct Notes {
    summary: Vec<String>,
    reasons: Vec<String>,
}

/// One loaded record being decided on.
struct Tracked<'r, T> {
    record: &'r StateRecord,
    /// The record whose `applied` set holds this record's effect keys, when that is
    /// not the record itself (a SKU's stock moves are keyed on the order).
    owner: Option<&'r StateRecord>,
    value: T,
    new_keys: Vec<String>,
    done_keys: Vec<String>,
}

impl<'r, T: Clone + Serialize> Tracked<'r, T> {
    fn new(record: &'r StateRecord, value: T) -> Self {
        Tracked {
            record,
            owner: None,
            value,
            new_keys: Vec::new(),
            done_keys: Vec::new(),
        }
    }

    /// A record many events change: its effect keys live on `owner`, so it does not
    /// grow with the number of events that touched it.
    fn keyed_on(record: &'r StateRecord, value: T, owner: &'r StateRecord) -> Self {
        Tracked {
            owner: Some(owner),
            ..Tracked::new(record, value)
        }
    }

    fn effect(
        &mut self,
        key: String,
        notes: &mut Notes,
        f: impl FnOnce(&mut T) -> Result<Step, DomainError>,
    ) -> Result<Outcome, DomainError> {
        // The record itself may hold a key from before its keys moved to the owner.
        let applied = |r: &StateRecord| r.applied.contains(&key);
        if applied(self.record) || self.owner.is_some_and(applied) {
            self.done_keys.push(key);
            return Ok(Outcome::Done);
        }
        let before = self.value.clone();
        match f(&mut self.value)? {
            Step::Changed(summary) => {
                if !summary.is_empty() {
                    notes.summary.push(summary);
                }
                self.new_keys.push(key);
                Ok(Outcome::Changed)
            }
            Step::Skipped(reason) => {
                self.value = before;
                notes.reasons.push(reason);
                Ok(Outcome::Skipped)
            }
        }
    }

    fn finish(self) -> Part {
        Part {
            key: self.record.key.clone(),
            keyed_on: self.owner.map(|o| o.key.clone()),
            original: self.record.data.clone(),
            data: to_data(&self.value),
            new_keys: self.new_keys,
            done_keys: self.done_keys,
        }
    }
}

struct Part {
    key: StateKey,
    keyed_on: Option<StateKey>,
    original: serde_json::Value,
    data: serde_json::Value,
    new_keys: Vec<String>,
    done_keys: Vec<String>,
}

fn assemble(parts: Vec<Part>, notes: Notes) -> Decision {
    let changes = |p: &Part, keys: &[String], data: &serde_json::Value| -> Vec<Change> {
        keys.iter()
            .map(|k| Change {
                key: p.key.clone(),
                effect_key: k.clone(),
                data: data.clone(),
                keyed_on: p.keyed_on.clone(),
            })
            .collect()
    };
    let new: Vec<Change> = parts
        .iter()
        .filter(|p| p.data != p.original)
        .flat_map(|p| changes(p, &p.new_keys, &p.data))
        .collect();
    if !new.is_empty() {
        return Decision::Apply {
            changes: new,
            result: notes.summary.join("; "),
        };
    }
    let done: Vec<Change> = parts
        .iter()
        .flat_map(|p| changes(p, &p.done_keys, &p.original))
        .collect();
    if !done.is_empty() {
        let keys: Vec<&str> = done.iter().map(|c| c.effect_key.as_str()).collect();
        let result = format!("already applied: {}", keys.join(", "));
        return Decision::Apply {
            changes: done,
            result,
        };
    }
    let reason = if notes.reasons.is_empty() {
        "nothing to apply".to_owned()
    } else {
        notes.reasons.join("; ")
    };
    Decision::Ignore { reason }
}

fn load_order(record: &StateRecord) -> Result<Option<Order>, DomainError> {
    if !record.exists() {
        return Ok(None);
    }
    let order: Order = parse_data(record)?;
    if order.order_id != record.key.id {
        return Err(DomainError::Permanent(format!(
            "record {} holds another order",
            record.key.pk()
        )));
    }
    Ok(Some(order))
}

fn load_sku(record: &StateRecord) -> Result<Option<Sku>, DomainError> {
    if !record.exists() {
        return Ok(None);
    }
    let sku: Sku = parse_data(record)?;
    if sku.sku != record.key.id {
        return Err(DomainError::Permanent(format!(
            "record {} holds another SKU",
            record.key.pk()
        )));
    }
    Ok(Some(sku))
}

pub(super) fn decide(
    event: &Event,
    tenant: &str,
    current: &[StateRecord],
) -> Result<Decision, DomainError> {
    let id = event.order_id();
    let keys = EffectKeys::new(tenant, id);
    let mut notes = Notes::default();
    let mut order = Tracked::new(&current[0], load_order(&current[0])?);
    let mut skus = Vec::with_capacity(current.len() - 1);
    for record in &current[1..] {
        // SKUs are touched by every order: their stock moves are keyed on the order.
        skus.push(Tracked::keyed_on(record, load_sku(record)?, &current[0]));
    }

    match event {
        Event::Checkout {
            session_id,
            amount,
            currency,
            paid,
            payment_intent,
            ..
        } => {
            order.effect(keys.checkout(session_id), &mut notes, |o| {
                if o.is_some() {
                    return Ok(Step::Skipped(format!("order {id} already exists")));
                }
                *o = Some(minimal(id, currency.as_deref(), amount.unwrap_or(0)));
                Ok(Step::Changed(format!(
                    "order {id} opened by checkout {session_id}"
                )))
            })?;
            if *paid {
                let amount = amount.unwrap_or(0);
                let invoiced = order.effect(keys.paid(), &mut notes, |o| {
                    pay(o, &keys, id, amount, currency.as_deref(), None)
                })?;
                // A session without a payment intent names no payment to record: its
                // amount stays the invoice's.
                if let Some(intent) = payment_intent {
                    let payment = PaymentRef::new("stripe", intent);
                    record_payment(
                        &mut order, &keys, &mut notes, id, &payment, amount, invoiced,
                    )?;
                }
            }
        }
        Event::PaymentSucceeded {
            payment,
            amount,
            currency,
            ..
        } => {
            let invoiced = order.effect(keys.paid(), &mut notes, |o| {
                pay(o, &keys, id, *amount, currency.as_deref(), None)
            })?;
            record_payment(
                &mut order, &keys, &mut notes, id, payment, *amount, invoiced,
            )?;
        }
        Event::ShopifyPaid { amount, .. } => {
            let wait = Some("orders/paid before the order exists");
            let invoiced = order.effect(keys.paid(), &mut notes, |o| {
                pay(o, &keys, id, *amount, None, wait)
            })?;
            let payment = PaymentRef::new("shopify", SHOPIFY_ORDER_PAYMENT);
            record_payment(
                &mut order, &keys, &mut notes, id, &payment, *amount, invoiced,
            )?;
        }
        Event::PaymentFailed {
            payment_id,
            at,
            amount,
            currency,
            ..
        } => {
            let key = keys.payment_failed(payment_id, *at);
            order.effect(key.clone(), &mut notes, |o| {
                let order = o.get_or_insert_with(|| minimal(id, currency.as_deref(), *amount));
                if order.is_paid() {
                    return Ok(Step::Skipped(format!(
                        "superseded: order {id} already paid"
                    )));
                }
                let last = order
                    .notifications
                    .iter()
                    .find(|n| n.kind == NotificationKind::PaymentFailed);
                let last_key = last.map(|n| n.dedup_key.as_str()).unwrap_or("");
                if let Some(last_at) = order.payment_event_at {
                    if (*at, key.as_str()) <= (last_at, last_key) {
                        return Ok(Step::Skipped(format!(
                            "superseded: payment failure older than the last one of order {id}"
                        )));
                    }
                }
                order.payment_status = PaymentStatus::Failed;
                order.payment_event_at = Some(*at);
                // Only the newest failure is worth telling the customer about.
                order
                    .notifications
                    .retain(|n| n.kind != NotificationKind::PaymentFailed);
                order.notify(NotificationKind::PaymentFailed, &key);
                order.normalize();
                Ok(Step::Changed(format!(
                    "order {id} payment {payment_id} failed"
                )))
            })?;
        }
        Event::Refunds { refunds, .. } => {
            if refunds.is_empty() {
                notes
                    .reasons
                    .push(format!("no refund of order {id} moves money"));
            }
            for r in refunds {
                order.effect(keys.refund(&r.id), &mut notes, |o| refund(o, &keys, id, r))?;
            }
        }
        Event::PaymentCancelled {
            payment_id,
            amount,
            currency,
            ..
        } => {
            order.effect(keys.payment_cancelled(payment_id), &mut notes, |o| {
                let order = o.get_or_insert_with(|| minimal(id, currency.as_deref(), *amount));
                if order.status == OrderStatus::Cancelled {
                    return Ok(Step::Skipped(format!("order {id} already cancelled")));
                }
                order.status = OrderStatus::Cancelled;
                // The same notification as a Shopify cancel: one per order.
                order.notify(NotificationKind::Cancelled, &keys.cancelled());
                order.normalize();
                Ok(Step::Changed(format!(
                    "order {id} cancelled (payment {payment_id} cancelled)"
                )))
            })?;
        }
        Event::Fulfillment {
            fulfillment_id,
            tracking,
            ..
        } => {
            let key = keys.fulfillment(fulfillment_id);
            order.effect(key.clone(), &mut notes, |o| {
                let Some(order) = o else {
                    return Err(DomainError::Wait(format!(
                        "fulfillment before order {id} exists"
                    )));
                };
                if order
                    .shipments
                    .iter()
                    .any(|s| s.fulfillment_id == *fulfillment_id)
                {
                    return Ok(Step::Skipped(format!(
                        "fulfillment {fulfillment_id} already recorded"
                    )));
                }
                order.shipments.push(Shipment {
                    fulfillment_id: fulfillment_id.clone(),
                    tracking: tracking.clone(),
                });
                order.notify(NotificationKind::Shipped, &key);
                order.normalize();
                Ok(Step::Changed(format!(
                    "order {id} shipped (fulfillment {fulfillment_id})"
                )))
            })?;
        }
        Event::ShopifyCreate { snapshot, paid } => {
            let created = order.effect(keys.created(), &mut notes, |o| {
                let order = o.get_or_insert_with(|| Order::new(id));
                if order.shopify_created {
                    return Ok(Step::Skipped(format!("order {id} already created")));
                }
                order.shopify_created = true;
                apply_snapshot(order, snapshot);
                order.stock_reserved = snapshot.stock.clone();
                order.normalize();
                Ok(Step::Changed(format!("order {id} created")))
            })?;
            if created == Outcome::Changed {
                for (sku, line) in skus.iter_mut().zip(&snapshot.stock) {
                    sku.effect(keys.stock(&line.sku), &mut notes, |s| {
                        let s = s.as_mut().ok_or_else(|| unknown_sku(&line.sku))?;
                        s.on_hand -= line.quantity;
                        Ok(Step::Changed(format!("{} -{}", line.sku, line.quantity)))
                    })?;
                }
            }
            if *paid {
                let amount = snapshot.total_minor;
                let invoiced = order.effect(keys.paid(), &mut notes, |o| {
                    pay(o, &keys, id, amount, None, None)
                })?;
                let payment = PaymentRef::new("shopify", SHOPIFY_ORDER_PAYMENT);
                record_payment(
                    &mut order, &keys, &mut notes, id, &payment, amount, invoiced,
                )?;
            }
        }
        Event::ShopifyUpdated { snapshot } => {
            order.effect(keys.updated(&snapshot.version), &mut notes, |o| {
                let order = created_order(o, id, "update before create")?;
                if !apply_snapshot(order, snapshot) {
                    return Ok(Step::Skipped(format!(
                        "superseded: older version {} of order {id}",
                        snapshot.version
                    )));
                }
                order.normalize();
                Ok(Step::Changed(format!(
                    "order {id} updated to {}",
                    snapshot.version
                )))
            })?;
        }
        Event::ShopifyCancelled { snapshot } => {
            order.effect(keys.cancelled(), &mut notes, |o| {
                let order = created_order(o, id, "cancel before create")?;
                let was_cancelled = order.status == OrderStatus::Cancelled;
                order.status = OrderStatus::Cancelled;
                // Also advances the version: a late, older orders/updated is superseded.
                // Taken even when a payment provider (Adyen) cancelled the order first.
                let newer = apply_snapshot(order, snapshot);
                if was_cancelled && !newer {
                    return Ok(Step::Skipped(format!("order {id} already cancelled")));
                }
                order.notify(NotificationKind::Cancelled, &keys.cancelled());
                order.normalize();
                Ok(Step::Changed(format!("order {id} cancelled")))
            })?;
            // Put back exactly what orders/create took, once per SKU (guarded by the
            // `#restock#{sku}` key, recorded on the order). Not tied to this event changing
            // the order: an Adyen CANCELLATION may have cancelled it already, and it
            // never moves stock.
            let reserved = order
                .value
                .as_ref()
                .filter(|o| o.status == OrderStatus::Cancelled)
                .map(|o| o.stock_reserved.clone())
                .unwrap_or_default();
            for line in reserved {
                let Some(sku) = skus.iter_mut().find(|s| s.record.key.id == line.sku) else {
                    return Err(DomainError::Permanent(format!(
                        "orders/cancelled for order {id} does not list reserved SKU {}",
                        line.sku
                    )));
                };
                sku.effect(keys.restock(&line.sku), &mut notes, |s| {
                    let s = s.as_mut().ok_or_else(|| unknown_sku(&line.sku))?;
                    s.on_hand += line.quantity;
                    Ok(Step::Changed(format!("{} +{}", line.sku, line.quantity)))
                })?;
            }
        }
    }

    let mut parts = vec![order.finish()];
    parts.extend(skus.into_iter().map(Tracked::finish));
    Ok(assemble(parts, notes))
}

fn unknown_sku(sku: &str) -> DomainError {
    DomainError::Permanent(format!("unknown SKU {sku}"))
}

/// An order known only from a payment provider (Stripe-only shops).
fn minimal(id: &str, currency: Option<&str>, amount: i64) -> Order {
    let mut o = Order::new(id);
    o.currency = currency.map(str::to_owned);
    o.total_minor = amount;
    o
}

/// The order, once `orders/create` has been applied; otherwise wait for it.
fn created_order<'o>(
    o: &'o mut Option<Order>,
    id: &str,
    what: &str,
) -> Result<&'o mut Order, DomainError> {
    match o {
        Some(order) if order.shopify_created => Ok(order),
        _ => Err(DomainError::Wait(format!("{what}: order {id}"))),
    }
}

/// Take a Shopify snapshot's display fields if it is newer than the stored one.
fn apply_snapshot(order: &mut Order, snapshot: &Snapshot) -> bool {
    if let Some((stored, _)) = order
        .shopify_updated_at
        .as_deref()
        .and_then(shopify::version)
    {
        if snapshot.version_secs <= stored {
            return false;
        }
    }
    order.shopify_updated_at = Some(snapshot.version.clone());
    if snapshot.currency.is_some() {
        order.currency = snapshot.currency.clone();
    }
    order.total_minor = snapshot.total_minor;
    order.line_items = snapshot.line_items.clone();
    true
}

/// The payment effect (`#paid`), whichever provider reports it: one invoice, one
/// notification, loyalty credit (derived). `wait`: what to say when the order is
/// missing; `None` creates a minimal order (a payment provider may know it first).
fn pay(
    o: &mut Option<Order>,
    keys: &EffectKeys,
    id: &str,
    amount: i64,
    currency: Option<&str>,
    wait: Option<&str>,
) -> Result<Step, DomainError> {
    let order = match (o.as_mut(), wait) {
        (Some(order), _) => order,
        (None, Some(reason)) => return Err(DomainError::Wait(format!("{reason}: order {id}"))),
        (None, None) => o.insert(minimal(id, currency, amount)),
    };
    if order.is_paid() {
        return Ok(Step::Skipped(format!("order {id} already paid")));
    }
    let key = keys.paid();
    let invoice_id = format!("inv-{id}-1");
    order.invoices.push(Invoice {
        invoice_id: invoice_id.clone(),
        amount_minor: amount,
        source_effect: key.clone(),
    });
    // A failure notice not yet superseded is withdrawn: the customer has paid.
    order
        .notifications
        .retain(|n| n.kind != NotificationKind::PaymentFailed);
    order.notify(NotificationKind::PaymentReceived, &key);
    order.payment_event_at = None;
    order.normalize();
    Ok(Step::Changed(format!(
        "order {id} paid; invoice {invoice_id}"
    )))
}

/// One reported payment (`#payment#{provider}#{id}`), after the `#paid` effect of
/// the same event: recorded once, summed per provider into the paid total (see
/// [`Order::payments_total_minor`]). A second payment of an order (deposit + balance,
/// a partial capture) is thereby counted, and the same payment reported again is not.
fn record_payment(
    order: &mut Tracked<'_, Option<Order>>,
    keys: &EffectKeys,
    notes: &mut Notes,
    id: &str,
    payment: &PaymentRef,
    amount: i64,
    invoiced: Outcome,
) -> Result<Outcome, DomainError> {
    let key = keys.payment(&payment.provider, &payment.id);
    order.effect(key, notes, |o| {
        let Some(order) = o else {
            return Err(DomainError::Wait(format!(
                "payment before order {id} exists"
            )));
        };
        if order
            .payments
            .iter()
            .any(|p| p.provider == payment.provider && p.payment_id == payment.id)
        {
            return Ok(Step::Skipped(format!(
                "payment {} already recorded",
                payment.id
            )));
        }
        let before = order.paid_minor();
        // Paid before any payment was recorded (a record written before payments
        // were, or a checkout without a payment intent): the invoice's amount is kept
        // as a report of its own, so the paid total never drops below it.
        if invoiced != Outcome::Changed && order.payments.is_empty() {
            if let Some(invoice) = order.invoices.first() {
                order.payments.push(Payment {
                    provider: INVOICE_PAYMENT.to_owned(),
                    payment_id: invoice.invoice_id.clone(),
                    amount_minor: invoice.amount_minor,
                });
            }
        }
        order.payments.push(Payment {
            provider: payment.provider.clone(),
            payment_id: payment.id.clone(),
            amount_minor: amount,
        });
        order.normalize();
        // The payment that issued the invoice is told by `#paid`'s summary.
        Ok(Step::Changed(if invoiced == Outcome::Changed {
            String::new()
        } else if order.paid_minor() == before {
            format!(
                "order {id} payment {} {} recorded (paid total unchanged)",
                payment.provider, payment.id
            )
        } else {
            format!(
                "order {id} payment {} {} of {amount}; paid {}",
                payment.provider,
                payment.id,
                order.paid_minor()
            )
        }))
    })
}

/// One refund (`#refund#{id}`), whichever event reports it.
fn refund(
    o: &mut Option<Order>,
    keys: &EffectKeys,
    id: &str,
    r: &RefundFact,
) -> Result<Step, DomainError> {
    if r.amount == 0 {
        return Ok(Step::Skipped(format!("refund {} moves no money", r.id)));
    }
    let Some(order) = o else {
        return Err(DomainError::Wait(format!(
            "refund before payment: order {id} unknown"
        )));
    };
    if order.refunds.iter().any(|x| x.refund_id == r.id) {
        return Ok(Step::Skipped(format!("refund {} already recorded", r.id)));
    }
    if !order.is_paid() {
        return Err(DomainError::Wait(format!(
            "refund before payment: order {id}"
        )));
    }
    let after = order.refunded_minor + r.amount;
    if after > order.paid_minor() {
        // More than paid so far, but perhaps not more than will be paid (the balance
        // after a deposit). A Shopify order knows its total: within it, wait for the
        // rest of the payment. An order known only from a payment provider has no
        // total beyond its payments: wait when the refund names a payment not
        // recorded yet, or comes from Shopify (whose orders/create brings the total).
        if order.shopify_created && after <= order.total_minor {
            return Err(DomainError::Wait(format!(
                "refund before payment: refund {} of order {id} exceeds the amount paid so far",
                r.id
            )));
        }
        if !order.shopify_created && r.from_shopify {
            return Err(DomainError::Wait(format!(
                "refund before orders/create: refund {} of order {id} exceeds the amount paid so far",
                r.id
            )));
        }
        if let Some(payment) = r.payment_id.as_deref().filter(|p| {
            !order.shopify_created && !order.payments.iter().any(|x| x.payment_id == *p)
        }) {
            return Err(DomainError::Wait(format!(
                "refund before payment: refund {} of order {id} exceeds the amount paid until payment {payment} is recorded",
                r.id
            )));
        }
        return Err(DomainError::Permanent(format!(
            "refund {} exceeds the amount paid for order {id}",
            r.id
        )));
    }
    order.refunds.push(Refund {
        refund_id: r.id.clone(),
        amount_minor: r.amount,
    });
    order.notify(NotificationKind::Refunded, &keys.refund(&r.id));
    order.normalize();
    Ok(Step::Changed(format!(
        "order {id} refund {} of {}",
        r.id, r.amount
    )))
}
