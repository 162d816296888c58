//! Receiver Lambda: builds clients and configuration once, then serves events.

use std::sync::Arc;

use einmal::adapters::aws::{config_source_from_env, AwsStore};
use einmal::pipeline::ingest::Ingestor;
use lambda_http::{run, service_fn, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let (sdk_config, store) = AwsStore::from_env().await?;
    let source = config_source_from_env(&sdk_config).await?;
    let store = Arc::new(store);
    let ingestor = Ingestor::from_store(source, store);
    let deployment = einmal::telemetry::emf::deployment_from_env();
    run(service_fn(|req| {
        receiver::handle_and_emit(&ingestor, &deployment, req)
    }))
    .await
}
