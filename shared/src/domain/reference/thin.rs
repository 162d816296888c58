//! Thin webhooks (Mollie classic, GoPay, Klarna push) carry only an id; the processor
//! fetches the authoritative state and hands the domain that JSON as the body. The
//! state is final or not: only final states are facts.
//!
//! - `mollie` `payment`: a Mollie API v2 payment `{resource: "payment", id, status,
//!   amount {value "10.00", currency}, metadata {order_id}}`. Signed Mollie next-gen
//!   events share the provider name; a body that is not a fetched payment object
//!   (`resource` = `payment` with a `status`) is ignored.
//! - `gopay` `payment`: `{id, order_number, state, amount (minor), currency}`.
//! - `klarna-push` `order`: a Klarna order-management order `{order_id, status,
//!   merchant_reference1, order_amount (minor), purchase_currency}`.
//!
//! Where each body keeps its id, status and order reference, and which statuses are
//! final, are the provider's own facts (`providers::{mollie, gopay, klarna_push}::
//! RESOURCE`), which reconciliation reads too.
//!
//! A failure's time is the body's own timestamp (Mollie `failedAt`/`canceledAt`/
//! `expiredAt`), else 0: the fetched state has no other business time, and the
//! arrival or fetch time must not become part of an effect key.

use serde_json::Value;

use super::{
    currency, get, minor_decimal, minor_int, missing, order_id_of, required_id, text, time_of,
    Event, Mapped, PaymentRef,
};
use crate::domain::DomainError;
use crate::providers::thin::PaymentState;
use crate::providers::{gopay, klarna_push, mollie};

pub(super) fn parse(provider: &str, event_type: &str, body: &Value) -> Result<Mapped, DomainError> {
    match (provider, event_type) {
        ("mollie", "payment") => mollie(body),
        ("gopay", "payment") => gopay(body),
        ("klarna-push", "order") => klarna(body),
        (p, t) => Err(DomainError::Permanent(format!("{p} {t}: not mapped"))),
    }
}

/// The fetched state, provider-neutral.
struct Fetched {
    /// `mollie payment`, `gopay payment`, `klarna order`.
    what: &'static str,
    status: String,
    order_id: Option<String>,
    payment_id: String,
    amount: Option<i64>,
    currency: Option<String>,
    at: i64,
}

fn fact(state: PaymentState, f: Fetched) -> Result<Mapped, DomainError> {
    let Fetched {
        what,
        status,
        order_id,
        payment_id,
        amount,
        currency,
        at,
    } = f;
    if let PaymentState::Open = state {
        return Ok(Mapped::Ignore(format!(
            "{what} {payment_id} not final or not mapped: {status}"
        )));
    }
    let order_id = order_id
        .ok_or_else(|| DomainError::Permanent(format!("{what} {payment_id}: names no order")))?;
    Ok(Mapped::Event(match state {
        PaymentState::Paid => Event::PaymentSucceeded {
            order_id,
            payment: PaymentRef::new(what.split(' ').next().unwrap_or(what), &payment_id),
            amount: amount.ok_or_else(|| missing(what, "amount"))?,
            currency,
        },
        _ => Event::PaymentFailed {
            order_id,
            payment_id,
            at,
            amount: amount.unwrap_or(0),
            currency,
        },
    }))
}

fn mollie(body: &Value) -> Result<Mapped, DomainError> {
    let facts = &mollie::RESOURCE;
    let status = text(get(body, facts.status));
    let (true, Some(status)) = (
        get(body, &["resource"]).and_then(Value::as_str) == Some("payment"),
        status,
    ) else {
        return Ok(Mapped::Ignore(
            "mollie payment: body is not a fetched payment object".into(),
        ));
    };
    let id = required_id(
        "mollie payment",
        get(body, facts.id),
        "id",
        "Mollie payment id",
    )?;
    let state = facts.state(&status);
    let at = ["failedAt", "canceledAt", "expiredAt"]
        .iter()
        .find_map(|f| time_of(get(body, &[f])))
        .unwrap_or(0);
    let f = Fetched {
        what: "mollie payment",
        status,
        order_id: order_id_of(get(body, facts.order_id))?,
        payment_id: id,
        amount: minor_decimal(get(body, &["amount", "value"])),
        currency: currency(get(body, &["amount", "currency"])),
        at,
    };
    fact(state, f)
}

fn gopay(body: &Value) -> Result<Mapped, DomainError> {
    let facts = &gopay::RESOURCE;
    let id = required_id(
        "gopay payment",
        get(body, facts.id),
        "id",
        "GoPay payment id",
    )?;
    let status = text(get(body, facts.status)).ok_or_else(|| missing("gopay payment", "state"))?;
    let state = facts.state(&status);
    let f = Fetched {
        what: "gopay payment",
        status,
        order_id: order_id_of(get(body, facts.order_id))?,
        payment_id: id,
        amount: minor_int(get(body, &["amount"])),
        currency: currency(get(body, &["currency"])),
        at: 0,
    };
    fact(state, f)
}

fn klarna(body: &Value) -> Result<Mapped, DomainError> {
    let facts = &klarna_push::RESOURCE;
    let id = required_id(
        "klarna order",
        get(body, facts.id),
        "order_id",
        "Klarna order id",
    )?;
    let status = text(get(body, facts.status)).ok_or_else(|| missing("klarna order", "status"))?;
    let state = facts.state(&status);
    let f = Fetched {
        what: "klarna order",
        status,
        order_id: order_id_of(get(body, facts.order_id))?,
        payment_id: id,
        amount: minor_int(get(body, &["order_amount"])),
        currency: currency(get(body, &["purchase_currency"])),
        at: 0,
    };
    fact(state, f)
}
