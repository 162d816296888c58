//! A provider's reconcile source: how reconciliation (`crate::reconcile`) reads what
//! the provider may not have told us, declared by the provider itself
//! ([`super::Provider::reconcile`]).

use super::thin::ThinResource;

/// Where a reconciled provider's missed events or payment states come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcileSource {
    /// The tenant option holding the API credential; a tenant without it is not
    /// reconciled unless it is selected by provider and tenant.
    pub credential_option: &'static str,
    pub method: ReconcileMethod,
}

/// How a run reads the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileMethod {
    /// Stripe's event list: each event is the webhook body Stripe would have sent.
    StripeEvents,
    /// Shopify's order list: each order version becomes an `orders/updated`.
    ShopifyOrders,
    /// Mollie's payment list, compared with our orders (a thin provider).
    MolliePayments(&'static ThinResource),
    /// No list API: one lookup per payment the tenant's hints named (a thin provider).
    WatchedHints(&'static ThinResource),
}

impl ReconcileSource {
    /// The fetched resource of a thin provider (payment status reconciliation).
    pub fn thin(&self) -> Option<&'static ThinResource> {
        match self.method {
            ReconcileMethod::MolliePayments(r) | ReconcileMethod::WatchedHints(r) => Some(r),
            ReconcileMethod::StripeEvents | ReconcileMethod::ShopifyOrders => None,
        }
    }
}
