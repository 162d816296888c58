//! What a run reports: the per-tenant counts, the differences between the provider's
//! word and our orders, and the audit record of a run.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Fetched, ReconcileError, ReconcileOptions};
use crate::audit::AuditRecord;
use crate::config::TenantConfig;
use crate::domain::payment_view::{PaymentBelief, PaymentView};
use crate::domain::state::{StateKey, StateStore};
use crate::time::format_rfc3339;

/// The result for one provider/tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantReport {
    pub provider: String,
    pub tenant: String,
    /// The start of the window read (RFC 3339).
    pub since: String,
    /// Events (Stripe), order versions (Shopify: plus one `orders/create` per listed
    /// order the business has not created) or payments (thin providers) read from the
    /// API.
    pub fetched: usize,
    /// Of those, already in the inbox (a webhook or an earlier run brought them);
    /// thin providers: already in sync with our order (see the module docs).
    pub already_present: usize,
    /// Of those, missing from the inbox and ingested now (`source = reconcile`); thin
    /// providers: the hints ingested now.
    pub ingested: usize,
    /// The checkpoint stored after the run (RFC 3339); `None` when the run failed.
    pub checkpoint: Option<String>,
    /// Why the run failed; the checkpoint was not advanced.
    pub error: Option<String>,
    /// Inbox keys of the events ingested now.
    #[serde(default)]
    pub ingested_events: Vec<String>,
    /// Provider says paid, our order is not (Stripe/Shopify: computed only with a
    /// business state store, see [`Reconciler::run_with`]; thin providers: always, one
    /// per payment a hint was ingested or is due for).
    #[serde(default)]
    pub differences: Vec<Difference>,
}

impl TenantReport {
    /// A run's report before anything is ingested: `fetched` read since `since`, no
    /// checkpoint, no error, no differences yet.
    pub(crate) fn fetched(tenant: &TenantConfig, since: String, fetched: usize) -> Self {
        TenantReport {
            provider: tenant.provider.clone(),
            tenant: tenant.tenant.clone(),
            since,
            fetched,
            already_present: 0,
            ingested: 0,
            checkpoint: None,
            error: None,
            ingested_events: Vec::new(),
            differences: Vec::new(),
        }
    }
}

/// `our_status` of an object whose event this run just ingested.
pub const PENDING_PROCESSING: &str = "pending processing";
/// `our_status` of an order we have no record of.
pub const MISSING: &str = "missing";
/// `our_status` of an order record the business's view cannot read.
pub const UNREADABLE: &str = "unreadable";

/// The provider says an object is paid (thin providers: or finally failed); our order
/// says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Difference {
    pub provider: String,
    pub tenant: String,
    /// Payment intent id (Stripe), order id (Shopify), payment / order id (thin).
    pub object_id: String,
    pub order_id: String,
    /// `succeeded` (Stripe) / `paid` (Shopify) / the thin provider's status.
    pub provider_status: String,
    /// [`MISSING`], [`PENDING_PROCESSING`] or the order's `payment_status`.
    pub our_status: String,
}

/// The newest provider state of one object seen by a run.
pub(super) struct Observed {
    pub(super) order_id: String,
    pub(super) status: String,
    pub(super) paid: bool,
    pub(super) ingested_now: bool,
}

/// The object id and provider state of a fetched event the differences look at:
/// Stripe `payment_intent.*` events with `metadata.order_id`, and Shopify orders.
pub(super) fn observe(event: &Fetched) -> Option<(String, Observed)> {
    let body: serde_json::Value = serde_json::from_slice(&event.body).ok()?;
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    match event.envelope.provider.as_str() {
        "stripe" if event.envelope.event_type.starts_with("payment_intent.") => {
            let object = body.pointer("/data/object")?;
            let status = object.get("status").and_then(text).unwrap_or_default();
            Some((
                object.get("id").and_then(text)?,
                Observed {
                    order_id: object.pointer("/metadata/order_id").and_then(text)?,
                    paid: status == "succeeded",
                    status,
                    ingested_now: false,
                },
            ))
        }
        "shopify" => {
            let id = body.get("id").and_then(text)?;
            let status = body
                .get("financial_status")
                .and_then(text)
                .unwrap_or_default();
            Some((
                id.clone(),
                Observed {
                    order_id: id,
                    paid: status == "paid",
                    status,
                    ingested_now: false,
                },
            ))
        }
        _ => None,
    }
}

/// What the business believes of the observed objects the provider says are paid and
/// our order does not show as paid: object id → our status ([`MISSING`],
/// [`UNREADABLE`] or the order's `payment_status`). Read before the run ingests
/// anything: a processor may apply a just-ingested event before the report is built,
/// and what the run repaired must still be listed.
pub(super) async fn unpaid_beliefs(
    business: &dyn StateStore,
    view: &dyn PaymentView,
    tenant: &TenantConfig,
    observed: &std::collections::BTreeMap<String, Observed>,
) -> Result<std::collections::BTreeMap<String, String>, ReconcileError> {
    let paid: Vec<(&String, &Observed)> = observed.iter().filter(|(_, o)| o.paid).collect();
    if paid.is_empty() {
        return Ok(Default::default());
    }
    let keys: Vec<StateKey> = paid
        .iter()
        .map(|(_, o)| view.order_key(&tenant.tenant, &o.order_id))
        .collect();
    let records = business.load(&keys).await?;
    let mut out = std::collections::BTreeMap::new();
    for ((object_id, _), record) in paid.into_iter().zip(records) {
        let ours = match view.belief(&record).payment {
            PaymentBelief::Known { paid: true, .. } => continue,
            PaymentBelief::Known { status, .. } => status,
            PaymentBelief::Unreadable => UNREADABLE.to_owned(),
            PaymentBelief::Missing => MISSING.to_owned(),
        };
        out.insert(object_id.clone(), ours);
    }
    Ok(out)
}

/// The observed objects the provider says are paid and our order did not show as paid
/// when the run started (`before`, from [`unpaid_beliefs`]); an object whose event
/// this run ingested is [`PENDING_PROCESSING`].
pub(super) fn differences(
    tenant: &TenantConfig,
    observed: std::collections::BTreeMap<String, Observed>,
    before: &std::collections::BTreeMap<String, String>,
) -> Vec<Difference> {
    observed
        .into_iter()
        .filter(|(_, seen)| seen.paid)
        .filter_map(|(object_id, seen)| {
            let ours = before.get(&object_id)?;
            Some(Difference {
                provider: tenant.provider.clone(),
                tenant: tenant.tenant.clone(),
                our_status: if seen.ingested_now {
                    PENDING_PROCESSING.to_owned()
                } else {
                    ours.clone()
                },
                object_id,
                order_id: seen.order_id,
                provider_status: seen.status,
            })
        })
        .collect()
}

/// Most differences one run's audit record lists (`result.difference_list`, the
/// first ones in tenant order; `result.differences` keeps the full count): an audit
/// record stays a few KB (DynamoDB items are capped at 400 KB) however far apart the
/// provider and the orders are.
pub const MAX_AUDITED_DIFFERENCES: usize = 50;

impl Difference {
    /// What kind of difference: the provider says paid and our order is missing,
    /// unreadable, waiting for the event just ingested, or in another status.
    pub fn kind(&self) -> &'static str {
        match self.our_status.as_str() {
            MISSING => "order missing",
            UNREADABLE => "order unreadable",
            PENDING_PROCESSING => "event pending",
            _ => "status differs",
        }
    }
}

/// The audit record of one reconciliation run (`action = reconcile`): the selector is
/// provider/tenant/since, the events are the inbox keys ingested, the result the
/// per-tenant counts and the first [`MAX_AUDITED_DIFFERENCES`] differences (ids and
/// statuses only: no payload, no secret).
pub fn audit_record(
    actor: &str,
    reason: &str,
    options: &ReconcileOptions,
    reports: &[TenantReport],
    at_ms: i64,
) -> AuditRecord {
    AuditRecord {
        id: AuditRecord::new_id(at_ms),
        at_ms,
        actor: actor.to_owned(),
        action: "reconcile".to_owned(),
        reason: reason.to_owned(),
        selector: json!({
            "provider": options.provider,
            "tenant": options.tenant,
            "since": options.since.map(format_rfc3339),
        }),
        events: reports
            .iter()
            .flat_map(|r| r.ingested_events.iter().cloned())
            .collect(),
        result: json!({
            "tenants": reports.iter().map(|r| json!({
                "provider": r.provider,
                "tenant": r.tenant,
                "since": r.since,
                "fetched": r.fetched,
                "already_present": r.already_present,
                "ingested": r.ingested,
                "differences": r.differences.len(),
                "checkpoint": r.checkpoint,
                "error": r.error,
            })).collect::<Vec<_>>(),
            "fetched": reports.iter().map(|r| r.fetched).sum::<usize>(),
            "already_present": reports.iter().map(|r| r.already_present).sum::<usize>(),
            "ingested": reports.iter().map(|r| r.ingested).sum::<usize>(),
            "differences": reports.iter().map(|r| r.differences.len()).sum::<usize>(),
            "difference_list": reports
                .iter()
                .flat_map(|r| r.differences.iter())
                .take(MAX_AUDITED_DIFFERENCES)
                .map(|d| json!({
                    "kind": d.kind(),
                    "provider": d.provider,
                    "tenant": d.tenant,
                    "object_id": d.object_id,
                    "order_id": d.order_id,
                    "provider_status": d.provider_status,
                    "our_status": d.our_status,
                }))
                .collect::<Vec<_>>(),
            "failed": reports.iter().filter(|r| r.error.is_some()).count(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn difference(i: usize, our_status: &str) -> Difference {
        Difference {
            provider: "stripe".into(),
            tenant: "t1".into(),
            object_id: format!("pi_{i}"),
            order_id: format!("{i}"),
            provider_status: "succeeded".into(),
            our_status: our_status.into(),
        }
    }

    #[test]
    fn the_audit_record_lists_each_difference_up_to_the_bound_and_counts_all() {
        let report = TenantReport {
            provider: "stripe".into(),
            tenant: "t1".into(),
            since: "2026-01-01T00:00:00Z".into(),
            fetched: 70,
            already_present: 0,
            ingested: 0,
            checkpoint: None,
            error: None,
            ingested_events: Vec::new(),
            differences: (0..70)
                .map(|i| difference(i, if i == 0 { MISSING } else { "pending" }))
                .collect(),
        };
        let record = audit_record("ops", "r", &ReconcileOptions::default(), &[report], 1);
        assert_eq!(record.result["differences"], json!(70));
        let list = record.result["difference_list"].as_array().unwrap();
        assert_eq!(list.len(), MAX_AUDITED_DIFFERENCES);
        assert_eq!(
            list[0],
            json!({"kind": "order missing", "provider": "stripe", "tenant": "t1",
                   "object_id": "pi_0", "order_id": "0", "provider_status": "succeeded",
                   "our_status": "missing"})
        );
        assert_eq!(list[1]["kind"], json!("status differs"));
        assert_eq!(list[49]["object_id"], json!("pi_49"));
    }
}

#[cfg(test)]
mod embedded_tests {
    use super::*;
    use crate::adapters::embedded::EmbeddedAuditLog;
    use crate::audit::AuditLog;

    #[tokio::test]
    async fn the_differences_survive_the_embedded_audit_log() {
        let dir = tempfile::tempdir().unwrap();
        let audit = EmbeddedAuditLog::open(dir.path()).unwrap();
        let report = TenantReport {
            provider: "shopify".into(),
            tenant: "t1".into(),
            since: "2026-01-01T00:00:00Z".into(),
            fetched: 1,
            already_present: 1,
            ingested: 0,
            checkpoint: Some("2026-01-02T00:00:00Z".into()),
            error: None,
            ingested_events: Vec::new(),
            differences: vec![Difference {
                provider: "shopify".into(),
                tenant: "t1".into(),
                object_id: "820982911946154508".into(),
                order_id: "820982911946154508".into(),
                provider_status: "paid".into(),
                our_status: "pending".into(),
            }],
        };
        let record = audit_record("ops", "nightly", &ReconcileOptions::default(), &[report], 7);
        audit.append(&record).await.unwrap();
        let reopened = EmbeddedAuditLog::open(dir.path()).unwrap();
        let stored = reopened.list(10).await.unwrap();
        assert_eq!(stored.len(), 1);
        assert_eq!(
            stored[0].result["difference_list"],
            json!([{"kind": "status differs", "provider": "shopify", "tenant": "t1",
                    "object_id": "820982911946154508", "order_id": "820982911946154508",
                    "provider_status": "paid", "our_status": "pending"}])
        );
    }
}
