//! PayPal payloads → [`Event`]. The event's `resource` is a capture (or, for
//! `PAYMENT.CAPTURE.REFUNDED`, the refund); the order is the capture's or refund's
//! `custom_id`, else its `invoice_id` (set when the PayPal order was created).
//! Amounts are decimal strings (`{"value": "49.90", "currency_code": "EUR"}`).

use serde_json::Value;

use super::{
    currency, get, minor_decimal, missing, order_id_of, required_id, text, time_of, Event, Mapped,
    PaymentRef, RefundFact,
};
use crate::domain::DomainError;

pub(super) fn parse(
    event_type: &str,
    body: &Value,
    occurred_at: Option<i64>,
) -> Result<Mapped, DomainError> {
    let resource = get(body, &["resource"])
        .filter(|r| r.is_object())
        .ok_or_else(|| missing(event_type, "resource"))?;
    let id = required_id(
        event_type,
        get(resource, &["id"]),
        "resource.id",
        "PayPal id",
    )?;
    let order_id = match order_id_of(get(resource, &["custom_id"]))? {
        Some(o) => o,
        None => order_id_of(get(resource, &["invoice_id"]))?.ok_or_else(|| {
            DomainError::Permanent(format!(
                "{event_type}: no resource.custom_id or resource.invoice_id"
            ))
        })?,
    };
    let amount = || {
        minor_decimal(get(resource, &["amount", "value"]))
            .ok_or_else(|| missing(event_type, "resource.amount.value"))
    };
    let currency = currency(get(resource, &["amount", "currency_code"]));
    let status = text(get(resource, &["status"]));
    match event_type {
        "PAYMENT.CAPTURE.COMPLETED" => Ok(Mapped::Event(Event::PaymentSucceeded {
            order_id,
            payment: PaymentRef::new("paypal", &id),
            amount: amount()?,
            currency,
        })),
        "PAYMENT.CAPTURE.DENIED" => {
            let at = time_of(get(body, &["create_time"]))
                .or(occurred_at)
                .ok_or_else(|| missing(event_type, "create_time"))?;
            Ok(Mapped::Event(Event::PaymentFailed {
                order_id,
                payment_id: id,
                at,
                amount: amount().unwrap_or(0),
                currency,
            }))
        }
        "PAYMENT.CAPTURE.REFUNDED" => {
            if let Some(s @ ("FAILED" | "CANCELLED")) = status.as_deref() {
                return Ok(Mapped::Ignore(format!(
                    "paypal refund {id} of order {order_id} moves no money ({s})"
                )));
            }
            Ok(Mapped::Event(Event::Refunds {
                order_id,
                refunds: vec![RefundFact {
                    id,
                    amount: amount()?,
                    payment_id: None,
                    from_shopify: false,
                }],
            }))
        }
        other => Err(DomainError::Permanent(format!(
            "paypal {other}: not mapped"
        ))),
    }
}
