//! Paddle Billing payloads → [`Event`]. `data` is a transaction (`txn_…`) or an
//! adjustment (`adj_…`). The order is `data.custom_data.order_id` (custom data the shop
//! puts on the transaction). Amounts are strings of integer minor units
//! (`details.totals.grand_total`, `totals.total`).
//!
//! Adjustments name only their `transaction_id`; without `custom_data.order_id` on the
//! adjustment the order cannot be found (a transaction → order lookup is out of scope),
//! so such refunds are ignored with that reason.

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
    let data = get(body, &["data"])
        .filter(|d| d.is_object())
        .ok_or_else(|| missing(event_type, "data"))?;
    let id = required_id(event_type, get(data, &["id"]), "data.id", "Paddle id")?;
    let order_id = order_id_of(get(data, &["custom_data", "order_id"]))?;
    let currency = currency(get(data, &["currency_code"]));
    match event_type {
        "transaction.completed" | "transaction.paid" | "transaction.payment_failed" => {
            let order_id = order_id.ok_or_else(|| {
                DomainError::Permanent(format!("{event_type}: no data.custom_data.order_id"))
            })?;
            let total = minor_int(get(data, &["details", "totals", "grand_total"]))
                .or_else(|| minor_int(get(data, &["details", "totals", "total"])));
            if event_type == "transaction.payment_failed" {
                let at = time_of(get(body, &["occurred_at"]))
                    .or(occurred_at)
                    .ok_or_else(|| missing(event_type, "occurred_at"))?;
                return Ok(Mapped::Event(Event::PaymentFailed {
                    order_id,
                    payment_id: id,
                    at,
                    amount: total.unwrap_or(0),
                    currency,
                }));
            }
            Ok(Mapped::Event(Event::PaymentSucceeded {
                order_id,
                payment: PaymentRef::new("paddle", &id),
                amount: total
                    .ok_or_else(|| missing(event_type, "data.details.totals.grand_total"))?,
                currency,
            }))
        }
        "adjustment.created" | "adjustment.updated" => {
            let action = text(get(data, &["action"])).unwrap_or_default();
            if action != "refund" {
                return Ok(Mapped::Ignore(format!(
                    "paddle adjustment {id} is not a refund ({action})"
                )));
            }
            let status = text(get(data, &["status"])).unwrap_or_default();
            if status != "approved" {
                return Ok(Mapped::Ignore(format!(
                    "paddle refund {id} is not approved ({status})"
                )));
            }
            let Some(order_id) = order_id else {
                return Ok(Mapped::Ignore(format!(
                    "paddle refund {id} names no order (no data.custom_data.order_id; \
                     transaction → order lookup is out of scope)"
                )));
            };
            let amount = minor_int(get(data, &["totals", "total"]))
                .ok_or_else(|| missing(event_type, "data.totals.total"))?;
            Ok(Mapped::Event(Event::Refunds {
                order_id,
                refunds: vec![RefundFact {
                    id,
                    amount,
                    payment_id: text(get(data, &["transaction_id"])),
                    from_shopify: false,
                }],
            }))
        }
        other => Err(DomainError::Permanent(format!(
            "paddle {other}: not mapped"
        ))),
    }
}
