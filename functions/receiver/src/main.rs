//! Receiver Lambda: builds clients and configuration once, then serves events.

use std::sync::Arc;

use std::time::Duration;

use einmal::adapters::aws::{config_source_from_env, AwsStore};
use einmal::pipeline::ingest::Ingestor;
use lambda_http::{run, service_fn, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let sdk_config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    // Secrets rotated in SSM take effect within this TTL, without a redeploy.
    let ttl_secs = std::env::var("EINMAL_CONFIG_TTL_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let source = config_source_from_env(&sdk_config, Duration::from_secs(ttl_secs)).await?;
    let store = Arc::new(AwsStore::from_env().await?);
    let ingestor =
        Ingestor::new(source.snapshot(), store.clone(), store).with_config_source(source);
    run(service_fn(|req| receiver::handle(&ingestor, req))).await
}
