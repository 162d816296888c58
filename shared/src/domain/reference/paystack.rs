//! Paystack payloads → [`Event`]. `data` is the transaction (`charge.success`); the
//! order is the shop's `metadata.order_id` (metadata the shop passes when it
//! initialises the transaction). Amounts are integer minor units (kobo, pesewas, cents).
//! Refund webhooks are not mapped: their payload shape was not confirmed from a primary
//! source (`docs/domain.md`).

use serde_json::Value;

use super::{
    currency, get, minor_int, missing, order_id_of, required_id, Event, Mapped, PaymentRef,
};
use crate::domain::DomainError;

pub(super) fn parse(event_type: &str, body: &Value) -> Result<Mapped, DomainError> {
    let data = get(body, &["data"])
        .filter(|d| d.is_object())
        .ok_or_else(|| missing(event_type, "data"))?;
    match event_type {
        "charge.success" => {
            let id = required_id(event_type, get(data, &["id"]), "data.id", "Paystack id")?;
            let order_id = order_id_of(get(data, &["metadata", "order_id"]))?.ok_or_else(|| {
                DomainError::Permanent(format!("{event_type}: no data.metadata.order_id"))
            })?;
            Ok(Mapped::Event(Event::PaymentSucceeded {
                order_id,
                payment: PaymentRef::new("paystack", &id),
                amount: minor_int(get(data, &["amount"]))
                    .ok_or_else(|| missing(event_type, "data.amount"))?,
                currency: currency(get(data, &["currency"])),
            }))
        }
        other => Err(DomainError::Permanent(format!(
            "paystack {other}: not mapped"
        ))),
    }
}
