//! Square payloads → [`Event`]. `data.object.payment` (or `.refund`) is the object;
//! the order is the payment's `reference_id` (the shop sets it; Square's own
//! `order_id` is not ours). Amounts are `{amount (minor units), currency}`; a payment
//! counts `total_money` (amount + tip) when present, else `amount_money`.
//!
//! Square payments without `reference_id` (point-of-sale sales) are not shop orders
//! and are ignored with that reason. Square refunds carry no `reference_id`: a refund
//! is mapped only if one is present; the payment → order lookup is out of scope.

use serde_json::Value;

use super::{
    currency, get, minor_int, missing, order_id_of, required_id, text, time_of, Event, Mapped,
    PaymentRef, RefundFact,
};
use crate::domain::DomainError;

pub(super) fn parse(
    event_type: &str,
    body: &Value,
    occurred_at: Option<i64>,
) -> Result<Mapped, DomainError> {
    let (field, name) = if event_type.starts_with("refund.") {
        ("refund", "data.object.refund")
    } else {
        ("payment", "data.object.payment")
    };
    let object = get(body, &["data", "object", field])
        .filter(|o| o.is_object())
        .ok_or_else(|| missing(event_type, name))?;
    let id = required_id(event_type, get(object, &["id"]), "id", "Square id")?;
    let status = text(get(object, &["status"])).ok_or_else(|| missing(event_type, "status"))?;
    let Some(order_id) = order_id_of(get(object, &["reference_id"]))? else {
        return Ok(Mapped::Ignore(format!(
            "square {field} {id} names no order (no reference_id)"
        )));
    };
    let money = get(object, &["total_money"])
        .filter(|_| field == "payment")
        .or_else(|| get(object, &["amount_money"]));
    let amount = minor_int(money.and_then(|m| m.get("amount")));
    let currency = currency(money.and_then(|m| m.get("currency")));
    match (field, status.as_str()) {
        ("payment", "COMPLETED") => Ok(Mapped::Event(Event::PaymentSucceeded {
            order_id,
            payment: PaymentRef::new("square", &id),
            amount: amount.ok_or_else(|| missing(event_type, "amount_money.amount"))?,
            currency,
        })),
        ("payment", "FAILED" | "CANCELED") => {
            let at = time_of(get(object, &["updated_at"]))
                .or_else(|| time_of(get(body, &["created_at"])))
                .or(occurred_at)
                .ok_or_else(|| missing(event_type, "updated_at"))?;
            Ok(Mapped::Event(Event::PaymentFailed {
                order_id,
                payment_id: id,
                at,
                amount: amount.unwrap_or(0),
                currency,
            }))
        }
        ("refund", "COMPLETED") => Ok(Mapped::Event(Event::Refunds {
            order_id,
            refunds: vec![RefundFact {
                id,
                amount: amount.ok_or_else(|| missing(event_type, "amount_money.amount"))?,
                payment_id: text(get(object, &["payment_id"])),
                from_shopify: false,
            }],
        })),
        ("refund", s @ ("FAILED" | "REJECTED")) => Ok(Mapped::Ignore(format!(
            "square refund {id} moves no money ({s})"
        ))),
        (_, s) => Ok(Mapped::Ignore(format!(
            "square {field} {id} not final: {s}"
        ))),
    }
}
