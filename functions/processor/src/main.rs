//! Processor Lambda: builds clients, settings and the domain once, then serves batches.

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
use einmal::adapters::aws::AwsStore;
use einmal::adapters::aws_state::DynamoStateStore;
use einmal::domain::reference::ReferenceDomain;
use einmal::pipeline::process::{ProcessSettings, Processor};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let settings = ProcessSettings::from_env()?;
    let store = Arc::new(AwsStore::from_env().await?);
    let state = Arc::new(DynamoStateStore::from_env().await?);
    let domain = Arc::new(ReferenceDomain::new());
    let engine =
        Processor::new(store.clone(), store.clone(), store, state, domain).with_settings(settings);
    let engine = &engine;
    run(service_fn(|event: LambdaEvent<SqsEvent>| async move {
        let response = processor::handle_as(engine, event.payload, &event.context.request_id).await;
        Ok::<_, Error>(response)
    }))
    .await
}
