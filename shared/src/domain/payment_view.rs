//! The payment view: what the business believes about its orders' payments. The port
//! reconciliation (`crate::reconcile`) compares the providers' word with, so that it
//! never reads a domain's records itself; a domain implements it next to
//! [`super::Domain`] (the reference domain does so in its `view.rs`).
//!
//! Pure, like the domain: the caller loads the records (in batches, from the store
//! it chooses) and the view only names and reads them.

use super::state::{StateKey, StateRecord};

pub trait PaymentView: Send + Sync {
    /// The record holding what the business believes about order `order_id`.
    fn order_key(&self, tenant: &str, order_id: &str) -> StateKey;

    /// What `record` (loaded from [`Self::order_key`]; it may not exist) says.
    fn belief(&self, record: &StateRecord) -> OrderBelief;
}

/// What the business believes about one order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderBelief {
    pub payment: PaymentBelief,
    /// The business created the order from the shop's own order (Shopify
    /// `orders/create`), not only from a payment naming it.
    pub created_from_shop: bool,
}

/// What the business believes about an order's payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaymentBelief {
    /// No record of the order.
    Missing,
    /// A record the view cannot read.
    Unreadable,
    Known {
        /// Past the payment (paid, partially refunded, refunded).
        paid: bool,
        /// The payment failed.
        failed: bool,
        /// The business's own word for it (`pending`, `paid`, `failed`, …).
        status: String,
    },
}
