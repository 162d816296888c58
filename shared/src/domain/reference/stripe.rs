//! Stripe payloads → [`Event`]. The order is found through `metadata.order_id` on the
//! event's object (payment intent, checkout session, charge or refund); a checkout
//! session may name it in `client_reference_id` instead, a charge in the metadata of
//! one of its refunds. Amounts are integer minor units already.

use serde_json::Value;

use super::model::check_id;
use super::{currency, get, id_text, missing, text, Event, PaymentRef, RefundFact};
use crate::domain::DomainError;

pub(super) fn parse(
    event_type: &str,
    body: &Value,
    occurred_at: Option<i64>,
) -> Result<Event, DomainError> {
    let object = get(body, &["data", "object"])
        .filter(|o| o.is_object())
        .ok_or_else(|| missing(event_type, "data.object"))?;
    let object_id =
        || id_text(get(object, &["id"])).ok_or_else(|| missing(event_type, "data.object.id"));
    match event_type {
        "checkout.session.completed" => {
            let session_id = object_id()?;
            check_id("checkout session id", &session_id)?;
            let order_id = match metadata_order_id(object) {
                Some(id) => id,
                None => text(get(object, &["client_reference_id"])).ok_or_else(no_order_id)?,
            };
            check_id("order id", &order_id)?;
            let paid = get(object, &["payment_status"]).and_then(Value::as_str) == Some("paid");
            let amount = match get(object, &["amount_total"]) {
                None => None,
                Some(v) => Some(
                    amount_of(v).ok_or_else(|| missing(event_type, "data.object.amount_total"))?,
                ),
            };
            if paid && amount.is_none() {
                return Err(missing(event_type, "data.object.amount_total"));
            }
            Ok(Event::Checkout {
                order_id,
                session_id,
                amount,
                currency: currency(get(object, &["currency"])),
                paid,
                payment_intent: payment_intent_of(object)?,
            })
        }
        "payment_intent.succeeded" | "payment_intent.payment_failed" => {
            let payment_id = object_id()?;
            check_id("payment intent id", &payment_id)?;
            let order_id = metadata_order_id(object).ok_or_else(no_order_id)?;
            check_id("order id", &order_id)?;
            let currency = currency(get(object, &["currency"]));
            if event_type == "payment_intent.succeeded" {
                // What was actually captured; `amount` for intents that report no receipt.
                let amount = get(object, &["amount_received"])
                    .and_then(amount_of)
                    .filter(|a| *a > 0)
                    .or_else(|| get(object, &["amount"]).and_then(amount_of))
                    .ok_or_else(|| missing(event_type, "data.object.amount_received"))?;
                Ok(Event::PaymentSucceeded {
                    order_id,
                    payment: PaymentRef::new("stripe", &payment_id),
                    amount,
                    currency,
                })
            } else {
                let at = get(body, &["created"])
                    .and_then(Value::as_i64)
                    .or(occurred_at)
                    .ok_or_else(|| missing(event_type, "created"))?;
                let amount = get(object, &["amount"]).and_then(amount_of).unwrap_or(0);
                Ok(Event::PaymentFailed {
                    order_id,
                    payment_id,
                    at,
                    amount,
                    currency,
                })
            }
        }
        "charge.refunded" => {
            let list = get(object, &["refunds", "data"]).and_then(Value::as_array).ok_or_else(|| {
                DomainError::Permanent(
                    "charge.refunded: no `refunds.data[]` to identify the refunds (subscribe to refund.created)".into(),
                )
            })?;
            let order_id = metadata_order_id(object)
                .or_else(|| list.iter().find_map(metadata_order_id))
                .ok_or_else(no_order_id)?;
            check_id("order id", &order_id)?;
            let mut refunds = Vec::new();
            for r in list {
                if let Some(fact) = refund_fact(event_type, r)? {
                    refunds.push(fact);
                }
            }
            Ok(Event::Refunds { order_id, refunds })
        }
        "refund.created" => {
            let order_id = metadata_order_id(object).ok_or_else(no_order_id)?;
            check_id("order id", &order_id)?;
            let refunds = refund_fact(event_type, object)?.into_iter().collect();
            Ok(Event::Refunds { order_id, refunds })
        }
        other => Err(DomainError::Permanent(format!(
            "stripe {other}: not mapped"
        ))),
    }
}

fn no_order_id() -> DomainError {
    DomainError::Permanent("no metadata.order_id".into())
}

fn metadata_order_id(object: &Value) -> Option<String> {
    id_text(get(object, &["metadata", "order_id"]))
}

/// Stripe amounts: non-negative integers in minor units.
fn amount_of(v: &Value) -> Option<i64> {
    v.as_i64().filter(|a| *a >= 0)
}

/// One refund object; `None` when it moves no money (failed or canceled refunds).
fn refund_fact(event_type: &str, r: &Value) -> Result<Option<RefundFact>, DomainError> {
    let id = id_text(get(r, &["id"])).ok_or_else(|| missing(event_type, "refund id"))?;
    check_id("refund id", &id)?;
    let amount = get(r, &["amount"])
        .and_then(amount_of)
        .ok_or_else(|| missing(event_type, "refund amount"))?;
    let status = get(r, &["status"]).and_then(Value::as_str);
    if matches!(status, Some("failed" | "canceled")) {
        return Ok(None);
    }
    Ok(Some(RefundFact {
        id,
        amount,
        payment_id: payment_intent_of(r)?,
        from_shopify: false,
    }))
}

/// The object's `payment_intent`: an id, or (expanded) an object with an id.
fn payment_intent_of(object: &Value) -> Result<Option<String>, DomainError> {
    let id = id_text(get(object, &["payment_intent"]))
        .or_else(|| id_text(get(object, &["payment_intent", "id"])));
    if let Some(id) = &id {
        check_id("payment intent id", id)?;
    }
    Ok(id)
}
