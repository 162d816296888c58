//! Test fixtures shared by the integration suites: a demo configuration, signed
//! requests, backends on real stores, and the one fake we allow: fault injection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use einmal::config::Config;
use einmal::ports::{Delivery, Inbox, InboxFilter, InboxItem, Queue, QueueError, QueueMessage};
use einmal::providers;
use einmal::request::WebhookRequest;

pub const STRIPE_SECRET: &str = "whsec_conformance_stripe";
pub const SHOPIFY_SECRET: &str = "conformance-shopify";
pub const GITHUB_SECRET: &str = "conformance-github";
pub const STANDARD_SECRET: &str = "whsec_Y29uZm9ybWFuY2Utc3RhbmRhcmQtd2ViaG9va3M=";

/// A configuration with one tenant `t1` per provider, plus `t2` for Stripe (isolation).
pub fn config_toml() -> String {
    format!(
        r#"
[defaults]
max_body_bytes = 65536

[[tenant]]
provider = "stripe"
tenant = "t1"
secrets = ["{STRIPE_SECRET}"]

[[tenant]]
provider = "stripe"
tenant = "t2"
secrets = ["whsec_other_tenant"]

[[tenant]]
provider = "shopify"
tenant = "t1"
secrets = ["{SHOPIFY_SECRET}"]
options = {{ shop_domain = "t1.myshopify.com" }}

[[tenant]]
provider = "github"
tenant = "t1"
secrets = ["{GITHUB_SECRET}"]

[[tenant]]
provider = "standard-webhooks"
tenant = "t1"
secrets = ["{STANDARD_SECRET}"]
"#
    )
}

pub fn config() -> Arc<Config> {
    Arc::new(Config::from_toml(&config_toml()).expect("fixture config parses"))
}

/// A Stripe event body of roughly `pad` extra bytes.
/// A GoPay notification: a GET with only the payment id in the query, on the
/// tenant's `path_token` URL.
pub fn gopay_hint(id: u64, path_token: &str) -> WebhookRequest {
    WebhookRequest {
        method: http::Method::GET,
        headers: http::HeaderMap::new(),
        query: Some(format!("id={id}")),
        body: Default::default(),
        path_token: Some(path_token.to_string()),
    }
}

pub fn stripe_body(event_id: &str, pad: usize) -> Vec<u8> {
    serde_json::json!({
        "id": event_id,
        "object": "event",
        "type": "payment_intent.succeeded",
        "created": 1764400000,
        "data": {"object": {"id": "pi_1", "object": "payment_intent", "amount": 4990,
                 "metadata": {"order_id": "order-1", "note": "x".repeat(pad)}}}
    })
    .to_string()
    .into_bytes()
}

/// A request for `provider`/`tenant` signed with that tenant's first secret, now.
pub fn signed(
    config: &Config,
    provider: &str,
    tenant: &str,
    event_id: &str,
    body: &[u8],
) -> WebhookRequest {
    let p = providers::lookup(provider).expect("known provider");
    let t = config.tenant(provider, tenant).expect("configured tenant");
    let (headers, body) = p
        .signed_request(body, t, event_id, einmal::time::now_secs())
        .expect("fixture signs");
    WebhookRequest::post(headers, body)
}

/// Drain every visible message (they become invisible for a minute).
pub async fn drain(queue: &dyn Queue) -> Vec<Delivery> {
    let mut all = Vec::new();
    loop {
        let batch = queue
            .receive(10, Duration::from_secs(60))
            .await
            .expect("receive works");
        if batch.is_empty() {
            return all;
        }
        all.extend(batch);
    }
}

pub async fn all_items(inbox: &dyn Inbox) -> Vec<InboxItem> {
    inbox
        .list(&InboxFilter {
            limit: 10_000,
            ..Default::default()
        })
        .await
        .expect("list works")
}

/// Fault injection: a real queue whose `send` fails on chosen calls (1-based).
pub struct FailingQueue {
    inner: Arc<dyn Queue>,
    sends: AtomicUsize,
    fail_on: Vec<usize>,
}

impl FailingQueue {
    pub fn new(inner: Arc<dyn Queue>, fail_on: Vec<usize>) -> Self {
        FailingQueue {
            inner,
            sends: AtomicUsize::new(0),
            fail_on,
        }
    }
}

#[async_trait]
impl Queue for FailingQueue {
    async fn send(&self, message: &QueueMessage) -> Result<(), QueueError> {
        let n = self.sends.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_on.contains(&n) {
            return Err(QueueError::Unavailable(format!(
                "injected failure on send {n}"
            )));
        }
        self.inner.send(message).await
    }
    async fn receive(&self, max: u32, visibility: Duration) -> Result<Vec<Delivery>, QueueError> {
        self.inner.receive(max, visibility).await
    }
    async fn ack(&self, receipt: &str) -> Result<(), QueueError> {
        self.inner.ack(receipt).await
    }
    async fn change_visibility(
        &self,
        receipt: &str,
        visibility: Duration,
    ) -> Result<(), QueueError> {
        self.inner.change_visibility(receipt, visibility).await
    }
    async fn postpone(&self, delivery: &Delivery, delay: Duration) -> Result<(), QueueError> {
        self.inner.postpone(delivery, delay).await
    }
    async fn send_dead_letter(&self, message: &QueueMessage) -> Result<(), QueueError> {
        self.inner.send_dead_letter(message).await
    }
    async fn receive_dead_letters(
        &self,
        max: u32,
        visibility: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        self.inner.receive_dead_letters(max, visibility).await
    }
}

/// Fault injection: the receiver's process dies at its first queue send. `send` never
/// returns, so whoever calls it stops there, and nothing else is reachable: the
/// state it leaves is the inbox write without the pointer.
pub struct DyingQueue {
    reached: tokio::sync::Notify,
}

impl Default for DyingQueue {
    fn default() -> Self {
        DyingQueue {
            reached: tokio::sync::Notify::new(),
        }
    }
}

impl DyingQueue {
    fn died() -> QueueError {
        QueueError::Unavailable("the process died".to_string())
    }
}

#[async_trait]
impl Queue for DyingQueue {
    async fn send(&self, _message: &QueueMessage) -> Result<(), QueueError> {
        self.reached.notify_one();
        std::future::pending().await
    }
    async fn receive(&self, _max: u32, _v: Duration) -> Result<Vec<Delivery>, QueueError> {
        Err(Self::died())
    }
    async fn ack(&self, _receipt: &str) -> Result<(), QueueError> {
        Err(Self::died())
    }
    async fn change_visibility(&self, _receipt: &str, _v: Duration) -> Result<(), QueueError> {
        Err(Self::died())
    }
    async fn postpone(&self, _delivery: &Delivery, _v: Duration) -> Result<(), QueueError> {
        Err(Self::died())
    }
    async fn send_dead_letter(&self, _message: &QueueMessage) -> Result<(), QueueError> {
        Err(Self::died())
    }
    async fn receive_dead_letters(
        &self,
        _max: u32,
        _v: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        Err(Self::died())
    }
}

/// Ingest `request` with `inbox` through a receiver that dies between its put and its
/// send: returns once the put is done and the send was reached (the request gets no
/// answer, as with a `kill -9` at that instant).
pub async fn ingest_then_die(
    config: Arc<Config>,
    inbox: Arc<dyn Inbox>,
    provider: &str,
    tenant: &str,
    request: &WebhookRequest,
) {
    let queue = Arc::new(DyingQueue::default());
    let ingestor = einmal::pipeline::ingest::Ingestor::new(config, inbox, queue.clone());
    tokio::select! {
        response = ingestor.ingest(provider, tenant, request) => {
            panic!("the receiver answered instead of dying at its send: {response:?}")
        }
        _ = queue.reached.notified() => {}
    }
}
