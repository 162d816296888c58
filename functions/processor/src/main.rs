//! Processor Lambda: builds clients, settings and the domain once, then serves batches.

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
use einmal::adapters::aws::{
    config_source_from_env, function_relay, AwsSetupError, AwsStore, DynamoStateStore,
    FunctionSinks,
};
use einmal::domain::reference::ReferenceDomain;
use einmal::https::HttpsClient;
use einmal::lookup::HttpLookup;
use einmal::pipeline::process::{ProcessSettings, Processor};
use einmal::pipeline::relay::RelaySettings;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let settings = ProcessSettings::from_env()?;
    let threshold_ms = einmal::telemetry::emf::sli_threshold_ms_from_env()?;
    let deployment = &einmal::telemetry::emf::deployment_from_env();
    let (sdk_config, store) = AwsStore::from_env().await?;
    let store = Arc::new(store);
    let state = Arc::new(DynamoStateStore::from_sdk_config(&sdk_config)?);
    let domain = Arc::new(ReferenceDomain::new());
    let mut engine = Processor::from_store(store.clone(), state, domain)
        .with_settings(settings)
        .with_sli_threshold_ms(threshold_ms);
    // Thin webhooks (Mollie classic, GoPay, Klarna push) need the tenants' API
    // credentials: the same configuration as the receiver (EINMAL_CONFIG_PARAMETER or
    // EINMAL_CONFIG). Without one, hints are dead-lettered with a clear reason.
    match config_source_from_env(&sdk_config).await {
        Ok(source) => {
            // The log redaction masks the tenants' secrets and API credentials.
            einmal::telemetry::redact::register_config(&source.snapshot());
            let https = HttpsClient::new();
            // The destinations, delivered right after each commit (the sweeper retries).
            let sinks = FunctionSinks::new(&sdk_config, https.clone());
            if let Some(relay) = function_relay(
                store,
                &source.snapshot(),
                &sinks,
                RelaySettings::from_env()?,
            )
            .await?
            {
                engine = engine.with_relay(relay);
            }
            engine = engine.with_lookup_source(Arc::new(HttpLookup::with_client(https)), source)
        }
        Err(AwsSetupError::NoConfigSource) => {
            tracing::warn!("no tenant configuration: thin webhooks cannot be looked up")
        }
        Err(e) => return Err(e.into()),
    }
    let engine = &engine;
    run(service_fn(|event: LambdaEvent<SqsEvent>| async move {
        let response = processor::handle_and_emit(
            engine,
            deployment,
            event.payload,
            &event.context.request_id,
        )
        .await;
        Ok::<_, Error>(response)
    }))
    .await
}
