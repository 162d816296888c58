//! Thin providers (Mollie classic, GoPay, Klarna push): payment status. The payments
//! whose final state at the provider our business does not show get a hint through
//! the normal ingest path (see the module docs of `reconcile`).

use bytes::Bytes;

use super::report::{Difference, TenantReport, MISSING, PENDING_PROCESSING, UNREADABLE};
use super::{ReconcileError, Reconciler};
use crate::config::TenantConfig;
use crate::domain::payment_view::PaymentBelief;
use crate::domain::state::{StateKey, StateRecord, StateStore};
use crate::providers::reconcile_source::{ReconcileMethod, ReconcileSource};
use crate::providers::thin::{self, PaymentState, ThinResource};
use crate::time::format_rfc3339;

/// One payment (Klarna: order) of a thin provider, as its API reports it now.
pub(super) struct ThinPayment {
    /// The resource id a hint names (`tr_…`, the GoPay payment id, the Klarna order id).
    pub(super) id: String,
    pub(super) status: String,
    pub(super) state: PaymentState,
    pub(super) order_id: Option<String>,
    /// Mollie: `createdAt`; GoPay / Klarna push: the first hint's arrival (unix secs).
    pub(super) at: i64,
}

fn json_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Read one fetched or listed resource of a thin provider, where its own facts say
/// (`providers::thin::ThinResource`).
pub(super) fn thin_payment(
    provider: &str,
    facts: &ThinResource,
    body: &serde_json::Value,
) -> Result<ThinPayment, ReconcileError> {
    let field = |path| ThinResource::field(body, path);
    let id = json_text(field(facts.id))
        .ok_or_else(|| ReconcileError::Payload(format!("{provider}: resource without an id")))?;
    thin::check_resource_id(&id)
        .map_err(|e| ReconcileError::Payload(format!("{provider}: resource id: {e}")))?;
    let status = json_text(field(facts.status)).ok_or_else(|| {
        ReconcileError::Payload(format!("{provider} {id}: resource without a status"))
    })?;
    Ok(ThinPayment {
        id,
        state: facts.state(&status),
        status,
        order_id: json_text(field(facts.order_id)),
        at: 0,
    })
}

impl Reconciler {
    /// Mollie, GoPay, Klarna push: find the payments whose final state at the provider
    /// our business state does not show, and ingest a hint for each (see the module
    /// docs).
    pub(super) async fn reconcile_thin(
        &self,
        tenant: &TenantConfig,
        source: &ReconcileSource,
        start: i64,
        stored: i64,
        checkpoint: StateRecord,
        business: Option<&dyn StateStore>,
    ) -> Result<TenantReport, ReconcileError> {
        let provider = tenant.provider.as_str();
        let now = (self.now_secs)();
        let (facts, listed) = match source.method {
            ReconcileMethod::MolliePayments(facts) => (facts, true),
            ReconcileMethod::WatchedHints(facts) => (facts, false),
            ReconcileMethod::StripeEvents | ReconcileMethod::ShopifyOrders => {
                return Err(ReconcileError::Config(format!(
                    "{provider} is not a thin provider"
                )))
            }
        };
        let (payments, pending_since) = if listed {
            let option = source.credential_option;
            (self.list_mollie(tenant, facts, start, option).await?, None)
        } else {
            self.watched(tenant, facts, start).await?
        };
        // The next run starts at the oldest payment that may still change (open at the
        // provider, or its hint still in processing), and at most at the newest seen
        // (Mollie) / now (the others) minus the overlap.
        let oldest_open = payments
            .iter()
            .filter(|p| p.state == PaymentState::Open)
            .map(|p| p.at)
            .chain(pending_since)
            .min();
        let newest = if listed {
            payments.iter().map(|p| p.at).max()
        } else {
            Some(now)
        }
        .map(|n| n - self.overlap_secs);
        let next = match (newest, oldest_open) {
            (Some(n), Some(o)) => Some(n.min(o)),
            (n, o) => n.or(o),
        }
        .map_or(stored, |n| n.max(stored));

        let mut report = TenantReport::fetched(tenant, format_rfc3339(start), payments.len());
        let store = business.unwrap_or(self.state.as_ref());
        let finals: Vec<&ThinPayment> = payments
            .iter()
            .filter(|p| p.state != PaymentState::Open && p.order_id.is_some())
            .collect();
        let mut orders = Vec::with_capacity(finals.len());
        for chunk in finals.chunks(100) {
            let keys: Vec<StateKey> = chunk
                .iter()
                .map(|p| {
                    let order_id = p.order_id.as_deref().unwrap_or_default();
                    self.payments.order_key(&tenant.tenant, order_id)
                })
                .collect();
            orders.extend(store.load(&keys).await?);
        }
        for (payment, record) in finals.into_iter().zip(orders) {
            let ours = self.payments.belief(&record).payment;
            let in_sync = match (&ours, payment.state) {
                (PaymentBelief::Known { paid, .. }, PaymentState::Paid) => *paid,
                (PaymentBelief::Known { paid, failed, .. }, PaymentState::Failed) => {
                    *paid || *failed
                }
                _ => false,
            };
            if in_sync {
                report.already_present += 1;
                continue;
            }
            let ours = match ours {
                PaymentBelief::Known { status, .. } => status,
                PaymentBelief::Missing => MISSING.to_owned(),
                PaymentBelief::Unreadable => UNREADABLE.to_owned(),
            };
            // The same envelope and event id as a webhook hint of this minute: a real
            // hint arriving now is a duplicate of this one (and a later one is a new
            // hint whose effects the domain's keys make exactly-once).
            let envelope = thin::hint_envelope(provider, tenant, facts.kind, &payment.id, now);
            // A classic Mollie webhook's body; the others send none.
            let body = if listed {
                Bytes::from(format!("id={}", payment.id))
            } else {
                Bytes::new()
            };
            let outcome = self.ingestor.ingest_reconciled(envelope, body).await?;
            let our_status = if outcome.duplicate {
                // A hint of this minute is already stored; the next run looks again.
                report.already_present += 1;
                ours
            } else {
                report.ingested += 1;
                report.ingested_events.push(outcome.key.as_str().to_owned());
                tracing::info!(
                    provider, tenant = %tenant.tenant, object_id = %payment.id,
                    event_id = %outcome.event_id, "reconciliation ingested a hint"
                );
                PENDING_PROCESSING.to_owned()
            };
            report.differences.push(Difference {
                provider: tenant.provider.clone(),
                tenant: tenant.tenant.clone(),
                object_id: payment.id.clone(),
                order_id: payment.order_id.clone().unwrap_or_default(),
                provider_status: payment.status.clone(),
                our_status,
            });
        }
        if next > stored || !checkpoint.exists() {
            self.store_checkpoint(checkpoint, next).await?;
        }
        report.checkpoint = Some(format_rfc3339(next));
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn thin_resources_are_read_where_the_provider_says() {
        let facts = |provider: &str| {
            super::super::source_of(provider)
                .and_then(|s| s.thin())
                .expect("a thin provider")
        };
        let state = |provider: &str, body: serde_json::Value| {
            thin_payment(provider, facts(provider), &body).map(|p| (p.id, p.state, p.order_id))
        };
        let mollie = |status: &str| {
            json!({"resource": "payment", "id": "tr_1", "status": status,
                   "metadata": {"order_id": "o-1"}})
        };
        for (status, expected) in [
            ("paid", PaymentState::Paid),
            ("failed", PaymentState::Failed),
            ("canceled", PaymentState::Failed),
            ("expired", PaymentState::Failed),
            ("open", PaymentState::Open),
            ("authorized", PaymentState::Open),
        ] {
            let (id, s, order) = state("mollie", mollie(status)).unwrap();
            assert_eq!(
                (id.as_str(), s, order.as_deref()),
                ("tr_1", expected, Some("o-1"))
            );
        }
        let gopay = json!({"id": 3000006529u64, "state": "PAID", "order_number": 17});
        let (id, s, order) = state("gopay", gopay).unwrap();
        assert_eq!((id.as_str(), s), ("3000006529", PaymentState::Paid));
        assert_eq!(order.as_deref(), Some("17"));
        for (status, expected) in [
            ("TIMEOUTED", PaymentState::Failed),
            ("CREATED", PaymentState::Open),
            ("REFUNDED", PaymentState::Open),
        ] {
            let body = json!({"id": 1, "state": status});
            assert_eq!(state("gopay", body).unwrap().1, expected, "{status}");
        }
        let klarna = json!({"order_id": "abc-1", "status": "CANCELLED"});
        let (_, s, order) = state("klarna-push", klarna).unwrap();
        assert_eq!((s, order), (PaymentState::Failed, None));
        // Bad input is an error, never a panic.
        for (provider, body) in [
            ("mollie", json!({"status": "paid"})),
            ("mollie", json!({"id": "tr_1"})),
            ("mollie", json!({"id": "../x", "status": "paid"})),
            ("gopay", json!({"id": [1], "state": "PAID"})),
            ("klarna-push", json!(null)),
        ] {
            assert!(
                matches!(
                    state(provider, body.clone()),
                    Err(ReconcileError::Payload(_))
                ),
                "{provider} {body}"
            );
        }
        assert_eq!(facts("klarna-push").kind, "order");
        assert_eq!(facts("gopay").kind, "payment");
    }
}
