//! The processor handler, called directly with SQS events built from JSON fixtures
//! (`tests/fixtures/`), on the embedded store and on moto (real SQS receipts).
//!
//! The domain is a tiny test double of the domain port: `ignored.*` types are
//! ignored, `fail` is permanent, `wait` always waits (parked, no retry), `incr`
//! counts, `flaky` targets a record whose loads the state store fails (a transient
//! error, injected over the real store).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::SqsEvent;
use einmal::adapters::aws::{create_state_table, DynamoStateStore};
use einmal::adapters::embedded::EmbeddedStateStore;
use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
use einmal::domain::state::{Commit, CommitAnswer, StateKey, StateRecord, StateStore};
use einmal::domain::{Change, Decision, Domain, DomainError, DomainEvent};
use einmal::envelope::{Envelope, InboxKey};
use einmal::pipeline::process::{ProcessSettings, Processor};
use einmal::ports::{
    Delivery, Inbox, InboxItem, InboxState, Queue, QueueMessage, Source, StoreError,
};
use einmal_tests::moto::{self, MAX_RECEIVE_COUNT};
use serde_json::json;

const BATCH: &str = include_str!("fixtures/sqs_batch.json");
const RECORD: &str = include_str!("fixtures/sqs_record.json");
const GARBAGE_ID: &str = "2e1424d4-f796-459a-8184-9c92662be6da";

struct TestDomain;

impl Domain for TestDomain {
    fn targets(&self, event: &DomainEvent<'_>) -> Result<Vec<StateKey>, DomainError> {
        match event.envelope.event_type.as_str() {
            "incr" => Ok(vec![StateKey::new(&event.envelope.tenant, "counter", "c")]),
            "fail" => Err(DomainError::Permanent("schema invalid".into())),
            "wait" => Err(DomainError::Wait("payment not seen yet".into())),
            "flaky" => Ok(vec![StateKey::new(
                &event.envelope.tenant,
                "counter",
                UNREACHABLE,
            )]),
            _ => Ok(Vec::new()),
        }
    }

    fn decide(
        &self,
        event: &DomainEvent<'_>,
        current: &[StateRecord],
    ) -> Result<Decision, DomainError> {
        match current.first() {
            Some(record) => Ok(Decision::Apply {
                changes: vec![Change {
                    key: record.key.clone(),
                    effect_key: format!("incr#{}", event.envelope.event_id),
                    data: json!({ "count": record.data["count"].as_i64().unwrap_or(0) + 1 }),
                    keyed_on: None,
                }],
                result: "counted".into(),
            }),
            None => Ok(Decision::Ignore {
                reason: format!("{} is not handled", event.envelope.event_type),
            }),
        }
    }
}

/// The record whose loads fail.
const UNREACHABLE: &str = "unreachable";

/// The real state store, unavailable for the [`UNREACHABLE`] record (throttling).
struct Unreachable(Arc<dyn StateStore>);

#[async_trait]
impl StateStore for Unreachable {
    async fn load(&self, keys: &[StateKey]) -> Result<Vec<StateRecord>, StoreError> {
        if keys.iter().any(|k| k.id == UNREACHABLE) {
            return Err(StoreError::Unavailable("injected: throttled".into()));
        }
        self.0.load(keys).await
    }
    async fn commit_each(&self, commits: &[Commit]) -> Vec<CommitAnswer> {
        self.0.commit_each(commits).await
    }
    fn gathers_commits(&self) -> bool {
        self.0.gathers_commits()
    }
    async fn mark_waited(&self, key: &StateKey, keep_until_ms: i64) -> Result<(), StoreError> {
        self.0.mark_waited(key, keep_until_ms).await
    }
    async fn list(
        &self,
        tenant: &str,
        kind: &str,
        limit: usize,
    ) -> Result<Vec<StateRecord>, StoreError> {
        self.0.list(tenant, kind, limit).await
    }
}

struct Setup {
    processor: Processor,
    /// A processor on the same stores with other settings.
    build: Box<dyn Fn(ProcessSettings) -> Processor>,
    inbox: Arc<dyn Inbox>,
    queue: Arc<dyn Queue>,
    _keep: Box<dyn std::any::Any>,
}

fn settings() -> ProcessSettings {
    ProcessSettings {
        max_receive_count: MAX_RECEIVE_COUNT,
        // A postponed message comes back after a second (SQS delays are whole seconds).
        backoff_base_ms: 1_000,
        backoff_max_ms: 1_000,
        ..ProcessSettings::default()
    }
}

fn embedded() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let options = EmbeddedOptions {
        max_receive_count: MAX_RECEIVE_COUNT,
    };
    let store = Arc::new(EmbeddedStore::open(dir.path(), options).unwrap());
    let state = Arc::new(Unreachable(Arc::new(
        EmbeddedStateStore::open(dir.path()).unwrap(),
    )));
    let build = {
        let store = store.clone();
        move |settings: ProcessSettings| {
            Processor::new(
                store.clone(),
                store.clone(),
                store.clone(),
                state.clone(),
                Arc::new(TestDomain),
            )
            .with_settings(settings)
            .with_jitter(|| 1.0)
        }
    };
    Setup {
        processor: build(settings()),
        build: Box::new(build),
        inbox: store.clone(),
        queue: store,
        _keep: Box::new(dir),
    }
}

async fn aws() -> Setup {
    let (store, names) = moto::aws_store(moto::shared(), None).await;
    let table = format!("{}-state", names.table);
    create_state_table(store.dynamodb(), &table).await.unwrap();
    let state = Arc::new(Unreachable(Arc::new(DynamoStateStore::new(
        store.dynamodb().clone(),
        table,
    ))));
    let store = Arc::new(store);
    let build = {
        let store = store.clone();
        move |settings: ProcessSettings| {
            Processor::new(
                store.clone(),
                store.clone(),
                store.clone(),
                state.clone(),
                Arc::new(TestDomain),
            )
            .with_settings(settings)
            .with_jitter(|| 1.0)
        }
    };
    Setup {
        processor: build(settings()),
        build: Box::new(build),
        inbox: store.clone(),
        queue: store,
        _keep: Box::new(()),
    }
}

impl Setup {
    /// Store an event, send its pointer, receive it: a real receipt.
    async fn deliver(&self, event_id: &str, event_type: &str) -> Delivery {
        let envelope = Envelope {
            provider: "stripe".into(),
            tenant: "t1".into(),
            event_id: event_id.into(),
            event_type: event_type.into(),
            object_id: Some("obj".into()),
            object_version: None,
            occurred_at: None,
            delivery_id: None,
        };
        let body = br#"{"id":"evt"}"#;
        let item = InboxItem {
            key: envelope.key(),
            envelope,
            state: InboxState::Received,
            source: Source::Webhook,
            attempts: 0,
            // Now: a transient failure is retried until the event is older than its
            // retry horizon (Stripe's retry window).
            received_at_ms: einmal::time::now_millis(),
            updated_at_ms: einmal::time::now_millis(),
            expires_at: einmal::time::now_secs() + 86_400,
            enqueue_failed: false,
            last_error: None,
            last_error_class: None,
            lease_until_ms: None,
            lease_owner: None,
            result: None,
            body_encoding: einmal::body::BODY_ENCODING.into(),
            body_len: body.len() as u64,
            body: einmal::body::compress(body).unwrap(),
            waiting: None,
            deliveries: Vec::new(),
            relay_due_ms: None,
        };
        self.inbox.put_new(&item).await.unwrap();
        self.queue
            .send(&QueueMessage {
                pk: item.key.clone(),
            })
            .await
            .unwrap();
        self.next_message().await
    }

    fn processor_with(&self, settings: ProcessSettings) -> Processor {
        (self.build)(settings)
    }

    /// The next message that becomes visible (within 20 s).
    async fn next_message(&self) -> Delivery {
        for _ in 0..200 {
            if let Some(d) = self
                .queue
                .receive(1, Duration::from_secs(60))
                .await
                .unwrap()
                .pop()
            {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no message came back")
    }

    async fn state(&self, key: &InboxKey) -> InboxItem {
        self.inbox.get(key).await.unwrap().unwrap()
    }
}

fn fill(template: &str, message_id: &str, d: &Delivery, receive_count: u32) -> String {
    template
        .replace("{{MESSAGE_ID}}", message_id)
        .replace("{{RECEIPT}}", &d.receipt)
        .replace("{{PK}}", d.message.pk.as_str())
        .replace("{{RECEIVE_COUNT}}", &receive_count.to_string())
}

/// An SQS event of one record per `(message id, delivery, receive count)`.
fn event(records: &[(&str, &Delivery, u32)]) -> SqsEvent {
    let records: Vec<String> = records
        .iter()
        .map(|(id, d, n)| fill(RECORD, id, d, *n))
        .collect();
    serde_json::from_str(&format!("{{\"Records\":[{}]}}", records.join(","))).unwrap()
}

fn reported(response: &aws_lambda_events::event::sqs::SqsBatchResponse) -> Vec<&str> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect()
}

#[tokio::test]
async fn only_the_garbage_record_is_reported() {
    let s = embedded();
    let good = s.deliver("evt_good", "ignored.type").await;
    let batch: SqsEvent = serde_json::from_str(&fill(BATCH, "", &good, 1)).unwrap();
    let response = processor::handle(&s.processor, batch).await;
    assert_eq!(
        serde_json::to_value(&response).unwrap(),
        json!({ "batchItemFailures": [{ "itemIdentifier": GARBAGE_ID }] })
    );
    let item = s.state(&good.message.pk).await;
    assert_eq!(item.state, InboxState::Ignored);
    assert_eq!(item.result.as_deref(), Some("ignored.type is not handled"));
}

#[tokio::test]
async fn an_empty_batch_reports_nothing() {
    let s = embedded();
    let response = processor::handle(&s.processor, SqsEvent::default()).await;
    assert!(response.batch_item_failures.is_empty());
}

async fn retry_is_postponed_and_dead_letter_is_not_reported(s: Setup) {
    let ok = s.deliver("evt_ok", "incr").await;
    let flaky = s.deliver("evt_flaky", "flaky").await;
    let fail = s.deliver("evt_fail", "fail").await;
    let parked = s.deliver("evt_parked", "wait").await;
    let batch = event(&[
        ("m-ok", &ok, 1),
        ("m-flaky", &flaky, 1),
        ("m-fail", &fail, 1),
        ("m-parked", &parked, 1),
    ]);
    let response = processor::handle_as(&s.processor, batch, "req-1").await;
    // The transient failure is postponed: its message is replaced by a delayed one,
    // so Lambda deletes the received one and no receive of the redrive is spent.
    assert!(reported(&response).is_empty(), "{:?}", reported(&response));

    assert_eq!(s.state(&ok.message.pk).await.state, InboxState::Completed);
    let retrying = s.state(&flaky.message.pk).await;
    assert_eq!(retrying.state, InboxState::Retryable);
    assert_eq!(retrying.last_error_class.as_deref(), Some("transient"));
    // A wait is parked: Lambda deletes its message (not reported), no retry spent.
    assert_eq!(s.state(&parked.message.pk).await.state, InboxState::Waiting);
    let dead = s.state(&fail.message.pk).await;
    assert_eq!(dead.state, InboxState::DeadLetter);
    assert!(dead.last_error.unwrap().contains("schema invalid"));

    // The failed pointer is in the DLQ at once.
    let dlq = s
        .queue
        .receive_dead_letters(10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].message.pk, fail.message.pk);
    // The postponed message comes back after the backoff as a fresh message.
    let back = s.next_message().await;
    assert_eq!(back.message.pk, flaky.message.pk);
    assert_eq!((back.receive_count, back.postponed), (1, 1));
}

async fn the_last_receive_is_postponed_and_the_horizon_ends_it(s: Setup) {
    let flaky = s.deliver("evt_last", "flaky").await;
    let parked = s.deliver("evt_last_wait", "wait").await;
    let batch = event(&[
        ("m-last", &flaky, MAX_RECEIVE_COUNT),
        ("m-last-wait", &parked, MAX_RECEIVE_COUNT),
    ]);
    let response = processor::handle(&s.processor, batch).await;
    assert!(
        reported(&response).is_empty(),
        "postponed or parked, so Lambda deletes both"
    );
    // The last receive SQS allows is not the end of a transient failure: a fresh
    // message stands in for it.
    let item = s.state(&flaky.message.pk).await;
    assert_eq!(item.state, InboxState::Retryable, "{:?}", item.last_error);
    // Waiting spends no receives: parked even on the last one SQS allows.
    assert_eq!(s.state(&parked.message.pk).await.state, InboxState::Waiting);
    let back = s.next_message().await;
    assert_eq!(back.message.pk, flaky.message.pk);
    assert_eq!(back.receive_count, 1, "the redrive's count starts again");
    let dlq = s
        .queue
        .receive_dead_letters(10, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(dlq.is_empty(), "nothing dead-lettered: {dlq:?}");

    // Once the event is older than its retry horizon, the provider has given up too:
    // the transient failure ends it, on any receive.
    let horizon = ProcessSettings {
        retry_horizon_ms: Some(60_000),
        ..settings()
    };
    let processor = s
        .processor_with(horizon)
        .with_clock(|| einmal::time::now_millis() + 120_000);
    let batch = event(&[("m-back", &back, 1)]);
    let response = processor::handle(&processor, batch).await;
    assert!(reported(&response).is_empty());
    let item = s.state(&flaky.message.pk).await;
    assert_eq!(item.state, InboxState::DeadLetter);
    let error = item.last_error.unwrap();
    assert!(
        error.starts_with("retries exhausted: transient failures for"),
        "{error}"
    );
    let dlq = s
        .queue
        .receive_dead_letters(10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(dlq.len(), 1);
}

#[tokio::test]
async fn embedded_retry_is_postponed_and_dead_letter_is_not_reported() {
    retry_is_postponed_and_dead_letter_is_not_reported(embedded()).await
}

#[tokio::test]
async fn embedded_the_last_receive_is_postponed_and_the_horizon_ends_it() {
    the_last_receive_is_postponed_and_the_horizon_ends_it(embedded()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moto_retry_is_postponed_and_dead_letter_is_not_reported() {
    retry_is_postponed_and_dead_letter_is_not_reported(aws().await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moto_the_last_receive_is_postponed_and_the_horizon_ends_it() {
    the_last_receive_is_postponed_and_the_horizon_ends_it(aws().await).await
}

/// The processor's start-up with its PostgreSQL destination down, on moto: the init
/// does not fail (before, `function_relay` returned the connect error and the Lambda's
/// init failed, so its batches burnt their receives into the DLQ); the event completes
/// with its delivery pending, and once the database is up the relay delivers it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_destination_never_fails_the_start_and_is_delivered_once_it_is_up() {
    use einmal::config_source::ConfigSource;
    use einmal::pipeline::relay::{RelaySettings, RetryPolicy};
    use einmal::ports::DeliveryState;

    let Some(mut pg) = einmal_tests::postgres::PgServer::private_or_skip() else {
        return;
    };
    let db = pg.create_database("processor_start").await;
    tokio::task::block_in_place(|| pg.stop());

    let moto = moto::shared();
    let sdk = moto.sdk_config().await;
    let (store, names) = moto::aws_store(moto, None).await;
    let table = format!("{}-state", names.table);
    create_state_table(store.dynamodb(), &table).await.unwrap();
    let state = Arc::new(DynamoStateStore::new(store.dynamodb().clone(), table));
    let store = Arc::new(store);
    let config = einmal::config::Config::from_toml(&format!(
        "[[tenant]]\nprovider = \"stripe\"\ntenant = \"t1\"\nsecrets = [\"whsec_test\"]\n\n\
         [[destination]]\nname = \"warehouse\"\ntenant = \"t1\"\nkind = \"postgres\"\n\
         events = [\"*\"]\ndsn = \"{}\"\ntable = \"einmal_events\"\nmax_attempts = 1000\n",
        pg.dsn(&db)
    ))
    .unwrap();
    let relay_settings = RelaySettings {
        policy: RetryPolicy {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(200),
        },
        ..RelaySettings::default()
    };
    let engine = processor::engine(
        &sdk,
        store.clone(),
        state,
        Arc::new(TestDomain),
        Some(ConfigSource::fixed(Arc::new(config))),
        settings(),
        relay_settings,
    )
    .await
    .expect("an unreachable destination does not fail the start");

    let s = Setup {
        processor: engine,
        build: Box::new(|_| unreachable!("one processor")),
        inbox: store.clone(),
        queue: store.clone(),
        _keep: Box::new(()),
    };
    let d = s.deliver("evt_pg1", "ignored.type").await;
    let response = processor::handle(&s.processor, event(&[("m-1", &d, 1)])).await;
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    let item = s.state(&d.message.pk).await;
    assert_eq!(item.state, InboxState::Ignored, "the event is finished");
    assert_eq!(item.deliveries.len(), 1);
    assert_eq!(item.deliveries[0].state, DeliveryState::Pending);

    tokio::task::block_in_place(|| pg.restart());
    let relay = s.processor.relay().expect("a relay").clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let item = s.state(&d.message.pk).await;
        if item.deliveries[0].state == DeliveryState::Delivered {
            break;
        }
        assert_eq!(item.deliveries[0].state, DeliveryState::Pending, "{item:?}");
        assert!(
            std::time::Instant::now() < deadline,
            "never delivered: {item:?}"
        );
        relay.run_due(einmal::time::now_millis(), 10).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Another pass delivers nothing again.
    relay
        .run_due(einmal::time::now_millis() + 3_600_000, 10)
        .await
        .unwrap();
    let client = pg.client(&db).await;
    let rows: i64 = client
        .query_one(
            "SELECT count(*) FROM einmal_events WHERE event_id = 'evt_pg1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "delivered exactly once");
}
