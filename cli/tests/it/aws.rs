//! The operator commands with `--backend aws`, through the real `einmal` binary,
//! against DynamoDB + SQS in moto (tables and queues named per test, configured the
//! way an operator does: `EINMAL_INBOX_TABLE`, `EINMAL_QUEUE_URL`, `EINMAL_DLQ_URL`,
//! `EINMAL_STATE_TABLE`, `EINMAL_AUDIT_TABLE`, `AWS_ENDPOINT_URL`, credentials).
//!
//! The test prepares the stores in-process with the library (ingest, process with the
//! reference domain), runs `einmal dlq list|show`, `einmal replay` (one event with
//! `--reason`, bulk with `--dry-run`), `einmal audit list` and `einmal reconcile`
//! (Stripe's event list, and GoPay's payment status from its hints, against fake APIs
//! on loopback), and checks both their output and the stores afterwards. Bad input (an unknown id,
//! an unknown provider) gets a clear message and a non-zero exit.

use crate::common;
use einmal::domain::state::CommitOne;

use common::{http, repo, Reply};
use std::collections::BTreeMap;

use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use einmal::adapters::aws::{create_audit_table, DynamoAuditLog};
use einmal::adapters::aws::{create_queues, create_tables, AwsNames, AwsStore};
use einmal::adapters::aws::{create_state_table, DynamoStateStore};
use einmal::audit::AuditLog;
use einmal::domain::reference::{order_key, seed_sku, sku_key, Order, ReferenceDomain, Sku};
use einmal::domain::state::{CommitOutcome, StateKey, StateRecord, StateStore};
use einmal::envelope::InboxKey;
use einmal::pipeline::ingest::Ingestor;
use einmal::pipeline::process::Processor;
use einmal::ports::{Inbox, InboxFilter, InboxItem, InboxState, Queue, Source};
use einmal_tests::fixtures::STRIPE_SECRET;
use einmal_tests::moto;
use einmal_tests::scenario::{self, orders_create, pi_succeeded, settle_all, Event, TENANT};
use serde_json::{json, Value};

const RED: &str = "SKU-RED-M";
const NOPE: &str = "SKU-NOPE";
const MAX_RECEIVES: u32 = 5;
const LEASE_MS: i64 = 2_000;
const API_KEY: &str = "sk_test_cli_reconcile";
const GOPAY_TOKEN: &str = "gopay-cli-access-token";
const GOPAY_PATH_TOKEN: &str = "gopay-cli-path-token";

/// A config with one Stripe tenant whose API (`api_base`) answers with `api_key`.
fn write_stripe_config(path: &std::path::Path, api_base: &str, api_key: &str) {
    std::fs::write(
        path,
        format!(
            r#"
[[tenant]]
provider = "stripe"
tenant = "{TENANT}"
secrets = ["{STRIPE_SECRET}"]
options = {{ api_base = "{api_base}", api_key = "{api_key}" }}
"#
        ),
    )
    .expect("config written");
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json_out(o: &Output) -> Value {
    assert!(o.status.success(), "{}{}", stdout(o), stderr(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

/// One set of tables and queues in moto, the stores on them, and the environment
/// that points the binary at them.
struct Aws {
    env: Vec<(&'static str, String)>,
    store: Arc<AwsStore>,
    state: Arc<DynamoStateStore>,
    audit: DynamoAuditLog,
}

impl Aws {
    async fn new() -> Aws {
        let moto = moto::shared();
        let sdk = moto.sdk_config().await;
        let name = moto::unique_name("einmal-cli");
        let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        create_tables(&dynamodb, &name).await.expect("inbox table");
        let names: AwsNames = create_queues(&sqs, &name, MAX_RECEIVES)
            .await
            .expect("queues");
        let state_table = format!("{name}-state");
        create_state_table(&dynamodb, &state_table)
            .await
            .expect("state table");
        let audit_table = format!("{name}-audit");
        create_audit_table(&dynamodb, &audit_table)
            .await
            .expect("audit table");
        let env = vec![
            ("AWS_ENDPOINT_URL", moto.endpoint.clone()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
            ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
            ("EINMAL_INBOX_TABLE", names.table.clone()),
            ("EINMAL_QUEUE_URL", names.queue_url.clone()),
            (
                "EINMAL_DLQ_URL",
                names.dlq_url.clone().expect("a dead-letter queue"),
            ),
            ("EINMAL_STATE_TABLE", state_table.clone()),
            ("EINMAL_AUDIT_TABLE", audit_table.clone()),
            ("RUST_LOG", "warn".to_owned()),
        ];
        Aws {
            env,
            store: Arc::new(AwsStore::new(dynamodb.clone(), sqs, names)),
            state: Arc::new(DynamoStateStore::new(dynamodb.clone(), state_table)),
            audit: DynamoAuditLog::new(dynamodb, audit_table),
        }
    }

    /// The environment for base name `name`, the way an operator sets it before
    /// `einmal setup --backend aws`: nothing created yet.
    fn env_for(endpoint: &str, name: &str) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", endpoint.to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
            ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
            ("EINMAL_INBOX_TABLE", name.to_owned()),
            // moto's queue URLs: `{endpoint}/{account}/{name}`.
            (
                "EINMAL_QUEUE_URL",
                format!("{endpoint}/123456789012/{name}"),
            ),
            (
                "EINMAL_DLQ_URL",
                format!("{endpoint}/123456789012/{name}-dlq"),
            ),
            ("EINMAL_STATE_TABLE", format!("{name}-state")),
            ("EINMAL_AUDIT_TABLE", format!("{name}-audit")),
            ("EINMAL_MAX_RECEIVE_COUNT", MAX_RECEIVES.to_string()),
            ("RUST_LOG", "warn".to_owned()),
        ]
    }

    /// The stores on what `einmal setup` created under base name `name`.
    async fn on_setup(name: &str) -> Aws {
        let moto = moto::shared();
        let sdk = moto.sdk_config().await;
        let env = Aws::env_for(&moto.endpoint, name);
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let names = AwsNames {
            table: get("EINMAL_INBOX_TABLE"),
            queue_url: get("EINMAL_QUEUE_URL"),
            dlq_url: Some(get("EINMAL_DLQ_URL")),
        };
        Aws {
            store: Arc::new(AwsStore::new(dynamodb.clone(), sqs, names)),
            state: Arc::new(DynamoStateStore::new(
                dynamodb.clone(),
                get("EINMAL_STATE_TABLE"),
            )),
            audit: DynamoAuditLog::new(dynamodb, get("EINMAL_AUDIT_TABLE")),
            env,
        }
    }

    /// `einmal ARGS --backend aws` with this environment (blocking).
    async fn einmal(&self, args: &[&str]) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_einmal"));
        command
            .args(args)
            .args(["--backend", "aws"])
            .current_dir(repo())
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("EINMAL_CONFIG")
            .env_remove("EINMAL_CONFIG_PARAMETER")
            // An operator's shell: audited commands name $USER unless --actor says.
            .env("USER", "ops-shell");
        for (k, v) in &self.env {
            command.env(k, v);
        }
        tokio::task::spawn_blocking(move || command.output().expect("einmal runs"))
            .await
            .expect("join")
    }

    fn ingestor(&self) -> Ingestor {
        Ingestor::new(scenario::config(), self.store.clone(), self.store.clone())
    }

    fn processor(&self) -> Processor {
        Processor::from_store(
            self.store.clone(),
            self.state.clone(),
            Arc::new(ReferenceDomain),
        )
        .with_settings(scenario::settings(LEASE_MS, MAX_RECEIVES))
        .with_jitter(|| 1.0)
    }

    async fn seed(&self, sku: &str, on_hand: i64) {
        let outcome = self
            .state
            .commit(&[seed_sku(TENANT, sku, on_hand)])
            .await
            .expect("seed commits");
        assert_eq!(outcome, CommitOutcome::Committed, "seed {sku}");
    }

    async fn send(&self, event: &Event) {
        let ingestor = self.ingestor();
        let request = event.request(&ingestor.config());
        let response = ingestor.ingest(event.provider, TENANT, &request).await;
        assert_eq!(
            response.status, 200,
            "{}: {}",
            event.event_id, response.body
        );
    }

    async fn items(&self) -> Vec<InboxItem> {
        self.store
            .list(&InboxFilter {
                limit: 10_000,
                ..Default::default()
            })
            .await
            .expect("inbox list")
    }

    async fn item(&self, key: &InboxKey) -> InboxItem {
        self.store
            .get(key)
            .await
            .expect("inbox get")
            .unwrap_or_else(|| panic!("no inbox item {key}"))
    }

    /// Process until the queue is empty and every item is terminal; the number of
    /// messages handled.
    async fn drain(&self) -> usize {
        self.drain_with(&self.processor()).await
    }

    async fn drain_with(&self, p: &Processor) -> usize {
        let visibility = Duration::from_millis(LEASE_MS as u64 + 1_000);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut handled = 0;
        loop {
            let batch = self.store.receive(10, visibility).await.expect("receive");
            if !batch.is_empty() {
                handled += settle_all(p, &batch, "cli-test").await.len();
                continue;
            }
            if self.items().await.iter().all(|i| i.state.is_terminal()) {
                return handled;
            }
            assert!(Instant::now() < deadline, "drain timed out");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn record(&self, key: &StateKey) -> StateRecord {
        self.state
            .load(std::slice::from_ref(key))
            .await
            .expect("state load")
            .remove(0)
    }

    async fn order(&self, id: &str) -> Order {
        let record = self.record(&order_key(TENANT, id)).await;
        assert!(record.exists(), "order {id}");
        serde_json::from_value(record.data).expect("order data")
    }

    async fn on_hand(&self, sku: &str) -> i64 {
        let record = self.record(&sku_key(TENANT, sku)).await;
        let sku: Sku = serde_json::from_value(record.data).expect("sku data");
        sku.on_hand
    }

    async fn records(&self, keys: &[StateKey]) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        for r in self.state.load(keys).await.expect("state load") {
            out.insert(r.key.pk(), json!({"version": r.version, "data": r.data}));
        }
        out
    }
}

// ---------------------------------------------------------------------------
// a dead-lettered delivery: dlq list, events list --delivery-state, replay

/// An HTTP destination `erp` for the Shopify orders of the test tenant.
fn erp(url: &str) -> einmal::destinations::DestinationConfig {
    use einmal::destinations::http::HttpDestination;
    use einmal::destinations::{BodyFormat, DestinationConfig, DestinationKind};
    DestinationConfig {
        name: "erp".into(),
        tenant: TENANT.into(),
        provider: Some("shopify".into()),
        events: vec!["orders/*".into()],
        outputs: Vec::new(),
        ordered: false,
        max_attempts: 10,
        max_age: Duration::from_secs(3600),
        kind: DestinationKind::Http(HttpDestination {
            url: url.into(),
            secrets: vec![einmal::config::Secret::new(
                einmal_tests::destination_server::SECRET,
            )],
            body: BodyFormat::Original,
            timeout: Duration::from_millis(2_000),
            allow_private: false,
        }),
    }
}

/// On DynamoDB (moto), through the binary: an order completes but the destination
/// answers 410, so its delivery is dead-lettered. `dlq list` and `events list
/// --delivery-state dead_letter` show it (the `by_relay_dead` index); a replay
/// schedules it again (pending, out of the dead letters); the relay delivers it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_delivery_is_listed_and_replayed_with_backend_aws() {
    use einmal::destinations::http::HttpSink;
    use einmal::pipeline::relay::{Relay, RelayDestination};
    use einmal_tests::destination_server::{Answer, DestinationServer};
    use std::sync::atomic::{AtomicBool, Ordering};

    let aws = Aws::new().await;
    aws.seed(RED, 10).await;
    let fixed = Arc::new(AtomicBool::new(false));
    let server = DestinationServer::start({
        let fixed = fixed.clone();
        move |_, _| match fixed.load(Ordering::SeqCst) {
            true => Answer::Ok,
            false => Answer::Status(410, "gone"),
        }
    })
    .await;
    let config = erp(&server.url);
    let einmal::destinations::DestinationKind::Http(http) = &config.kind else {
        unreachable!()
    };
    let sink = HttpSink::new(http, &einmal::https::HttpsClient::new()).expect("sink");
    let relay = Arc::new(Relay::new(
        aws.store.clone(),
        vec![RelayDestination {
            config: config.clone(),
            sink: Arc::new(sink),
        }],
    ));
    let processor = aws.processor().with_relay(relay.clone());
    let order = orders_create(6001, 1_764_600_000, &[(RED, 1)], 1_000, "pending");
    aws.send(&order).await;
    aws.drain_with(&processor).await;
    let key = order.inbox_key();
    let item = aws.item(&key).await;
    assert_eq!(item.state, InboxState::Completed);
    assert_eq!(
        item.deliveries[0].state,
        einmal::ports::DeliveryState::DeadLetter
    );

    // dlq list: the delivery, not the event.
    let listed = json_out(&aws.einmal(&["dlq", "list", "--json"]).await);
    let entries = listed.as_array().expect("array");
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["kind"], json!("delivery"));
    assert_eq!(entries[0]["id"], json!(key.as_str()));
    assert_eq!(entries[0]["destination"], json!("erp"));
    assert_eq!(entries[0]["event_state"], json!("completed"));
    assert_eq!(entries[0]["last_status"], json!(410));
    let out = aws.einmal(&["dlq", "list"]).await;
    assert!(
        stdout(&out).contains(&format!("{key}  delivery erp ")),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        json_out(&aws.einmal(&["dlq", "list", "--events", "--json"]).await),
        json!([])
    );
    let dead = [
        "events",
        "list",
        "--delivery-state",
        "dead_letter",
        "--json",
    ];
    let found = json_out(&aws.einmal(&dead).await);
    assert_eq!(found.as_array().map(Vec::len), Some(1), "{found}");
    assert_eq!(found[0]["key"], json!(key.as_str()));
    let other: Vec<&str> = dead
        .iter()
        .copied()
        .chain(["--destination", "crm"])
        .collect();
    assert_eq!(json_out(&aws.einmal(&other).await), json!([]));

    // Replayed (audited as $USER): pending again, no dead letter any more.
    let event_id = entries[0]["event_id"].as_str().unwrap().to_owned();
    let out = aws
        .einmal(&[
            "replay",
            "--provider",
            "shopify",
            "--tenant",
            TENANT,
            "--event-id",
            &event_id,
            "--reason",
            "erp restored",
        ])
        .await;
    assert!(
        stdout(&out).contains("redelivered"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let pending = ["events", "list", "--delivery-state", "pending", "--json"];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = json_out(&aws.einmal(&pending).await);
        let none_dead = json_out(&aws.einmal(&["dlq", "list", "--json"]).await) == json!([]);
        if listed.as_array().map(Vec::len) == Some(1) && none_dead {
            break;
        }
        assert!(Instant::now() < deadline, "after the replay: {listed}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The destination fixed, the relay's pass delivers it, once.
    fixed.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.effects().is_empty() {
        assert!(Instant::now() < deadline, "never delivered");
        relay
            .run_due(einmal::time::now_millis(), 10)
            .await
            .expect("relay pass");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(server.effects().len(), 1);
    let item = aws.item(&key).await;
    assert_eq!(
        item.deliveries[0].state,
        einmal::ports::DeliveryState::Delivered
    );
}

// ---------------------------------------------------------------------------
// setup --backend aws

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_creates_what_the_adapters_use_and_a_second_run_reports_exists() {
    let name = moto::unique_name("einmal-setup");
    let aws = Aws::on_setup(&name).await;
    let first = json_out(&aws.einmal(&["setup", "--json"]).await);
    let steps = first.as_array().expect("steps");
    let kinds: Vec<_> = steps.iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "inbox table",
            "state table",
            "audit table",
            "dead-letter queue",
            "queue"
        ],
        "{first}"
    );
    assert!(steps.iter().all(|s| s["status"] == "created"), "{first}");
    assert_eq!(
        steps[4]["name"],
        json!(aws.env[6].1),
        "the queue URL: {first}"
    );
    // Idempotent: everything exists, nothing fails.
    let again = aws.einmal(&["setup"]).await;
    assert!(again.status.success(), "{}", stderr(&again));
    let text = stdout(&again);
    assert_eq!(text.lines().count(), 5, "{text}");
    assert!(text.lines().all(|l| l.starts_with("exists")), "{text}");

    // The inbox table has the indexes the code queries, the queue its redrive policy.
    let sdk = moto::shared().sdk_config().await;
    let table = aws_sdk_dynamodb::Client::new(&sdk)
        .describe_table()
        .table_name(&name)
        .send()
        .await
        .unwrap();
    let indexes: Vec<&str> = table
        .table()
        .unwrap()
        .global_secondary_indexes()
        .iter()
        .filter_map(|i| i.index_name())
        .collect();
    assert_eq!(
        indexes,
        [
            "by_sweep_shard",
            "by_hint",
            "by_wait_shard",
            "by_relay_due",
            "by_relay_dead"
        ],
        "the indexes the code queries"
    );
    let redrive = aws_sdk_sqs::Client::new(&sdk)
        .get_queue_attributes()
        .queue_url(&aws.env[6].1)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy)
        .send()
        .await
        .unwrap();
    let policy = redrive.attributes().unwrap()
        [&aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy]
        .clone();
    assert!(policy.contains(&format!("{name}-dlq")), "{policy}");

    // The adapters work on them: a dead letter, listed, replayed with a reason, audited.
    aws.seed(RED, 10).await;
    let broken = orders_create(7001, 1_764_600_000, &[(NOPE, 1)], 1_000, "pending");
    let fine = orders_create(7002, 1_764_600_100, &[(RED, 2)], 3_000, "pending");
    aws.send(&broken).await;
    aws.send(&fine).await;
    aws.drain().await;
    assert_eq!(
        aws.item(&broken.inbox_key()).await.state,
        InboxState::DeadLetter
    );
    assert_eq!(aws.on_hand(RED).await, 8);
    let listed = json_out(&aws.einmal(&["dlq", "list", "--json"]).await);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    aws.seed(NOPE, 5).await;
    let key = broken.inbox_key();
    let event_id = key.as_str().splitn(3, '#').nth(2).unwrap().to_string();
    let out = aws
        .einmal(&[
            "replay",
            "--provider",
            "shopify",
            "--tenant",
            TENANT,
            "--event-id",
            &event_id,
            "--reason",
            "stocked",
            "--actor",
            "ops-setup",
        ])
        .await;
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    aws.drain().await;
    assert_eq!(aws.item(&key).await.state, InboxState::Completed);
    assert_eq!(aws.on_hand(NOPE).await, 4);
    let records = aws.audit.list(10).await.expect("audit list");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].actor, "ops-setup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_names_the_missing_variable_and_creates_nothing() {
    let name = moto::unique_name("einmal-setup-bad");
    let mut aws = Aws::on_setup(&name).await;
    aws.env.retain(|(k, _)| *k != "EINMAL_STATE_TABLE");
    let out = aws.einmal(&["setup"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("EINMAL_STATE_TABLE"),
        "{}",
        stderr(&out)
    );
    let sdk = moto::shared().sdk_config().await;
    let tables = aws_sdk_dynamodb::Client::new(&sdk)
        .list_tables()
        .send()
        .await
        .unwrap();
    assert!(!tables.table_names().contains(&name), "{tables:?}");
}

// ---------------------------------------------------------------------------
// dlq list / show, replay (one, bulk dry run), audit list

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_replay_and_audit_with_backend_aws() {
    let aws = Aws::new().await;
    aws.seed(RED, 10).await;
    // One order names a SKU we do not stock: a permanent failure, dead-lettered.
    let broken = orders_create(
        5001,
        1_764_600_000,
        &[(RED, 1), (NOPE, 2)],
        5_000,
        "pending",
    );
    let fine = orders_create(5002, 1_764_600_100, &[(RED, 2)], 3_000, "pending");
    aws.send(&broken).await;
    aws.send(&fine).await;
    aws.drain().await;
    let key = broken.inbox_key();
    assert_eq!(aws.item(&key).await.state, InboxState::DeadLetter);
    assert_eq!(
        aws.item(&fine.inbox_key()).await.state,
        InboxState::Completed
    );

    // dlq list: the dead letter with its reason, in text and JSON.
    let out = aws.einmal(&["dlq", "list"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains(key.as_str()), "{text}");
    assert!(text.contains("unknown SKU SKU-NOPE"), "{text}");
    assert!(!text.contains(fine.inbox_key().as_str()), "{text}");
    let listed = json_out(
        &aws.einmal(&["dlq", "list", "--json", "--provider", "shopify"])
            .await,
    );
    let listed = listed.as_array().expect("array");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], json!(key.as_str()));
    assert_eq!(listed[0]["state"], json!("dead_letter"));
    assert_eq!(listed[0]["error_class"], json!("permanent"));
    let none = json_out(
        &aws.einmal(&["dlq", "list", "--json", "--tenant", "other"])
            .await,
    );
    assert_eq!(none, json!([]));

    // dlq show ID
    let shown = json_out(&aws.einmal(&["dlq", "show", key.as_str(), "--json"]).await);
    assert_eq!(shown["id"], json!(key.as_str()));
    assert_eq!(shown["event_type"], json!("orders/create"));
    assert_eq!(shown["attempts"], json!(1));
    assert!(shown["reason"]
        .as_str()
        .unwrap_or_default()
        .contains("unknown SKU SKU-NOPE"));
    let out = aws.einmal(&["dlq", "show", key.as_str()]).await;
    assert!(out.status.success());
    assert!(
        stdout(&out).contains("state:       dead_letter"),
        "{}",
        stdout(&out)
    );
    // An unknown id: a clear message, exit 3 (not found).
    let out = aws
        .einmal(&["dlq", "show", "shopify#t1#no-such-event"])
        .await;
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("no event shopify#t1#no-such-event"),
        "{}",
        stderr(&out)
    );

    // Fix (stock the SKU), then replay the one event with a reason.
    aws.seed(NOPE, 5).await;
    let event_id = format!("{}:orders/create:{}", scenario::SHOP, broken.event_id);
    let replay = |reason: &'static str| {
        let event_id = event_id.clone();
        let aws = &aws;
        async move {
            aws.einmal(&[
                "replay",
                "--provider",
                "shopify",
                "--tenant",
                TENANT,
                "--event-id",
                &event_id,
                "--reason",
                reason,
                "--actor",
                "ops-carol",
            ])
            .await
        }
    };
    let out = replay("SKU-NOPE stocked").await;
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.contains(&format!("{key}  replayed")), "{text}");
    assert!(text.contains("replayed=1"), "{text}");
    assert!(text.contains("dead_letters_removed=1"), "{text}");
    assert_eq!(aws.drain().await, 1, "one message: the replayed event");
    let item = aws.item(&key).await;
    assert_eq!(item.state, InboxState::Completed, "{:?}", item.last_error);
    assert_eq!(aws.on_hand(RED).await, 10 - 1 - 2);
    assert_eq!(aws.on_hand(NOPE).await, 5 - 2);
    assert_eq!(aws.order("5001").await.line_items.len(), 2);
    let keys = [
        order_key(TENANT, "5001"),
        order_key(TENANT, "5002"),
        sku_key(TENANT, RED),
        sku_key(TENANT, NOPE),
    ];
    let state_after = aws.records(&keys).await;

    // Again: already done, nothing enqueued, nothing changes.
    let out = replay("checking").await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("already_done=1"), "{}", stdout(&out));
    assert_eq!(aws.drain().await, 0);
    assert_eq!(aws.records(&keys).await, state_after);

    // An unknown event: reported missing, exit 1.
    let out = aws
        .einmal(&[
            "replay",
            "--provider",
            "shopify",
            "--tenant",
            TENANT,
            "--event-id",
            "no-such-event",
            "--reason",
            "typo",
        ])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("missing=1"), "{}", stdout(&out));

    // Bulk dry run: both completed events match, nothing is enqueued or audited.
    let out = aws
        .einmal(&[
            "replay",
            "--bulk",
            "--provider",
            "shopify",
            "--tenant",
            TENANT,
            "--force",
            "--reason",
            "what would a forced replay touch?",
            "--dry-run",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("dry run (nothing changed): would replay 2 and redeliver 0 of matched=2"),
        "{text}"
    );
    assert!(text.contains(key.as_str()) && text.contains(fine.inbox_key().as_str()));
    assert_eq!(aws.drain().await, 0, "a dry run enqueues nothing");
    assert_eq!(aws.records(&keys).await, state_after);
    // A bad state filter is refused before anything runs.
    let out = aws
        .einmal(&[
            "replay",
            "--bulk",
            "--state",
            "stuck",
            "--reason",
            "x",
            "--dry-run",
        ])
        .await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("unknown state"), "{}", stderr(&out));

    // audit list: the three replays (not the dry run), newest first.
    let records = json_out(&aws.einmal(&["audit", "list", "--json"]).await);
    let records = records.as_array().expect("array");
    assert_eq!(records.len(), 3, "{records:?}");
    let reasons: Vec<&str> = records
        .iter()
        .map(|r| r["reason"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(reasons, ["typo", "checking", "SKU-NOPE stocked"]);
    assert!(records.iter().all(|r| r["action"] == json!("replay")));
    assert_eq!(records[2]["actor"], json!("ops-carol"));
    assert_eq!(records[2]["events"], json!([key.as_str()]));
    assert_eq!(records[2]["result"]["replayed"], json!(1));
    assert_eq!(records[1]["result"]["already_done"], json!(1));
    assert_eq!(records[0]["result"]["missing"], json!(1));
    let out = aws.einmal(&["audit", "list", "--limit", "1"]).await;
    assert!(out.status.success());
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains("replay") && text.contains("\"typo\""),
        "{text}"
    );
    // The stores agree with the command.
    assert_eq!(aws.audit.list(10).await.expect("audit list").len(), 3);
}

// ---------------------------------------------------------------------------
// reconcile

/// A fake Stripe `GET /v1/events` (one page, `created[gte]` honoured) and GoPay
/// `GET /api/payments/payment/{id}`.
#[derive(Clone, Default)]
struct FakeApi {
    events: Arc<Mutex<Vec<Value>>>,
    gopay: Arc<Mutex<BTreeMap<String, Value>>>,
}

impl FakeApi {
    /// Serve on a free loopback port; the base URL.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake API binds");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let app = Router::new().fallback(fake_api).with_state(self.clone());
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake API serves");
        });
        base
    }
}

async fn fake_api(State(api): State<FakeApi>, headers: HeaderMap, uri: Uri) -> Response {
    if let Some(id) = uri.path().strip_prefix("/api/payments/payment/") {
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
        if auth != Some(&format!("Bearer {GOPAY_TOKEN}")) {
            return StatusCode::UNAUTHORIZED.into_response();
        }
        return match api.gopay.lock().unwrap().get(id) {
            Some(p) => axum::Json(p.clone()).into_response(),
            None => StatusCode::NOT_FOUND.into_response(),
        };
    }
    if uri.path() != "/v1/events" {
        return StatusCode::NOT_FOUND.into_response();
    }
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
    if auth != Some(&format!("Bearer {API_KEY}")) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let gte: i64 = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|p| p.strip_prefix("created%5Bgte%5D="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let data: Vec<Value> = api
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e["created"].as_i64().unwrap_or(0) >= gte)
        .cloned()
        .collect();
    axum::Json(json!({"object": "list", "has_more": false, "data": data})).into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_with_backend_aws_ingests_the_missed_event_once() {
    let aws = Aws::new().await;
    aws.seed(RED, 10).await;
    let now = einmal::time::now_secs();
    let create = orders_create(6001, now - 3_600, &[(RED, 1)], 2_500, "pending");
    aws.send(&create).await;
    aws.drain().await;
    // The payment's webhook never came; Stripe lists it.
    let missed = pi_succeeded("6001", "pi_cli_1", 2_500, now - 120);
    let api = FakeApi::default();
    api.events
        .lock()
        .unwrap()
        .push(serde_json::from_slice(&missed.body).expect("event"));
    let base = api.start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("einmal.toml");
    write_stripe_config(&config, &base, API_KEY);
    let config = config.to_str().expect("utf-8 path");
    let reconcile = |reason: &'static str| {
        let aws = &aws;
        async move {
            aws.einmal(&[
                "reconcile",
                "--config",
                config,
                "--provider",
                "stripe",
                "--tenant",
                TENANT,
                "--reason",
                reason,
                "--actor",
                "ops-dan",
                "--json",
            ])
            .await
        }
    };

    let reports = json_out(&reconcile("missed webhook").await);
    let r = &reports[0];
    assert_eq!(r["error"], Value::Null, "{r}");
    assert_eq!(
        (&r["fetched"], &r["already_present"], &r["ingested"]),
        (&json!(1), &json!(0), &json!(1)),
        "{r}"
    );
    assert_eq!(r["ingested_events"], json!([missed.inbox_key().as_str()]));
    assert_eq!(r["differences"][0]["order_id"], json!("6001"));
    assert_eq!(
        r["differences"][0]["our_status"],
        json!("pending processing")
    );
    let item = aws.item(&missed.inbox_key()).await;
    assert_eq!(item.source, Source::Reconcile);
    assert_eq!(aws.drain().await, 1);
    let order = aws.order("6001").await;
    assert!(order.is_paid());
    assert_eq!(order.invoices.len(), 1);
    let checkpoint = aws
        .record(&StateKey::new(TENANT, "checkpoint", "stripe"))
        .await;
    assert!(
        checkpoint.exists(),
        "checkpoint in the DynamoDB state table"
    );
    let items = aws.items().await.len();
    let keys = [order_key(TENANT, "6001"), sku_key(TENANT, RED)];
    let state_after = aws.records(&keys).await;

    // Again, in text: present, nothing ingested, nothing applied.
    let out = aws
        .einmal(&[
            "reconcile",
            "--config",
            config,
            "--provider",
            "stripe",
            "--tenant",
            TENANT,
            "--reason",
            "second look",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let row = text
        .lines()
        .find(|l| l.starts_with("stripe"))
        .unwrap_or_else(|| panic!("no stripe row: {text}"));
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&columns[..5], ["stripe", TENANT, "1", "1", "0"], "{text}");
    assert!(
        !text.contains("pending processing"),
        "no difference: {text}"
    );
    assert_eq!(aws.drain().await, 0);
    assert_eq!(aws.items().await.len(), items);
    assert_eq!(aws.records(&keys).await, state_after);

    // Every run is audited.
    let records = json_out(&aws.einmal(&["audit", "list", "--json"]).await);
    let records = records.as_array().expect("array");
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(records.iter().all(|r| r["action"] == json!("reconcile")));
    assert_eq!(records[1]["reason"], json!("missed webhook"));
    assert_eq!(records[1]["actor"], json!("ops-dan"));
    assert_eq!(records[1]["events"], json!([missed.inbox_key().as_str()]));
    assert_eq!(records[0]["result"]["ingested"], json!(0));
    // The differences themselves, in the DynamoDB audit table and on the console.
    assert_eq!(
        records[1]["result"]["difference_list"],
        json!([{"kind": "event pending", "provider": "stripe", "tenant": TENANT,
                "object_id": r["differences"][0]["object_id"], "order_id": "6001",
                "provider_status": "succeeded", "our_status": "pending processing"}])
    );
    assert_eq!(records[0]["result"]["difference_list"], json!([]));
    let (_console, addr) = aws.console().await;
    let Reply {
        status, body: page, ..
    } = tokio::task::spawn_blocking(move || http("GET", &addr, "/console/reconcile", &[], ""))
        .await
        .unwrap();
    assert_eq!(status, 200, "{page}");
    let row = page
        .split("<tr>")
        .find(|row| row.contains("event pending"))
        .unwrap_or_else(|| panic!("the difference is shown: {page}"));
    assert!(
        row.contains("6001") && row.contains("pending processing"),
        "{row}"
    );

    // Bad input: a provider reconciliation does not know, a tenant that does not exist.
    let out = aws
        .einmal(&["reconcile", "--config", config, "--provider", "paypal"])
        .await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("reconciliation supports"),
        "{}",
        stderr(&out)
    );
    let out = aws
        .einmal(&[
            "reconcile",
            "--config",
            config,
            "--provider",
            "stripe",
            "--tenant",
            "nobody",
        ])
        .await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no such provider/tenant"),
        "{}",
        stderr(&out)
    );
    assert_eq!(aws.audit.list(10).await.expect("audit list").len(), 2);

    // A refused credential: the run fails (exit 1), says which call failed and which
    // option to fix, on stderr and in --json; the checkpoint stays where it was.
    let refused = dir.path().join("refused.toml");
    write_stripe_config(&refused, &base, "sk_test_wrong");
    let out = aws
        .einmal(&[
            "reconcile",
            "--config",
            refused.to_str().expect("utf-8 path"),
            "--provider",
            "stripe",
            "--tenant",
            TENANT,
            "--json",
        ])
        .await;
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("GET ") && err.contains("/v1/events (page 1)"),
        "{err}"
    );
    assert!(err.contains("answered 401"), "{err}");
    assert!(err.contains("tenant option `api_key`"), "{err}");
    assert!(!err.contains("sk_test_wrong"), "{err}");
    let reports: Value = serde_json::from_slice(&out.stdout).expect("--json on stdout");
    let error = reports[0]["error"].as_str().expect("error in --json");
    assert!(error.contains("tenant option `api_key`"), "{error}");
    assert_eq!(reports[0]["checkpoint"], Value::Null);
    let after = aws
        .record(&StateKey::new(TENANT, "checkpoint", "stripe"))
        .await;
    assert_eq!(after.data, checkpoint.data, "checkpoint kept");
}

/// GoPay has no list API: `einmal reconcile` looks up the payment its (ignored) hint
/// named, finds it paid, and ingests one hint that the processor applies once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_gopay_with_backend_aws_applies_the_unannounced_payment_once() {
    let aws = Aws::new().await;
    let api = FakeApi::default();
    let base = api.start().await;
    let id = "3000000777";
    let payment = |state: &str| {
        json!({"id": 3_000_000_777u64, "order_number": "g-77", "state": state,
               "amount": 4990, "currency": "CZK"})
    };
    api.gopay
        .lock()
        .unwrap()
        .insert(id.into(), payment("CREATED"));
    let toml = format!(
        r#"
[[tenant]]
provider = "gopay"
tenant = "{TENANT}"
options = {{ path_token = "{GOPAY_PATH_TOKEN}", access_token = "{GOPAY_TOKEN}", api_base = "{base}" }}
"#
    );
    let config = Arc::new(einmal::config::Config::from_toml(&toml).expect("config"));
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("einmal.toml");
    std::fs::write(&path, &toml).expect("config written");
    let path = path.to_str().expect("utf-8 path");
    // GoPay's notification came three minutes ago, while the payment was CREATED.
    let ingestor = Ingestor::new(config.clone(), aws.store.clone(), aws.store.clone())
        .with_clock(|| einmal::time::now_millis() - 180_000);
    let hint = einmal::request::WebhookRequest {
        method: http::Method::GET,
        headers: http::HeaderMap::new(),
        query: Some(format!("id={id}")),
        body: Default::default(),
        path_token: Some(GOPAY_PATH_TOKEN.into()),
    };
    let response = ingestor.ingest("gopay", TENANT, &hint).await;
    assert_eq!(response.status, 200, "{}", response.body);
    let processor = aws
        .processor()
        .with_lookup(Arc::new(einmal::lookup::HttpLookup::new()), config);
    assert_eq!(aws.drain_with(&processor).await, 1);
    let items = aws.items().await;
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].state, InboxState::Ignored, "{:?}", items[0].result);
    // The customer pays; that notification never arrives.
    api.gopay.lock().unwrap().insert(id.into(), payment("PAID"));

    let run = |reason: &'static str| {
        let aws = &aws;
        async move {
            aws.einmal(&[
                "reconcile",
                "--config",
                path,
                "--provider",
                "gopay",
                "--reason",
                reason,
                "--json",
            ])
            .await
        }
    };
    let reports = json_out(&run("gopay has no list API").await);
    let r = &reports[0];
    assert_eq!(r["error"], Value::Null, "{r}");
    assert_eq!(
        (&r["fetched"], &r["ingested"]),
        (&json!(1), &json!(1)),
        "{r}"
    );
    assert_eq!(r["differences"][0]["object_id"], json!(id));
    assert_eq!(r["differences"][0]["order_id"], json!("g-77"));
    assert_eq!(r["differences"][0]["provider_status"], json!("PAID"));
    let reconciled: Vec<InboxItem> = aws
        .items()
        .await
        .into_iter()
        .filter(|i| i.source == Source::Reconcile)
        .collect();
    assert_eq!(reconciled.len(), 1);
    assert_eq!(reconciled[0].envelope.event_type, "hint.payment");
    assert_eq!(aws.drain_with(&processor).await, 1);
    let order = aws.order("g-77").await;
    assert!(order.is_paid());
    assert_eq!(order.invoices.len(), 1);
    let keys = [order_key(TENANT, "g-77")];
    let state_after = aws.records(&keys).await;

    // Again: the payment's hint completed; nothing is looked up, ingested or applied.
    let reports = json_out(&run("again").await);
    let r = &reports[0];
    assert_eq!(
        (&r["fetched"], &r["ingested"]),
        (&json!(0), &json!(0)),
        "{r}"
    );
    assert_eq!(r["differences"], json!([]));
    assert_eq!(aws.drain_with(&processor).await, 0);
    assert_eq!(aws.records(&keys).await, state_after);
    assert_eq!(aws.items().await.len(), 2);
}

// ---------------------------------------------------------------------------
// console --backend aws

/// A child process killed (by its own handle) when the test ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Aws {
    /// `einmal console --backend aws` on a free loopback port, once it listens.
    async fn console(&self) -> (Child, String) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut command = Command::new(env!("CARGO_BIN_EXE_einmal"));
        command
            .args(["console", "--backend", "aws", "--addr", &addr])
            .current_dir(repo())
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("EINMAL_CONSOLE_TOKEN")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        for (k, v) in &self.env {
            command.env(k, v);
        }
        let child = Child(command.spawn().expect("einmal console starts"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "einmal console did not listen");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (child, addr)
    }
}

/// A query or form value: the characters of inbox keys that are not plain.
fn encoded(v: &str) -> String {
    v.replace('%', "%25")
        .replace('#', "%23")
        .replace('&', "%26")
        .replace('+', "%2B")
        .replace(' ', "+")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_with_backend_aws_lists_events_and_replays_a_dead_letter_audited() {
    // The stores as `einmal setup --backend aws` creates them.
    let name = moto::unique_name("einmal-console");
    let aws = Aws::on_setup(&name).await;
    let setup = aws.einmal(&["setup"]).await;
    assert!(setup.status.success(), "{}", stderr(&setup));
    aws.seed(RED, 10).await;
    let broken = orders_create(6001, 1_764_600_000, &[(NOPE, 1)], 2_000, "pending");
    let fine = orders_create(6002, 1_764_600_100, &[(RED, 2)], 3_000, "pending");
    aws.send(&broken).await;
    aws.send(&fine).await;
    aws.drain().await;
    let key = broken.inbox_key();
    assert_eq!(aws.item(&key).await.state, InboxState::DeadLetter);

    let (_console, addr) = aws.console().await;
    let get = |path: String| {
        let addr = addr.clone();
        async move {
            let reply = tokio::task::spawn_blocking(move || http("GET", &addr, &path, &[], ""))
                .await
                .unwrap();
            (reply.status, reply.body)
        }
    };

    // The events page lists both with their states; an event's page shows its timeline.
    let (status, page) = get("/console/events".into()).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("aws"), "the header names the backend");
    for (k, state) in [(&key, "dead_letter"), (&fine.inbox_key(), "completed")] {
        let row = page
            .split("<tr")
            .find(|row| row.contains(k.as_str()))
            .unwrap_or_else(|| panic!("{k} listed: {page}"));
        assert!(row.contains(state), "{k} is {state}: {row}");
    }
    let (status, page) = get("/console/events?state=dead_letter".into()).await;
    assert_eq!(status, 200);
    assert!(page.contains(key.as_str()) && !page.contains(fine.inbox_key().as_str()));
    let (status, page) = get(format!("/console/event?id={}", encoded(key.as_str()))).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("dead_letter") && page.contains("unknown SKU SKU-NOPE"),
        "{page}"
    );

    // The stock arrives; the dead letter is replayed through the page's form.
    aws.seed(NOPE, 5).await;
    let (status, page) = get("/console/dead-letters".into()).await;
    assert_eq!(status, 200);
    assert!(page.contains(key.as_str()), "{page}");
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the form carries the CSRF token")
        .to_owned();
    let form = format!(
        "id={}&reason=stock+arrived&operator=ops-dana&csrf={csrf}",
        encoded(key.as_str())
    );
    let Reply {
        status, body: page, ..
    } = {
        let addr = addr.clone();
        tokio::task::spawn_blocking(move || http("POST", &addr, "/console/replay", &[], &form))
            .await
            .unwrap()
    };
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("replayed"), "{page}");
    assert_eq!(aws.drain().await, 1, "one message: the replayed event");
    assert_eq!(aws.item(&key).await.state, InboxState::Completed);
    assert_eq!(aws.on_hand(NOPE).await, 5 - 1, "the effect is applied once");

    // Audited with the operator and the reason, in the user's audit table.
    let records = aws.audit.list(10).await.expect("audit list");
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].action, "replay");
    assert_eq!(records[0].actor, "ops-dana");
    assert_eq!(records[0].reason, "stock arrived");
    assert_eq!(records[0].events, vec![key.as_str().to_owned()]);
    let (status, page) = get("/console/audit".into()).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("ops-dana") && page.contains("stock arrived"),
        "{page}"
    );
}

/// `einmal config check` on a file with `{ ssm = … }` references fetches them with the
/// caller's credentials (here moto's), as the functions do: valid when they exist, a
/// problem at the reference's line naming the parameter when one does not.
#[tokio::test]
async fn config_check_resolves_ssm_secret_references() {
    let moto = moto::shared();
    let sdk = moto.sdk_config().await;
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    let base = format!("/einmal/{}", moto::unique_name("check-refs"));
    ssm.put_parameter()
        .name(format!("{base}/secrets/shop-db"))
        .value("host=db.internal user=einmal password=NEVER_PRINTED dbname=shop")
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .send()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("einmal.toml");
    let write = |dsn_parameter: &str| {
        std::fs::write(
            &config,
            format!(
                "[[tenant]]\nprovider = \"stripe\"\ntenant = \"demo\"\nsecrets = [\"whsec_check\"]\n\n\
                 [[destination]]\nname = \"shop-db\"\ntenant = \"demo\"\nkind = \"postgres\"\n\
                 events = [\"*\"]\ndsn = {{ ssm = \"{base}/secrets/{dsn_parameter}\" }}\ntable = \"events\"\ntls = false\n"
            ),
        )
        .unwrap();
    };
    let check = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_einmal"));
        command
            .args(["config", "check", "--config"])
            .arg(&config)
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN");
        for (k, v) in Aws::env_for(&moto.endpoint, "unused") {
            command.env(k, v);
        }
        command.output().expect("einmal runs")
    };
    write("shop-db");
    let valid = check();
    assert!(
        valid.status.success(),
        "{}{}",
        stdout(&valid),
        stderr(&valid)
    );
    assert!(
        stdout(&valid).contains("valid (1 tenants, 1 destinations)"),
        "{}",
        stdout(&valid)
    );

    write("missing");
    let invalid = check();
    assert!(!invalid.status.success());
    assert!(
        stdout(&invalid).contains(&format!(
            ":11: destination demo/shop-db: `dsn` refers to SSM parameter {base}/secrets/missing, which was not found"
        )),
        "{}",
        stdout(&invalid)
    );
    assert!(
        !stdout(&invalid).contains("NEVER_PRINTED") && !stderr(&invalid).contains("NEVER_PRINTED")
    );
}

/// `events list` past one store page (1,000) on DynamoDB: `--all` streams every event
/// once, `--limit` over a page gives that many and the cursor of the rest, and `--all
/// --cursor` continues there to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_list_pages_past_a_page_with_backend_aws() {
    use std::collections::BTreeSet;
    const EVENTS: usize = 1_050;
    let aws = Arc::new(Aws::new().await);
    // Eight senders at a time, as a provider's retries overlap.
    let mut sends = tokio::task::JoinSet::new();
    for sender in 0..8 {
        let aws = aws.clone();
        sends.spawn(async move {
            for i in (sender..EVENTS).step_by(8) {
                let event =
                    pi_succeeded(&format!("order-page-{i}"), &format!("pi_page_{i}"), 100, 1);
                aws.send(&event).await;
            }
        });
    }
    while let Some(sent) = sends.join_next().await {
        sent.expect("sender");
    }
    let keys = |out: &Output| -> Vec<String> {
        assert!(out.status.success(), "{}", stderr(out));
        let items: Vec<Value> = serde_json::from_str(&stdout(out)).expect("a JSON list");
        items
            .iter()
            .map(|i| i["key"].as_str().expect("a key").to_string())
            .collect()
    };

    let all = keys(&aws.einmal(&["events", "list", "--all", "--json"]).await);
    assert_eq!(all.len(), EVENTS);
    let distinct: BTreeSet<_> = all.iter().cloned().collect();
    assert_eq!(distinct.len(), EVENTS, "no event twice across pages");
    let sent: BTreeSet<String> = (0..EVENTS).map(|i| format!("evt_ps_pi_page_{i}")).collect();
    let listed: BTreeSet<String> = all
        .iter()
        .map(|k| k.rsplit('#').next().expect("an event id").to_string())
        .collect();
    assert_eq!(listed, sent, "every sent event is listed");

    let limited = aws
        .einmal(&["events", "list", "--limit", "1020", "--json"])
        .await;
    let first = keys(&limited);
    assert_eq!(first.len(), 1020);
    let said = stderr(&limited);
    let cursor = said
        .split("--cursor ")
        .nth(1)
        .unwrap_or_else(|| panic!("no cursor: {said}"))
        .trim()
        .to_string();
    let rest = keys(
        &aws.einmal(&["events", "list", "--all", "--cursor", &cursor, "--json"])
            .await,
    );
    let both: Vec<String> = first.into_iter().chain(rest).collect();
    assert_eq!(
        both.len(),
        EVENTS,
        "the limit and its cursor's rest: no event twice"
    );
    assert_eq!(
        both.into_iter().collect::<BTreeSet<_>>(),
        distinct,
        "the limit and its cursor's rest are every event"
    );
}
