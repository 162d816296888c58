//! Sweeper Lambda: one pass per scheduled invocation (any JSON payload), its figures
//! printed as one EMF line.

use std::sync::Arc;

use einmal::adapters::aws::AwsStore;
use einmal::pipeline::sweep::{SweepSettings, Sweeper};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let (_sdk_config, store) = AwsStore::from_env().await?;
    let store = Arc::new(store);
    let settings = SweepSettings::from_env()?;
    let sweeper = Sweeper::from_store(store).with_settings(settings);
    let sweeper = &sweeper;
    let deployment = &einmal::telemetry::emf::deployment_from_env();
    run(service_fn(|_event: LambdaEvent<Value>| async move {
        let now = einmal::time::now_millis();
        let report = sweeper.sweep_once(now).await;
        // The backlog gauges, one EMF line per run.
        einmal::telemetry::emf::print(&report.figures().emf(deployment, now).render());
        Ok::<_, Error>(serde_json::to_value(report)?)
    }))
    .await
}
