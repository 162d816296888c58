//! Support for the acceptance tests (`tests/acceptance.rs`): the processor with the
//! reference domain on both backends, events entering through the real [`Ingestor`]
//! as signed requests, a queue-draining loop, the business-invariant checker, and a
//! generated day of mixed Stripe/Shopify traffic with its expected outcome.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use einmal::adapters::aws::{create_queues, create_tables, AwsStore};
use einmal::adapters::aws_state::{create_state_table, DynamoStateStore};
use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
use einmal::adapters::embedded_state::EmbeddedStateStore;
use einmal::config::Config;
use einmal::domain::reference::{
    order_key, seed_sku, sku_key, Invoice, LineItem, Notification, NotificationKind, Order,
    OrderStatus, Payment, PaymentStatus, ReferenceDomain, Refund, Shipment, Sku, StockLine, ORDER,
    SKU,
};
use einmal::domain::state::{
    CommitOutcome, ReadCheck, StateKey, StateRecord, StateStore, StateWrite,
};
use einmal::envelope::InboxKey;
use einmal::pipeline::ingest::Ingestor;
use einmal::pipeline::process::{AckMode, MessageOutcome, ProcessSettings, Processor};
use einmal::ports::{
    ClaimOutcome, Delivery, Finish, Inbox, InboxFilter, InboxItem, InboxProcessing, Queue,
    StoreError,
};
use einmal::providers;
use einmal::request::WebhookRequest;
use einmal::time::format_rfc3339;
use serde_json::{json, Value};

use crate::fixtures::{SHOPIFY_SECRET, STRIPE_SECRET};
use crate::moto::{self, CallCounter, OperationLog};

pub const TENANT: &str = "t1";
pub const SHOP: &str = "t1.myshopify.com";

// ---------------------------------------------------------------------------
// Configuration and signed requests

/// Stripe and Shopify for tenant `t1`.
pub fn config() -> Arc<Config> {
    let toml = format!(
        r#"
[[tenant]]
provider = "stripe"
tenant = "{TENANT}"
secrets = ["{STRIPE_SECRET}"]

[[tenant]]
provider = "shopify"
tenant = "{TENANT}"
secrets = ["{SHOPIFY_SECRET}"]
options = {{ shop_domain = "{SHOP}" }}
"#
    );
    Arc::new(Config::from_toml(&toml).expect("acceptance config parses"))
}

/// One provider event as the provider would send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub provider: &'static str,
    /// Stripe `type` / Shopify topic.
    pub kind: String,
    /// Stripe: the body's `id`; Shopify: the `X-Shopify-Event-Id` header.
    pub event_id: String,
    pub body: Vec<u8>,
}

impl Event {
    /// The inbox key the receiver derives for it.
    pub fn inbox_key(&self) -> InboxKey {
        match self.provider {
            "shopify" => InboxKey::new(
                "shopify",
                TENANT,
                &format!("{SHOP}:{}:{}", self.kind, self.event_id),
            ),
            p => InboxKey::new(p, TENANT, &self.event_id),
        }
    }

    /// The same business fact reported under another event id (a second provider
    /// event, or a provider that re-sends with a new id).
    pub fn with_event_id(&self, event_id: &str) -> Event {
        let mut e = self.clone();
        e.event_id = event_id.to_owned();
        if self.provider == "stripe" {
            let mut body: Value = serde_json::from_slice(&self.body).expect("stripe body");
            body["id"] = json!(event_id);
            e.body = body.to_string().into_bytes();
        }
        e
    }

    /// A freshly signed request (Stripe signs the current time; Shopify gets its
    /// topic from the tenant's `topic` option).
    pub fn request(&self, config: &Config) -> WebhookRequest {
        let provider = providers::lookup(self.provider).expect("known provider");
        let mut tenant = config
            .tenant(self.provider, TENANT)
            .expect("configured tenant")
            .clone();
        if self.provider == "shopify" {
            tenant.options.insert("topic".into(), self.kind.clone());
        }
        let headers = provider
            .sign(
                &self.body,
                &tenant,
                &self.event_id,
                einmal::time::now_secs(),
            )
            .expect("signs");
        WebhookRequest::post(headers, self.body.clone())
    }
}

pub fn stripe_event(kind: &str, event_id: &str, created: i64, object: Value) -> Event {
    let body = json!({
        "id": event_id, "object": "event", "api_version": "2024-06-20", "type": kind,
        "created": created, "livemode": false, "data": {"object": object}
    });
    Event {
        provider: "stripe",
        kind: kind.into(),
        event_id: event_id.into(),
        body: body.to_string().into_bytes(),
    }
}

pub fn shopify_event(topic: &str, event_id: &str, body: Value) -> Event {
    Event {
        provider: "shopify",
        kind: topic.into(),
        event_id: event_id.into(),
        body: body.to_string().into_bytes(),
    }
}

/// `1234` minor units → `"12.34"`.
pub fn decimal(minor: i64) -> String {
    format!("{}.{:02}", minor / 100, minor % 100)
}

/// A Shopify timestamp as a shop in UTC-5 writes it (`…-05:00`).
pub fn shop_time(secs: i64) -> String {
    let utc = format_rfc3339(secs - 5 * 3600);
    format!("{}-05:00", utc.trim_end_matches('Z'))
}

/// Canonical UTC form (what the order stores as `shopify_updated_at`).
pub fn utc(secs: i64) -> String {
    format_rfc3339(secs)
}

pub fn pi_succeeded(order: &str, pi: &str, amount: i64, created: i64) -> Event {
    stripe_event(
        "payment_intent.succeeded",
        &format!("evt_ps_{pi}"),
        created,
        json!({"id": pi, "object": "payment_intent", "amount": amount, "amount_received": amount,
               "currency": "eur", "status": "succeeded", "metadata": {"order_id": order}}),
    )
}

pub fn pi_failed(order: &str, pi: &str, amount: i64, created: i64) -> Event {
    stripe_event(
        "payment_intent.payment_failed",
        &format!("evt_pf_{pi}_{created}"),
        created,
        json!({"id": pi, "object": "payment_intent", "amount": amount, "amount_received": 0,
               "currency": "eur", "status": "requires_payment_method",
               "last_payment_error": {"code": "card_declined"}, "metadata": {"order_id": order}}),
    )
}

pub fn checkout(order: &str, cs: &str, amount: i64, paid: bool, created: i64) -> Event {
    stripe_event(
        "checkout.session.completed",
        &format!("evt_cs_{cs}"),
        created,
        json!({"id": cs, "object": "checkout.session", "mode": "payment", "status": "complete",
               "amount_total": amount, "currency": "eur",
               "payment_status": if paid { "paid" } else { "unpaid" },
               "client_reference_id": order, "metadata": {"order_id": order}}),
    )
}

/// `charge.refunded` lists every refund of the charge so far.
pub fn charge_refunded(order: &str, ch: &str, refunds: &[(&str, i64)], created: i64) -> Event {
    let data: Vec<Value> = refunds
        .iter()
        .map(|(id, amount)| {
            json!({"id": id, "object": "refund", "amount": amount, "charge": ch,
                   "currency": "eur", "status": "succeeded", "metadata": {"order_id": order}})
        })
        .collect();
    let refunded: i64 = refunds.iter().map(|(_, a)| a).sum();
    stripe_event(
        "charge.refunded",
        &format!("evt_cr_{ch}_{created}"),
        created,
        json!({"id": ch, "object": "charge", "amount_refunded": refunded, "currency": "eur",
               "metadata": {"order_id": order},
               "refunds": {"object": "list", "data": data, "has_more": false}}),
    )
}

pub fn refund_created(order: &str, re: &str, amount: i64, created: i64) -> Event {
    stripe_event(
        "refund.created",
        &format!("evt_rc_{re}"),
        created,
        json!({"id": re, "object": "refund", "amount": amount, "currency": "eur",
               "status": "succeeded", "metadata": {"order_id": order}}),
    )
}

/// A Shopify order snapshot body (`orders/create`, `/updated`, `/paid`, `/cancelled`).
pub fn order_body(
    order: u64,
    updated_at: i64,
    items: &[(&str, i64)],
    total: i64,
    financial: &str,
) -> Value {
    let items: Vec<Value> = items
        .iter()
        .enumerate()
        .map(|(i, (sku, q))| {
            json!({"id": order * 100 + i as u64, "sku": sku, "quantity": q, "title": "T-shirt",
                   "price": "1.00"})
        })
        .collect();
    json!({"id": order, "name": format!("#{order}"), "order_number": order,
           "email": "jon@example.com", "created_at": shop_time(updated_at),
           "updated_at": shop_time(updated_at), "currency": "EUR",
           "total_price": decimal(total), "subtotal_price": decimal(total),
           "financial_status": financial, "line_items": items})
}

pub fn orders_create(
    order: u64,
    at: i64,
    items: &[(&str, i64)],
    total: i64,
    financial: &str,
) -> Event {
    shopify_event(
        "orders/create",
        &format!("create-{order}"),
        order_body(order, at, items, total, financial),
    )
}

pub fn orders_paid(order: u64, at: i64, items: &[(&str, i64)], total: i64) -> Event {
    shopify_event(
        "orders/paid",
        &format!("paid-{order}"),
        order_body(order, at, items, total, "paid"),
    )
}

pub fn orders_updated(order: u64, at: i64, items: &[(&str, i64)], total: i64) -> Event {
    shopify_event(
        "orders/updated",
        &format!("update-{order}-{at}"),
        order_body(order, at, items, total, "pending"),
    )
}

pub fn orders_cancelled(order: u64, at: i64, items: &[(&str, i64)], total: i64) -> Event {
    let mut body = order_body(order, at, items, total, "paid");
    body["cancelled_at"] = json!(shop_time(at));
    body["cancel_reason"] = json!("customer");
    shopify_event("orders/cancelled", &format!("cancel-{order}"), body)
}

pub fn shopify_refund(order: u64, id: u64, amount: i64, at: i64) -> Event {
    shopify_event(
        "refunds/create",
        &format!("refund-{id}"),
        json!({"id": id, "order_id": order, "created_at": shop_time(at), "restock": false,
        "transactions": [
            {"id": id * 10, "order_id": order, "kind": "refund", "status": "success",
             "amount": decimal(amount), "currency": "EUR"},
            {"id": id * 10 + 1, "order_id": order, "kind": "refund", "status": "failure",
             "amount": "999.00", "currency": "EUR"}
        ]}),
    )
}

/// A Shopify refund that only restocks: no successful refund transaction.
pub fn restock_only_refund(order: u64, id: u64, at: i64) -> Event {
    shopify_event(
        "refunds/create",
        &format!("refund-{id}"),
        json!({"id": id, "order_id": order, "created_at": shop_time(at), "restock": true,
               "refund_line_items": [{"quantity": 1, "restock_type": "return"}],
               "transactions": []}),
    )
}

pub fn fulfillment(order: u64, id: u64, tracking: &str, at: i64) -> Event {
    shopify_event(
        "fulfillments/create",
        &format!("fulfillment-{id}"),
        json!({"id": id, "order_id": order, "status": "success", "created_at": shop_time(at),
               "updated_at": shop_time(at), "tracking_company": "UPS",
               "tracking_number": tracking, "tracking_numbers": [tracking]}),
    )
}

/// A sample from `events/samples/domain/` (`name` without `.json`).
pub fn sample(name: &str) -> Event {
    let path = format!(
        "{}/../events/samples/domain/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let body = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let value: Value = serde_json::from_slice(&body).expect("sample is JSON");
    match name.split_once('-').expect("provider-kind") {
        ("stripe", kind) => Event {
            provider: "stripe",
            kind: kind.into(),
            event_id: value["id"].as_str().expect("stripe id").into(),
            body,
        },
        ("shopify", topic) => Event {
            provider: "shopify",
            kind: topic.replacen('-', "/", 1),
            event_id: format!("sample-{name}"),
            body,
        },
        _ => panic!("unknown sample {name}"),
    }
}

// ---------------------------------------------------------------------------
// Backends

/// Which backend a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Embedded,
    Aws,
}

impl Kind {
    /// A fresh backend whose queue redrives after `max_receive_count` receives.
    pub async fn backend(self, max_receive_count: u32) -> Backend {
        match self {
            Kind::Embedded => embedded(max_receive_count).await,
            Kind::Aws => aws(max_receive_count).await,
        }
    }
}

/// All ports of one backend, plus what keeps it alive.
pub struct Backend {
    pub name: &'static str,
    pub inbox: Arc<dyn Inbox>,
    pub processing: Arc<dyn InboxProcessing>,
    pub queue: Arc<dyn Queue>,
    pub state: Arc<dyn StateStore>,
    /// The sweeper's index queries (the store itself, unwrapped).
    pub sweep: Arc<dyn einmal::ports::InboxSweep>,
    /// The reconciler's hint index queries (the store itself, unwrapped).
    pub hints: Arc<dyn einmal::ports::InboxHints>,
    /// Every AWS call of the stores (AWS only).
    pub calls: Option<CallCounter>,
    pub max_receive_count: u32,
    /// How long an idle loop waits before polling the queue again: SQS visibility
    /// is whole seconds, so polling moto every few ms only burns calls.
    pub idle_poll: Duration,
    _keep: Box<dyn Any + Send + Sync>,
}

/// SQLite inbox + queue + state in a fresh temp dir.
pub async fn embedded(max_receive_count: u32) -> Backend {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(
        EmbeddedStore::open(dir.path(), EmbeddedOptions { max_receive_count })
            .expect("store opens"),
    );
    let state = Arc::new(EmbeddedStateStore::open(dir.path()).expect("state store opens"));
    Backend {
        name: "embedded",
        inbox: store.clone(),
        processing: store.clone(),
        queue: store.clone(),
        sweep: store.clone(),
        hints: store,
        state,
        calls: None,
        max_receive_count,
        idle_poll: Duration::from_millis(10),
        _keep: Box::new(dir),
    }
}

/// Fresh DynamoDB tables, SQS queue and DLQ (redrive after `max_receive_count`) on the
/// shared moto server. Every store call is counted.
pub async fn aws(max_receive_count: u32) -> Backend {
    aws_logged(max_receive_count, None).await
}

/// [`aws`] that also records the operation name of every call in `operations`.
pub async fn aws_logged(max_receive_count: u32, operations: Option<OperationLog>) -> Backend {
    let moto = moto::shared();
    let sdk = moto.sdk_config().await;
    let name = moto::unique_name("einmal-acc");
    create_tables(&aws_sdk_dynamodb::Client::new(&sdk), &name)
        .await
        .expect("inbox table on moto");
    let names = create_queues(&aws_sdk_sqs::Client::new(&sdk), &name, max_receive_count)
        .await
        .expect("queues on moto");
    let state_table = format!("{name}-state");
    create_state_table(&aws_sdk_dynamodb::Client::new(&sdk), &state_table)
        .await
        .expect("state table on moto");
    let counter = CallCounter::new();
    let mut dynamodb = aws_sdk_dynamodb::config::Builder::from(&sdk).interceptor(counter.clone());
    let mut sqs = aws_sdk_sqs::config::Builder::from(&sdk).interceptor(counter.clone());
    if let Some(operations) = operations {
        dynamodb = dynamodb.interceptor(operations.clone());
        sqs = sqs.interceptor(operations);
    }
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(dynamodb.build());
    let sqs = aws_sdk_sqs::Client::from_conf(sqs.build());
    let store = Arc::new(AwsStore::new(dynamodb.clone(), sqs, names));
    let state = Arc::new(DynamoStateStore::new(dynamodb, state_table));
    Backend {
        name: "aws",
        inbox: store.clone(),
        processing: store.clone(),
        queue: store.clone(),
        sweep: store.clone(),
        hints: store,
        state,
        calls: Some(counter),
        max_receive_count,
        idle_poll: Duration::from_millis(100),
        _keep: Box::new(()),
    }
}

/// Short leases and backoffs so retries happen within a test; jitter is pinned by
/// [`Backend::processor`].
pub fn settings(lease_ms: i64, max_receive_count: u32) -> ProcessSettings {
    ProcessSettings {
        lease_ms,
        max_receive_count,
        backoff_base_ms: 1,
        backoff_max_ms: 20,
        max_conflict_retries: 5,
        wait_window_ms: None,
    }
}

impl Backend {
    pub fn ingestor(&self) -> Ingestor {
        Ingestor::new(config(), self.inbox.clone(), self.queue.clone())
    }

    /// The processor with the reference domain; jitter pinned to 1.0 (every backoff
    /// is its ceiling, so delays are predictable).
    pub fn processor(&self, lease_ms: i64) -> Processor {
        self.processor_with(self.processing.clone(), self.state.clone(), lease_ms)
    }

    pub fn processor_with(
        &self,
        processing: Arc<dyn InboxProcessing>,
        state: Arc<dyn StateStore>,
        lease_ms: i64,
    ) -> Processor {
        Processor::new(
            self.inbox.clone(),
            processing,
            self.queue.clone(),
            state,
            Arc::new(ReferenceDomain),
        )
        .with_settings(settings(lease_ms, self.max_receive_count))
        .with_jitter(|| 1.0)
    }

    /// The reference-domain processor with explicit settings (jitter pinned to 1.0).
    pub fn processor_with_settings(&self, settings: ProcessSettings) -> Processor {
        Processor::new(
            self.inbox.clone(),
            self.processing.clone(),
            self.queue.clone(),
            self.state.clone(),
            Arc::new(ReferenceDomain),
        )
        .with_settings(settings)
        .with_jitter(|| 1.0)
    }

    /// Inventory, seeded out of band.
    pub async fn seed(&self, skus: &[(&str, i64)]) {
        for (sku, on_hand) in skus {
            let outcome = self
                .state
                .commit(&[seed_sku(TENANT, sku, *on_hand)])
                .await
                .expect("seed commits");
            assert_eq!(outcome, CommitOutcome::Committed, "seed {sku}");
        }
    }

    /// Deliver `event` through the ingestor as a freshly signed request; returns
    /// whether the receiver saw it as a duplicate. Panics unless the answer is 200.
    pub async fn send(&self, ingestor: &Ingestor, event: &Event) -> bool {
        let request = event.request(&ingestor.config());
        let response = ingestor.ingest(event.provider, TENANT, &request).await;
        assert_eq!(
            response.status, 200,
            "{} {}: {}",
            event.kind, event.event_id, response.body
        );
        response.body["duplicate"] == json!(true)
    }

    pub async fn item(&self, event: &Event) -> InboxItem {
        self.inbox
            .get(&event.inbox_key())
            .await
            .expect("inbox get")
            .unwrap_or_else(|| panic!("no inbox item for {}", event.event_id))
    }

    pub async fn items(&self) -> Vec<InboxItem> {
        self.inbox
            .list(&InboxFilter {
                limit: 10_000,
                ..Default::default()
            })
            .await
            .expect("inbox list")
    }

    pub async fn order(&self, id: &str) -> Order {
        let record = self.record(&order_key(TENANT, id)).await;
        assert!(record.exists(), "order {id} does not exist");
        serde_json::from_value(record.data).expect("order data parses")
    }

    pub async fn on_hand(&self, sku: &str) -> i64 {
        let record = self.record(&sku_key(TENANT, sku)).await;
        let sku: Sku = serde_json::from_value(record.data).expect("sku data parses");
        sku.on_hand
    }

    pub async fn record(&self, key: &StateKey) -> StateRecord {
        let mut records = self
            .state
            .load(std::slice::from_ref(key))
            .await
            .expect("state load");
        records.remove(0)
    }

    /// Every order and SKU record of the tenant, re-read with strongly consistent loads.
    pub async fn business_state(&self) -> BTreeMap<String, StateRecord> {
        let mut keys = Vec::new();
        for kind in [ORDER, SKU] {
            let listed = self
                .state
                .list(TENANT, kind, 10_000)
                .await
                .expect("state list");
            keys.extend(listed.into_iter().map(|r| r.key));
        }
        self.load_all(&keys).await
    }

    pub async fn load_all(&self, keys: &[StateKey]) -> BTreeMap<String, StateRecord> {
        let mut out = BTreeMap::new();
        for chunk in keys.chunks(50) {
            for record in self.state.load(chunk).await.expect("state load") {
                if record.exists() {
                    out.insert(record.key.pk(), record);
                }
            }
        }
        out
    }

    /// Pointers in the dead-letter queue now (hidden again for a minute).
    pub async fn dead_letters(&self) -> Vec<InboxKey> {
        let mut all = Vec::new();
        for _ in 0..3 {
            let got = self
                .queue
                .receive_dead_letters(10, Duration::from_secs(60))
                .await
                .expect("receive dead letters");
            if got.is_empty() {
                if all.is_empty() {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    continue;
                }
                break;
            }
            all.extend(got.into_iter().map(|d| d.message.pk));
        }
        all
    }

    /// Every visible message now (each hidden for `visibility`).
    pub async fn receive_all(&self, visibility: Duration) -> Vec<Delivery> {
        let mut all = Vec::new();
        loop {
            let got = self.queue.receive(10, visibility).await.expect("receive");
            if got.is_empty() {
                return all;
            }
            all.extend(got);
        }
    }
}

/// Only the `data` of each record: what the business sees.
pub fn data_of(state: &BTreeMap<String, StateRecord>) -> BTreeMap<String, Value> {
    state
        .iter()
        .map(|(pk, r)| (pk.clone(), r.data.clone()))
        .collect()
}

// ---------------------------------------------------------------------------
// Draining the queue

/// One processed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    pub key: InboxKey,
    pub receive_count: u32,
    pub outcome: MessageOutcome,
    pub worker: String,
}

/// One receive (up to 10 messages), then process_batch and settle them. A retried
/// message is not received again in the same step, however short its delay.
pub async fn step(b: &Backend, p: &Processor, worker: &str) -> Vec<Handled> {
    let visibility = Duration::from_millis(p.settings().lease_ms as u64 + 250);
    let batch = b.queue.receive(10, visibility).await.expect("receive");
    settle_all(p, &batch, worker).await
}

/// `process_batch` then `settle` each delivery (local mode: the processor deletes).
pub async fn settle_all(p: &Processor, batch: &[Delivery], worker: &str) -> Vec<Handled> {
    let outcomes = p.process_batch(batch, worker).await;
    let mut handled = Vec::with_capacity(batch.len());
    for (delivery, (_, outcome)) in batch.iter().zip(outcomes) {
        p.settle(delivery, outcome, AckMode::Delete).await;
        handled.push(Handled {
            key: delivery.message.pk.clone(),
            receive_count: delivery.receive_count,
            outcome,
            worker: worker.to_owned(),
        });
    }
    handled
}

/// When a drain may stop.
pub struct Until<'a> {
    /// At least this many inbox items must exist (all events ingested).
    pub items: usize,
    /// An extra gate, e.g. "every ingest task has finished".
    pub gate: &'a (dyn Fn() -> bool + Send + Sync),
    pub timeout: Duration,
}

/// Receive → process_batch → settle until the queue is empty and every inbox item is
/// in a terminal state (so no message still in flight can change anything: a
/// redelivery of a finished item is acknowledged as a duplicate). Waits and
/// conflicts come back through the queue after their backoff.
pub async fn drain_until(
    b: &Backend,
    p: &Processor,
    worker: &str,
    until: Until<'_>,
) -> Vec<Handled> {
    let visibility = Duration::from_millis(p.settings().lease_ms as u64 + 250);
    let deadline = Instant::now() + until.timeout;
    let mut handled = Vec::new();
    loop {
        let batch = b.queue.receive(10, visibility).await.expect("receive");
        if !batch.is_empty() {
            handled.extend(settle_all(p, &batch, worker).await);
            continue;
        }
        if (until.gate)() {
            let items = b.items().await;
            if items.len() >= until.items && items.iter().all(|i| i.state.is_terminal()) {
                return handled;
            }
            if Instant::now() > deadline {
                let stuck: Vec<String> = items
                    .iter()
                    .filter(|i| !i.state.is_terminal())
                    .map(|i| format!("{} {} {:?}", i.key, i.state, i.last_error))
                    .collect();
                panic!(
                    "{}: drain timed out with {} of {} items, not terminal: {stuck:#?}",
                    b.name,
                    items.len(),
                    until.items
                );
            }
        } else {
            assert!(
                Instant::now() < deadline,
                "{}: drain gate never opened",
                b.name
            );
        }
        tokio::time::sleep(b.idle_poll).await;
    }
}

/// [`drain_until`] every inbox item that exists now is terminal.
pub async fn drain(b: &Backend, p: &Processor) -> Vec<Handled> {
    let items = b.items().await.len();
    drain_until(
        b,
        p,
        "drain",
        Until {
            items,
            gate: &|| true,
            timeout: Duration::from_secs(180),
        },
    )
    .await
}

/// The Retry delays one inbox item got, in order.
pub fn retry_delays(handled: &[Handled], key: &InboxKey) -> Vec<Duration> {
    handled
        .iter()
        .filter(|h| h.key == *key)
        .filter_map(|h| match h.outcome {
            MessageOutcome::Retry { delay } => Some(delay),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Fault injection (the only fakes: real stores underneath)

/// Says yes to the first `n` calls of [`FirstN::take`] and no after: the "fail the
/// first n times" counter of the fault-injecting wrappers.
#[derive(Debug)]
pub struct FirstN(std::sync::atomic::AtomicUsize);

impl FirstN {
    pub fn new(n: usize) -> Self {
        FirstN(n.into())
    }

    /// Whether this call is one of the first `n`.
    pub fn take(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// `finish` fails the first `n` times, as if the process died after its commit and
/// before the inbox was finished.
pub struct FinishFails {
    inner: Arc<dyn InboxProcessing>,
    left: FirstN,
}

impl FinishFails {
    pub fn new(inner: Arc<dyn InboxProcessing>, n: usize) -> Self {
        FinishFails {
            inner,
            left: FirstN::new(n),
        }
    }
}

#[async_trait]
impl InboxProcessing for FinishFails {
    async fn claim(
        &self,
        key: &InboxKey,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(key, owner, now_ms, lease_ms).await
    }
    async fn finish(&self, key: &InboxKey, owner: &str, f: &Finish) -> Result<bool, StoreError> {
        if self.left.take() {
            return Err(StoreError::Unavailable(
                "injected: crashed before finish".into(),
            ));
        }
        self.inner.finish(key, owner, f).await
    }
    async fn mark_dead_letter(
        &self,
        key: &InboxKey,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.inner.mark_dead_letter(key, reason, now_ms).await
    }
    async fn waiters(&self, record_pk: &str, limit: usize) -> Result<Vec<InboxKey>, StoreError> {
        self.inner.waiters(record_pk, limit).await
    }
}

/// A state store whose `commit` is unavailable the first `n` times (throttling, an
/// outage): a transient error.
pub struct CommitFails {
    inner: Arc<dyn StateStore>,
    left: FirstN,
}

impl CommitFails {
    pub fn new(inner: Arc<dyn StateStore>, n: usize) -> Self {
        CommitFails {
            inner,
            left: FirstN::new(n),
        }
    }
}

#[async_trait]
impl StateStore for CommitFails {
    async fn load(&self, keys: &[StateKey]) -> Result<Vec<StateRecord>, StoreError> {
        self.inner.load(keys).await
    }
    async fn commit(&self, writes: &[StateWrite]) -> Result<CommitOutcome, StoreError> {
        if self.left.take() {
            return Err(StoreError::Unavailable("injected: throttled".into()));
        }
        self.inner.commit(writes).await
    }
    async fn commit_checked(
        &self,
        writes: &[StateWrite],
        reads: &[ReadCheck],
    ) -> Result<CommitOutcome, StoreError> {
        if self.left.take() {
            return Err(StoreError::Unavailable("injected: throttled".into()));
        }
        self.inner.commit_checked(writes, reads).await
    }
    async fn list(
        &self,
        tenant: &str,
        kind: &str,
        limit: usize,
    ) -> Result<Vec<StateRecord>, StoreError> {
        self.inner.list(tenant, kind, limit).await
    }
}

/// A state store whose first `n` commits stall for `delay` before they reach the
/// store (a worker paused by GC, a slow network): its lease runs out meanwhile.
pub struct SlowCommits {
    inner: Arc<dyn StateStore>,
    delay: Duration,
    left: FirstN,
}

impl SlowCommits {
    pub fn new(inner: Arc<dyn StateStore>, n: usize, delay: Duration) -> Self {
        SlowCommits {
            inner,
            delay,
            left: FirstN::new(n),
        }
    }
}

#[async_trait]
impl StateStore for SlowCommits {
    async fn load(&self, keys: &[StateKey]) -> Result<Vec<StateRecord>, StoreError> {
        self.inner.load(keys).await
    }
    async fn commit(&self, writes: &[StateWrite]) -> Result<CommitOutcome, StoreError> {
        if self.left.take() {
            tokio::time::sleep(self.delay).await;
        }
        self.inner.commit(writes).await
    }
    async fn commit_checked(
        &self,
        writes: &[StateWrite],
        reads: &[ReadCheck],
    ) -> Result<CommitOutcome, StoreError> {
        if self.left.take() {
            tokio::time::sleep(self.delay).await;
        }
        self.inner.commit_checked(writes, reads).await
    }
    async fn list(
        &self,
        tenant: &str,
        kind: &str,
        limit: usize,
    ) -> Result<Vec<StateRecord>, StoreError> {
        self.inner.list(tenant, kind, limit).await
    }
}

// ---------------------------------------------------------------------------
// Business invariants

/// Checks what must hold after any sequence of deliveries, whatever the order,
/// duplicates or crashes: no second invoice, refund, shipment, stock movement or
/// notification, derived numbers consistent with the facts, and stock equal to
/// `seeded − reserved + restocked`. Also: every inbox item is terminal. Returns the
/// business state it checked.
pub async fn check_invariants(b: &Backend, seeds: &[(&str, i64)]) -> BTreeMap<String, StateRecord> {
    let state = b.business_state().await;
    let mut orders: Vec<(&StateRecord, Order)> = Vec::new();
    let mut skus: BTreeMap<String, (&StateRecord, Sku)> = BTreeMap::new();
    for record in state.values() {
        match record.key.kind.as_str() {
            ORDER => {
                let order: Order = serde_json::from_value(record.data.clone())
                    .unwrap_or_else(|e| panic!("{}: order does not parse: {e}", record.key.pk()));
                assert_eq!(order.order_id, record.key.id);
                orders.push((record, order));
            }
            SKU => {
                let sku: Sku = serde_json::from_value(record.data.clone())
                    .unwrap_or_else(|e| panic!("{}: sku does not parse: {e}", record.key.pk()));
                skus.insert(sku.sku.clone(), (record, sku));
            }
            other => panic!("unexpected record kind {other}"),
        }
    }
    for (record, o) in &orders {
        check_order(record, o);
    }

    // Stock: exactly seeded − reserved + restocked, and one movement per order.
    let seeded: BTreeSet<&str> = seeds.iter().map(|(s, _)| *s).collect();
    let found: BTreeSet<&str> = skus.keys().map(String::as_str).collect();
    assert_eq!(found, seeded, "SKU records are exactly the seeded ones");
    for (sku, seed) in seeds {
        let (record, data) = &skus[*sku];
        let mut expected = *seed;
        let mut takers = BTreeSet::new();
        let mut restockers = BTreeSet::new();
        for (_, o) in &orders {
            for line in o.stock_reserved.iter().filter(|l| l.sku == *sku) {
                expected -= line.quantity;
                takers.insert(format!("{TENANT}#order-{}#stock#{sku}", o.order_id));
                if o.status == OrderStatus::Cancelled {
                    expected += line.quantity;
                    restockers.insert(format!("{TENANT}#order-{}#restock#{sku}", o.order_id));
                }
            }
        }
        assert_eq!(
            data.on_hand, expected,
            "{}: on_hand must be seeded {seed} − reserved + restocked",
            sku
        );
        // The movements' keys live on the orders; the SKU record carries none of them
        // (it must not grow with the number of orders).
        let keys_of = |kind: &str| -> BTreeSet<String> {
            orders
                .iter()
                .flat_map(|(r, _)| r.applied.iter())
                .filter(|k| k.contains(kind) && k.ends_with(&format!("#{sku}")))
                .cloned()
                .collect()
        };
        assert_eq!(
            keys_of("#stock#"),
            takers,
            "{sku}: one stock movement per order"
        );
        assert_eq!(
            keys_of("#restock#"),
            restockers,
            "{sku}: one restock per cancel"
        );
        assert!(
            record.applied.iter().all(|k| k.ends_with("#seed")),
            "{sku}: only the seed key on the SKU record: {:?}",
            record.applied
        );
    }

    // Every inbox item is finished.
    let items = b.items().await;
    let open: Vec<String> = items
        .iter()
        .filter(|i| !i.state.is_terminal())
        .map(|i| format!("{} {}", i.key, i.state))
        .collect();
    assert!(
        open.is_empty(),
        "{}: inbox items not terminal: {open:?}",
        b.name
    );
    state
}

fn check_order(record: &StateRecord, o: &Order) {
    let id = &o.order_id;
    let keys = einmal::domain::reference::EffectKeys::new(TENANT, id);
    let unique = |what: &str, ids: Vec<&str>| {
        let set: BTreeSet<&str> = ids.iter().copied().collect();
        assert_eq!(
            set.len(),
            ids.len(),
            "order {id}: duplicate {what}: {ids:?}"
        );
    };
    assert!(
        o.invoices.len() <= 1,
        "order {id}: {} invoices",
        o.invoices.len()
    );
    if let Some(inv) = o.invoices.first() {
        assert_eq!(inv.invoice_id, format!("inv-{id}-1"));
        assert_eq!(inv.source_effect, keys.paid());
        assert!(
            record.applied.contains(&keys.paid()),
            "order {id}: #paid not recorded"
        );
    } else {
        assert!(
            !record.applied.contains(&keys.paid()),
            "order {id}: #paid without invoice"
        );
    }
    unique(
        "refunds",
        o.refunds.iter().map(|r| r.refund_id.as_str()).collect(),
    );
    unique(
        "shipments",
        o.shipments
            .iter()
            .map(|s| s.fulfillment_id.as_str())
            .collect(),
    );
    unique(
        "notifications",
        o.notifications
            .iter()
            .map(|n| n.dedup_key.as_str())
            .collect(),
    );
    for r in &o.refunds {
        assert!(r.amount_minor > 0);
        assert!(record.applied.contains(&keys.refund(&r.refund_id)));
    }
    for s in &o.shipments {
        assert!(record
            .applied
            .contains(&keys.fulfillment(&s.fulfillment_id)));
    }
    let refunded: i64 = o.refunds.iter().map(|r| r.amount_minor).sum();
    assert_eq!(o.refunded_minor, refunded, "order {id}: refunded_minor");
    assert!(
        refunded <= o.paid_minor(),
        "order {id}: refunded more than paid"
    );
    if !o.refunds.is_empty() {
        assert!(o.is_paid(), "order {id}: refund on an unpaid order");
    }
    let count = |kind| o.notifications.iter().filter(|n| n.kind == kind).count();
    assert_eq!(
        count(NotificationKind::PaymentReceived),
        o.invoices.len(),
        "order {id}"
    );
    assert_eq!(
        count(NotificationKind::Refunded),
        o.refunds.len(),
        "order {id}"
    );
    assert_eq!(
        count(NotificationKind::Shipped),
        o.shipments.len(),
        "order {id}"
    );
    assert_eq!(
        count(NotificationKind::Cancelled),
        usize::from(o.status == OrderStatus::Cancelled),
        "order {id}"
    );
    let failures = count(NotificationKind::PaymentFailed);
    if o.is_paid() {
        assert_eq!(failures, 0, "order {id}: failure notice on a paid order");
        assert_eq!(o.payment_event_at, None);
        let paid = o.paid_minor();
        let expected = if refunded == 0 {
            PaymentStatus::Paid
        } else if refunded >= paid {
            PaymentStatus::Refunded
        } else {
            PaymentStatus::PartiallyRefunded
        };
        assert_eq!(o.payment_status, expected, "order {id}");
        assert_eq!(o.loyalty_points, (paid - refunded) / 100, "order {id}");
    } else {
        assert!(failures <= 1, "order {id}: several failure notices");
        let expected = if failures == 1 {
            PaymentStatus::Failed
        } else {
            PaymentStatus::Pending
        };
        assert_eq!(o.payment_status, expected, "order {id}");
        assert_eq!(o.loyalty_points, 0);
    }
    assert_eq!(
        o.shopify_created,
        record.applied.contains(&keys.created()),
        "order {id}: created flag vs effect"
    );
    if !o.shopify_created {
        assert!(
            o.stock_reserved.is_empty(),
            "order {id}: stock without create"
        );
    }
}

/// What may never happen between two observations of the same records: a version
/// going back, an effect key disappearing, a fact (invoice, refund, shipment,
/// notification other than a withdrawn payment-failure notice) disappearing, a paid
/// order becoming unpaid, a cancelled order reopening, an older Shopify version
/// replacing a newer one.
pub fn assert_no_regression(
    before: &BTreeMap<String, StateRecord>,
    after: &BTreeMap<String, StateRecord>,
) {
    for (pk, old) in before {
        let new = after
            .get(pk)
            .unwrap_or_else(|| panic!("record {pk} disappeared"));
        assert!(
            new.version >= old.version,
            "{pk}: version went back from {} to {}",
            old.version,
            new.version
        );
        if new.version == old.version {
            assert_eq!(
                new.data, old.data,
                "{pk}: data changed without a new version"
            );
            continue;
        }
        assert!(
            old.applied.is_subset(&new.applied),
            "{pk}: effect keys disappeared: {:?}",
            old.applied.difference(&new.applied).collect::<Vec<_>>()
        );
        if old.key.kind != ORDER {
            continue;
        }
        let (o, n): (Order, Order) = (
            serde_json::from_value(old.data.clone()).expect("order"),
            serde_json::from_value(new.data.clone()).expect("order"),
        );
        let kept = |what: &str, a: Vec<String>, b: Vec<String>| {
            let b: BTreeSet<String> = b.into_iter().collect();
            for x in a {
                assert!(b.contains(&x), "{pk}: {what} {x} disappeared");
            }
        };
        kept(
            "invoice",
            o.invoices.iter().map(|i| format!("{i:?}")).collect(),
            n.invoices.iter().map(|i| format!("{i:?}")).collect(),
        );
        kept(
            "refund",
            o.refunds.iter().map(|r| format!("{r:?}")).collect(),
            n.refunds.iter().map(|r| format!("{r:?}")).collect(),
        );
        kept(
            "shipment",
            o.shipments.iter().map(|s| format!("{s:?}")).collect(),
            n.shipments.iter().map(|s| format!("{s:?}")).collect(),
        );
        kept(
            "notification",
            o.notifications
                .iter()
                .filter(|x| x.kind != NotificationKind::PaymentFailed)
                .map(|x| x.dedup_key.clone())
                .collect(),
            n.notifications
                .iter()
                .map(|x| x.dedup_key.clone())
                .collect(),
        );
        kept(
            "stock reservation",
            o.stock_reserved.iter().map(|s| format!("{s:?}")).collect(),
            n.stock_reserved.iter().map(|s| format!("{s:?}")).collect(),
        );
        assert!(
            !o.is_paid() || n.is_paid(),
            "{pk}: paid order became unpaid"
        );
        assert!(
            o.status != OrderStatus::Cancelled || n.status == OrderStatus::Cancelled,
            "{pk}: cancelled order reopened"
        );
        assert!(!o.shopify_created || n.shopify_created, "{pk}: un-created");
        // Canonical UTC text orders like time.
        assert!(
            o.shopify_updated_at <= n.shopify_updated_at,
            "{pk}: version went back from {:?} to {:?}",
            o.shopify_updated_at,
            n.shopify_updated_at
        );
    }
}

// ---------------------------------------------------------------------------
// A seeded PRNG (no external crate): xorshift64*.

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

// ---------------------------------------------------------------------------
// Yesterday's stream: a generated day of traffic and its expected outcome

pub const STREAM_SKUS: [(&str, i64); 4] = [
    ("SKU-A", 1990),
    ("SKU-B", 2990),
    ("SKU-C", 4990),
    ("SKU-D", 990),
];
pub const STREAM_SEED_STOCK: i64 = 100;

pub struct Stream {
    /// In causal (clean) order: every prerequisite before what needs it.
    pub events: Vec<Event>,
    /// The expected final data of every order (key = order id).
    pub orders: BTreeMap<String, Order>,
    /// The expected final `on_hand` per SKU.
    pub on_hand: BTreeMap<String, i64>,
}

impl Stream {
    pub fn seeds(&self) -> Vec<(&'static str, i64)> {
        STREAM_SKUS
            .iter()
            .map(|(s, _)| (*s, STREAM_SEED_STOCK))
            .collect()
    }

    pub fn state_keys(&self) -> Vec<StateKey> {
        let mut keys: Vec<StateKey> = self.orders.keys().map(|id| order_key(TENANT, id)).collect();
        keys.extend(STREAM_SKUS.iter().map(|(s, _)| sku_key(TENANT, s)));
        keys
    }

    /// The expected business state (`data` per record pk).
    pub fn expected_data(&self) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        for (id, o) in &self.orders {
            out.insert(order_key(TENANT, id).pk(), serde_json::to_value(o).unwrap());
        }
        for (sku, on_hand) in &self.on_hand {
            out.insert(
                sku_key(TENANT, sku).pk(),
                serde_json::to_value(Sku {
                    sku: sku.clone(),
                    on_hand: *on_hand,
                })
                .unwrap(),
            );
        }
        out
    }
}

/// Nine Shopify orders (some paid through Stripe, Shopify or both; with payment
/// failures, 12–18 updates, fulfillments, Stripe and Shopify refunds, cancellations)
/// and one Stripe-only order; the expected outcome is computed from the documented
/// rules, independently of the processor.
pub fn yesterday(seed: u64) -> Stream {
    let mut rng = Rng::new(seed);
    let mut timed: Vec<(i64, Event)> = Vec::new();
    let mut orders = BTreeMap::new();
    let mut on_hand: BTreeMap<String, i64> = STREAM_SKUS
        .iter()
        .map(|(s, _)| (s.to_string(), STREAM_SEED_STOCK))
        .collect();
    let day = 1_764_547_200; // 2025-12-01T00:00:00Z

    for k in 0..9u64 {
        let id = 3001 + k;
        let ids = id.to_string();
        let keys = einmal::domain::reference::EffectKeys::new(TENANT, &ids);
        let start = day + k as i64 * 3_000;
        // Line items: 1–3 distinct SKUs, 1–3 units each.
        let mut skus: Vec<(&str, i64)> = STREAM_SKUS.to_vec();
        rng.shuffle(&mut skus);
        let n_lines = rng.range(1, 3) as usize;
        let lines: Vec<(&str, i64)> = skus[..n_lines]
            .iter()
            .map(|(s, _)| (*s, rng.range(1, 3)))
            .collect();
        let total: i64 = lines
            .iter()
            .map(|(s, q)| q * STREAM_SKUS.iter().find(|(x, _)| x == s).unwrap().1)
            .sum();
        let pays = k != 8;
        let paid_at_create = k % 4 == 1;

        let mut o = Order::new(&ids);
        o.currency = Some("EUR".into());
        o.total_minor = total;
        o.shopify_created = true;
        let mut stock: Vec<StockLine> = lines
            .iter()
            .map(|(s, q)| StockLine {
                sku: s.to_string(),
                quantity: *q,
            })
            .collect();
        stock.sort_by(|a, b| a.sku.cmp(&b.sku));
        o.stock_reserved = stock;
        let as_items = |ls: &[(&str, i64)]| -> Vec<LineItem> {
            ls.iter()
                .map(|(s, q)| LineItem {
                    sku: Some(s.to_string()),
                    quantity: *q,
                })
                .collect()
        };
        // The newest snapshot so far: (time, line items).
        let mut newest = (start, lines.clone());

        let financial = if paid_at_create { "paid" } else { "pending" };
        timed.push((start, orders_create(id, start, &lines, total, financial)));

        // Card declines before the payment; one more decline after it (ignored).
        let pi = format!("pi_{id}");
        if k % 3 == 0 || !pays {
            timed.push((start + 30, pi_failed(&ids, &pi, total, start + 30)));
            timed.push((start + 35, pi_failed(&ids, &pi, total, start + 35)));
        }
        if k % 3 == 0 && pays {
            timed.push((start + 900, pi_failed(&ids, &pi, total, start + 900)));
        }

        // The payment, reported by one or two providers.
        if pays {
            match k % 4 {
                0 => {
                    timed.push((start + 60, orders_paid(id, start + 60, &lines, total)));
                    timed.push((start + 61, pi_succeeded(&ids, &pi, total, start + 61)));
                }
                1 => {
                    timed.push((start + 61, pi_succeeded(&ids, &pi, total, start + 61)));
                }
                2 => {
                    let cs = format!("cs_{id}");
                    timed.push((start + 60, checkout(&ids, &cs, total, true, start + 60)));
                }
                _ => {
                    timed.push((start + 60, orders_paid(id, start + 60, &lines, total)));
                }
            }
            o.invoices.push(Invoice {
                invoice_id: format!("inv-{ids}-1"),
                amount_minor: total,
                source_effect: keys.paid(),
            });
            o.notifications.push(Notification {
                kind: NotificationKind::PaymentReceived,
                dedup_key: keys.paid(),
            });
            // Each report of the payment is recorded (the paid total stays `total`).
            let reported = |provider: &str, payment_id: &str| Payment {
                provider: provider.into(),
                payment_id: payment_id.into(),
                amount_minor: total,
            };
            if k % 4 != 2 {
                if k % 4 != 3 {
                    o.payments.push(reported("stripe", &pi));
                }
                if k % 4 != 1 || paid_at_create {
                    o.payments.push(reported("shopify", "order"));
                }
            }
        } else {
            let key = keys.payment_failed(&pi, start + 35);
            o.payment_status = PaymentStatus::Failed;
            o.payment_event_at = Some(start + 35);
            o.notifications.push(Notification {
                kind: NotificationKind::PaymentFailed,
                dedup_key: key,
            });
        }

        // Updates: line item quantities change (display only; stock stays reserved).
        let cancel_at = match k % 4 {
            3 => Some(start + 2_000),
            _ if k == 6 => Some(start + 100 + 5 * 20 + 5), // in the middle of the updates
            _ => None,
        };
        let n_updates = rng.range(12, 18);
        for u in 0..n_updates {
            let at = start + 100 + u * 20;
            let items: Vec<(&str, i64)> =
                lines.iter().map(|(s, _)| (*s, rng.range(1, 4))).collect();
            timed.push((at, orders_updated(id, at, &items, total)));
            if at > newest.0 {
                newest = (at, items);
            }
        }

        // Fulfillments.
        if k % 2 == 0 {
            for f in 0..rng.range(1, 2) as u64 {
                let fid = 7000 + id * 10 + f;
                let tracking = format!("1Z{fid}");
                let at = start + 1_000 + f as i64;
                timed.push((at, fulfillment(id, fid, &tracking, at)));
                o.shipments.push(Shipment {
                    fulfillment_id: fid.to_string(),
                    tracking: Some(tracking),
                });
                o.notifications.push(Notification {
                    kind: NotificationKind::Shipped,
                    dedup_key: keys.fulfillment(&fid.to_string()),
                });
            }
        }

        // Refunds: Stripe (reported by charge.refunded and refund.created), Shopify.
        if pays {
            let mut stripe_refunds: Vec<(String, i64)> = Vec::new();
            if k % 3 == 1 || k == 0 {
                stripe_refunds.push((format!("re_{id}_1"), total / 4));
            }
            if k == 0 {
                stripe_refunds.push((format!("re_{id}_2"), total / 4));
            }
            let ch = format!("ch_{id}");
            for (i, (re, amount)) in stripe_refunds.iter().enumerate() {
                let at = start + 1_500 + i as i64 * 10;
                timed.push((at, refund_created(&ids, re, *amount, at)));
                let so_far: Vec<(&str, i64)> = stripe_refunds[..=i]
                    .iter()
                    .map(|(r, a)| (r.as_str(), *a))
                    .collect();
                timed.push((at + 1, charge_refunded(&ids, &ch, &so_far, at + 1)));
                o.refunds.push(Refund {
                    refund_id: re.clone(),
                    amount_minor: *amount,
                });
                o.notifications.push(Notification {
                    kind: NotificationKind::Refunded,
                    dedup_key: keys.refund(re),
                });
            }
            if k % 3 == 2 || k == 3 {
                let rid = 9000 + id;
                let amount = if k == 3 { total } else { total / 2 };
                let at = start + 1_600;
                timed.push((at, shopify_refund(id, rid, amount, at)));
                o.refunds.push(Refund {
                    refund_id: rid.to_string(),
                    amount_minor: amount,
                });
                o.notifications.push(Notification {
                    kind: NotificationKind::Refunded,
                    dedup_key: keys.refund(&rid.to_string()),
                });
            }
        }

        // Events that move nothing: a Stripe refund that failed, a restock-only
        // Shopify refund, event types the domain does not map.
        if k == 1 {
            let at = start + 1_700;
            let mut e = refund_created(&ids, &format!("re_{id}_failed"), 500, at);
            let mut body: Value = serde_json::from_slice(&e.body).unwrap();
            body["data"]["object"]["status"] = json!("failed");
            e.body = body.to_string().into_bytes();
            timed.push((at, e));
        }
        if k == 4 {
            let at = start + 1_700;
            timed.push((at, restock_only_refund(id, 9_500 + id, at)));
        }
        if k % 3 == 0 {
            let at = start + 62;
            timed.push((
                at,
                stripe_event(
                    "charge.succeeded",
                    &format!("evt_ch_{id}"),
                    at,
                    json!({"id": format!("ch_{id}"), "object": "charge", "amount": total,
                           "metadata": {"order_id": ids}}),
                ),
            ));
            timed.push((
                at + 1,
                shopify_event(
                    "orders/fulfilled",
                    &format!("fulfilled-{id}"),
                    order_body(id, at + 1, &lines, total, "paid"),
                ),
            ));
        }

        // Cancellation: restock what create reserved.
        if let Some(at) = cancel_at {
            let items: Vec<(&str, i64)> =
                lines.iter().map(|(s, _)| (*s, rng.range(1, 4))).collect();
            timed.push((at, orders_cancelled(id, at, &items, total)));
            if at > newest.0 {
                newest = (at, items);
            }
            o.status = OrderStatus::Cancelled;
            o.notifications.push(Notification {
                kind: NotificationKind::Cancelled,
                dedup_key: keys.cancelled(),
            });
        } else {
            for (s, q) in &lines {
                *on_hand.get_mut(*s).unwrap() -= q;
            }
        }

        o.line_items = as_items(&newest.1);
        o.shopify_updated_at = Some(utc(newest.0));
        o.normalize();
        orders.insert(ids, o);
    }

    // A Stripe-only order: checkout opens it unpaid, a decline, the payment, a refund.
    {
        let ids = "web-4001".to_string();
        let keys = einmal::domain::reference::EffectKeys::new(TENANT, &ids);
        let start = day + 40_000;
        let amount = 8_450;
        timed.push((start, checkout(&ids, "cs_web_4001", amount, false, start)));
        timed.push((
            start + 10,
            pi_failed(&ids, "pi_web_4001", amount, start + 10),
        ));
        timed.push((
            start + 40,
            pi_succeeded(&ids, "pi_web_4001", amount, start + 40),
        ));
        timed.push((
            start + 700,
            pi_failed(&ids, "pi_web_4001", amount, start + 700),
        ));
        timed.push((
            start + 800,
            refund_created(&ids, "re_web_4001", 2_000, start + 800),
        ));
        timed.push((
            start + 801,
            charge_refunded(&ids, "ch_web_4001", &[("re_web_4001", 2_000)], start + 801),
        ));
        let mut o = Order::new(&ids);
        o.currency = Some("EUR".into());
        o.total_minor = amount;
        o.invoices.push(Invoice {
            invoice_id: format!("inv-{ids}-1"),
            amount_minor: amount,
            source_effect: keys.paid(),
        });
        o.payments.push(Payment {
            provider: "stripe".into(),
            payment_id: "pi_web_4001".into(),
            amount_minor: amount,
        });
        o.refunds.push(Refund {
            refund_id: "re_web_4001".into(),
            amount_minor: 2_000,
        });
        o.notifications.push(Notification {
            kind: NotificationKind::PaymentReceived,
            dedup_key: keys.paid(),
        });
        o.notifications.push(Notification {
            kind: NotificationKind::Refunded,
            dedup_key: keys.refund("re_web_4001"),
        });
        o.normalize();
        orders.insert(ids, o);
    }

    timed.sort_by_key(|(at, _)| *at);
    Stream {
        events: timed.into_iter().map(|(_, e)| e).collect(),
        orders,
        on_hand,
    }
}
