//! The AWS adapter against moto (real DynamoDB/SQS wire protocol on loopback).
//!
//! One moto per test binary (`moto::shared()`); every test gets its own table and
//! queues, so they run in parallel.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_dynamodb::types::AttributeValue;
use einmal::adapters::aws::{
    create_queues, create_state_table, create_tables, load_config_from_ssm, load_config_with,
    AwsNames, AwsSetupError, AwsStore, DynamoStateStore, CONFIG_ENV, CONFIG_PARAMETER_ENV,
};
use einmal::domain::reference::{order_key, ReferenceDomain};
use einmal::domain::state::StateStore;
use einmal::envelope::Envelope;
use einmal::envelope::InboxKey;
use einmal::pipeline::ingest::Ingestor;
use einmal::pipeline::process::{MessageOutcome, Processor};
use einmal::ports::{
    Inbox, InboxFilter, InboxItem, InboxProcessing, InboxReplay, InboxState, ItemVersion,
    PutOutcome, Queue, QueueError, QueueMessage, RequeueOutcome, Source, StoreError,
};
use einmal_tests::moto::{self, aws_store, unique_name, CallCounter, MAX_RECEIVE_COUNT};
use einmal_tests::scenario;

const LONG: Duration = Duration::from_secs(60);

fn item(tenant: &str, event_id: &str, received_at_ms: i64) -> InboxItem {
    let envelope = Envelope {
        provider: "stripe".into(),
        tenant: tenant.into(),
        event_id: event_id.into(),
        event_type: "payment_intent.succeeded".into(),
        object_id: Some("pi_123".into()),
        object_version: Some("2024-01-01T00:00:00Z".into()),
        occurred_at: Some(1_700_000_000),
        delivery_id: Some("dlv_1".into()),
    };
    InboxItem {
        key: envelope.key(),
        envelope,
        state: InboxState::Received,
        source: Source::Webhook,
        attempts: 0,
        received_at_ms,
        updated_at_ms: received_at_ms,
        expires_at: received_at_ms / 1000 + 30 * 86_400,
        enqueue_failed: false,
        last_error: None,
        last_error_class: None,
        lease_until_ms: None,
        lease_owner: None,
        result: None,
        body_encoding: "zstd".into(),
        body_len: 1234,
        // Not UTF-8 on purpose: the body is a binary attribute.
        body: vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xff, 0x80, 0x01],
        waiting: None,
        deliveries: Vec::new(),
        relay_due_ms: None,
    }
}

fn msg(pk: &str) -> QueueMessage {
    QueueMessage {
        pk: einmal::envelope::InboxKey::from_stored(pk),
    }
}

#[tokio::test]
async fn duplicate_returns_the_stored_item_field_by_field() {
    let (store, _) = aws_store(moto::shared(), None).await;
    let mut first = item("t1", "evt_dup", 1_700_000_000_123);
    first.last_error = Some("transient: timeout".into());
    first.attempts = 2;
    assert_eq!(store.put_new(&first).await.unwrap(), PutOutcome::Inserted);

    // A retry of the same event with a different body and delivery id.
    let mut retry = item("t1", "evt_dup", 1_700_000_999_000);
    retry.envelope.delivery_id = Some("dlv_2".into());
    retry.body = b"other".to_vec();
    match store.put_new(&retry).await.unwrap() {
        PutOutcome::Duplicate(old) => {
            assert_eq!(old.key, first.key);
            assert_eq!(old.envelope, first.envelope);
            // The body is in its own item: the rejected put returns the small one.
            assert!(old.body.is_empty());
            assert_eq!(
                *old,
                InboxItem {
                    body: Vec::new(),
                    ..first.clone()
                }
            );
            // The first body is kept, not the retry's.
            assert_eq!(
                store.get(&first.key).await.unwrap().unwrap().body,
                first.body
            );
        }
        other => panic!("expected a duplicate, got {other:?}"),
    }
    assert_eq!(store.get(&first.key).await.unwrap(), Some(first));
}

#[tokio::test]
async fn absent_optional_fields_round_trip_as_none() {
    let (store, _) = aws_store(moto::shared(), None).await;
    let mut bare = item("t1", "evt_bare", 1);
    bare.envelope.object_id = None;
    bare.envelope.object_version = None;
    bare.envelope.occurred_at = None;
    bare.envelope.delivery_id = None;
    bare.body = Vec::new();
    bare.source = Source::Reconcile;
    store.put_new(&bare).await.unwrap();
    assert_eq!(store.get(&bare.key).await.unwrap(), Some(bare));
}

#[tokio::test]
async fn get_of_a_missing_key_is_none() {
    let (store, _) = aws_store(moto::shared(), None).await;
    let key = item("t1", "evt_never", 1).key;
    assert_eq!(store.get(&key).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_puts_of_one_key_insert_once() {
    let (store, _) = aws_store(moto::shared(), None).await;
    let store = Arc::new(store);
    // 50 requests race to be first; the server (moto, single-threaded like DynamoDB's
    // atomic conditional put) decides, no lock of ours.
    let original = item("t1", "evt_race", 42_000);
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store = store.clone();
            let mut it = original.clone();
            it.received_at_ms += i;
            tokio::spawn(async move { store.put_new(&it).await })
        })
        .collect();
    let mut inserted = 0;
    let mut duplicates = Vec::new();
    for t in tasks {
        match t.await.unwrap().unwrap() {
            PutOutcome::Inserted => inserted += 1,
            // A duplicate between the insert's two puts stores the body itself.
            PutOutcome::Duplicate(old) | PutOutcome::Restored(old) => duplicates.push(old),
        }
    }
    assert_eq!(inserted, 1);
    assert_eq!(duplicates.len(), 49);
    let stored = store.get(&original.key).await.unwrap().unwrap();
    assert_eq!(stored.body, original.body);
    let without_body = InboxItem {
        body: Vec::new(),
        ..stored
    };
    assert!(duplicates.iter().all(|d| **d == without_body));
}

#[tokio::test]
async fn mark_enqueue_failed_applies_only_while_received() {
    let (store, _) = aws_store(moto::shared(), None).await;
    let received = item("t1", "evt_recv", 1);
    store.put_new(&received).await.unwrap();
    store.mark_enqueue_failed(&received.key).await.unwrap();
    let got = store.get(&received.key).await.unwrap().unwrap();
    assert!(got.enqueue_failed);
    assert_eq!(got.state, InboxState::Received);

    let mut queued = item("t1", "evt_queued", 2);
    queued.state = InboxState::Queued;
    store.put_new(&queued).await.unwrap();
    store.mark_enqueue_failed(&queued.key).await.unwrap();
    assert!(
        !store
            .get(&queued.key)
            .await
            .unwrap()
            .unwrap()
            .enqueue_failed
    );

    // A missing key is not an error and is not created.
    let missing = item("t1", "evt_missing", 3).key;
    store.mark_enqueue_failed(&missing).await.unwrap();
    assert_eq!(store.get(&missing).await.unwrap(), None);
}

#[tokio::test]
async fn list_filters_and_returns_newest_first() {
    let (store, _) = aws_store(moto::shared(), None).await;
    for (tenant, id, at, state) in [
        ("a", "e1", 1_000, InboxState::Received),
        ("a", "e2", 3_000, InboxState::Received),
        ("a", "e3", 2_000, InboxState::Completed),
        ("b", "e4", 4_000, InboxState::Received),
    ] {
        let mut it = item(tenant, id, at);
        it.state = state;
        store.put_new(&it).await.unwrap();
    }
    let ids = |items: Vec<InboxItem>| -> Vec<String> {
        items.into_iter().map(|i| i.envelope.event_id).collect()
    };
    let all = store.list(&InboxFilter::default()).await.unwrap();
    assert_eq!(ids(all), ["e4", "e2", "e3", "e1"]);
    let tenant_a = InboxFilter {
        tenant: Some("a".into()),
        limit: 2,
        ..Default::default()
    };
    assert_eq!(ids(store.list(&tenant_a).await.unwrap()), ["e2", "e3"]);
    let received_a = InboxFilter {
        tenant: Some("a".into()),
        state: Some(InboxState::Received),
        provider: Some("stripe".into()),
        limit: 0,
    };
    assert_eq!(ids(store.list(&received_a).await.unwrap()), ["e2", "e1"]);
    let other_provider = InboxFilter {
        provider: Some("shopify".into()),
        ..Default::default()
    };
    assert!(store.list(&other_provider).await.unwrap().is_empty());
}

#[tokio::test]
async fn an_undecodable_item_is_corrupt_and_the_error_omits_the_body() {
    let (store, names) = aws_store(moto::shared(), None).await;
    let key = item("t1", "evt_corrupt", 1).key;
    store
        .dynamodb()
        .put_item()
        .table_name(&names.table)
        .item("pk", AttributeValue::S(key.as_str().into()))
        .item("state", AttributeValue::S("received".into()))
        .item("body", AttributeValue::B(b"SECRET-BODY".to_vec().into()))
        .send()
        .await
        .unwrap();
    match store.get(&key).await {
        Err(StoreError::Corrupt(msg)) => {
            assert!(msg.contains("evt_corrupt"), "{msg}");
            assert!(!msg.contains("SECRET"), "{msg}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn send_receive_ack() {
    let (store, _) = aws_store(moto::shared(), None).await;
    store.send(&msg("stripe#t1#evt_q")).await.unwrap();
    let got = store.receive(10, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message, msg("stripe#t1#evt_q"));
    assert_eq!(got[0].receive_count, 1);
    store.ack(&got[0].receipt).await.unwrap();
    // Visibility 0 would have shown it again; acked, it is gone.
    assert!(store.receive(10, LONG).await.unwrap().is_empty());
}

#[tokio::test]
async fn received_messages_are_invisible_until_visibility_changes() {
    let (store, _) = aws_store(moto::shared(), None).await;
    store.send(&msg("stripe#t1#evt_v")).await.unwrap();
    let first = store.receive(10, LONG).await.unwrap();
    assert_eq!(first.len(), 1);
    assert!(
        store.receive(10, LONG).await.unwrap().is_empty(),
        "invisible"
    );
    store
        .change_visibility(&first[0].receipt, Duration::ZERO)
        .await
        .unwrap();
    let again = store.receive(10, LONG).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].message, first[0].message);
    assert_eq!(again[0].receive_count, 2);
    assert_eq!(store.receive(0, LONG).await.unwrap(), vec![]);
}

#[tokio::test]
async fn unacked_messages_redrive_to_the_dead_letter_queue() {
    let (store, _) = aws_store(moto::shared(), None).await;
    store.send(&msg("stripe#t1#evt_dlq")).await.unwrap();
    for n in 1..=MAX_RECEIVE_COUNT {
        let got = store.receive(10, LONG).await.unwrap();
        assert_eq!(got.len(), 1, "receive {n}");
        assert_eq!(got[0].receive_count, n);
        store
            .change_visibility(&got[0].receipt, Duration::ZERO)
            .await
            .unwrap();
    }
    // The next receive finds the count exhausted and moves it.
    assert!(store.receive(10, LONG).await.unwrap().is_empty());
    let dead = store.receive_dead_letters(10, LONG).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message, msg("stripe#t1#evt_dlq"));
}

#[tokio::test]
async fn a_foreign_message_is_malformed_and_names_only_its_id() {
    let (store, names) = aws_store(moto::shared(), None).await;
    store
        .sqs()
        .send_message()
        .queue_url(&names.queue_url)
        .message_body("card=4242424242424242")
        .send()
        .await
        .unwrap();
    match store.receive(10, LONG).await {
        Err(QueueError::Malformed(m)) => assert!(!m.contains("4242"), "{m}"),
        other => panic!("expected Malformed, got {other:?}"),
    }
}

#[tokio::test]
async fn dead_letters_need_a_configured_dlq() {
    let (store, mut names) = aws_store(moto::shared(), None).await;
    names.dlq_url = None;
    let store = AwsStore::new(store.dynamodb().clone(), store.sqs().clone(), names);
    assert!(matches!(
        store.receive_dead_letters(1, LONG).await,
        Err(QueueError::Unavailable(_))
    ));
}

#[tokio::test]
async fn each_port_call_is_exactly_one_aws_call() {
    let counter = CallCounter::new();
    let (store, _) = aws_store(moto::shared(), Some(counter.clone())).await;
    assert_eq!(counter.count(), 0, "setup is not counted");
    let it = item("t1", "evt_count", 1);

    let mut calls = Vec::new();
    let mut measure = |name: &'static str, before: usize, counter: &CallCounter| {
        calls.push((name, counter.count() - before));
    };
    // Two calls each: the event's put and its body's (written once, its own item); a
    // duplicate of an event still `received` also puts the body if it is missing
    // (rejected here). Every other port call is one.
    let b = counter.count();
    assert_eq!(store.put_new(&it).await.unwrap(), PutOutcome::Inserted);
    let new_put = counter.count() - b;
    let b = counter.count();
    assert!(matches!(
        store.put_new(&it).await.unwrap(),
        PutOutcome::Duplicate(_)
    ));
    let duplicate_put = counter.count() - b;
    assert_eq!((new_put, duplicate_put), (2, 2));
    let b = counter.count();
    store.send(&msg(it.key.as_str())).await.unwrap();
    measure("send", b, &counter);
    // The event's item, then its body's.
    let b = counter.count();
    store.get(&it.key).await.unwrap();
    assert_eq!(counter.count() - b, 2);
    let b = counter.count();
    store.mark_enqueue_failed(&it.key).await.unwrap();
    measure("mark_enqueue_failed", b, &counter);
    let b = counter.count();
    let got = store.receive(10, LONG).await.unwrap();
    measure("receive", b, &counter);
    let b = counter.count();
    store.ack(&got[0].receipt).await.unwrap();
    measure("ack", b, &counter);

    let expected: Vec<_> = calls.iter().map(|(n, _)| (*n, 1)).collect();
    assert_eq!(calls, expected);
}

#[tokio::test]
async fn connection_refused_is_unavailable_quickly() {
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(format!("http://127.0.0.1:{port}"))
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(2)
                .with_initial_backoff(Duration::from_millis(10)),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_millis(500))
                .operation_timeout(Duration::from_secs(3))
                .build(),
        )
        .load()
        .await;
    let counter = CallCounter::new();
    let dynamodb = aws_sdk_dynamodb::config::Builder::from(&sdk).interceptor(counter.clone());
    let store = AwsStore::new(
        aws_sdk_dynamodb::Client::from_conf(dynamodb.build()),
        aws_sdk_sqs::Client::new(&sdk),
        AwsNames {
            table: "nowhere".into(),
            queue_url: format!("http://127.0.0.1:{port}/123456789012/nowhere"),
            dlq_url: None,
        },
    );
    let started = Instant::now();
    match store.put_new(&item("t1", "evt_down", 1)).await {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("Connection refused"), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(counter.count(), 2, "retried, but only as configured");
    assert!(matches!(
        store.get(&item("t1", "evt_down", 1).key).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        store.send(&msg("stripe#t1#evt_down")).await,
        Err(QueueError::Unavailable(_))
    ));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn setup_helpers_are_idempotent() {
    let sdk = moto::shared().sdk_config().await;
    let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let name = unique_name("idem");
    create_tables(&dynamodb, &name).await.unwrap();
    create_tables(&dynamodb, &name).await.unwrap();
    let first = create_queues(&sqs, &name, 5).await.unwrap();
    let second = create_queues(&sqs, &name, 5).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(first.table, name);
    let ttl = dynamodb
        .describe_time_to_live()
        .table_name(&name)
        .send()
        .await
        .unwrap();
    let desc = ttl.time_to_live_description().unwrap();
    assert_eq!(desc.attribute_name(), Some("expires_at"));
}

const TOML: &str =
    "[[tenant]]\nprovider = \"stripe\"\ntenant = \"shop-1\"\nsecrets = [\"whsec_x\"]\n";

#[tokio::test]
async fn config_loads_from_ssm_or_inline_env() {
    let sdk = moto::shared().sdk_config().await;
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    let name = format!("/einmal/{}/config", unique_name("cfg"));
    ssm.put_parameter()
        .name(&name)
        .value(TOML)
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .unwrap();
    let cfg = load_config_from_ssm(&ssm, &name).await.unwrap();
    assert!(cfg.tenant("stripe", "shop-1").is_some());

    match load_config_from_ssm(&ssm, "/einmal/does-not-exist").await {
        Err(AwsSetupError::Ssm { reason, .. }) => assert_eq!(reason, "not found"),
        other => panic!("expected Ssm error, got {other:?}"),
    }

    // The parameter wins over inline TOML.
    let both = |k: &str| match k {
        CONFIG_PARAMETER_ENV => Some(name.clone()),
        CONFIG_ENV => Some("not toml [".to_string()),
        _ => None,
    };
    let cfg = load_config_with(&sdk, both).await.unwrap();
    assert!(cfg.tenant("stripe", "shop-1").is_some());
    let inline = |k: &str| (k == CONFIG_ENV).then(|| TOML.to_string());
    assert!(load_config_with(&sdk, inline)
        .await
        .unwrap()
        .tenant("stripe", "shop-1")
        .is_some());
    assert!(matches!(
        load_config_with(&sdk, |_| None).await,
        Err(AwsSetupError::NoConfigSource)
    ));
}

/// A configuration over 8 KB (more than an Advanced parameter holds) split across
/// Standard parameters below a path: loaded as one; a problem in one part names that
/// parameter and its own line; the parts still check across each other (a
/// destination in one part refers to a tenant in another).
#[tokio::test]
async fn a_configuration_over_8_kb_loads_from_parameters_below_a_path() {
    let sdk = moto::shared().sdk_config().await;
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    let path = format!("/einmal/{}/config/", unique_name("split"));
    let tenants = |part: usize| -> String {
        (0..30)
            .map(|i| {
                format!(
                    "[[tenant]]\nprovider = \"stripe\"\ntenant = \"shop-{part}-{i:02}\"\n\
                     secrets = [\"whsec_{part}_{i:02}_padding_to_make_each_part_near_four_kb\"]\n\n"
                )
            })
            .collect()
    };
    let mut total = 0;
    for part in 0..3 {
        let value = tenants(part);
        assert!(value.len() <= 4096, "a Standard parameter: {}", value.len());
        total += value.len();
        ssm.put_parameter()
            .name(format!("{path}tenants-{part}"))
            .value(value)
            .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
            .send()
            .await
            .unwrap();
    }
    let destination = "[[destination]]\nname = \"orders\"\ntenant = \"shop-0-00\"\n\
                       kind = \"lambda\"\nfunction = \"orders\"\nevents = [\"*\"]\n";
    ssm.put_parameter()
        .name(format!("{path}z/destinations"))
        .value(destination)
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .unwrap();
    assert!(
        total > 8192,
        "over what one Advanced parameter holds: {total}"
    );
    let env = |k: &str| (k == CONFIG_PARAMETER_ENV).then(|| path.clone());
    let cfg = load_config_with(&sdk, env).await.unwrap();
    assert_eq!(cfg.tenants().count(), 90);
    assert!(cfg.tenant("stripe", "shop-2-29").is_some());
    assert_eq!(cfg.destinations().len(), 1);

    // A broken part: its parameter and its own line, no secret.
    ssm.put_parameter()
        .name(format!("{path}tenants-1"))
        .value("[[tenant]]\nprovider = \"stripe\"\ntenant = \"x\"\nsecrets = \"whsec_LEAKED\"\n")
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .overwrite(true)
        .send()
        .await
        .unwrap();
    let err = load_config_with(&sdk, env).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "SSM parameter {path}tenants-1:4: invalid config at `tenant[0].secrets`"
        )),
        "{err}"
    );
    assert!(!err.contains("LEAKED"), "{err}");

    // A problem across parts (a destination of a tenant no part has): its parameter
    // and the line there.
    ssm.put_parameter()
        .name(format!("{path}tenants-1"))
        .value(tenants(1))
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .overwrite(true)
        .send()
        .await
        .unwrap();
    ssm.put_parameter()
        .name(format!("{path}z/destinations"))
        .value(destination.replace("shop-0-00", "nobody"))
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .overwrite(true)
        .send()
        .await
        .unwrap();
    let err = load_config_with(&sdk, env).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!("(parameter {path}z/destinations)")),
        "{err}"
    );
    assert!(err.contains("nobody"), "{err}");
}

#[test]
fn a_private_moto_stops_on_drop() {
    let moto = moto::Moto::start();
    let addr: std::net::SocketAddr = moto.endpoint.trim_start_matches("http://").parse().unwrap();
    assert!(std::net::TcpStream::connect(addr).is_ok());
    drop(moto);
    // Drop waits for the wrapper, which waits for moto: the port is closed now.
    assert!(std::net::TcpStream::connect(addr).is_err());
}

/// A mixed-version deployment during an update: an event stored by the previous
/// release (its body inline in the event's item, no body item) with that release's
/// pointer message (no carried item) is processed by this one, and keeps its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_of_the_previous_layout_is_processed() {
    let (store, names) = aws_store(moto::shared(), None).await;
    let store = Arc::new(store);
    let dynamodb = store.dynamodb().clone();
    let state_table = format!("{}-state", names.table);
    create_state_table(&dynamodb, &state_table)
        .await
        .expect("state table");
    let state = Arc::new(DynamoStateStore::new(dynamodb.clone(), state_table));
    let config = scenario::config();
    let ingest = Ingestor::new(config.clone(), store.clone(), store.clone());
    let event = scenario::pi_succeeded("order-mv1", "pi_mv1", 4990, einmal::time::now_secs());
    let resp = ingest
        .ingest("stripe", scenario::TENANT, &event.request(&config))
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let carried = store.receive(10, LONG).await.expect("receive");
    assert_eq!(carried.len(), 1);
    store.ack(&carried[0].receipt).await.expect("ack");
    let key = carried[0].message.pk.clone();
    let body = carried[0]
        .item
        .as_ref()
        .expect("the item rides along")
        .body
        .clone();

    // Rewrite it as the previous release stored it.
    let pk = AttributeValue::S(key.as_str().to_string());
    let body_pk = AttributeValue::S(format!("body#{}", key.as_str()));
    let mut old = dynamodb
        .get_item()
        .table_name(&names.table)
        .key("pk", pk.clone())
        .send()
        .await
        .expect("get")
        .item
        .expect("stored");
    assert_eq!(old.remove("body_item"), Some(AttributeValue::Bool(true)));
    old.insert(
        "body".into(),
        AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(body.clone())),
    );
    dynamodb
        .put_item()
        .table_name(&names.table)
        .set_item(Some(old))
        .send()
        .await
        .expect("put the old layout");
    dynamodb
        .delete_item()
        .table_name(&names.table)
        .key("pk", body_pk)
        .send()
        .await
        .expect("no body item");
    store
        .send(&msg(key.as_str()))
        .await
        .expect("the old pointer");

    let processor = Processor::new(
        store.clone(),
        store.clone(),
        store.clone(),
        state.clone(),
        Arc::new(ReferenceDomain),
    )
    .with_settings(scenario::settings(30_000, 3));
    let batch = store.receive(10, LONG).await.expect("receive");
    assert_eq!(batch.len(), 1);
    assert!(batch[0].item.is_none(), "a pointer alone");
    let outcomes = processor.process_batch(&batch, "w-new").await;
    assert!(
        matches!(outcomes[..], [(_, MessageOutcome::Ack)]),
        "{outcomes:?}"
    );
    let done = store.get(&key).await.expect("get").expect("item");
    assert_eq!(done.state, InboxState::Completed, "{:?}", done.last_error);
    assert_eq!(done.attempts, 1);
    assert_eq!(done.body, body, "the inline body is kept");
    let order = state
        .load(&[order_key(scenario::TENANT, "order-mv1")])
        .await
        .expect("load")
        .remove(0);
    assert!(order.exists(), "the payment's effect");
    assert_eq!(order.data["payment_status"], "paid", "{}", order.data);
}

/// A body missing from a `queued` item (a replay of it) or a `dead_letter` one is
/// stored by the next duplicate, which takes a dead letter back to `queued`; so is a
/// dead letter whose reason says the body was missing when a restore stored the body
/// and died before moving the item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_takes_back_queued_and_dead_items_without_their_body() {
    let (store, names) = aws_store(moto::shared(), None).await;
    let drop_body = |key: &InboxKey| {
        let (dynamodb, table) = (store.dynamodb().clone(), names.table.clone());
        let pk = format!("body#{}", key.as_str());
        async move {
            dynamodb
                .delete_item()
                .table_name(&table)
                .key("pk", AttributeValue::S(pk))
                .send()
                .await
                .expect("as if the body's put never happened");
        }
    };
    let now = einmal::time::now_millis();

    // Queued (a replay) without its body.
    let mut queued = item("t1", "evt_nobody_queued", now);
    queued.body = einmal::body::compress(br#"{"id":"evt_nobody_queued"}"#).unwrap();
    assert_eq!(store.put_new(&queued).await.unwrap(), PutOutcome::Inserted);
    drop_body(&queued.key).await;
    assert!(matches!(
        store.requeue(&queued.key, false, now + 10).await.unwrap(),
        RequeueOutcome::Requeued { .. }
    ));
    match store.put_new(&queued).await.unwrap() {
        PutOutcome::Restored(now) => assert_eq!(now.state, InboxState::Queued),
        other => panic!("expected a restore, got {other:?}"),
    }
    assert_eq!(
        store.get(&queued.key).await.unwrap().unwrap().body,
        queued.body
    );

    // Dead-lettered because the body was missing, then the body came back but the
    // move to `queued` was lost: the next duplicate moves it.
    let mut dead = item("t1", "evt_nobody_dead", now);
    dead.body = einmal::body::compress(br#"{"id":"evt_nobody_dead"}"#).unwrap();
    assert_eq!(store.put_new(&dead).await.unwrap(), PutOutcome::Inserted);
    let seen = ItemVersion::of(&store.get(&dead.key).await.unwrap().unwrap());
    assert!(store
        .mark_dead_letter(
            &dead.key,
            "body missing: pointer reached the dead-letter queue",
            seen,
            now + 20
        )
        .await
        .unwrap());
    let mut retry = dead.clone();
    retry.updated_at_ms = now + 30;
    match store.put_new(&retry).await.unwrap() {
        PutOutcome::Restored(now) => assert_eq!(now.state, InboxState::Queued),
        other => panic!("expected a restore, got {other:?}"),
    }
    // A dead letter for another reason, body present: a plain duplicate.
    let mut poison = item("t1", "evt_poison", now);
    poison.body = einmal::body::compress(br#"{"id":"evt_poison"}"#).unwrap();
    assert_eq!(store.put_new(&poison).await.unwrap(), PutOutcome::Inserted);
    let seen = ItemVersion::of(&store.get(&poison.key).await.unwrap().unwrap());
    assert!(store
        .mark_dead_letter(&poison.key, "permanent: bad amount", seen, now + 20)
        .await
        .unwrap());
    assert!(matches!(
        store.put_new(&poison).await.unwrap(),
        PutOutcome::Duplicate(_)
    ));
    assert_eq!(
        store.get(&poison.key).await.unwrap().unwrap().state,
        InboxState::DeadLetter
    );
}

/// A receiver that died between the event's put and the body's: the provider's retry
/// (a duplicate of an event still `received`) stores the body and says so
/// (`Restored`, so the receiver sends its pointer), and the pointer is processed from
/// the body item. A second retry finds the body: a plain duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_stores_a_body_its_first_request_never_wrote() {
    let (store, names) = aws_store(moto::shared(), None).await;
    let mut it = item("t1", "evt_nobody", 1_700_000_000_000);
    it.body = einmal::body::compress(br#"{"id":"evt_nobody"}"#).unwrap();
    assert_eq!(store.put_new(&it).await.unwrap(), PutOutcome::Inserted);
    store
        .dynamodb()
        .delete_item()
        .table_name(&names.table)
        .key("pk", AttributeValue::S(format!("body#{}", it.key.as_str())))
        .send()
        .await
        .expect("as if the body's put never happened");
    assert!(store.get(&it.key).await.unwrap().unwrap().body.is_empty());

    assert!(matches!(
        store.put_new(&it).await.unwrap(),
        PutOutcome::Restored(_)
    ));
    assert_eq!(store.get(&it.key).await.unwrap().unwrap().body, it.body);
    assert!(matches!(
        store.put_new(&it).await.unwrap(),
        PutOutcome::Duplicate(_)
    ));
}

/// A secret referenced as `{ ssm = "…" }` (a DSN, a tenant's signing secret) is fetched
/// at every load, so an overwrite rotates it at the next reload; a reference SSM does
/// not have is a problem at its line naming the parameter, never a value.
#[tokio::test]
async fn ssm_secret_references_resolve_at_each_load() {
    use einmal::destinations::DestinationKind;
    let sdk = moto::shared().sdk_config().await;
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    let base = format!("/einmal/{}", unique_name("refs"));
    let put = |name: String, value: &'static str| {
        let ssm = ssm.clone();
        async move {
            ssm.put_parameter()
                .name(name)
                .value(value)
                .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
                .overwrite(true)
                .send()
                .await
                .unwrap();
        }
    };
    put(format!("{base}/secrets/stripe"), "whsec_from_ssm_one").await;
    put(
        format!("{base}/secrets/shop-db"),
        "host=db.internal user=einmal password=SSM_ONLY dbname=shop",
    )
    .await;
    let config = format!(
        "[[tenant]]\nprovider = \"stripe\"\ntenant = \"demo\"\n\
         secrets = [{{ ssm = \"{base}/secrets/stripe\" }}]\n\n\
         [[destination]]\nname = \"shop-db\"\ntenant = \"demo\"\nkind = \"postgres\"\n\
         events = [\"*\"]\ndsn = {{ ssm = \"{base}/secrets/shop-db\" }}\ntable = \"events\"\ntls = false\n"
    );
    let parameter = format!("{base}/tenants");
    ssm.put_parameter()
        .name(&parameter)
        .value(&config)
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .unwrap();
    let env = |k: &str| (k == CONFIG_PARAMETER_ENV).then(|| parameter.clone());
    let dsn = |cfg: &einmal::config::Config| match &cfg.destinations()[0].kind {
        DestinationKind::Postgres(p) => p.dsn.expose().to_string(),
        other => panic!("not postgres: {other:?}"),
    };
    let cfg = load_config_with(&sdk, env).await.unwrap();
    let tenant = cfg.tenant("stripe", "demo").unwrap();
    assert_eq!(tenant.secrets[0].expose(), "whsec_from_ssm_one");
    assert!(dsn(&cfg).contains("password=SSM_ONLY"));

    // Rotated in SSM: the next load has the new value.
    put(format!("{base}/secrets/stripe"), "whsec_from_ssm_two").await;
    let cfg = load_config_with(&sdk, env).await.unwrap();
    assert_eq!(
        cfg.tenant("stripe", "demo").unwrap().secrets[0].expose(),
        "whsec_from_ssm_two"
    );

    // A reference to a parameter that does not exist: its line and name, no value.
    ssm.put_parameter()
        .name(&parameter)
        .value(config.replace("/secrets/shop-db", "/secrets/missing"))
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .overwrite(true)
        .send()
        .await
        .unwrap();
    let err = load_config_with(&sdk, env).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "line 11: destination demo/shop-db: `dsn` refers to SSM parameter {base}/secrets/missing, which was not found"
        )),
        "{err}"
    );
    assert!(!err.contains("whsec_from_ssm"), "{err}");
}
