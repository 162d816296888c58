//! Receiver Lambda: builds clients and configuration once, then serves events.

use std::sync::Arc;

use einmal::adapters::aws::{load_config_from_env, AwsStore};
use einmal::pipeline::ingest::Ingestor;
use lambda_http::{run, service_fn, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let sdk_config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let config = Arc::new(load_config_from_env(&sdk_config).await?);
    let store = Arc::new(AwsStore::from_env().await?);
    let ingestor = Ingestor::new(config, store.clone(), store);
    run(service_fn(|req| receiver::handle(&ingestor, req))).await
}
