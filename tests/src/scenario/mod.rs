//! Support for the acceptance tests (`it/acceptance.rs`): the processor with a domain
//! (the reference domain unless [`Backend::with_domain`]) on both backends, events
//! entering through the real [`Ingestor`] as signed requests, a queue-draining loop,
//! the domain-generic conformance scenarios ([`suite`]), the reference domain's
//! business-invariant checker, and a generated day of mixed Stripe/Shopify traffic
//! with its expected outcome.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use einmal::adapters::aws::{create_queues, create_tables, AwsStore};
use einmal::adapters::aws::{create_state_table, DynamoStateStore};
use einmal::adapters::embedded::EmbeddedStateStore;
use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
use einmal::config::Config;
use einmal::domain::reference::{
    order_key, seed_sku, sku_key, Order, ReferenceDomain, Sku, ORDER, SKU,
};
use einmal::domain::state::{
    Commit, CommitAnswer, CommitOne, CommitOutcome, StateKey, StateRecord, StateStore,
};
use einmal::domain::Domain;
use einmal::envelope::InboxKey;
use einmal::pipeline::ingest::Ingestor;
use einmal::pipeline::process::{AckMode, MessageOutcome, ProcessSettings, Processor};
use einmal::ports::{
    ClaimOutcome, Delivery, Finish, Handout, Inbox, InboxFilter, InboxItem, InboxProcessing,
    ItemVersion, Queue, StoreError,
};
use einmal::providers;
use einmal::request::WebhookRequest;
use einmal::time::format_rfc3339;
use serde_json::{json, Value};

use crate::fixtures::{SHOPIFY_SECRET, STRIPE_SECRET};
use crate::moto::{self, CallCounter, OperationLog};

mod invariants;
mod stream;
pub mod suite;

pub use invariants::*;
pub use stream::*;
pub use suite::Subject;

pub const TENANT: &str = "t1";
pub const SHOP: &str = "t1.myshopify.com";
pub const RAZORPAY_SECRET: &str = "scenario-razorpay-webhook-secret";
/// `keyid:secret` (Worldline picks the key by `X-GCS-KeyId`).
pub const WORLDLINE_SECRET: &str = "k1:scenario-worldline-webhook-secret";
pub const PAYSTACK_SECRET: &str = "sk_test_scenario_paystack";

// ---------------------------------------------------------------------------
// Configuration and signed requests

/// Stripe, Shopify and three issue-28 payment providers (Razorpay, Worldline, Paystack)
/// for tenant `t1`.
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

[[tenant]]
provider = "razorpay"
tenant = "{TENANT}"
secrets = ["{RAZORPAY_SECRET}"]

[[tenant]]
provider = "worldline"
tenant = "{TENANT}"
secrets = ["{WORLDLINE_SECRET}"]

[[tenant]]
provider = "paystack"
tenant = "{TENANT}"
secrets = ["{PAYSTACK_SECRET}"]
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
        // Stripe and Worldline carry the event id in the body (Razorpay in a header).
        if matches!(self.provider, "stripe" | "worldline") {
            let mut body: Value = serde_json::from_slice(&self.body).expect("JSON body");
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

/// Razorpay `payment.captured` / `payment.failed`; the shop's order id in `notes`.
pub fn razorpay_payment(kind: &str, order: &str, pay: &str, amount: i64, at: i64) -> Event {
    let body = json!({
        "entity": "event", "account_id": "acc_t1", "event": kind, "contains": ["payment"],
        "payload": {"payment": {"entity": {"id": pay, "entity": "payment", "amount": amount,
            "currency": "INR", "status": if kind == "payment.failed" { "failed" } else { "captured" },
            "notes": {"order_id": order}}}},
        "created_at": at
    });
    Event {
        provider: "razorpay",
        kind: kind.into(),
        event_id: format!("evt_rzp_{pay}_{at}"),
        body: body.to_string().into_bytes(),
    }
}

/// Razorpay `refund.processed`: the refund (no notes) and its payment (the order).
pub fn razorpay_refund(order: &str, pay: &str, refund: &str, amount: i64, at: i64) -> Event {
    let body = json!({
        "entity": "event", "account_id": "acc_t1", "event": "refund.processed",
        "contains": ["refund", "payment"],
        "payload": {
            "refund": {"entity": {"id": refund, "entity": "refund", "amount": amount,
                "currency": "INR", "payment_id": pay, "notes": [], "status": "processed"}},
            "payment": {"entity": {"id": pay, "entity": "payment", "notes": {"order_id": order}}}
        },
        "created_at": at
    });
    Event {
        provider: "razorpay",
        kind: "refund.processed".into(),
        event_id: format!("evt_rzp_{refund}"),
        body: body.to_string().into_bytes(),
    }
}

/// Worldline `payment.captured` / `payment.rejected`, or `refund.refunded` (`refund`
/// set): the shop's order id in `references.merchantReference`.
pub fn worldline_event(
    kind: &str,
    order: &str,
    id: &str,
    amount: i64,
    at: i64,
    refund_of: Option<&str>,
) -> Event {
    let money = json!({"amount": amount, "currencyCode": "EUR"});
    let refs = json!({"merchantReference": order});
    let created = utc(at).replace('Z', ".000+0000");
    let event_id = format!("wl-{kind}-{id}");
    let mut body = json!({"apiVersion": "v1", "created": created, "id": event_id,
                          "merchantId": "t1-merchant", "type": kind});
    match refund_of {
        Some(payment) => {
            body["refund"] = json!({"id": id, "paymentId": payment, "status": "REFUNDED",
                "refundOutput": {"amountOfMoney": money, "references": refs}})
        }
        None => {
            body["payment"] = json!({"id": id, "paymentOutput": {"amountOfMoney": money,
                "references": refs}})
        }
    }
    Event {
        provider: "worldline",
        kind: kind.into(),
        event_id,
        body: body.to_string().into_bytes(),
    }
}

/// Paystack `charge.success`: the shop's order id in `metadata`; the dedup id is
/// `charge.success:{data.id}`.
pub fn paystack_charge(order: &str, id: u64, amount: i64, at: i64) -> Event {
    let body = json!({"event": "charge.success", "data": {
        "id": id, "domain": "test", "status": "success", "reference": format!("ref-{id}"),
        // The scenario's shop sells in EUR (the Stripe events of the same order do).
        "amount": amount, "currency": "EUR", "paid_at": utc(at),
        "metadata": {"order_id": order}}});
    Event {
        provider: "paystack",
        kind: "charge.success".into(),
        event_id: format!("charge.success:{id}"),
        body: body.to_string().into_bytes(),
    }
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
    /// The domain its processors run (the reference domain unless replaced).
    pub domain: Arc<dyn Domain>,
    _keep: Box<dyn Any + Send + Sync>,
}

/// SQLite inbox + queue + state in a fresh temp dir.
pub async fn embedded(max_receive_count: u32) -> Backend {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(
        EmbeddedStore::open(dir.path(), EmbeddedOptions { max_receive_count })
            .expect("store opens"),
    );
    embedded_on(store, max_receive_count, Box::new(dir))
}

/// The embedded backend on `store` (a test that also drives the store itself);
/// `keep` lives as long as the backend (the store's temp dir).
pub fn embedded_on(
    store: Arc<EmbeddedStore>,
    max_receive_count: u32,
    keep: Box<dyn Any + Send + Sync>,
) -> Backend {
    // The records share the store's file and writer, as in `einmal serve`.
    let state = Arc::new(EmbeddedStateStore::new(store.clone()));
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
        domain: Arc::new(ReferenceDomain),
        _keep: keep,
    }
}

/// Fresh DynamoDB tables, SQS queue and DLQ (redrive after `max_receive_count`) on the
/// shared moto server. Every store call is counted.
pub async fn aws(max_receive_count: u32) -> Backend {
    aws_logged(max_receive_count, None).await
}

/// [`aws`] that also records the operation name of every call in `operations`.
pub async fn aws_logged(max_receive_count: u32, operations: Option<OperationLog>) -> Backend {
    aws_with(max_receive_count, operations, None).await
}

/// [`aws`] whose stores reach moto through `proxy` (a fault layer,
/// [`crate::fault_proxy`]); the tables and queues are created directly.
pub async fn aws_behind(max_receive_count: u32, proxy: &crate::fault_proxy::FaultProxy) -> Backend {
    aws_with(max_receive_count, None, Some(&proxy.endpoint)).await
}

async fn aws_with(
    max_receive_count: u32,
    operations: Option<OperationLog>,
    endpoint: Option<&str>,
) -> Backend {
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
    if let Some(endpoint) = endpoint {
        dynamodb = dynamodb.endpoint_url(endpoint);
        sqs = sqs.endpoint_url(endpoint);
    }
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
        domain: Arc::new(ReferenceDomain),
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
        retry_horizon_ms: None,
    }
}

impl Backend {
    /// The same backend with `domain` deciding in its processors.
    pub fn with_domain(mut self, domain: Arc<dyn Domain>) -> Self {
        self.domain = domain;
        self
    }

    pub fn ingestor(&self) -> Ingestor {
        Ingestor::new(config(), self.inbox.clone(), self.queue.clone())
    }

    /// The processor with the backend's domain; jitter pinned to 1.0 (every backoff
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
            self.domain.clone(),
        )
        .with_settings(settings(lease_ms, self.max_receive_count))
        .with_jitter(|| 1.0)
    }

    /// The processor with explicit settings (jitter pinned to 1.0).
    pub fn processor_with_settings(&self, settings: ProcessSettings) -> Processor {
        Processor::new(
            self.inbox.clone(),
            self.processing.clone(),
            self.queue.clone(),
            self.state.clone(),
            self.domain.clone(),
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
        self.items_up_to(10_000).await
    }

    /// At most `limit` items: a scenario larger than `items()`'s 10,000 asks for all of
    /// its own.
    pub async fn items_up_to(&self, limit: usize) -> Vec<InboxItem> {
        self.inbox
            .list(&InboxFilter {
                limit,
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

/// The inbox items that are not `completed` (key, state, last error): what a scenario
/// that must end with every event completed reports when it does not.
pub fn not_completed(items: &[InboxItem]) -> Vec<String> {
    items
        .iter()
        .filter(|i| i.state != einmal::ports::InboxState::Completed)
        .map(|i| format!("{} {} {:?}", i.key, i.state, i.last_error))
        .collect()
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

/// A number from the environment (a bench's full-size run), else the CI default.
pub fn sized(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(raw) => raw
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {raw:?} is not a number")),
        Err(_) => default,
    }
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
    async fn begin(
        &self,
        delivery: &Delivery,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.inner.begin(delivery, owner, now_ms, lease_ms).await
    }
    async fn claim(
        &self,
        key: &InboxKey,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(key, owner, now_ms, lease_ms).await
    }
    async fn finish(&self, key: &InboxKey, run: &Handout, f: &Finish) -> Result<bool, StoreError> {
        if self.left.take() {
            return Err(StoreError::Unavailable(
                "injected: crashed before finish".into(),
            ));
        }
        self.inner.finish(key, run, f).await
    }
    async fn mark_dead_letter(
        &self,
        key: &InboxKey,
        reason: &str,
        seen: ItemVersion,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.inner.mark_dead_letter(key, reason, seen, now_ms).await
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
    fn gathers_commits(&self) -> bool {
        self.inner.gathers_commits()
    }
    async fn commit_each(&self, commits: &[Commit]) -> Vec<CommitAnswer> {
        // The injected failures answer their commits; the rest go through together.
        let failed: Vec<bool> = commits.iter().map(|_| self.left.take()).collect();
        let passed: Vec<Commit> = commits
            .iter()
            .zip(&failed)
            .filter(|(_, f)| !**f)
            .map(|(c, _)| c.clone())
            .collect();
        let mut answers = self.inner.commit_each(&passed).await.into_iter();
        failed
            .into_iter()
            .map(|f| match f {
                true => Err(StoreError::Unavailable("injected: throttled".into())),
                false => answers
                    .next()
                    .unwrap_or_else(|| Err(StoreError::Unavailable("no answer".into()))),
            })
            .collect()
    }
    async fn mark_waited(&self, key: &StateKey, keep_until_ms: i64) -> Result<(), StoreError> {
        self.inner.mark_waited(key, keep_until_ms).await
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
    fn gathers_commits(&self) -> bool {
        self.inner.gathers_commits()
    }
    async fn commit_each(&self, commits: &[Commit]) -> Vec<CommitAnswer> {
        if commits.iter().any(|_| self.left.take()) {
            tokio::time::sleep(self.delay).await;
        }
        self.inner.commit_each(commits).await
    }
    async fn mark_waited(&self, key: &StateKey, keep_until_ms: i64) -> Result<(), StoreError> {
        self.inner.mark_waited(key, keep_until_ms).await
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

/// A state store that is down (every call unavailable, as a throttled or restarting
/// database answers) while its switch is on. It forwards every method of the port, so
/// the processor takes the production path of the store underneath.
pub struct Outage {
    inner: Arc<dyn StateStore>,
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl Outage {
    pub fn new(inner: Arc<dyn StateStore>, down: Arc<std::sync::atomic::AtomicBool>) -> Self {
        Outage { inner, down }
    }

    fn is_down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.is_down() {
            return Err(StoreError::Unavailable(
                "injected: the store is down".into(),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl StateStore for Outage {
    async fn load(&self, keys: &[StateKey]) -> Result<Vec<StateRecord>, StoreError> {
        self.check()?;
        self.inner.load(keys).await
    }
    fn gathers_commits(&self) -> bool {
        self.inner.gathers_commits()
    }
    async fn commit_each(&self, commits: &[Commit]) -> Vec<CommitAnswer> {
        if self.is_down() {
            return commits
                .iter()
                .map(|_| {
                    Err(StoreError::Unavailable(
                        "injected: the store is down".into(),
                    ))
                })
                .collect();
        }
        self.inner.commit_each(commits).await
    }
    async fn mark_waited(&self, key: &StateKey, keep_until_ms: i64) -> Result<(), StoreError> {
        self.check()?;
        self.inner.mark_waited(key, keep_until_ms).await
    }
    async fn list(
        &self,
        tenant: &str,
        kind: &str,
        limit: usize,
    ) -> Result<Vec<StateRecord>, StoreError> {
        self.check()?;
        self.inner.list(tenant, kind, limit).await
    }
}
