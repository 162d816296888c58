//! Sweeper Lambda: one pass per scheduled invocation (any JSON payload).

use std::sync::Arc;

use einmal::adapters::aws::AwsStore;
use einmal::pipeline::sweep::{SweepSettings, Sweeper};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let store = Arc::new(AwsStore::from_env().await?);
    let settings = SweepSettings::from_env()?;
    let sweeper =
        Sweeper::new(store.clone(), store.clone(), store.clone(), store).with_settings(settings);
    let sweeper = &sweeper;
    run(service_fn(|_event: LambdaEvent<Value>| async move {
        let report = sweeper.sweep_once(einmal::time::now_millis()).await;
        Ok::<_, Error>(serde_json::to_value(report)?)
    }))
    .await
}
