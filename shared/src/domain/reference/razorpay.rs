//! Razorpay payloads → [`Event`]. The entities sit under `payload.{payment,refund}.entity`;
//! the order is the shop's id in the payment's (or the refund's) `notes.order_id` (notes
//! the shop sets when it creates the payment; Razorpay's own `order_id` is its order
//! object, not the shop's). Amounts are integer minor units (paise).

use serde_json::Value;

use super::{
    currency, get, minor_int, missing, order_id_of, required_id, Event, Mapped, PaymentRef,
    RefundFact,
};
use crate::domain::DomainError;

pub(super) fn parse(
    event_type: &str,
    body: &Value,
    occurred_at: Option<i64>,
) -> Result<Mapped, DomainError> {
    let payment = get(body, &["payload", "payment", "entity"]);
    let payment_order = order_id_of(payment.and_then(|p| get(p, &["notes", "order_id"])))?;
    match event_type {
        "payment.captured" | "payment.failed" => {
            let payment = payment.ok_or_else(|| missing(event_type, "payload.payment.entity"))?;
            let id = required_id(
                event_type,
                get(payment, &["id"]),
                "payment id",
                "Razorpay id",
            )?;
            let order_id = payment_order.ok_or_else(|| {
                DomainError::Permanent(format!("{event_type}: no notes.order_id on the payment"))
            })?;
            let amount = minor_int(get(payment, &["amount"]));
            let currency = currency(get(payment, &["currency"]));
            if event_type == "payment.failed" {
                let at = occurred_at.ok_or_else(|| missing(event_type, "created_at"))?;
                return Ok(Mapped::Event(Event::PaymentFailed {
                    order_id,
                    payment_id: id,
                    at,
                    amount: amount.unwrap_or(0),
                    currency,
                }));
            }
            Ok(Mapped::Event(Event::PaymentSucceeded {
                order_id,
                payment: PaymentRef::new("razorpay", &id),
                amount: amount.ok_or_else(|| missing(event_type, "amount"))?,
                currency,
            }))
        }
        "refund.processed" => {
            let refund = get(body, &["payload", "refund", "entity"])
                .ok_or_else(|| missing(event_type, "payload.refund.entity"))?;
            let id = required_id(event_type, get(refund, &["id"]), "refund id", "Razorpay id")?;
            let order_id = match order_id_of(get(refund, &["notes", "order_id"]))? {
                Some(order) => order,
                None => match payment_order {
                    Some(order) => order,
                    None => {
                        return Ok(Mapped::Ignore(format!(
                            "razorpay refund {id} names no order (no notes.order_id)"
                        )))
                    }
                },
            };
            let amount = minor_int(get(refund, &["amount"]))
                .ok_or_else(|| missing(event_type, "refund amount"))?;
            Ok(Mapped::Event(Event::Refunds {
                order_id,
                refunds: vec![RefundFact {
                    id,
                    amount,
                    payment_id: super::text(get(refund, &["payment_id"])),
                    from_shopify: false,
                }],
            }))
        }
        other => Err(DomainError::Permanent(format!(
            "razorpay {other}: not mapped"
        ))),
    }
}
