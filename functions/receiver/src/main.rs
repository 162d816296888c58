//! Receiver Lambda: builds clients and configuration once, then serves events.

use std::sync::Arc;

use einmal::adapters::aws::{config_source_from_env, AwsNames, AwsStore};
use einmal::pipeline::ingest::Ingestor;
use lambda_http::{run, service_fn, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    // Check the names first: a missing variable should fail before any AWS lookup.
    let names = AwsNames::from_env()?;
    // One SDK config, one connection pool per service, for every client.
    let sdk_config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let source = config_source_from_env(&sdk_config).await?;
    let store = Arc::new(AwsStore::from_sdk_config(&sdk_config, names));
    let ingestor = Ingestor::from_store(source, store);
    let deployment = einmal::telemetry::emf::deployment_from_env();
    run(service_fn(|req| {
        receiver::handle_and_emit(&ingestor, &deployment, req)
    }))
    .await
}
