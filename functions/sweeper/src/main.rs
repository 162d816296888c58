//! Sweeper Lambda: one pass per scheduled invocation (any JSON payload): the sweep,
//! then the relay's due retries and its backlog gauges (when destinations are
//! configured); the figures printed as EMF lines.

use std::sync::Arc;

use einmal::adapters::aws::{
    config_source_from_env, function_relay, relay_pass, AwsSetupError, AwsStore, FunctionSinks,
};
use einmal::https::HttpsClient;
use einmal::pipeline::relay::RelaySettings;
use einmal::pipeline::sweep::{SweepSettings, Sweeper};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::{json, Value};

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let (sdk_config, store) = AwsStore::from_env().await?;
    let store = Arc::new(store);
    let settings = SweepSettings::from_env()?;
    let batch = settings.batch;
    let sweeper = Sweeper::from_store(store.clone()).with_settings(settings);
    // The destinations: the same configuration as the processor's.
    // It follows the configuration's reloads; a destination that cannot be reached
    // at start is retried per delivery, never a failed init.
    let relay = match config_source_from_env(&sdk_config).await {
        Ok(source) => {
            einmal::telemetry::redact::register_config(&source.snapshot());
            let sinks = Arc::new(FunctionSinks::new(&sdk_config, HttpsClient::new()));
            Some(function_relay(store.clone(), source, sinks, RelaySettings::from_env()?).await?)
        }
        Err(AwsSetupError::NoConfigSource) => None,
        Err(e) => return Err(e.into()),
    };
    let (sweeper, relay) = (&sweeper, relay.as_deref());
    let deployment = &einmal::telemetry::emf::deployment_from_env();
    run(service_fn(|_event: LambdaEvent<Value>| async move {
        let now = einmal::time::now_millis();
        let report = sweeper.sweep_once(now).await;
        // The backlog gauges, one EMF line per run.
        einmal::telemetry::emf::print(&report.figures().emf(deployment, now).render());
        let relayed = match relay {
            Some(relay) => {
                let pass = relay_pass(relay, now, batch, deployment).await;
                einmal::telemetry::emf::print(&pass.emf);
                Some(pass)
            }
            None => None,
        };
        Ok::<_, Error>(json!({ "sweep": report, "relay": relayed }))
    }))
    .await
}
