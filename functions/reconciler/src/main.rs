//! Reconciler Lambda (scheduled): builds the stores, the ingestor and the reconciler
//! once, then reconciles on every invocation.

use std::sync::Arc;

use einmal::adapters::aws::{config_source_from_env, AwsNames, AwsStore, DynamoStateStore};
use einmal::adapters::aws::{DynamoAuditLog, AUDIT_TABLE_ENV};
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
    // Check the names first: a missing variable should fail before any AWS lookup.
    let names = AwsNames::from_env()?;
    // One SDK config, one connection pool per service, for every client.
    let sdk_config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let store = Arc::new(AwsStore::from_sdk_config(&sdk_config, names));
    let state = Arc::new(DynamoStateStore::from_sdk_config(&sdk_config)?);
    let source = config_source_from_env(&sdk_config).await?;
    let ingestor = Arc::new(Ingestor::from_store(source, store.clone()));
    // Audited when the audit table is configured.
    let audit: Option<Arc<dyn AuditLog>> =
        if std::env::var(AUDIT_TABLE_ENV).is_ok_and(|t| !t.is_empty()) {
            Some(Arc::new(DynamoAuditLog::from_sdk_config(&sdk_config)?))
        } else {
            None
        };
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
