//! The reference e-commerce domain: orders paid through Stripe and/or sold through
//! Shopify, with invoices, stock per SKU, refunds, shipments, a customer notification
//! outbox and loyalty credit. See `docs/domain.md` for the full mapping.
//!
//! Pure and deterministic: it reads only the event (envelope + verified body) and the
//! records it is given; no clock, no I/O, never the delivery id. Provider payloads are
//! first reduced to a provider-neutral [`Event`] (`stripe.rs`, `shopify.rs`,
//! `paypal.rs`, `adyen.rs`, `paddle.rs`, `square.rs`, and `thin.rs` for the fetched
//! state of Mollie, GoPay and Klarna), which `decide.rs` turns into record changes.
//! A provider parser may also decide that a supported event carries no business
//! effect (a declined refund, a payment that is not final yet): [`Mapped::Ignore`].
//!
//! Order independence: every fact is merged commutatively (sorted lists, sums,
//! newest-version-wins snapshots) and every missing prerequisite is a
//! [`DomainError::Wait`], so any arrival order, retried until nothing waits, ends in the
//! same record *data*. (The `applied` sets and versions can differ: a superseded event
//! is ignored in one order and applied in another; the data converges.)

mod adyen;
mod decide;
pub mod model;
mod paddle;
mod paypal;
mod paystack;
mod razorpay;
mod shopify;
mod square;
mod stripe;
#[cfg(test)]
mod tests;
mod thin;
mod view;
mod worldline;

use serde_json::Value;

use super::state::{StateKey, StateRecord};
use super::{Change, Decision, Domain, DomainError, DomainEvent, Prepared};
use crate::destinations::Output;
pub use model::{
    order_key, seed_sku, sku_key, EffectKeys, Invoice, LineItem, Notification, NotificationKind,
    Order, OrderStatus, Payment, PaymentStatus, Refund, Shipment, Sku, StockLine, MINOR_PER_POINT,
    ORDER, SHOPIFY_ORDER_PAYMENT, SKU,
};

/// The reference domain. Stateless; construct with `ReferenceDomain` or `::default()`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceDomain;

/// The event types this domain maps to effects, as `(provider, event_type)`.
pub const SUPPORTED: &[(&str, &str)] = &[
    ("stripe", "checkout.session.completed"),
    ("stripe", "payment_intent.succeeded"),
    ("stripe", "payment_intent.payment_failed"),
    ("stripe", "charge.refunded"),
    ("stripe", "refund.created"),
    ("shopify", "orders/create"),
    ("shopify", "orders/paid"),
    ("shopify", "orders/updated"),
    ("shopify", "orders/cancelled"),
    ("shopify", "refunds/create"),
    ("shopify", "fulfillments/create"),
    ("paypal", "PAYMENT.CAPTURE.COMPLETED"),
    ("paypal", "PAYMENT.CAPTURE.REFUNDED"),
    ("paypal", "PAYMENT.CAPTURE.DENIED"),
    ("adyen", "AUTHORISATION"),
    ("adyen", "CAPTURE"),
    ("adyen", "REFUND"),
    ("adyen", "CANCELLATION"),
    ("paddle", "transaction.completed"),
    ("paddle", "transaction.paid"),
    ("paddle", "transaction.payment_failed"),
    ("paddle", "adjustment.created"),
    ("paddle", "adjustment.updated"),
    ("square", "payment.created"),
    ("square", "payment.updated"),
    ("square", "refund.created"),
    ("square", "refund.updated"),
    ("razorpay", "payment.captured"),
    ("razorpay", "payment.failed"),
    ("razorpay", "refund.processed"),
    ("worldline", "payment.captured"),
    ("worldline", "payment.rejected"),
    ("worldline", "refund.refunded"),
    ("paystack", "charge.success"),
    // Thin webhooks: the processor replaced the body with the fetched state.
    ("mollie", "payment"),
    ("gopay", "payment"),
    ("klarna-push", "order"),
];

impl ReferenceDomain {
    pub fn new() -> Self {
        ReferenceDomain
    }

    /// Whether `(provider, event_type)` is mapped to effects (others are ignored).
    pub fn supports(provider: &str, event_type: &str) -> bool {
        SUPPORTED
            .iter()
            .any(|(p, t)| *p == provider && *t == event_type)
    }
}

impl Domain for ReferenceDomain {
    fn targets(&self, event: &DomainEvent<'_>) -> Result<Vec<StateKey>, DomainError> {
        Ok(match parse(event)? {
            Some(Mapped::Event(e)) => e.targets(&event.envelope.tenant),
            Some(Mapped::Ignore(_)) | None => Vec::new(),
        })
    }

    /// Parsed once: the conflict rounds of a hot record decide on the same parse.
    fn prepare(&self, event: &DomainEvent<'_>) -> Result<Prepared, DomainError> {
        let mapped = parse(event)?;
        let targets = match &mapped {
            Some(Mapped::Event(e)) => e.targets(&event.envelope.tenant),
            Some(Mapped::Ignore(_)) | None => Vec::new(),
        };
        Ok(Prepared::with_parsed(targets, mapped))
    }

    fn decide(
        &self,
        event: &DomainEvent<'_>,
        current: &[StateRecord],
    ) -> Result<Decision, DomainError> {
        decide_mapped(event, parse(event)?.as_ref(), current)
    }

    fn decide_prepared(
        &self,
        event: &DomainEvent<'_>,
        prepared: &Prepared,
        current: &[StateRecord],
    ) -> Result<Decision, DomainError> {
        match prepared.parsed::<Option<Mapped>>() {
            Some(mapped) => decide_mapped(event, mapped.as_ref(), current),
            None => self.decide(event, current),
        }
    }

    /// SKU reads are not guarded: a decision uses a SKU only to move its stock, and
    /// then writes it under its version. A guard would make every order event that
    /// loads a SKU without moving it (a paid `orders/create` redelivered, a cancel
    /// already restocked) conflict with every order of that SKU. The order is always
    /// guarded: it is written whenever anything commits (it holds the effect keys).
    fn guards_read(&self, _event: &DomainEvent<'_>, record: &StateKey) -> bool {
        record.kind != SKU
    }

    /// The customer notifications this decision put in an order's outbox: each order
    /// change's notification whose `dedup_key` is that change's effect key (kind
    /// `notification.<kind>`, key = the dedup key), so each is delivered once per
    /// dedup key, also when a re-run finds the change already applied.
    fn outputs(&self, _event: &DomainEvent<'_>, changes: &[Change]) -> Vec<Output> {
        let mut outputs: Vec<Output> = Vec::new();
        for change in changes.iter().filter(|c| c.key.kind == ORDER) {
            let Ok(order) = serde_json::from_value::<Order>(change.data.clone()) else {
                continue;
            };
            for n in order
                .notifications
                .iter()
                .filter(|n| n.dedup_key == change.effect_key)
            {
                if outputs.iter().any(|o| o.key == n.dedup_key) {
                    continue;
                }
                let kind = serde_json::to_value(n.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                outputs.push(Output {
                    kind: format!("{NOTIFICATION_PREFIX}{kind}"),
                    key: n.dedup_key.clone(),
                    object_id: Some(order.order_id.clone()),
                    data: serde_json::json!({
                        "kind": kind,
                        "dedup_key": n.dedup_key,
                        "tenant": change.key.tenant,
                        "order_id": order.order_id,
                        "order_status": order.status,
                        "payment_status": order.payment_status,
                        "currency": order.currency,
                        "total_minor": order.total_minor,
                        "refunded_minor": order.refunded_minor,
                    }),
                });
            }
        }
        outputs
    }
}

/// The kind prefix of the reference domain's notification outputs.
pub const NOTIFICATION_PREFIX: &str = "notification.";

fn unsupported(event: &DomainEvent<'_>) -> String {
    format!(
        "unsupported event type {} {}",
        event.envelope.provider, event.envelope.event_type
    )
}

/// The decision on an event as [`parse`] mapped it.
fn decide_mapped(
    event: &DomainEvent<'_>,
    mapped: Option<&Mapped>,
    current: &[StateRecord],
) -> Result<Decision, DomainError> {
    let parsed = match mapped {
        Some(Mapped::Event(e)) => e,
        Some(Mapped::Ignore(reason)) => {
            return Ok(Decision::Ignore {
                reason: reason.clone(),
            })
        }
        None => {
            return Ok(Decision::Ignore {
                reason: unsupported(event),
            })
        }
    };
    let tenant = &event.envelope.tenant;
    let targets = parsed.targets(tenant);
    if current.len() != targets.len() || current.iter().zip(&targets).any(|(r, k)| r.key != *k) {
        return Err(DomainError::Permanent(format!(
            "records given to {} do not match its targets",
            event.envelope.event_type
        )));
    }
    decide::decide(parsed, tenant, current)
}

/// What a provider parser made of a supported event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mapped {
    /// A business fact for `decide`.
    Event(Event),
    /// A supported type that carries no business effect (not final, declined, or
    /// no order to attach it to), with the reason; no record is loaded.
    Ignore(String),
}

/// Reduce a supported event to its provider-neutral form; `None` if unsupported.
pub(crate) fn parse(event: &DomainEvent<'_>) -> Result<Option<Mapped>, DomainError> {
    let env = event.envelope;
    if !ReferenceDomain::supports(&env.provider, &env.event_type) {
        return Ok(None);
    }
    let body: Value = serde_json::from_slice(event.body).map_err(|_| {
        DomainError::Permanent(format!("{}: body is not valid JSON", env.event_type))
    })?;
    if !body.is_object() {
        return Err(DomainError::Permanent(format!(
            "{}: body is not a JSON object",
            env.event_type
        )));
    }
    let ty = env.event_type.as_str();
    let parsed = match env.provider.as_str() {
        "stripe" => Mapped::Event(stripe::parse(ty, &body, env.occurred_at)?),
        "shopify" => shopify::parse(ty, &body)?,
        "paypal" => paypal::parse(ty, &body, env.occurred_at)?,
        "adyen" => adyen::parse(ty, &body, env.occurred_at)?,
        "paddle" => paddle::parse(ty, &body, env.occurred_at)?,
        "square" => square::parse(ty, &body, env.occurred_at)?,
        "razorpay" => razorpay::parse(ty, &body, env.occurred_at)?,
        "worldline" => worldline::parse(ty, &body, env.occurred_at)?,
        "paystack" => paystack::parse(ty, &body)?,
        provider => thin::parse(provider, ty, &body)?,
    };
    Ok(Some(parsed))
}

/// A refund as reported: id and positive amount in minor units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefundFact {
    /// The gateway's refund id where the event carries it (Stripe `re_…`, also inside
    /// a Shopify refund's transaction), so every feed of one refund names it alike.
    pub id: String,
    pub amount: i64,
    /// The payment it returns money from, where the event names it (Stripe
    /// `payment_intent`, Adyen `originalReference`, Square `payment_id`).
    pub payment_id: Option<String>,
    /// Reported by Shopify: the order's total comes with its `orders/create`.
    pub from_shopify: bool,
}

/// Which payment a payment report is about: `(provider, payment id)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PaymentRef {
    pub provider: String,
    pub id: String,
}

impl PaymentRef {
    pub fn new(provider: &str, id: &str) -> Self {
        PaymentRef {
            provider: provider.to_owned(),
            id: id.to_owned(),
        }
    }
}

/// A full Shopify order snapshot (create, updated, cancelled bodies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub order_id: String,
    /// `updated_at` normalised to `YYYY-MM-DDTHH:MM:SSZ`.
    pub version: String,
    pub version_secs: i64,
    pub currency: Option<String>,
    pub total_minor: i64,
    pub line_items: Vec<LineItem>,
    /// Quantities per SKU (summed over line items), sorted by SKU.
    pub stock: Vec<StockLine>,
}

/// What the domain understood of one supported event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// Stripe `checkout.session.completed`.
    Checkout {
        order_id: String,
        session_id: String,
        amount: Option<i64>,
        currency: Option<String>,
        paid: bool,
        /// The session's `payment_intent`: the payment a paid session reports.
        payment_intent: Option<String>,
    },
    /// Stripe `payment_intent.succeeded` and the other providers' payments.
    PaymentSucceeded {
        order_id: String,
        payment: PaymentRef,
        amount: i64,
        currency: Option<String>,
    },
    /// Stripe `payment_intent.payment_failed`.
    PaymentFailed {
        order_id: String,
        payment_id: String,
        at: i64,
        amount: i64,
        currency: Option<String>,
    },
    /// Stripe `charge.refunded` / `refund.created`, Shopify `refunds/create`.
    Refunds {
        order_id: String,
        refunds: Vec<RefundFact>,
    },
    /// Shopify `orders/create`.
    ShopifyCreate { snapshot: Snapshot, paid: bool },
    /// Shopify `orders/paid`.
    ShopifyPaid { order_id: String, amount: i64 },
    /// Shopify `orders/updated`.
    ShopifyUpdated { snapshot: Snapshot },
    /// Shopify `orders/cancelled`.
    ShopifyCancelled { snapshot: Snapshot },
    /// Adyen `CANCELLATION` (success): the payment `payment_id` was cancelled, so the
    /// order is cancelled. Never moves stock (see `docs/domain.md`).
    PaymentCancelled {
        order_id: String,
        payment_id: String,
        amount: i64,
        currency: Option<String>,
    },
    /// Shopify `fulfillments/create`.
    Fulfillment {
        order_id: String,
        fulfillment_id: String,
        tracking: Option<String>,
    },
}

impl Event {
    pub fn order_id(&self) -> &str {
        match self {
            Event::Checkout { order_id, .. }
            | Event::PaymentSucceeded { order_id, .. }
            | Event::PaymentFailed { order_id, .. }
            | Event::Refunds { order_id, .. }
            | Event::ShopifyPaid { order_id, .. }
            | Event::PaymentCancelled { order_id, .. }
            | Event::Fulfillment { order_id, .. } => order_id,
            Event::ShopifyCreate { snapshot, .. }
            | Event::ShopifyUpdated { snapshot }
            | Event::ShopifyCancelled { snapshot } => &snapshot.order_id,
        }
    }

    /// The order first, then (create / cancel) one `sku` record per SKU, sorted.
    pub fn targets(&self, tenant: &str) -> Vec<StateKey> {
        let mut keys = vec![order_key(tenant, self.order_id())];
        if let Event::ShopifyCreate { snapshot, .. } | Event::ShopifyCancelled { snapshot } = self {
            keys.extend(snapshot.stock.iter().map(|l| sku_key(tenant, &l.sku)));
        }
        keys
    }
}

// ---- JSON helpers shared by the provider parsers ----------------------------------

pub(crate) fn get<'v>(v: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .filter(|v| !v.is_null())
}

/// An id given as a non-empty string or an integer.
pub(crate) fn id_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) if n.is_u64() || n.is_i64() => Some(n.to_string()),
        _ => None,
    }
}

pub(crate) fn text(v: Option<&Value>) -> Option<String> {
    v?.as_str().filter(|s| !s.is_empty()).map(str::to_owned)
}

pub(crate) fn missing(event_type: &str, field: &str) -> DomainError {
    DomainError::Permanent(format!("{event_type}: missing or invalid `{field}`"))
}

pub(crate) fn currency(v: Option<&Value>) -> Option<String> {
    text(v).map(|c| c.to_ascii_uppercase())
}

/// A checked order id taken from `v` (string or integer); `None` if absent.
pub(crate) fn order_id_of(v: Option<&Value>) -> Result<Option<String>, DomainError> {
    let Some(id) = id_text(v) else {
        return Ok(None);
    };
    model::check_id("order id", &id)?;
    Ok(Some(id))
}

/// A checked provider id (payment, refund, ...) that must be present.
pub(crate) fn required_id(
    event_type: &str,
    v: Option<&Value>,
    field: &str,
    what: &str,
) -> Result<String, DomainError> {
    let id = id_text(v).ok_or_else(|| missing(event_type, field))?;
    model::check_id(what, &id)?;
    Ok(id)
}

/// Integer minor units, given as a JSON integer or a string of digits (Paddle).
pub(crate) fn minor_int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse().ok()
        }
        _ => None,
    }
    .filter(|a| *a >= 0)
}

/// A decimal amount (`"49.90"`) in minor units, two decimals.
pub(crate) fn minor_decimal(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::String(s) => model::parse_minor(s),
        Value::Number(n) => model::parse_minor(&n.to_string()),
        _ => None,
    }
    .filter(|a| *a >= 0)
}

/// An RFC 3339 timestamp in Unix seconds.
pub(crate) fn time_of(v: Option<&Value>) -> Option<i64> {
    crate::time::parse_rfc3339(v?.as_str()?)
}
