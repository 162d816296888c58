//! Worldline Online Payments payloads → [`Event`]. The event names its `payment` or
//! `refund`; the order is the shop's `merchantReference` in
//! `paymentOutput.references` (`refundOutput.references` for a refund). Amounts are
//! `amountOfMoney.amount` in minor units with `currencyCode`.

use serde_json::Value;

use super::{
    currency, get, minor_int, missing, order_id_of, required_id, Event, Mapped, PaymentRef,
    RefundFact,
};
use crate::domain::DomainError;

/// `created`, which Worldline writes with a colon-less offset
/// (`2026-11-29T10:00:00.000+0000`); RFC 3339 wants `+00:00`.
fn created(body: &Value) -> Option<i64> {
    let text = get(body, &["created"])?.as_str()?;
    let parse = crate::time::parse_rfc3339;
    parse(text).or_else(|| {
        let (head, offset) = text.split_at_checked(text.len().checked_sub(5)?)?;
        let digits = offset.get(1..)?;
        (offset.starts_with(['+', '-']) && digits.bytes().all(|b| b.is_ascii_digit())).then(
            || {
                parse(&format!(
                    "{head}{}{}:{}",
                    &offset[..1],
                    &digits[..2],
                    &digits[2..]
                ))
            },
        )?
    })
}

pub(super) fn parse(
    event_type: &str,
    body: &Value,
    occurred_at: Option<i64>,
) -> Result<Mapped, DomainError> {
    match event_type {
        "payment.captured" | "payment.rejected" => {
            let payment = get(body, &["payment"]).ok_or_else(|| missing(event_type, "payment"))?;
            let id = required_id(
                event_type,
                get(payment, &["id"]),
                "payment.id",
                "Worldline id",
            )?;
            let output = get(payment, &["paymentOutput"]);
            let order_id =
                order_id_of(output.and_then(|o| get(o, &["references", "merchantReference"])))?
                    .ok_or_else(|| {
                        DomainError::Permanent(format!(
                            "{event_type}: no paymentOutput.references.merchantReference"
                        ))
                    })?;
            let money = output.and_then(|o| get(o, &["amountOfMoney"]));
            let amount = minor_int(money.and_then(|m| get(m, &["amount"])));
            let currency = currency(money.and_then(|m| get(m, &["currencyCode"])));
            if event_type == "payment.rejected" {
                let at = created(body)
                    .or(occurred_at)
                    .ok_or_else(|| missing(event_type, "created"))?;
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
                payment: PaymentRef::new("worldline", &id),
                amount: amount.ok_or_else(|| missing(event_type, "amountOfMoney.amount"))?,
                currency,
            }))
        }
        "refund.refunded" => {
            let refund = get(body, &["refund"]).ok_or_else(|| missing(event_type, "refund"))?;
            let id = required_id(
                event_type,
                get(refund, &["id"]),
                "refund.id",
                "Worldline id",
            )?;
            let output = get(refund, &["refundOutput"]);
            let Some(order_id) =
                order_id_of(output.and_then(|o| get(o, &["references", "merchantReference"])))?
            else {
                return Ok(Mapped::Ignore(format!(
                    "worldline refund {id} names no order (no refundOutput.references.merchantReference)"
                )));
            };
            let amount = minor_int(output.and_then(|o| get(o, &["amountOfMoney", "amount"])))
                .ok_or_else(|| missing(event_type, "refundOutput.amountOfMoney.amount"))?;
            Ok(Mapped::Event(Event::Refunds {
                order_id,
                refunds: vec![RefundFact {
                    id,
                    amount,
                    payment_id: super::text(get(refund, &["paymentId"])),
                    from_shopify: false,
                }],
            }))
        }
        other => Err(DomainError::Permanent(format!(
            "worldline {other}: not mapped"
        ))),
    }
}
