//! Shopify payloads → [`Event`]. Order topics carry the order itself (`id`,
//! `updated_at`, `total_price`, `line_items`); refunds and fulfillments name it in
//! `order_id`. Prices are decimal strings (`"49.90"` → 4990 minor units).
//!
//! Shopify signs only the body; the topic header is not signed, so it only selects
//! which mapping to try. The signed body must agree with it (invariant 10): an order
//! body under `refunds/create` or `fulfillments/create` (or the reverse), an
//! `orders/paid` whose order is not `paid`, an `orders/cancelled` whose order has no
//! `cancelled_at` are ignored with the reason, so a genuine body replayed under another
//! topic changes nothing.

use std::collections::BTreeMap;

use serde_json::Value;

use super::model::{check_id, parse_minor, LineItem, StockLine};
use super::{currency, get, id_text, missing, text, Event, Mapped, RefundFact, Snapshot};
use crate::domain::DomainError;
use crate::time::{format_rfc3339, parse_rfc3339};

pub(super) fn parse(topic: &str, body: &Value) -> Result<Mapped, DomainError> {
    if let Some(reason) = contradiction(topic, body) {
        return Ok(Mapped::Ignore(reason));
    }
    parse_event(topic, body).map(Mapped::Event)
}

/// What a Shopify body is, by the fields each kind always carries: refunds and
/// fulfillments name their order in `order_id`, refunds list `refund_line_items` /
/// `transactions`; an order has no `order_id` but its `financial_status` and
/// `line_items`. `None` when the body shows none of these (the mapping then reports
/// what is missing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyKind {
    Order,
    Refund,
    Fulfillment,
}

impl BodyKind {
    fn of(body: &Value) -> Option<BodyKind> {
        let has = |field| get(body, &[field]).is_some_and(|v| !v.is_null());
        if has("order_id") {
            if has("refund_line_items") || has("transactions") {
                Some(BodyKind::Refund)
            } else {
                Some(BodyKind::Fulfillment)
            }
        } else if has("financial_status") || has("line_items") {
            Some(BodyKind::Order)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            BodyKind::Order => "an order",
            BodyKind::Refund => "a refund",
            BodyKind::Fulfillment => "a fulfillment",
        }
    }
}

/// Financial statuses Shopify documents; any other value is not echoed into a reason.
const FINANCIAL_STATUSES: [&str; 8] = [
    "pending",
    "authorized",
    "partially_paid",
    "paid",
    "partially_refunded",
    "refunded",
    "voided",
    "expired",
];

/// Why the signed body contradicts the (unsigned) topic, if it does.
fn contradiction(topic: &str, body: &Value) -> Option<String> {
    let expected = match topic {
        "orders/create" | "orders/updated" | "orders/paid" | "orders/cancelled" => BodyKind::Order,
        "refunds/create" => BodyKind::Refund,
        "fulfillments/create" => BodyKind::Fulfillment,
        _ => return None,
    };
    let untrusted = "the topic header is not signed";
    match BodyKind::of(body) {
        Some(kind) if kind != expected => {
            return Some(format!(
                "{topic}: the signed body is {}, not {} ({untrusted})",
                kind.name(),
                expected.name()
            ))
        }
        _ => {}
    }
    let cancelled = get(body, &["cancelled_at"]).is_some_and(|v| !v.is_null());
    match topic {
        "orders/paid" => {
            let status = get(body, &["financial_status"]).and_then(Value::as_str);
            if status == Some("paid") {
                return None;
            }
            let shown = match status {
                Some(s) if FINANCIAL_STATUSES.contains(&s) => s,
                Some(_) => "not a known status",
                None => "missing",
            };
            Some(format!(
                "orders/paid: the signed order's financial_status is {shown}, not paid ({untrusted})"
            ))
        }
        "orders/cancelled" if !cancelled => Some(format!(
            "orders/cancelled: the signed order has no cancelled_at ({untrusted})"
        )),
        _ => None,
    }
}

fn parse_event(topic: &str, body: &Value) -> Result<Event, DomainError> {
    match topic {
        "orders/create" => {
            let snapshot = snapshot(topic, body)?;
            let paid = get(body, &["financial_status"]).and_then(Value::as_str) == Some("paid");
            Ok(Event::ShopifyCreate { snapshot, paid })
        }
        "orders/updated" => Ok(Event::ShopifyUpdated {
            snapshot: snapshot(topic, body)?,
        }),
        "orders/cancelled" => Ok(Event::ShopifyCancelled {
            snapshot: snapshot(topic, body)?,
        }),
        "orders/paid" => {
            let order_id = order_id(topic, body, "id")?;
            let amount = get(body, &["total_price"])
                .and_then(decimal)
                .ok_or_else(|| missing(topic, "total_price"))?;
            Ok(Event::ShopifyPaid { order_id, amount })
        }
        "refunds/create" => {
            let order_id = order_id(topic, body, "order_id")?;
            let id = id_text(get(body, &["id"])).ok_or_else(|| missing(topic, "id"))?;
            check_id("refund id", &id)?;
            // The money moved: successful `refund` transactions. (Line-item subtotals
            // are not used: they ignore shipping and adjustments.) A transaction that
            // carries the gateway's refund id (Stripe `re_…`) is that refund, the one
            // Stripe reports too; the others together are Shopify's refund `id`.
            let mut amount = 0i64;
            let mut refunds: Vec<RefundFact> = Vec::new();
            for t in get(body, &["transactions"])
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let kind_ok = get(t, &["kind"])
                    .and_then(Value::as_str)
                    .is_none_or(|k| k == "refund");
                let status_ok = get(t, &["status"])
                    .and_then(Value::as_str)
                    .is_none_or(|s| s == "success");
                if kind_ok && status_ok {
                    let a = get(t, &["amount"]).and_then(decimal).filter(|a| *a >= 0);
                    let a = a.ok_or_else(|| missing(topic, "transactions[].amount"))?;
                    match gateway_refund_id(t) {
                        Some(gateway_id) => match refunds.iter_mut().find(|r| r.id == gateway_id) {
                            Some(r) => r.amount += a,
                            None => refunds.push(RefundFact {
                                id: gateway_id,
                                amount: a,
                                payment_id: None,
                                from_shopify: true,
                            }),
                        },
                        None => amount += a,
                    }
                }
            }
            if refunds.is_empty() || amount > 0 {
                refunds.push(RefundFact {
                    id,
                    amount,
                    payment_id: None,
                    from_shopify: true,
                });
            }
            Ok(Event::Refunds { order_id, refunds })
        }
        "fulfillments/create" => {
            let order_id = order_id(topic, body, "order_id")?;
            let fulfillment_id = id_text(get(body, &["id"])).ok_or_else(|| missing(topic, "id"))?;
            check_id("fulfillment id", &fulfillment_id)?;
            let tracking = text(get(body, &["tracking_number"])).or_else(|| {
                get(body, &["tracking_numbers"])
                    .and_then(Value::as_array)
                    .and_then(|a| text(a.first()))
            });
            Ok(Event::Fulfillment {
                order_id,
                fulfillment_id,
                tracking,
            })
        }
        other => Err(DomainError::Permanent(format!(
            "shopify {other}: not mapped"
        ))),
    }
}

/// The gateway's own refund id in a Shopify refund transaction: a Stripe refund id
/// (`re_…`, `pyr_…`) in `receipt.id`, `receipt.refund_id` or `authorization`. Only
/// ids of that shape are taken: other gateways may repeat the payment's
/// authorization on every refund, which would merge two refunds into one.
fn gateway_refund_id(transaction: &Value) -> Option<String> {
    [
        get(transaction, &["receipt", "id"]),
        get(transaction, &["receipt", "refund_id"]),
        get(transaction, &["authorization"]),
    ]
    .into_iter()
    .filter_map(|v| v.and_then(Value::as_str))
    .find(|id| {
        (id.starts_with("re_") || id.starts_with("pyr_")) && check_id("refund id", id).is_ok()
    })
    .map(str::to_owned)
}

fn order_id(topic: &str, body: &Value, field: &str) -> Result<String, DomainError> {
    let id = id_text(get(body, &[field])).ok_or_else(|| missing(topic, field))?;
    check_id("order id", &id)?;
    Ok(id)
}

/// Shopify decimals: strings (`"49.90"`) or, leniently, JSON numbers.
fn decimal(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => parse_minor(s),
        Value::Number(n) => parse_minor(&n.to_string()),
        _ => None,
    }
}

/// Normalise an RFC 3339 timestamp to UTC seconds and its canonical text form.
pub(super) fn version(text: &str) -> Option<(i64, String)> {
    let secs = parse_rfc3339(text)?;
    Some((secs, format_rfc3339(secs)))
}

fn snapshot(topic: &str, body: &Value) -> Result<Snapshot, DomainError> {
    let order_id = order_id(topic, body, "id")?;
    let (version_secs, version) = get(body, &["updated_at"])
        .and_then(Value::as_str)
        .and_then(version)
        .ok_or_else(|| missing(topic, "updated_at"))?;
    let total_minor = get(body, &["total_price"])
        .and_then(decimal)
        .ok_or_else(|| missing(topic, "total_price"))?;
    if total_minor < 0 {
        return Err(missing(topic, "total_price"));
    }
    let mut line_items = Vec::new();
    let mut stock: BTreeMap<String, i64> = BTreeMap::new();
    for item in get(body, &["line_items"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let quantity = get(item, &["quantity"])
            .and_then(Value::as_i64)
            .filter(|q| *q >= 0)
            .ok_or_else(|| missing(topic, "line_items[].quantity"))?;
        let sku = text(get(item, &["sku"]));
        if let Some(sku) = &sku {
            check_id("SKU", sku)?;
            if quantity > 0 {
                *stock.entry(sku.clone()).or_default() += quantity;
            }
        }
        line_items.push(LineItem { sku, quantity });
    }
    Ok(Snapshot {
        order_id,
        version,
        version_secs,
        currency: currency(get(body, &["currency"])),
        total_minor,
        line_items,
        stock: stock
            .into_iter()
            .map(|(sku, quantity)| StockLine { sku, quantity })
            .collect(),
    })
}
