//! Typed record data of the reference domain and the effect-key scheme.
//!
//! Two record kinds: `order` (id = the shop's order id) and `sku` (id = the SKU).
//! Everything that belongs to one order (invoice, refunds, shipments, the customer
//! notification outbox, loyalty credit) lives in the order record, so most effects
//! write one record; only stock moves touch `sku` records as well.
//!
//! Every vector is kept sorted by a stable key and every derived number (refunded
//! total, payment status after refunds, loyalty points) is recomputed from the
//! facts by [`Order::normalize`], so the data does not depend on arrival order.

use serde::{Deserialize, Serialize};

use crate::domain::state::{StateKey, StateRecord, StateWrite};
use crate::domain::DomainError;

/// Record kind of orders.
pub const ORDER: &str = "order";
/// Record kind of stock-keeping units.
pub const SKU: &str = "sku";

/// One loyalty point per full currency unit paid and not refunded
/// (`(paid - refunded) / 100`, rounded down; every currency is treated as having
/// two decimals, which is exact for EUR/USD/GBP and generous for JPY-like ones).
pub const MINOR_PER_POINT: i64 = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    Open,
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    Pending,
    Paid,
    Failed,
    Refunded,
    PartiallyRefunded,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineItem {
    /// `None` for items without a SKU (gift cards, custom items): shown, never stocked.
    pub sku: Option<String>,
    pub quantity: i64,
}

/// Stock taken from a SKU when the order was created (what a cancel puts back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StockLine {
    pub sku: String,
    pub quantity: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Invoice {
    pub invoice_id: String,
    pub amount_minor: i64,
    /// The effect key that issued it (`…#paid`).
    pub source_effect: String,
}

/// One payment as a provider reported it (`…#payment#{provider}#{payment_id}`).
/// Shopify reports the order paid as a whole: its payment id is [`SHOPIFY_ORDER_PAYMENT`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Payment {
    pub provider: String,
    pub payment_id: String,
    pub amount_minor: i64,
}

/// The provider of the report that stands for an invoice issued before any payment
/// was recorded (its payment id is the invoice id).
pub const INVOICE_PAYMENT: &str = "invoice";

/// The payment id of Shopify's order-level payment report (`orders/paid`, a paid
/// `orders/create`), which names no gateway payment.
pub const SHOPIFY_ORDER_PAYMENT: &str = "order";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refund {
    pub refund_id: String,
    pub amount_minor: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shipment {
    pub fulfillment_id: String,
    pub tracking: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotificationKind {
    PaymentReceived,
    PaymentFailed,
    Refunded,
    Shipped,
    Cancelled,
}

/// One customer notification in the order's outbox. `dedup_key` is the effect key
/// that caused it, so a sender can deliver each at most once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Notification {
    pub kind: NotificationKind,
    pub dedup_key: String,
}

/// The `order` record's data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Order {
    pub order_id: String,
    pub status: OrderStatus,
    pub payment_status: PaymentStatus,
    /// ISO 4217, upper case.
    pub currency: Option<String>,
    pub total_minor: i64,
    pub line_items: Vec<LineItem>,
    /// Stock taken by `orders/create`, sorted by SKU.
    pub stock_reserved: Vec<StockLine>,
    /// At most one (issued by the first payment), sorted by id. Its amount is the
    /// paid total ([`Order::paid_minor`]) once payments are recorded.
    pub invoices: Vec<Invoice>,
    /// Every payment reported, sorted by (provider, payment id). Absent in records
    /// written before payments were recorded (then the invoice holds the amount).
    #[serde(default)]
    pub payments: Vec<Payment>,
    /// Sorted by refund id.
    pub refunds: Vec<Refund>,
    /// Sum of `refunds` (derived).
    pub refunded_minor: i64,
    /// Sorted by fulfillment id.
    pub shipments: Vec<Shipment>,
    /// Outbox, sorted by dedup key.
    pub notifications: Vec<Notification>,
    /// Derived: `(paid - refunded) / MINOR_PER_POINT` once paid.
    pub loyalty_points: i64,
    /// `orders/create` has been applied (Shopify line items and stock are known).
    pub shopify_created: bool,
    /// Newest applied Shopify order snapshot (`updated_at`, normalised to UTC).
    pub shopify_updated_at: Option<String>,
    /// Provider time (Unix seconds) of the newest applied payment failure while the
    /// order is unpaid; cleared by the payment (a paid order ignores every failure).
    pub payment_event_at: Option<i64>,
}

impl Order {
    /// An order known only by id: pending, open, no items.
    pub fn new(order_id: &str) -> Order {
        Order {
            order_id: order_id.to_owned(),
            status: OrderStatus::Open,
            payment_status: PaymentStatus::Pending,
            currency: None,
            total_minor: 0,
            line_items: Vec::new(),
            stock_reserved: Vec::new(),
            invoices: Vec::new(),
            payments: Vec::new(),
            refunds: Vec::new(),
            refunded_minor: 0,
            shipments: Vec::new(),
            notifications: Vec::new(),
            loyalty_points: 0,
            shopify_created: false,
            shopify_updated_at: None,
            payment_event_at: None,
        }
    }

    /// The invoiced (paid) amount; 0 while unpaid.
    pub fn paid_minor(&self) -> i64 {
        self.invoices.iter().map(|i| i.amount_minor).sum()
    }

    /// The paid total from the recorded payments: each provider's payments are summed
    /// (deposit + balance, partial captures), and the largest provider total counts,
    /// because two providers reporting an order paid (Shopify's order-level report and
    /// the gateway's payment) report the same money. `None` without recorded payments.
    pub fn payments_total_minor(&self) -> Option<i64> {
        let mut totals: Vec<(&str, i64)> = Vec::new();
        for p in &self.payments {
            match totals
                .iter_mut()
                .find(|(provider, _)| *provider == p.provider)
            {
                Some((_, sum)) => *sum += p.amount_minor,
                None => totals.push((&p.provider, p.amount_minor)),
            }
        }
        totals.into_iter().map(|(_, sum)| sum).max()
    }

    /// Paid, partially refunded or refunded: past the payment.
    pub fn is_paid(&self) -> bool {
        !self.invoices.is_empty()
    }

    pub fn notify(&mut self, kind: NotificationKind, dedup_key: &str) {
        if !self.notifications.iter().any(|n| n.dedup_key == dedup_key) {
            self.notifications.push(Notification {
                kind,
                dedup_key: dedup_key.to_owned(),
            });
        }
    }

    /// Sort every list by its stable key and recompute the derived fields.
    pub fn normalize(&mut self) {
        self.stock_reserved.sort_by(|a, b| a.sku.cmp(&b.sku));
        self.invoices
            .sort_by(|a, b| a.invoice_id.cmp(&b.invoice_id));
        self.payments
            .sort_by(|a, b| (&a.provider, &a.payment_id).cmp(&(&b.provider, &b.payment_id)));
        if let (Some(total), Some(invoice)) =
            (self.payments_total_minor(), self.invoices.first_mut())
        {
            invoice.amount_minor = total;
            // An order only a payment provider knows is worth what was paid for it
            // (deposit + balance); a Shopify order keeps its own total.
            if !self.shopify_created {
                self.total_minor = self.total_minor.max(total);
            }
        }
        self.refunds.sort_by(|a, b| a.refund_id.cmp(&b.refund_id));
        self.shipments
            .sort_by(|a, b| a.fulfillment_id.cmp(&b.fulfillment_id));
        self.notifications
            .sort_by(|a, b| a.dedup_key.cmp(&b.dedup_key).then(a.kind.cmp(&b.kind)));
        self.refunded_minor = self.refunds.iter().map(|r| r.amount_minor).sum();
        if self.is_paid() {
            let paid = self.paid_minor();
            self.payment_status = if self.refunded_minor == 0 {
                PaymentStatus::Paid
            } else if self.refunded_minor >= paid {
                PaymentStatus::Refunded
            } else {
                PaymentStatus::PartiallyRefunded
            };
            self.loyalty_points = (paid - self.refunded_minor).max(0) / MINOR_PER_POINT;
        } else {
            self.loyalty_points = 0;
        }
    }
}

/// The `sku` record's data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sku {
    pub sku: String,
    /// May go negative: the shop already accepted the order (oversold), we record it.
    pub on_hand: i64,
}

/// Parse an existing record's data; a record we do not understand is never rewritten
/// (re-serialising would drop what we do not know), so it is a permanent error.
pub(crate) fn parse_data<T: serde::de::DeserializeOwned>(
    record: &StateRecord,
) -> Result<T, DomainError> {
    serde_json::from_value(record.data.clone()).map_err(|e| {
        DomainError::Permanent(format!(
            "record {} has unreadable data: {e}",
            record.key.pk()
        ))
    })
}

pub(crate) fn to_data<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("reference domain data serialises")
}

/// Effect keys `{tenant}#order-{order_id}#{action}[#{version or id}]`: built from the
/// business identity only, never from a delivery or event id, so two providers (or two
/// event types) reporting the same business action produce the same key.
#[derive(Debug, Clone)]
pub struct EffectKeys {
    prefix: String,
}

impl EffectKeys {
    pub fn new(tenant: &str, order_id: &str) -> Self {
        EffectKeys {
            prefix: format!("{tenant}#order-{order_id}"),
        }
    }
    pub fn paid(&self) -> String {
        format!("{}#paid", self.prefix)
    }
    pub fn checkout(&self, session_id: &str) -> String {
        format!("{}#checkout#{session_id}", self.prefix)
    }
    pub fn payment_failed(&self, payment_id: &str, at: i64) -> String {
        format!("{}#payment_failed#{payment_id}#{at}", self.prefix)
    }
    /// One payment of `provider` (`payment_id`: intent, capture, transaction, ...).
    pub fn payment(&self, provider: &str, payment_id: &str) -> String {
        format!("{}#payment#{provider}#{payment_id}", self.prefix)
    }
    pub fn refund(&self, refund_id: &str) -> String {
        format!("{}#refund#{refund_id}", self.prefix)
    }
    pub fn fulfillment(&self, fulfillment_id: &str) -> String {
        format!("{}#fulfillment#{fulfillment_id}", self.prefix)
    }
    pub fn created(&self) -> String {
        format!("{}#created", self.prefix)
    }
    pub fn updated(&self, version: &str) -> String {
        format!("{}#updated#{version}", self.prefix)
    }
    pub fn cancelled(&self) -> String {
        format!("{}#cancelled", self.prefix)
    }
    /// A payment provider cancelled payment `payment_id` (Adyen `CANCELLATION`).
    pub fn payment_cancelled(&self, payment_id: &str) -> String {
        format!("{}#payment_cancelled#{payment_id}", self.prefix)
    }
    pub fn stock(&self, sku: &str) -> String {
        format!("{}#stock#{sku}", self.prefix)
    }
    pub fn restock(&self, sku: &str) -> String {
        format!("{}#restock#{sku}", self.prefix)
    }
}

pub fn order_key(tenant: &str, order_id: &str) -> StateKey {
    StateKey::new(tenant, ORDER, order_id)
}

pub fn sku_key(tenant: &str, sku: &str) -> StateKey {
    StateKey::new(tenant, SKU, sku)
}

/// The write that creates a `sku` record with `on_hand` units (inventory is seeded
/// out of band; an order for a SKU without a record is a permanent error). Its
/// applied set holds `{tenant}#sku-{sku}#seed`.
pub fn seed_sku(tenant: &str, sku: &str, on_hand: i64) -> StateWrite {
    let key = sku_key(tenant, sku);
    let applied = [format!("{tenant}#sku-{sku}#seed")].into_iter().collect();
    StateWrite {
        record: StateRecord {
            key,
            version: 1,
            data: to_data(&Sku {
                sku: sku.to_owned(),
                on_hand,
            }),
            applied,
        },
        expected_version: 0,
    }
}

/// Ids become parts of record keys and effect keys: non-empty, bounded, no `#`,
/// no whitespace or control characters.
pub(crate) fn check_id(what: &str, id: &str) -> Result<(), DomainError> {
    if id.is_empty()
        || id.len() > 128
        || id
            .chars()
            .any(|c| c == '#' || c.is_whitespace() || c.is_control())
    {
        return Err(DomainError::Permanent(format!(
            "invalid {what} (empty, too long, or contains '#'/whitespace)"
        )));
    }
    Ok(())
}

/// A decimal amount (`"49.90"`, `"49.9"`, `"50"`, or a JSON number) in minor units,
/// two decimals. More decimals are accepted only when they are zeros.
pub(crate) fn parse_minor(text: &str) -> Option<i64> {
    let (neg, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, frac) = match digits.split_once('.') {
        Some((w, f)) => (w, f),
        None => (digits, ""),
    };
    if whole.is_empty() || whole.len() > 15 || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) || (digits.contains('.') && frac.is_empty()) {
        return None;
    }
    if frac.len() > 2 && frac[2..].bytes().any(|b| b != b'0') {
        return None;
    }
    let mut cents = 0i64;
    for (i, b) in frac.bytes().take(2).enumerate() {
        cents += i64::from(b - b'0') * if i == 0 { 10 } else { 1 };
    }
    let value = whole.parse::<i64>().ok()? * 100 + cents;
    Some(if neg { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_units() {
        assert_eq!(parse_minor("49.90"), Some(4990));
        assert_eq!(parse_minor("49.9"), Some(4990));
        assert_eq!(parse_minor("50"), Some(5000));
        assert_eq!(parse_minor("0.05"), Some(5));
        assert_eq!(parse_minor("10.000"), Some(1000));
        assert_eq!(parse_minor("-3.50"), Some(-350));
        for bad in ["", ".5", "5.", "4.999", "1e3", "abc", "1.2.3", " 1"] {
            assert_eq!(parse_minor(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn order_round_trips_and_rejects_unknown_fields() {
        let mut o = Order::new("1001");
        o.normalize();
        let v = to_data(&o);
        let back: Order = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back, o);
        let mut extra = v;
        extra["surprise"] = serde_json::json!(1);
        assert!(serde_json::from_value::<Order>(extra).is_err());
    }

    #[test]
    fn ids() {
        assert!(check_id("order id", "1001").is_ok());
        assert!(check_id("order id", "SKU-RED-M").is_ok());
        for bad in ["", "a#b", "a b", "a\nb"] {
            assert!(check_id("order id", bad).is_err(), "{bad:?}");
        }
        assert!(check_id("order id", &"x".repeat(129)).is_err());
    }
}
