//! Processor Lambda handler: an SQS batch (with `ReportBatchItemFailures`) →
//! [`Processor::process_batch`] → the queue actions → the batch response. Everything
//! else lives in the library.
//!
//! Per record:
//! - done (completed, ignored, duplicate, expired): not reported, so Lambda deletes it;
//! - transient failure or leased elsewhere: its visibility is set to the backoff (or the
//!   remaining lease) with ChangeMessageVisibility and it is reported as a failure, so
//!   it comes back after that delay;
//! - dead letter: the pointer is sent to the DLQ and the record is not reported (Lambda
//!   deletes the original). If that send fails it is reported, and SQS redrive moves it
//!   after `maxReceiveCount` receives.
//! - a record that is not a pointer message at all (no receipt, a body that is not our
//!   JSON) can never be processed and cannot be sent to the DLQ as a pointer either: it
//!   is logged (id only) and reported as a failure, so SQS redrive moves it to the DLQ
//!   after `maxReceiveCount` receives instead of it looping forever.
//!
//! Each record's `AWSTraceHeader` attribute (set by the receiver's SendMessage) puts the
//! receiver's X-Ray trace id into the processing log lines. After the batch, the
//! processor's tally is printed as one EMF line ([`handle_and_emit`]).
//!
//! The queue URL the adapter writes to (`EINMAL_QUEUE_URL`) must be the event source
//! queue, since visibility changes use the records' receipt handles.
//!
//! Destinations never fail the start ([`engine`]): one that cannot be reached at
//! init is retried per delivery, and the set follows the configuration's reloads.
//! Inline deliveries end [`DELIVERY_MARGIN`] before the invocation's deadline; what
//! is left is the relay's (the sweeper), so a slow destination never times out a
//! batch whose events are committed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use einmal::adapters::aws::sinks::AwsSinks;
use einmal::adapters::aws::{
    config_source_from_env, function_relay, AwsSetupError, AwsStore, DynamoStateStore,
};
use einmal::config_source::ConfigSource;
use einmal::domain::state::StateStore;
use einmal::domain::Domain;
use einmal::https::HttpsClient;
use einmal::lookup::HttpLookup;
use einmal::pipeline::process::{AckMode, ProcessSettings, Processor};
use einmal::pipeline::relay::RelaySettings;
use einmal::ports::Delivery;
use einmal::telemetry::emf::{self, WorkerTally};
use einmal::telemetry::trace::AWS_TRACE_HEADER;
use einmal::wiring::SinkContext;

/// The error the Lambda runtime reports (so a user's `main` needs no other import).
pub use lambda_runtime::Error;

/// The processor Lambda with `domain` deciding: builds clients, settings and the
/// engine once from the environment, then serves SQS batches until the runtime stops.
/// A user's processor is `processor::run(Arc::new(MyDomain)).await` in `main`.
pub async fn run(domain: Arc<dyn Domain>) -> Result<(), Error> {
    einmal::telemetry::init_json_logs();
    let deployment = &einmal::telemetry::emf::deployment_from_env();
    let (sdk_config, store) = AwsStore::from_env().await?;
    let engine = engine_from_env(domain, &sdk_config, Arc::new(store)).await?;
    let engine = &engine;
    lambda_runtime::run(lambda_runtime::service_fn(
        |event: lambda_runtime::LambdaEvent<SqsEvent>| async move {
            let until = deliver_until(event.context.deadline, einmal::time::now_millis());
            let response = handle_and_emit(
                engine,
                deployment,
                event.payload,
                &event.context.request_id,
                Some(until),
            )
            .await;
            Ok::<_, Error>(response)
        },
    ))
    .await
}

/// The processor's engine as the Lambda builds it once per execution environment:
/// settings, state store, tenant configuration (thin-webhook lookups, destinations)
/// from the environment. `einmal serve --backend aws` builds the same and feeds it the
/// batches its poller receives.
pub async fn engine_from_env(
    domain: Arc<dyn Domain>,
    sdk_config: &aws_config::SdkConfig,
    store: Arc<AwsStore>,
) -> Result<Processor, Error> {
    let settings = ProcessSettings::from_env()?;
    let threshold_ms = einmal::telemetry::emf::sli_threshold_ms_from_env()?;
    let state = Arc::new(DynamoStateStore::from_sdk_config(sdk_config)?);
    // Thin webhooks (Mollie classic, GoPay, Klarna push) need the tenants' API
    // credentials: the same configuration as the receiver (EINMAL_CONFIG_PARAMETER or
    // EINMAL_CONFIG). Without one, hints are dead-lettered with a clear reason.
    let source = match config_source_from_env(sdk_config, einmal::config::ConfigScope::Whole).await
    {
        Ok(source) => Some(source),
        Err(AwsSetupError::NoConfigSource) => {
            tracing::warn!("no tenant configuration: thin webhooks cannot be looked up");
            None
        }
        Err(e) => return Err(e.into()),
    };
    Ok(engine(
        sdk_config,
        store,
        state,
        domain,
        source,
        settings,
        RelaySettings::from_env()?,
    )
    .await?
    .with_sli_threshold_ms(threshold_ms))
}

/// The processor's init after the environment is read: the engine on `store` and
/// `state`, with the relay of `source`'s destinations (following its reloads) and
/// its lookups. Only a destination's configuration error fails it; a destination that
/// cannot be reached now is retried per delivery, so the batches still run.
pub async fn engine(
    sdk_config: &aws_config::SdkConfig,
    store: Arc<AwsStore>,
    state: Arc<dyn StateStore>,
    domain: Arc<dyn Domain>,
    source: Option<ConfigSource>,
    settings: ProcessSettings,
    relay_settings: RelaySettings,
) -> Result<Processor, Error> {
    let mut engine = Processor::from_store(store.clone(), state, domain).with_settings(settings);
    if let Some(source) = source {
        // The log redaction masks the tenants' secrets and API credentials.
        einmal::telemetry::redact::register_config(&source.snapshot());
        let https = HttpsClient::new();
        // The destinations, delivered right after each commit (the sweeper retries).
        let sinks = Arc::new(SinkContext::with_aws(
            https.clone(),
            AwsSinks::given(sdk_config),
        ));
        let relay = function_relay(store, source.clone(), sinks, relay_settings).await?;
        engine = engine
            .with_relay(relay)
            .with_lookup_source(Arc::new(HttpLookup::with_client(https)), source);
    }
    Ok(engine)
}

/// Inline deliveries end this long before the invocation's deadline: time for the
/// finish writes, the queue actions and the metrics.
pub const DELIVERY_MARGIN: Duration = Duration::from_secs(5);

/// When inline deliveries stop, for an invocation whose deadline is `deadline_ms`
/// (Unix ms, the runtime's `Context::deadline`) at `now_ms`.
pub fn deliver_until(deadline_ms: u64, now_ms: i64) -> Instant {
    let deadline_ms = i64::try_from(deadline_ms).unwrap_or(i64::MAX);
    let margin_ms = i64::try_from(DELIVERY_MARGIN.as_millis()).unwrap_or(i64::MAX);
    let left = deadline_ms.saturating_sub(margin_ms).saturating_sub(now_ms);
    Instant::now() + Duration::from_millis(u64::try_from(left).unwrap_or(0))
}

/// The SQS system attribute with the receive count, this receive included.
pub const RECEIVE_COUNT_ATTRIBUTE: &str = "ApproximateReceiveCount";

/// Handle one batch under a fresh random worker id.
pub async fn handle(processor: &Processor, event: SqsEvent) -> SqsBatchResponse {
    let worker = format!("lambda-{:016x}", rand::random::<u64>());
    handle_as(processor, event, &worker).await
}

/// Handle one batch as `worker` (the Lambda request id: unique per invocation, so a
/// lease never outlives the invocation that took it).
pub async fn handle_as(processor: &Processor, event: SqsEvent, worker: &str) -> SqsBatchResponse {
    handle_observed(processor, event, worker).await.0
}

/// [`handle_as`], then print the batch's metrics as EMF on stdout (one line, more only
/// when retries had several causes or a metric has over 100 values).
pub async fn handle_and_emit(
    processor: &Processor,
    deployment: &str,
    event: SqsEvent,
    worker: &str,
    deliver_until: Option<Instant>,
) -> SqsBatchResponse {
    let (response, tally) = handle_until(processor, event, worker, deliver_until).await;
    let now = einmal::time::now_millis();
    emf::print(&tally.emf(deployment, now).render());
    // The deliveries made right after the commits, per destination.
    if let Some(relay) = processor.relay() {
        let deliveries = relay.drain_tally().emf(deployment, now);
        if !deliveries.is_empty() {
            emf::print(&deliveries.render());
        }
    }
    response
}

/// [`handle_as`], also returning the batch's tally (drained from the processor: one
/// invocation at a time per Lambda execution environment).
pub async fn handle_observed(
    processor: &Processor,
    event: SqsEvent,
    worker: &str,
) -> (SqsBatchResponse, WorkerTally) {
    handle_until(processor, event, worker, None).await
}

/// [`handle_observed`] whose inline deliveries end at `deliver_until` ([`deliver_until`]):
/// the rest stays pending for the relay.
pub async fn handle_until(
    processor: &Processor,
    event: SqsEvent,
    worker: &str,
    deliver_until: Option<Instant>,
) -> (SqsBatchResponse, WorkerTally) {
    let mut failures: Vec<String> = Vec::new();
    let mut deliveries: Vec<(String, Delivery)> = Vec::with_capacity(event.records.len());
    let mut traces: Vec<Option<String>> = Vec::with_capacity(event.records.len());
    for record in event.records {
        let id = record.message_id.clone().unwrap_or_default();
        let trace = record.attributes.get(AWS_TRACE_HEADER).cloned();
        match delivery(record) {
            Ok(delivery) => {
                deliveries.push((id, delivery));
                traces.push(trace);
            }
            Err(why) => {
                tracing::error!(message_id = %id, reason = why, "unprocessable SQS record; left for redrive");
                failures.push(id);
            }
        }
    }

    let only: Vec<Delivery> = deliveries.iter().map(|(_, d)| d.clone()).collect();
    let outcomes = processor
        .process_batch_until(&only, &traces, worker, deliver_until)
        .await;
    let settled =
        deliveries
            .iter()
            .zip(outcomes)
            .map(|((id, delivery), (_, outcome))| async move {
                let keep = processor.settle(delivery, outcome, AckMode::ByCaller).await;
                (id, keep)
            });
    for (id, keep) in futures::future::join_all(settled).await {
        if keep {
            failures.push(id.clone());
        }
    }

    let response = SqsBatchResponse {
        batch_item_failures: failures
            .into_iter()
            .map(|item_identifier| BatchItemFailure { item_identifier })
            .collect(),
    };
    (response, processor.metrics().drain())
}

/// A record as a [`Delivery`]; the error names what is wrong, never the body.
fn delivery(record: SqsMessage) -> Result<Delivery, &'static str> {
    let receipt = record.receipt_handle.ok_or("no receipt handle")?;
    let body = record.body.ok_or("no body")?;
    // The receiver's message carries the item and its body (no read to start).
    let decoded = einmal::adapters::aws::decode_message_body(&body)?;
    Ok(Delivery {
        message: decoded.message,
        receipt,
        receive_count: receive_count(&record.attributes),
        item: decoded.item,
        postponed: decoded.postponed,
    })
}

/// `ApproximateReceiveCount`; 1 when absent or unreadable (the first receive).
fn receive_count(attributes: &HashMap<String, String>) -> u32 {
    attributes
        .get(RECEIVE_COUNT_ATTRIBUTE)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1)
        .max(1)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use einmal::telemetry::LogCapture;
    use einmal_tests::scenario;

    use super::*;

    const TRACE: &str =
        "Root=1-67a1b2c3-0123456789abcdef0000beef;Parent=53995c3f42cd8ad8;Sampled=1";

    /// An SQS event whose record carries the receiver's `AWSTraceHeader`: the
    /// processing log lines carry its trace id, and the batch's tally comes back for
    /// the EMF line.
    #[tokio::test]
    async fn the_trace_header_of_a_record_reaches_the_processing_logs() {
        let b = scenario::embedded(5).await;
        let config = scenario::config();
        let now = einmal::time::now_secs();
        let event = scenario::pi_succeeded("order-x1", "pi_x1", 4990, now);
        let resp = b
            .ingestor()
            .ingest("stripe", scenario::TENANT, &event.request(&config))
            .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
        let delivery = b
            .queue
            .receive(1, Duration::from_secs(30))
            .await
            .expect("receive")
            .pop()
            .expect("one message");
        let body = serde_json::to_string(&delivery.message).expect("pointer JSON");
        let sqs: SqsEvent = serde_json::from_value(serde_json::json!({
            "Records": [{
                "messageId": "m-1",
                "receiptHandle": delivery.receipt,
                "body": body,
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "AWSTraceHeader": TRACE,
                    "SentTimestamp": "1764410400000"
                },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:eu-central-1:123456789012:einmal",
                "awsRegion": "eu-central-1"
            }]
        }))
        .expect("SQS event");

        let processor = b.processor(30_000);
        let capture = LogCapture::default();
        let guard = capture.install("info");
        let (response, tally) = handle_observed(&processor, sqs, "req-1").await;
        drop(guard);

        assert!(response.batch_item_failures.is_empty());
        assert_eq!(tally.completed, 1);
        assert_eq!(tally.payment_within_slo.values, vec![1.0]);
        let logs = capture.text();
        let processed = logs
            .lines()
            .find(|l| l.contains("\"message\":\"event processed\""))
            .unwrap_or_else(|| panic!("no processing line in {logs}"));
        assert!(
            processed.contains("\"trace_id\":\"1-67a1b2c3-0123456789abcdef0000beef\""),
            "{processed}"
        );
        assert!(
            processed.contains("\"event_id\":\"evt_ps_pi_x1\""),
            "{processed}"
        );
        // The tally was drained with the batch.
        assert_eq!(
            processor.metrics().drain(),
            einmal::telemetry::emf::WorkerTally::default()
        );
    }
}
