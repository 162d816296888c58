//! The reconciler Lambda's handler: one scheduled invocation reconciles every tenant
//! with API credentials (or the ones the event names) and returns the reports.
//!
//! The EventBridge schedule may pass a constant input to narrow the run:
//! `{"provider": "stripe", "tenant": "t1", "since": "2024-01-01T00:00:00Z"}` (all
//! optional). Any other event shape (the default scheduled event) reconciles all.

use std::sync::Arc;

use einmal::adapters::aws::{config_source_from_env, AwsStore, DynamoAuditLog, DynamoStateStore};
use einmal::audit::AuditLog;
use einmal::domain::payment_view::PaymentView;
use einmal::domain::state::StateStore;
use einmal::https::HttpsClient;
use einmal::pipeline::ingest::Ingestor;
use einmal::reconcile::{audit_record, ReconcileOptions, Reconciler, TenantReport};
use einmal::telemetry::emf::{self, ReconcileFigures};
use einmal::time::parse_rfc3339;
use serde_json::{json, Value};

/// The error the Lambda runtime reports (so a user's `main` needs no other import).
pub use lambda_runtime::Error;

/// The reconciler Lambda with `view` reading what the business believes about its
/// orders (the domain's [`PaymentView`]): builds [`Reconcile`] once, then reconciles on
/// every scheduled invocation.
pub async fn run(view: Arc<dyn PaymentView>) -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let (sdk_config, store) = AwsStore::from_env().await?;
    let reconcile = &Reconcile::new(view, &sdk_config, Arc::new(store)).await?;
    lambda_runtime::run(lambda_runtime::service_fn(
        |event: lambda_runtime::LambdaEvent<Value>| async move {
            reconcile.handle(&event.payload).await.map_err(Error::from)
        },
    ))
    .await
}

/// The reconciler function as its Lambda builds it once per execution environment:
/// the stores, the ingestor and the reconciler. `einmal serve --backend aws` builds the
/// same and calls [`Reconcile::handle`] on its schedule.
pub struct Reconcile {
    reconciler: Reconciler,
    business: Arc<dyn StateStore>,
    audit: Option<Arc<dyn AuditLog>>,
    deployment: String,
    emf: bool,
}

impl Reconcile {
    pub async fn new(
        view: Arc<dyn PaymentView>,
        sdk_config: &aws_config::SdkConfig,
        store: Arc<AwsStore>,
    ) -> Result<Self, Error> {
        let state = Arc::new(DynamoStateStore::from_sdk_config(sdk_config)?);
        let source = config_source_from_env(sdk_config, einmal::config::ConfigScope::Whole).await?;
        let ingestor = Arc::new(Ingestor::from_store(source, store.clone()));
        // Audited when the audit table is configured.
        let audit: Option<Arc<dyn AuditLog>> =
            DynamoAuditLog::from_sdk_config_if_configured(sdk_config)?
                .map(|audit| Arc::new(audit) as Arc<dyn AuditLog>);
        let business: Arc<dyn StateStore> = state.clone();
        // GoPay and Klarna push reconcile the payments their hints named: the inbox's
        // hint index (a Query on its sparse GSI). One HTTPS client (one pool) for the
        // pages and the thin-provider lookups.
        let reconciler =
            Reconciler::new(ingestor, state, view, HttpsClient::new()).with_hints(store);
        Ok(Reconcile {
            reconciler,
            business,
            audit,
            deployment: einmal::telemetry::emf::deployment_from_env(),
            emf: true,
        })
    }

    /// Whether the run's metrics are printed as an EMF line on stdout (on by default).
    pub fn with_emf(mut self, emf: bool) -> Self {
        self.emf = emf;
        self
    }

    /// One invocation with `payload` (the schedule's event or constant input).
    pub async fn handle(&self, payload: &Value) -> Result<Value, String> {
        let business = Some(self.business.as_ref());
        if self.emf {
            handle_and_emit(
                &self.reconciler,
                business,
                self.audit.as_deref(),
                &self.deployment,
                payload,
            )
            .await
        } else {
            handle_with(&self.reconciler, business, self.audit.as_deref(), payload).await
        }
    }
}

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
    handle_with(reconciler, None, None, payload).await
}

/// The run's metrics: events ingested, differences found, tenants that failed.
pub fn figures(reports: &[TenantReport]) -> ReconcileFigures {
    ReconcileFigures {
        ingested: reports.iter().map(|r| r.ingested as u64).sum(),
        differences: reports.iter().map(|r| r.differences.len() as u64).sum(),
        failures: reports.iter().filter(|r| r.error.is_some()).count() as u64,
    }
}

/// [`handle_with`], then print the run's metrics as one EMF line on stdout.
pub async fn handle_and_emit(
    reconciler: &Reconciler,
    business: Option<&dyn StateStore>,
    audit: Option<&dyn AuditLog>,
    deployment: &str,
    payload: &Value,
) -> Result<Value, String> {
    let (result, figures) = handle_observed(reconciler, business, audit, payload).await;
    emf::print(&figures.emf(deployment, einmal::time::now_millis()).render());
    result
}

/// [`handle`] with the business state store (differences) and the audit log (one
/// record per run: actor `reconciler-lambda`, reason `scheduled` or the payload's
/// `reason`).
pub async fn handle_with(
    reconciler: &Reconciler,
    business: Option<&dyn StateStore>,
    audit: Option<&dyn AuditLog>,
    payload: &Value,
) -> Result<Value, String> {
    handle_observed(reconciler, business, audit, payload)
        .await
        .0
}

/// [`handle_with`], also returning the run's metrics. A run that fails before any
/// tenant report (bad payload, configuration) counts as one failure.
pub async fn handle_observed(
    reconciler: &Reconciler,
    business: Option<&dyn StateStore>,
    audit: Option<&dyn AuditLog>,
    payload: &Value,
) -> (Result<Value, String>, ReconcileFigures) {
    let failed_run = ReconcileFigures {
        failures: 1,
        ..ReconcileFigures::default()
    };
    let options = match options(payload) {
        Ok(options) => options,
        Err(e) => return (Err(e), failed_run),
    };
    let reports = match reconciler.run_with(&options, business).await {
        Ok(reports) => reports,
        Err(e) => return (Err(e.to_string()), failed_run),
    };
    let figures = figures(&reports);
    (report(&options, &reports, audit, payload).await, figures)
}

async fn report(
    options: &ReconcileOptions,
    reports: &[TenantReport],
    audit: Option<&dyn AuditLog>,
    payload: &Value,
) -> Result<Value, String> {
    if let Some(audit) = audit {
        let reason = payload
            .get("reason")
            .and_then(Value::as_str)
            .filter(|r| !r.is_empty())
            .unwrap_or("scheduled");
        let record = audit_record(
            "reconciler-lambda",
            reason,
            options,
            reports,
            einmal::time::now_millis(),
        );
        if let Err(e) = audit.append(&record).await {
            tracing::error!(error = %e, "audit record of the reconciliation failed");
        }
    }
    for r in reports {
        tracing::info!(
            provider = %r.provider, tenant = %r.tenant, fetched = r.fetched,
            already_present = r.already_present, ingested = r.ingested,
            error = r.error.as_deref(), differences = r.differences.len(), "reconciled"
        );
        for d in &r.differences {
            tracing::warn!(
                provider = %d.provider, tenant = %d.tenant, object_id = %d.object_id,
                order_id = %d.order_id, provider_status = %d.provider_status,
                our_status = %d.our_status, "provider and business state differ"
            );
        }
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

#[cfg(test)]
mod tests {
    use einmal::adapters::embedded::EmbeddedStateStore;
    use einmal::adapters::embedded::EmbeddedStore;
    use einmal::config::Config;
    use einmal::domain::reference::ReferenceDomain;
    use einmal::pipeline::ingest::Ingestor;

    use super::*;

    /// A run with nothing to reconcile reports zeros (the gauges are always emitted);
    /// a run that cannot start counts as one failure.
    #[tokio::test]
    async fn every_run_is_measured() {
        let dir = std::env::temp_dir().join(format!(
            "einmal-reconciler-test-{}-{}",
            std::process::id(),
            einmal::time::now_millis()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let store = Arc::new(EmbeddedStore::open(&dir, Default::default()).expect("store"));
        let state = Arc::new(EmbeddedStateStore::open(&dir).expect("state"));
        // A tenant without API credentials: nothing to fetch.
        let config = Config::from_toml(
            "[[tenant]]\nprovider = \"github\"\ntenant = \"t1\"\nsecrets = [\"gh-secret-1234\"]\n",
        )
        .expect("config");
        let ingestor = Arc::new(Ingestor::new(Arc::new(config), store.clone(), store));
        let reconciler = Reconciler::new(
            ingestor,
            state,
            Arc::new(ReferenceDomain),
            einmal::https::HttpsClient::new(),
        );

        let (result, figures) =
            handle_observed(&reconciler, None, None, &json!({"source": "aws.scheduler"})).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(figures, ReconcileFigures::default());
        let line = &figures.emf("einmal", 1).render()[0];
        let doc: Value = serde_json::from_str(line).expect("EMF JSON");
        assert_eq!(doc["ReconcileFailures"], 0);
        assert_eq!(doc["ReconcileIngested"], 0);

        let (result, figures) =
            handle_observed(&reconciler, None, None, &json!({"since": "yesterday"})).await;
        assert!(result.is_err());
        assert_eq!(figures.failures, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
