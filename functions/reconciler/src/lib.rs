//! The reconciler Lambda's handler: one scheduled invocation reconciles every tenant
//! with API credentials (or the ones the event names) and returns the reports.
//!
//! The EventBridge schedule may pass a constant input to narrow the run:
//! `{"provider": "stripe", "tenant": "t1", "since": "2024-01-01T00:00:00Z"}` (all
//! optional). Any other event shape (the default scheduled event) reconciles all.

use einmal::providers::sig::parse_rfc3339;
use einmal::reconcile::{ReconcileOptions, Reconciler};
use serde_json::{json, Value};

/// The options named by the invocation payload.
pub fn options(payload: &Value) -> Result<ReconcileOptions, String> {
    let text = |name: &str| payload.get(name).and_then(Value::as_str).map(str::to_owned);
    let since = match text("since") {
        Some(s) => Some(parse_rfc3339(&s).ok_or_else(|| format!("`since` is not RFC 3339: {s}"))?),
        None => None,
    };
    Ok(ReconcileOptions {
        provider: text("provider"),
        tenant: text("tenant"),
        since,
    })
}

/// Run once; an error in any tenant fails the invocation (so the schedule's retry and
/// alarms see it) after every tenant was tried.
pub async fn handle(reconciler: &Reconciler, payload: &Value) -> Result<Value, String> {
    let reports = reconciler
        .run(&options(payload)?)
        .await
        .map_err(|e| e.to_string())?;
    for r in &reports {
        tracing::info!(
            provider = %r.provider, tenant = %r.tenant, fetched = r.fetched,
            already_present = r.already_present, ingested = r.ingested,
            error = r.error.as_deref(), "reconciled"
        );
    }
    let failed: Vec<String> = reports
        .iter()
        .filter_map(|r| {
            r.error
                .as_ref()
                .map(|e| format!("{}/{}: {e}", r.provider, r.tenant))
        })
        .collect();
    if !failed.is_empty() {
        return Err(format!("reconciliation failed for {}", failed.join("; ")));
    }
    Ok(json!({ "reports": reports }))
}
