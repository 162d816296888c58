//! Reconciler Lambda (scheduled): builds the stores, the ingestor and the reconciler
//! once, then reconciles on every invocation.

use std::sync::Arc;

use einmal::adapters::aws::DynamoAuditLog;
use einmal::adapters::aws::{config_source_from_env, AwsStore, DynamoStateStore};
use einmal::audit::AuditLog;
use einmal::domain::reference::ReferenceDomain;
use einmal::https::HttpsClient;
use einmal::pipeline::ingest::Ingestor;
use einmal::reconcile::Reconciler;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let (sdk_config, store) = AwsStore::from_env().await?;
    let store = Arc::new(store);
    let state = Arc::new(DynamoStateStore::from_sdk_config(&sdk_config)?);
    let source = config_source_from_env(&sdk_config).await?;
    let ingestor = Arc::new(Ingestor::from_store(source, store.clone()));
    // Audited when the audit table is configured.
    let audit: Option<Arc<dyn AuditLog>> =
        DynamoAuditLog::from_sdk_config_if_configured(&sdk_config)?
            .map(|audit| Arc::new(audit) as Arc<dyn AuditLog>);
    let business = state.clone();
    // GoPay and Klarna push reconcile the payments their hints named: the inbox's
    // hint index (a Query on its sparse GSI).
    // The business's orders are the reference domain's; one HTTPS client (one pool) for
    // the pages and the thin-provider lookups.
    let view = Arc::new(ReferenceDomain);
    let reconciler = &Reconciler::new(ingestor, state, view, HttpsClient::new()).with_hints(store);
    let business = &business;
    let audit = &audit;
    let deployment = &einmal::telemetry::emf::deployment_from_env();
    run(service_fn(|event: LambdaEvent<Value>| async move {
        reconciler::handle_and_emit(
            reconciler,
            Some(business.as_ref()),
            audit.as_deref(),
            deployment,
            &event.payload,
        )
        .await
        .map_err(Error::from)
    }))
    .await
}
