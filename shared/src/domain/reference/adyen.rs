//! Adyen payloads → [`Event`]. Each event's body is ONE `NotificationRequestItem`
//! (the provider splits batches): `eventCode`, `success` (`"true"`/`"false"`),
//! `pspReference` (the payment, or for modifications the modification itself),
//! `originalReference` (the payment a modification is about), `merchantReference` =
//! the shop's order id, `amount {value (minor units), currency}`, `eventDate`.
//!
//! The reference shop captures automatically, so a successful `AUTHORISATION` is the
//! payment (`#paid`); a `CAPTURE` restates it (same key: one invoice). A failed
//! `AUTHORISATION` is a payment failure; other unsuccessful items are ignored.

use serde_json::Value;

use super::{
    currency, get, minor_int, missing, order_id_of, required_id, text, time_of, Event, Mapped,
    PaymentRef, RefundFact,
};
use crate::domain::DomainError;

pub(super) fn parse(
    event_code: &str,
    item: &Value,
    occurred_at: Option<i64>,
) -> Result<Mapped, DomainError> {
    let psp = required_id(
        event_code,
        get(item, &["pspReference"]),
        "pspReference",
        "pspReference",
    )?;
    let success = match get(item, &["success"]) {
        Some(Value::String(s)) if s == "true" => true,
        Some(Value::String(s)) if s == "false" => false,
        Some(Value::Bool(b)) => *b,
        _ => return Err(missing(event_code, "success")),
    };
    let order_id = order_id_of(get(item, &["merchantReference"]))?
        .ok_or_else(|| DomainError::Permanent(format!("{event_code}: no merchantReference")))?;
    let amount = || {
        minor_int(get(item, &["amount", "value"]))
            .ok_or_else(|| missing(event_code, "amount.value"))
    };
    let currency = currency(get(item, &["amount", "currency"]));
    // The payment a modification is about; a payment's own items name it in pspReference.
    let payment = match text(get(item, &["originalReference"])) {
        Some(p) => {
            super::model::check_id("originalReference", &p)?;
            p
        }
        None => psp.clone(),
    };
    if !success {
        if event_code == "AUTHORISATION" {
            let at = time_of(get(item, &["eventDate"]))
                .or(occurred_at)
                .ok_or_else(|| missing(event_code, "eventDate"))?;
            return Ok(Mapped::Event(Event::PaymentFailed {
                order_id,
                payment_id: psp,
                at,
                amount: amount().unwrap_or(0),
                currency,
            }));
        }
        return Ok(Mapped::Ignore(format!(
            "adyen {event_code} {psp} of order {order_id} was not successful"
        )));
    }
    let event = match event_code {
        // A capture names its authorisation in originalReference: one payment.
        "AUTHORISATION" | "CAPTURE" => Event::PaymentSucceeded {
            order_id,
            payment: PaymentRef::new("adyen", &payment),
            amount: amount()?,
            currency,
        },
        "REFUND" => Event::Refunds {
            order_id,
            refunds: vec![RefundFact {
                id: psp,
                amount: amount()?,
                payment_id: Some(payment),
                from_shopify: false,
            }],
        },
        "CANCELLATION" => Event::PaymentCancelled {
            order_id,
            payment_id: payment,
            amount: amount().unwrap_or(0),
            currency,
        },
        other => return Err(DomainError::Permanent(format!("adyen {other}: not mapped"))),
    };
    Ok(Mapped::Event(event))
}
