//! Sweeper Lambda: builds the sweeper once, then one pass per scheduled invocation.

use std::sync::Arc;

use einmal::adapters::aws::AwsStore;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let (sdk_config, store) = AwsStore::from_env().await?;
    let sweep = &sweeper::Sweep::new(&sdk_config, Arc::new(store)).await?;
    run(service_fn(|_event: LambdaEvent<Value>| async move {
        Ok::<_, Error>(sweep.handle().await)
    }))
    .await
}
