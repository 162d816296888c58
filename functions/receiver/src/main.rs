//! Receiver Lambda: builds clients and configuration once, then serves events.

use std::sync::Arc;

use einmal::adapters::aws::AwsStore;
use lambda_http::{run, service_fn, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let (sdk_config, store) = AwsStore::from_env().await?;
    let receiver = receiver::Receiver::new(&sdk_config, Arc::new(store)).await?;
    run(service_fn(|req| receiver.handle(req))).await
}
