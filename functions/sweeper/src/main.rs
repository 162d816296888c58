//! Sweeper Lambda: one pass per scheduled invocation (any JSON payload), its figures
//! printed as one EMF line.

use std::sync::Arc;

use einmal::adapters::aws::{AwsNames, AwsStore};
use einmal::pipeline::sweep::{SweepSettings, Sweeper};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    // Check the names first: a missing variable should fail before any AWS lookup.
    let names = AwsNames::from_env()?;
    let sdk_config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let store = Arc::new(AwsStore::from_sdk_config(&sdk_config, names));
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
