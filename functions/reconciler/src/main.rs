//! Reconciler Lambda (scheduled): builds the stores, the ingestor and the reconciler
//! once, then reconciles on every invocation.

use std::sync::Arc;

use einmal::adapters::aws::{config_source_from_env, AwsStore};
use einmal::adapters::aws_state::DynamoStateStore;
use einmal::pipeline::ingest::Ingestor;
use einmal::reconcile::Reconciler;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let store = Arc::new(AwsStore::from_env().await?);
    let state = Arc::new(DynamoStateStore::from_env().await?);
    let sdk_config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let source = config_source_from_env(&sdk_config).await?;
    let ingestor = Arc::new(Ingestor::from_source(source, store.clone(), store));
    let reconciler = &Reconciler::new(ingestor, state);
    run(service_fn(|event: LambdaEvent<Value>| async move {
        reconciler::handle(reconciler, &event.payload)
            .await
            .map_err(Error::from)
    }))
    .await
}
