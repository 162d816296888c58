//! Telemetry on real runs: the metrics a real ingest, processing and sweep produce
//! (counted, then rendered as CloudWatch EMF and checked against the metric catalog),
//! the X-Ray trace header on SQS (moto), and the log + EMF bytes per webhook.

use std::sync::Arc;
use std::time::Duration;

use einmal::pipeline::ingest::Ingestor;
use einmal::pipeline::process::{AckMode, Processor};
use einmal::pipeline::sweep::Sweeper;
use einmal::ports::{Queue, QueueMessage};
use einmal::request::WebhookRequest;
use einmal::telemetry::catalog;
use einmal::telemetry::emf::{IntakeRecord, IntakeResult, WorkerTally};
use einmal::telemetry::trace::{TraceHeader, AWS_TRACE_HEADER};
use einmal::telemetry::LogCapture;
use einmal_tests::fixtures::FailingQueue;
use einmal_tests::moto;
use einmal_tests::scenario::{self, embedded, Backend, Event};
use serde_json::Value;

const TRACE: &str = "Root=1-67a1b2c3-0123456789abcdef01234567;Parent=53995c3f42cd8ad8;Sampled=1";
const TRACE_ROOT: &str = "1-67a1b2c3-0123456789abcdef01234567";

/// Parse EMF lines back and check each against the catalog; returns the documents.
fn emf_docs(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .map(|line| {
            let doc: Value = serde_json::from_str(line).expect("EMF line is JSON");
            assert!(doc["_aws"]["Timestamp"].is_i64(), "{line}");
            for directive in doc["_aws"]["CloudWatchMetrics"]
                .as_array()
                .expect("directives")
            {
                assert_eq!(directive["Namespace"], catalog::NAMESPACE);
                let sets: Vec<Vec<String>> =
                    serde_json::from_value(directive["Dimensions"].clone()).expect("sets");
                for metric in directive["Metrics"].as_array().expect("metrics") {
                    let name = metric["Name"].as_str().expect("name");
                    let spec = catalog::find(name).unwrap_or_else(|| panic!("{name}?"));
                    assert_eq!(metric["Unit"], spec.unit.as_str(), "{name}");
                    for set in &sets {
                        assert_eq!(set[0], catalog::DEPLOYMENT);
                        assert!(
                            spec.dimension_sets.iter().any(|s| s == set),
                            "{name} {set:?}"
                        );
                        for dim in set {
                            assert!(doc[dim].is_string(), "{dim} has no value in {line}");
                        }
                    }
                    assert!(!doc[name].is_null(), "{name} has no value");
                }
            }
            doc
        })
        .collect()
}

/// The sum of a metric's values over documents.
fn total(docs: &[Value], name: &str) -> f64 {
    docs.iter()
        .map(|d| match &d[name] {
            Value::Array(values) => values.iter().filter_map(Value::as_f64).sum(),
            v => v.as_f64().unwrap_or(0.0),
        })
        .sum()
}

fn values(docs: &[Value], name: &str) -> Vec<f64> {
    let mut all: Vec<f64> = docs
        .iter()
        .flat_map(|d| match &d[name] {
            Value::Array(values) => values.iter().filter_map(Value::as_f64).collect(),
            Value::Null => Vec::new(),
            v => v.as_f64().into_iter().collect(),
        })
        .collect();
    all.sort_by(f64::total_cmp);
    all
}

async fn ingest(ingestor: &Ingestor, provider: &str, req: &WebhookRequest) -> IntakeRecord {
    let trace = TraceHeader::parse(TRACE);
    let (_, record) = ingestor
        .ingest_traced(provider, scenario::TENANT, req, trace.as_ref())
        .await;
    record
}

#[tokio::test]
async fn a_real_ingest_run_counts_every_outcome_per_provider() {
    let b = embedded(5).await;
    let config = scenario::config();
    let ingestor = b.ingestor();
    let now = einmal::time::now_secs();
    let event = scenario::pi_succeeded("order-m1", "pi_m1", 4990, now);

    let accepted = ingest(&ingestor, "stripe", &event.request(&config)).await;
    let duplicate = ingest(&ingestor, "stripe", &event.request(&config)).await;
    let mut forged = event.request(&config);
    forged.headers.insert(
        "stripe-signature",
        http::HeaderValue::from_static("t=1,v1=00"),
    );
    let bad_signature = ingest(&ingestor, "stripe", &forged).await;
    let not_json = Event {
        body: b"not json".to_vec(),
        ..event.clone()
    };
    let malformed = ingest(&ingestor, "stripe", &not_json.request(&config)).await;
    let (_, unknown) = ingestor
        .ingest_traced("no-such-provider", "t1", &event.request(&config), None)
        .await;

    assert_eq!(
        accepted.result,
        IntakeResult::Accepted {
            new: 1,
            duplicates: 0
        }
    );
    assert_eq!(
        duplicate.result,
        IntakeResult::Accepted {
            new: 0,
            duplicates: 1
        }
    );
    assert_eq!(bad_signature.result, IntakeResult::SignatureFailure);
    assert_eq!(malformed.result, IntakeResult::Rejected);
    assert_eq!(unknown.result, IntakeResult::Rejected);
    // A made-up provider never becomes a dimension value (each one is a billed metric).
    assert_eq!(unknown.provider, "unknown");
    assert_eq!(accepted.provider, "stripe");

    let records = [accepted, duplicate, bad_signature, malformed, unknown];
    let mut docs = Vec::new();
    for record in &records {
        assert!(
            record.ack_ms > 0.0 && record.ack_ms < 10_000.0,
            "{record:?}"
        );
        let lines = record.emf("test-stack", 1_764_457_200_000).render();
        assert_eq!(lines.len(), 1, "one EMF line per request: {lines:?}");
        docs.extend(emf_docs(&lines));
    }
    assert!(docs.iter().all(|d| d["Deployment"] == "test-stack"));
    assert_eq!(docs[0]["Provider"], "stripe");
    assert_eq!(docs[4]["Provider"], "unknown");
    assert_eq!(total(&docs, catalog::WEBHOOKS_ACCEPTED), 1.0);
    assert_eq!(total(&docs, catalog::WEBHOOKS_DUPLICATE), 1.0);
    assert_eq!(total(&docs, catalog::SIGNATURE_FAILURES), 1.0);
    assert_eq!(total(&docs, catalog::WEBHOOKS_REJECTED), 2.0);
    assert_eq!(values(&docs, catalog::ACK_LATENCY).len(), 5);

    // The process-wide counters of `einmal serve` agree.
    let counts = ingestor.metrics().snapshot();
    assert_eq!(
        (
            counts.accepted,
            counts.duplicates,
            counts.signature_failures,
            counts.malformed,
            counts.not_found
        ),
        (1, 1, 1, 1, 1)
    );
}

#[tokio::test]
async fn an_unavailable_queue_counts_as_intake_unavailable() {
    let b = embedded(5).await;
    let queue: Arc<dyn Queue> = Arc::new(FailingQueue::new(b.queue.clone(), vec![1]));
    let ingestor = Ingestor::new(scenario::config(), b.inbox.clone(), queue.clone());
    let event = scenario::pi_succeeded("order-u1", "pi_u1", 100, einmal::time::now_secs());
    let record = ingest(&ingestor, "stripe", &event.request(&scenario::config())).await;
    assert_eq!(record.result, IntakeResult::Unavailable);
    let docs = emf_docs(&record.emf("einmal", 1).render());
    assert_eq!(total(&docs, catalog::INTAKE_UNAVAILABLE), 1.0);

    // The stored but never enqueued item is the sweeper's: stuck, re-enqueued.
    let sweeper = Sweeper::new(
        b.inbox.clone(),
        b.sweep.clone(),
        b.processing.clone(),
        queue,
    );
    let later = einmal::time::now_millis() + 10 * 60_000;
    let report = sweeper.sweep_once(later).await;
    let figures = report.figures();
    assert_eq!(
        (
            figures.pending_items,
            figures.stuck_items,
            figures.reenqueued
        ),
        (1, 1, 1),
        "{report:?}"
    );
    let lines = figures.emf("einmal", later).render();
    assert_eq!(lines.len(), 1);
    let doc = &emf_docs(&lines)[0];
    assert_eq!(doc[catalog::STUCK_ITEMS], 1);
    assert_eq!(doc[catalog::SWEEP_REENQUEUED], 1);
    assert_eq!(doc[catalog::PENDING_ITEMS], 1);
    assert_eq!(doc[catalog::LEASES_RELEASED], 0);
    assert_eq!(doc[catalog::DEAD_LETTERS_MARKED], 0);
    assert!(doc[catalog::OLDEST_PENDING_AGE].as_f64().unwrap() >= 600.0);
}

/// Receive up to 10 messages, process them as one batch (each with the trace header),
/// settle them, and return what the batch counted.
async fn one_batch(b: &Backend, processor: &Processor) -> (usize, WorkerTally) {
    let batch = b
        .queue
        .receive(10, Duration::from_secs(30))
        .await
        .expect("receive");
    let traces = vec![Some(TRACE.to_string()); batch.len()];
    let outcomes = processor.process_batch_traced(&batch, &traces, "w1").await;
    for (delivery, (_, outcome)) in batch.iter().zip(outcomes) {
        processor.settle(delivery, outcome, AckMode::Delete).await;
    }
    (batch.len(), processor.metrics().drain())
}

#[tokio::test]
async fn a_real_processing_run_counts_outcomes_lag_and_the_payment_sli() {
    let b = embedded(5).await;
    let config = scenario::config();
    let ingestor = b.ingestor();
    let processor = b.processor(30_000).with_sli_threshold_ms(60_000);
    let now = einmal::time::now_secs();
    let on_time = scenario::pi_succeeded("order-p1", "pi_p1", 4990, now - 5);
    let late = scenario::pi_succeeded("order-p2", "pi_p2", 2500, now - 7_200);
    let unsupported = scenario::stripe_event(
        "customer.created",
        "evt_cust_1",
        now,
        serde_json::json!({"id": "cus_1", "object": "customer"}),
    );
    let early_refund = scenario::refund_created("order-p3", "re_p3", 100, now);
    for event in [&on_time, &late, &unsupported, &early_refund] {
        let resp = ingestor
            .ingest("stripe", scenario::TENANT, &event.request(&config))
            .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }

    let (received, tally) = one_batch(&b, &processor).await;
    assert_eq!(received, 4);
    assert_eq!(
        (tally.completed, tally.ignored, tally.dead_letters),
        (2, 1, 0),
        "{tally:?}"
    );
    // The refund before its order is parked, not retried.
    assert_eq!(tally.parked, 1, "{tally:?}");
    assert_eq!(tally.retries_total(), 0, "{tally:?}");
    assert_eq!(tally.processing_ms.count, 4);
    // Lag from the provider's `created` (whole seconds) to the commit.
    let mut lags = tally.effect_lag_ms.values.clone();
    lags.sort_by(f64::total_cmp);
    assert_eq!(lags.len(), 2, "{lags:?}");
    assert!((5_000.0..65_000.0).contains(&lags[0]), "{lags:?}");
    assert!(lags[1] >= 7_200_000.0, "{lags:?}");
    // Both payments moved an order to paid: one on time, one not.
    let mut sli = tally.payment_within_slo.values.clone();
    sli.sort_by(f64::total_cmp);
    assert_eq!(sli, vec![0.0, 1.0]);

    let lines = tally.emf("test-stack", einmal::time::now_millis()).render();
    assert_eq!(lines.len(), 1, "one EMF line for the batch: {lines:#?}");
    let docs = emf_docs(&lines);
    assert_eq!(total(&docs, catalog::EVENTS_COMPLETED), 2.0);
    assert_eq!(total(&docs, catalog::EVENTS_IGNORED), 1.0);
    assert_eq!(total(&docs, catalog::EVENTS_PARKED), 1.0);
    assert!(docs[0].get(catalog::RETRIES).is_none(), "no retry");
    assert_eq!(values(&docs, catalog::PAYMENT_WITHIN_SLO), vec![0.0, 1.0]);
    assert_eq!(values(&docs, catalog::PROCESSING_TIME).len(), 4);
    assert_eq!(values(&docs, catalog::EFFECT_LAG).len(), 2);
    assert!(
        docs[0].get(catalog::DEAD_LETTERS).is_none(),
        "zero counts are left out"
    );

    // A redelivered pointer of a finished event counts nothing: no second effect, no
    // second lag or SLI sample. (The parked refund has no message.)
    b.queue
        .send(&QueueMessage {
            pk: on_time.inbox_key(),
        })
        .await
        .expect("send");
    let (received, tally) = one_batch(&b, &processor).await;
    assert_eq!(received, 1);
    assert_eq!((tally.completed, tally.ignored), (0, 0), "{tally:?}");
    assert_eq!((tally.parked, tally.retries_total()), (0, 0));
    assert_eq!(tally.effect_lag_ms.count, 0);
    assert_eq!(tally.payment_within_slo.count, 0);
    assert_eq!(tally.processing_ms.count, 0, "the duplicate is not claimed");
}

/// The receiver's SendMessage carries its X-Ray trace header as the message system
/// attribute `AWSTraceHeader`: checked by receiving the message back from moto.
#[tokio::test]
async fn the_trace_header_travels_as_the_aws_trace_header_attribute_on_moto() {
    let moto = moto::shared();
    let (store, names) = moto::aws_store(moto, None).await;
    let store = Arc::new(store);
    let ingestor = Ingestor::new(scenario::config(), store.clone(), store.clone());
    let event = scenario::pi_succeeded("order-t1", "pi_t1", 100, einmal::time::now_secs());
    let record = ingest(&ingestor, "stripe", &event.request(&scenario::config())).await;
    assert_eq!(
        record.result,
        IntakeResult::Accepted {
            new: 1,
            duplicates: 0
        }
    );

    let out = store
        .sqs()
        .receive_message()
        .queue_url(&names.queue_url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .message_system_attribute_names(
            aws_sdk_sqs::types::MessageSystemAttributeName::AwsTraceHeader,
        )
        .send()
        .await
        .expect("receive from moto");
    let messages = out.messages.unwrap_or_default();
    assert_eq!(messages.len(), 1);
    let attributes = messages[0].attributes.clone().unwrap_or_default();
    assert_eq!(
        attributes
            .get(&aws_sdk_sqs::types::MessageSystemAttributeName::AwsTraceHeader)
            .map(String::as_str),
        Some(TRACE),
        "{AWS_TRACE_HEADER} of {attributes:?}"
    );

    // Without a trace nothing is attached.
    let plain = scenario::pi_succeeded("order-t2", "pi_t2", 100, einmal::time::now_secs());
    let resp = ingestor
        .ingest(
            "stripe",
            scenario::TENANT,
            &plain.request(&scenario::config()),
        )
        .await;
    assert_eq!(resp.status, 200);
    let out = store
        .sqs()
        .receive_message()
        .queue_url(&names.queue_url)
        .wait_time_seconds(1)
        .message_system_attribute_names(
            aws_sdk_sqs::types::MessageSystemAttributeName::AwsTraceHeader,
        )
        .send()
        .await
        .expect("receive from moto");
    let messages = out.messages.unwrap_or_default();
    assert_eq!(messages.len(), 1);
    let attributes = messages[0].attributes.clone().unwrap_or_default();
    assert!(
        !attributes.contains_key(&aws_sdk_sqs::types::MessageSystemAttributeName::AwsTraceHeader),
        "{attributes:?}"
    );
}

/// Log bytes are billed: what one webhook costs in log + EMF bytes at the default
/// level (`info`), on the receiver (one request) and the processor (a batch of 10).
#[tokio::test]
async fn log_and_emf_bytes_per_webhook() {
    let b = embedded(5).await;
    let config = scenario::config();
    let ingestor = b.ingestor();
    let processor = b.processor(30_000);
    let capture = LogCapture::default();
    let _guard = capture.install("info");
    let now = einmal::time::now_secs();
    let events: Vec<Event> = (0..10)
        .map(|i| scenario::pi_succeeded(&format!("order-b{i}"), &format!("pi_b{i}"), 4990, now))
        .collect();

    let mut receiver_log = 0;
    let mut receiver_emf = 0;
    for event in &events {
        capture.clear();
        let record = ingest(&ingestor, "stripe", &event.request(&config)).await;
        receiver_log += capture.text().len();
        receiver_emf += record
            .emf("einmal", einmal::time::now_millis())
            .render()
            .iter()
            .map(|l| l.len() + 1)
            .sum::<usize>();
    }
    let logs = capture.text();
    assert!(logs.contains("webhook accepted"), "{logs}");
    assert!(logs.contains(TRACE_ROOT), "{logs}");

    capture.clear();
    let (received, tally) = one_batch(&b, &processor).await;
    assert_eq!(received, 10);
    assert_eq!(tally.completed, 10);
    let processor_log = capture.text().len();
    let processor_emf: usize = tally
        .emf("einmal", einmal::time::now_millis())
        .render()
        .iter()
        .map(|l| l.len() + 1)
        .sum();

    let per = |bytes: usize| bytes as f64 / events.len() as f64;
    println!(
        "bytes per webhook: receiver log {:.0} + EMF {:.0} = {:.0}; processor (batch of 10) log {:.0} + EMF {:.0} = {:.0}",
        per(receiver_log),
        per(receiver_emf),
        per(receiver_log + receiver_emf),
        per(processor_log),
        per(processor_emf),
        per(processor_log + processor_emf),
    );
    assert!(per(receiver_log + receiver_emf) < 900.0);
    assert!(per(processor_log + processor_emf) < 900.0);
}
