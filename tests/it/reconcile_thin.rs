//! Reconciliation of the thin-event providers' payment status (Mollie classic, GoPay,
//! Klarna push) against a fake provider API on loopback, with the reference domain and
//! the processor's real HTTP resource lookup.
//!
//! In each scenario a payment turns paid at the provider and no hint announces it
//! (for Mollie also one never announced by any hint at all): reconciliation finds it, ingests one hint (`source = reconcile`, the thin
//! providers' own dedup key), the processor fetches and applies it once, a real hint
//! arriving later adds no second effect, and a second run ingests and applies nothing.
//! Payments whose state did not change (or was never final: a forged hint) produce
//! nothing. GoPay runs on both backends (SQLite file and moto).

use std::sync::Arc;

use einmal::adapters::aws::{create_queues, create_tables, AwsStore};
use einmal::config::Config;
use einmal::domain::reference::{order_key, ReferenceDomain};
use einmal::domain::state::StateKey;
use einmal::envelope::{Envelope, InboxKey};
use einmal::lookup::HttpLookup;
use einmal::pipeline::ingest::Ingestor;
use einmal::pipeline::process::Processor;
use einmal::ports::{Inbox, InboxHints, InboxItem, InboxState, PutOutcome, Source};
use einmal::providers::thin::hint_event_id;
use einmal::reconcile::{
    audit_record, Difference, ReconcileOptions, Reconciler, TenantReport, DEFAULT_OVERLAP_SECS,
    MAX_WATCHED_ITEMS, PENDING_PROCESSING,
};
use einmal::request::WebhookRequest;
use einmal::time::format_rfc3339;
use einmal_tests::fake_thin_api::{query_param, Credentials, FakeThinApi, Options};
use einmal_tests::fixtures::gopay_hint;
use einmal_tests::moto::{self, OperationLog};
use einmal_tests::scenario::{self, Backend, Kind};
use serde_json::{json, Value};

const TENANT: &str = "t1";
const MOLLIE_TOKEN: &str = "mollie-path-token-recon";
const GOPAY_TOKEN: &str = "gopay-path-token-recon";
const KLARNA_TOKEN: &str = "klarna-path-token-recon";
const MOLLIE_KEY: &str = "test_mollie_reconcile_key";
const GOPAY_ACCESS: &str = "gopay-reconcile-access-token";
const KLARNA_USER: &str = "PK_reconcile";
const KLARNA_PASSWORD: &str = "klarna-reconcile-secret";
/// The reconciler's clock runs this far ahead of the ingestor's, so its hints fall
/// into a later minute than the webhook hints the test just sent (as they do when
/// the schedule runs).
const RECONCILE_AHEAD_SECS: i64 = 120;

// ---------------------------------------------------------------------------
// The fake provider API

fn credentials() -> Credentials {
    Credentials::new(MOLLIE_KEY, GOPAY_ACCESS, KLARNA_USER, KLARNA_PASSWORD)
}

fn mollie_payment(id: &str, status: &str, order: &str, created: i64) -> Value {
    json!({"resource": "payment", "id": id, "mode": "test", "status": status,
           "amount": {"value": "49.90", "currency": "EUR"},
           "description": "Order", "metadata": {"order_id": order},
           "createdAt": format_rfc3339(created)})
}

fn gopay_payment(id: u64, state: &str, order: &str) -> Value {
    json!({"id": id, "order_number": order, "state": state, "amount": 4990,
           "currency": "CZK"})
}

fn gopay_path(id: u64) -> String {
    format!("/api/payments/payment/{id}")
}

fn klarna_order(id: &str, status: &str, order: &str) -> Value {
    json!({"order_id": id, "status": status, "merchant_reference1": order,
           "order_amount": 4990, "purchase_currency": "SEK"})
}

fn klarna_path(id: &str) -> String {
    format!("/ordermanagement/v1/orders/{id}")
}

// ---------------------------------------------------------------------------
// The harness

struct Harness {
    b: Backend,
    api: FakeThinApi,
    ingestor: Arc<Ingestor>,
    /// The same ingest path a few minutes later (the provider's own late hint).
    later: Ingestor,
    processor: Processor,
    reconciler: Reconciler,
}

fn config(api_base: &str) -> Arc<Config> {
    let toml = format!(
        r#"
[[tenant]]
provider = "mollie"
tenant = "{TENANT}"
options = {{ path_token = "{MOLLIE_TOKEN}", api_key = "{MOLLIE_KEY}", api_base = "{api_base}" }}

[[tenant]]
provider = "gopay"
tenant = "{TENANT}"
options = {{ path_token = "{GOPAY_TOKEN}", access_token = "{GOPAY_ACCESS}", api_base = "{api_base}" }}

[[tenant]]
provider = "klarna-push"
tenant = "{TENANT}"
options = {{ path_token = "{KLARNA_TOKEN}", api_username = "{KLARNA_USER}", api_password = "{KLARNA_PASSWORD}", api_base = "{api_base}" }}
"#
    );
    Arc::new(Config::from_toml(&toml).expect("config parses"))
}

impl Harness {
    async fn new(kind: Kind, page_size: usize) -> Harness {
        Harness::on(kind.backend(10).await, page_size).await
    }

    async fn on(b: Backend, page_size: usize) -> Harness {
        let api = FakeThinApi::start_with(Options {
            credentials: credentials(),
            mollie_list_page_size: Some(page_size),
        })
        .await;
        let config = config(&api.base);
        let ingestor = Arc::new(Ingestor::new(
            config.clone(),
            b.inbox.clone(),
            b.queue.clone(),
        ));
        let later = Ingestor::new(config.clone(), b.inbox.clone(), b.queue.clone())
            .with_clock(|| einmal::time::now_millis() + 4 * 60_000);
        let processor = Processor::new(
            b.inbox.clone(),
            b.processing.clone(),
            b.queue.clone(),
            b.state.clone(),
            Arc::new(ReferenceDomain),
        )
        .with_settings(scenario::settings(5_000, b.max_receive_count))
        .with_jitter(|| 1.0)
        .with_lookup(Arc::new(HttpLookup::new()), config);
        let reconciler = Reconciler::new(
            ingestor.clone(),
            b.state.clone(),
            Arc::new(ReferenceDomain),
            einmal::https::HttpsClient::new(),
        )
        .with_hints(b.hints.clone())
        .with_clock(|| einmal::time::now_secs() + RECONCILE_AHEAD_SECS);
        Harness {
            b,
            api,
            ingestor,
            later,
            processor,
            reconciler,
        }
    }

    /// A webhook hint through the real ingest path; returns `duplicate`.
    async fn hint(&self, provider: &str, request: WebhookRequest) -> bool {
        let r = self.ingestor.ingest(provider, TENANT, &request).await;
        assert_eq!(r.status, 200, "{provider}: {}", r.body);
        r.body["duplicate"] == json!(true)
    }

    /// The provider's own hint, minutes after the reconciliation's.
    async fn late_hint(&self, provider: &str, request: WebhookRequest) -> bool {
        let r = self.later.ingest(provider, TENANT, &request).await;
        assert_eq!(r.status, 200, "{provider}: {}", r.body);
        r.body["duplicate"] == json!(true)
    }

    async fn drain(&self) -> Vec<scenario::Handled> {
        scenario::drain(&self.b, &self.processor).await
    }

    async fn run(&self, provider: &str) -> TenantReport {
        let options = only(provider);
        let mut reports = self
            .reconciler
            .run_with(&options, Some(self.b.state.as_ref()))
            .await
            .expect("reconciliation runs");
        assert_eq!(reports.len(), 1, "{reports:?}");
        let report = reports.remove(0);
        assert_eq!(report.error, None, "{report:?}");
        report
    }

    /// How many `#paid` effects the order has (one invoice each).
    async fn paid_effects(&self, order: &str) -> usize {
        let record = self.b.record(&order_key(TENANT, order)).await;
        if !record.exists() {
            return 0;
        }
        let applied = record
            .applied
            .iter()
            .filter(|k| k.ends_with("#paid"))
            .count();
        let o = self.b.order(order).await;
        assert_eq!(o.invoices.len(), applied, "one invoice per #paid effect");
        applied
    }

    async fn checkpoint(&self, provider: &str) -> Option<i64> {
        let record = self
            .b
            .record(&StateKey::new(TENANT, "checkpoint", provider))
            .await;
        record.data.get("since").and_then(Value::as_i64)
    }

    async fn reconciled_items(&self) -> Vec<InboxKey> {
        self.b
            .items()
            .await
            .into_iter()
            .filter(|i| i.source == Source::Reconcile)
            .map(|i| i.key)
            .collect()
    }
}

fn only(provider: &str) -> ReconcileOptions {
    ReconcileOptions {
        provider: Some(provider.into()),
        tenant: Some(TENANT.into()),
        since: None,
    }
}

fn mollie_hint(id: &str) -> WebhookRequest {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-www-form-urlencoded"),
    );
    let mut r = WebhookRequest::post(headers, format!("id={id}"));
    r.path_token = Some(MOLLIE_TOKEN.into());
    r
}

fn klarna_hint(id: &str) -> WebhookRequest {
    let mut r = WebhookRequest::post(http::HeaderMap::new(), "");
    r.query = Some(format!("klarna_order_id={id}"));
    r.path_token = Some(KLARNA_TOKEN.into());
    r
}

fn reconcile_key(provider: &str, id: &str, before: i64, after: i64) -> Vec<InboxKey> {
    // The run's clock read falls between `before` and `after`: one of these minutes.
    let mut keys: Vec<InboxKey> = [before, after]
        .iter()
        .map(|t| {
            InboxKey::new(
                provider,
                TENANT,
                &hint_event_id(id, t + RECONCILE_AHEAD_SECS),
            )
        })
        .collect();
    keys.dedup();
    keys
}

// ---------------------------------------------------------------------------
// Mollie: the payments list with a checkpoint

#[tokio::test]
async fn mollie_paid_never_announced_is_listed_ingested_and_applied_once() {
    let h = Harness::new(Kind::Embedded, 2).await;
    let now = einmal::time::now_secs();
    // Paid and announced: applied by its hint.
    h.api
        .mollie(mollie_payment("tr_paid1", "paid", "m-1", now - 900));
    // Open when its hint came (ignored), then paid without another hint.
    h.api
        .mollie(mollie_payment("tr_late1", "open", "m-2", now - 600));
    // Open, and stays open; its hint is a forgery claiming it was paid.
    h.api
        .mollie(mollie_payment("tr_open1", "open", "m-3", now - 1_200));
    // Created and paid, and no hint ever came.
    h.api
        .mollie(mollie_payment("tr_nohint", "paid", "m-4", now - 300));
    // Created before the first run's window: never listed.
    h.api
        .mollie(mollie_payment("tr_old01", "paid", "m-0", now - 5 * 86_400));
    for id in ["tr_paid1", "tr_late1", "tr_open1"] {
        assert!(!h.hint("mollie", mollie_hint(id)).await);
    }
    h.drain().await;
    assert_eq!(h.paid_effects("m-1").await, 1);
    assert_eq!(h.paid_effects("m-2").await, 0);
    h.api
        .mollie(mollie_payment("tr_late1", "paid", "m-2", now - 600));
    let items_before = h.b.items().await.len();

    let before = einmal::time::now_secs();
    let r = h.run("mollie").await;
    let after = einmal::time::now_secs();
    assert_eq!(
        (r.fetched, r.already_present, r.ingested),
        (4, 1, 2),
        "{r:?}"
    );
    // Newest first in pages of two, until a payment older than the window.
    let queries = h.api.list_queries();
    assert_eq!(queries.len(), 3, "{queries:?}");
    assert_eq!(query_param(&queries[0], "from"), None);
    assert_eq!(query_param(&queries[0], "limit").as_deref(), Some("250"));
    assert_eq!(
        query_param(&queries[1], "from").as_deref(),
        Some("tr_paid1")
    );
    assert_eq!(
        query_param(&queries[2], "from").as_deref(),
        Some("tr_old01")
    );
    let difference = |id: &str, order: &str| Difference {
        provider: "mollie".into(),
        tenant: TENANT.into(),
        object_id: id.into(),
        order_id: order.into(),
        provider_status: "paid".into(),
        our_status: PENDING_PROCESSING.into(),
    };
    assert_eq!(
        r.differences,
        vec![
            difference("tr_nohint", "m-4"),
            difference("tr_late1", "m-2")
        ]
    );
    let mut reconciled = h.reconciled_items().await;
    reconciled.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    assert_eq!(reconciled.len(), 2, "{reconciled:?}");
    // The thin providers' own key scheme.
    assert!(
        reconcile_key("mollie", "tr_late1", before, after).contains(&reconciled[0]),
        "{}",
        reconciled[0]
    );
    assert!(
        reconcile_key("mollie", "tr_nohint", before, after).contains(&reconciled[1]),
        "{}",
        reconciled[1]
    );
    let mut ingested = r.ingested_events.clone();
    ingested.sort();
    assert_eq!(
        ingested,
        reconciled
            .iter()
            .map(|k| k.as_str().to_owned())
            .collect::<Vec<_>>()
    );
    assert_eq!(h.b.items().await.len(), items_before + 2);
    // The checkpoint waits at the payment still open.
    assert_eq!(h.checkpoint("mollie").await, Some(now - 1_200));
    assert_eq!(r.checkpoint, Some(format_rfc3339(now - 1_200)));

    let handled = h.drain().await;
    assert_eq!(handled.len(), 2, "{handled:?}");
    for key in &reconciled {
        let item = h.b.inbox.get(key).await.unwrap().unwrap();
        assert_eq!(item.state, InboxState::Completed, "{:?}", item.last_error);
        assert_eq!(item.envelope.event_type, "hint.payment");
    }
    assert_eq!(h.paid_effects("m-2").await, 1);
    assert_eq!(h.paid_effects("m-4").await, 1);
    assert_eq!(h.paid_effects("m-3").await, 0);

    // Mollie's own late hint arrives now: a new item, and no second effect.
    assert!(!h.late_hint("mollie", mollie_hint("tr_late1")).await);
    h.drain().await;
    assert_eq!(h.paid_effects("m-2").await, 1);
    let state_after = h.b.business_state().await;
    let items_after = h.b.items().await.len();

    // Again: nothing differs, nothing is ingested or applied.
    let r = h.run("mollie").await;
    assert_eq!(
        (r.fetched, r.already_present, r.ingested),
        (4, 3, 0),
        "{r:?}"
    );
    assert!(r.differences.is_empty(), "{:?}", r.differences);
    assert!(h.drain().await.is_empty(), "nothing enqueued");
    assert_eq!(h.b.items().await.len(), items_after);
    assert_eq!(h.b.business_state().await, state_after);
    assert_eq!(h.checkpoint("mollie").await, Some(now - 1_200));

    // The open payment is paid now; the checkpoint moves past everything seen.
    h.api
        .mollie(mollie_payment("tr_open1", "paid", "m-3", now - 1_200));
    let r = h.run("mollie").await;
    assert_eq!(r.ingested, 1, "{r:?}");
    h.drain().await;
    assert_eq!(h.paid_effects("m-3").await, 1);
    assert_eq!(
        h.checkpoint("mollie").await,
        Some(now - 300 - DEFAULT_OVERLAP_SECS)
    );
}

// ---------------------------------------------------------------------------
// GoPay: no list API; the payments its hints named (both backends)

/// `operations`: the DynamoDB calls of the AWS backend, to check what a run issues.
async fn gopay_status_change_never_announced(b: Backend, operations: Option<OperationLog>) {
    let h = Harness::on(b, 100).await;
    let (late, paid, open) = (3_000_000_101u64, 3_000_000_102u64, 3_000_000_103u64);
    h.api
        .set(&gopay_path(late), gopay_payment(late, "CREATED", "g-1"));
    h.api
        .set(&gopay_path(paid), gopay_payment(paid, "PAID", "g-2"));
    // A forged hint for a payment the customer never paid.
    h.api
        .set(&gopay_path(open), gopay_payment(open, "CREATED", "g-3"));
    let start = einmal::time::now_secs();
    for id in [late, paid, open] {
        assert!(!h.hint("gopay", gopay_hint(id, GOPAY_TOKEN)).await);
    }
    let hinted = einmal::time::now_secs();
    h.drain().await;
    assert_eq!(h.paid_effects("g-1").await, 0);
    assert_eq!(h.paid_effects("g-2").await, 1);
    // The customer pays; GoPay's notification never reaches us.
    h.api
        .set(&gopay_path(late), gopay_payment(late, "PAID", "g-1"));
    let calls_before = h.api.calls(&gopay_path(paid));
    let items_before = h.b.items().await.len();

    let before = einmal::time::now_secs();
    if let Some(ops) = &operations {
        ops.take();
    }
    let r = h.run("gopay").await;
    let after = einmal::time::now_secs();
    if let Some(ops) = &operations {
        // The hints come from the sparse index: a Query (+ BatchGetItem), no Scan.
        let ops = ops.take();
        assert!(!ops.iter().any(|o| o == "Scan"), "{ops:?}");
        assert_eq!(ops.iter().filter(|o| *o == "Query").count(), 1, "{ops:?}");
    }
    // The two whose hints ended ignored are looked up; the completed one is not.
    assert_eq!(
        (r.fetched, r.already_present, r.ingested),
        (2, 0, 1),
        "{r:?}"
    );
    assert_eq!(h.api.calls(&gopay_path(paid)), calls_before);
    assert_eq!(
        r.differences,
        vec![Difference {
            provider: "gopay".into(),
            tenant: TENANT.into(),
            object_id: late.to_string(),
            order_id: "g-1".into(),
            provider_status: "PAID".into(),
            our_status: PENDING_PROCESSING.into(),
        }]
    );
    let reconciled = h.reconciled_items().await;
    assert_eq!(reconciled.len(), 1, "{reconciled:?}");
    assert!(
        reconcile_key("gopay", &late.to_string(), before, after).contains(&reconciled[0]),
        "{}",
        reconciled[0]
    );
    assert_eq!(h.b.items().await.len(), items_before + 1);
    // The checkpoint does not pass the first hint of the payment still open (the
    // overlap before now may keep it earlier).
    let checkpoint = h.checkpoint("gopay").await.expect("checkpoint stored");
    assert!(
        (start - DEFAULT_OVERLAP_SECS..=hinted).contains(&checkpoint),
        "{checkpoint} not within {start} - overlap..={hinted}"
    );

    let handled = h.drain().await;
    assert_eq!(handled.len(), 1, "{}: {handled:?}", h.b.name);
    assert_eq!(h.paid_effects("g-1").await, 1);
    assert_eq!(h.paid_effects("g-3").await, 0);
    // GoPay's notification turns up after all: no second effect.
    assert!(!h.late_hint("gopay", gopay_hint(late, GOPAY_TOKEN)).await);
    h.drain().await;
    assert_eq!(h.paid_effects("g-1").await, 1);
    let state_after = h.b.business_state().await;
    let items_after = h.b.items().await.len();

    // Again: only the open payment is looked at, and it is still open.
    let r = h.run("gopay").await;
    assert_eq!(
        (r.fetched, r.already_present, r.ingested),
        (1, 0, 0),
        "{r:?}"
    );
    assert!(r.differences.is_empty(), "{:?}", r.differences);
    assert!(h.drain().await.is_empty(), "nothing enqueued");
    assert_eq!(h.b.items().await.len(), items_after);
    assert_eq!(h.b.business_state().await, state_after);
    let moved = h.checkpoint("gopay").await.expect("checkpoint");
    assert!(
        (checkpoint..=hinted).contains(&moved),
        "{moved} not within {checkpoint}..={hinted}"
    );

    let audit = audit_record("ops", "scheduled", &only("gopay"), &[r], 1_700_000_000_000);
    assert_eq!(audit.result["ingested"], json!(0));
}

#[tokio::test]
async fn gopay_paid_never_announced_is_found_and_applied_once_embedded() {
    gopay_status_change_never_announced(Kind::Embedded.backend(10).await, None).await;
}

#[tokio::test]
async fn gopay_paid_never_announced_is_found_and_applied_once_on_moto() {
    let ops = OperationLog::new();
    let b = scenario::aws_logged(10, Some(ops.clone())).await;
    gopay_status_change_never_announced(b, Some(ops)).await;
}

#[tokio::test]
async fn gopay_lookup_error_fails_the_run_and_keeps_the_checkpoint() {
    let h = Harness::new(Kind::Embedded, 100).await;
    let id = 3_000_000_201u64;
    h.api
        .set(&gopay_path(id), gopay_payment(id, "CREATED", "g-9"));
    assert!(!h.hint("gopay", gopay_hint(id, GOPAY_TOKEN)).await);
    h.drain().await;
    h.api.set(&gopay_path(id), gopay_payment(id, "PAID", "g-9"));
    h.api.fail_next(&gopay_path(id), &[503]);
    let reports = h
        .reconciler
        .run_with(&only("gopay"), Some(h.b.state.as_ref()))
        .await
        .expect("run");
    let error = reports[0].error.as_deref().expect("error reported");
    assert!(error.contains("503"), "{error}");
    assert!(!error.contains(GOPAY_ACCESS), "no credential in errors");
    assert_eq!(reports[0].checkpoint, None);
    assert_eq!(h.checkpoint("gopay").await, None);
    assert!(h.reconciled_items().await.is_empty());
    // The next run finds it.
    let r = h.run("gopay").await;
    assert_eq!(r.ingested, 1, "{r:?}");
    h.drain().await;
    assert_eq!(h.paid_effects("g-9").await, 1);
}

// ---------------------------------------------------------------------------
// Klarna push

#[tokio::test]
async fn klarna_push_order_authorized_later_is_found_and_applied_once() {
    let h = Harness::new(Kind::Embedded, 100).await;
    let (late, forged) = (
        "0b1f5e2a-5b7c-4d0e-9a51-2b2f1d7c0001",
        "0b1f5e2a-5b7c-4d0e-9a51-2b2f1d7c0002",
    );
    h.api.set(
        &klarna_path(late),
        klarna_order(late, "CHECKOUT_INCOMPLETE", "k-1"),
    );
    h.api.set(
        &klarna_path(forged),
        klarna_order(forged, "CHECKOUT_INCOMPLETE", "k-2"),
    );
    for id in [late, forged] {
        assert!(!h.hint("klarna-push", klarna_hint(id)).await);
    }
    h.drain().await;
    h.api
        .set(&klarna_path(late), klarna_order(late, "AUTHORIZED", "k-1"));

    let r = h.run("klarna-push").await;
    assert_eq!(
        (r.fetched, r.already_present, r.ingested),
        (2, 0, 1),
        "{r:?}"
    );
    assert_eq!(r.differences.len(), 1, "{:?}", r.differences);
    assert_eq!(r.differences[0].object_id, late);
    assert_eq!(r.differences[0].provider_status, "AUTHORIZED");
    let reconciled = h.reconciled_items().await;
    assert_eq!(reconciled.len(), 1);
    let item = h.b.inbox.get(&reconciled[0]).await.unwrap().unwrap();
    assert_eq!(item.envelope.event_type, "hint.order");
    h.drain().await;
    assert_eq!(h.paid_effects("k-1").await, 1);
    assert_eq!(h.paid_effects("k-2").await, 0);
    let state_after = h.b.business_state().await;

    let r = h.run("klarna-push").await;
    assert_eq!((r.fetched, r.ingested), (1, 0), "{r:?}");
    assert!(r.differences.is_empty());
    assert!(h.drain().await.is_empty());
    assert_eq!(h.b.business_state().await, state_after);
}

#[tokio::test]
async fn every_thin_tenant_is_reconciled_in_one_run() {
    let h = Harness::new(Kind::Embedded, 100).await;
    let reports = h
        .reconciler
        .run_with(&ReconcileOptions::default(), None)
        .await
        .expect("run");
    let mut providers: Vec<&str> = reports.iter().map(|r| r.provider.as_str()).collect();
    providers.sort();
    assert_eq!(providers, ["gopay", "klarna-push", "mollie"]);
    assert!(reports.iter().all(|r| r.error.is_none()), "{reports:?}");
    assert!(reports.iter().all(|r| r.ingested == 0));
    // Without the inbox GoPay and Klarna push cannot know their payments: a clear error.
    let bare = Reconciler::new(
        h.ingestor.clone(),
        h.b.state.clone(),
        Arc::new(ReferenceDomain),
        einmal::https::HttpsClient::new(),
    );
    let reports = bare.run(&only("gopay")).await.expect("run");
    let error = reports[0].error.as_deref().expect("error");
    assert!(error.contains("inbox"), "{error}");
}

// ---------------------------------------------------------------------------
// The hint index on DynamoDB

/// A stored item as the receiver would put it (body left empty).
fn stored(provider: &str, tenant: &str, event_type: &str, object: &str, at_ms: i64) -> InboxItem {
    let envelope = Envelope {
        provider: provider.into(),
        tenant: tenant.into(),
        event_id: format!("{object}:{at_ms}"),
        event_type: event_type.into(),
        object_id: Some(object.into()),
        object_version: None,
        occurred_at: None,
        delivery_id: None,
    };
    InboxItem {
        key: envelope.key(),
        envelope,
        state: InboxState::Received,
        source: Source::Webhook,
        attempts: 0,
        received_at_ms: at_ms,
        updated_at_ms: at_ms,
        expires_at: at_ms / 1000 + 86_400,
        enqueue_failed: false,
        last_error: None,
        last_error_class: None,
        lease_until_ms: None,
        lease_owner: None,
        result: None,
        body_encoding: "identity".into(),
        body_len: 0,
        body: Vec::new(),
        waiting: None,
        deliveries: Vec::new(),
        relay_due_ms: None,
    }
}

/// Only the hints of GoPay and Klarna push carry `hint_scope`, so only they are in the
/// `by_hint` index (Stripe events and Mollie hints are not); `hints_since` reads one
/// tenant's range with Query + BatchGetItem (100 keys per call), oldest first, and
/// never scans.
#[tokio::test]
async fn only_gopay_and_klarna_push_hints_are_indexed_and_read_without_a_scan_on_moto() {
    let sdk = moto::shared().sdk_config().await;
    let name = moto::unique_name("einmal-hints");
    let raw = aws_sdk_dynamodb::Client::new(&sdk);
    create_tables(&raw, &name).await.expect("inbox table");
    let names = create_queues(&aws_sdk_sqs::Client::new(&sdk), &name, 5)
        .await
        .expect("queues");
    let ops = OperationLog::new();
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk)
            .interceptor(ops.clone())
            .build(),
    );
    let store = AwsStore::new(dynamodb, aws_sdk_sqs::Client::new(&sdk), names.clone());

    let t = 1_700_000_000_000i64;
    let not_indexed = [
        stored("stripe", "t1", "payment_intent.succeeded", "pi_1", t),
        stored("mollie", "t1", "hint.payment", "tr_1", t),
    ];
    let early = stored("gopay", "t1", "hint.payment", "101", t - 10_000);
    let first = stored("gopay", "t1", "hint.payment", "101", t);
    let second = stored("gopay", "t1", "hint.payment", "102", t + 1);
    let other_tenant = stored("gopay", "t2", "hint.payment", "201", t);
    let klarna = stored("klarna-push", "t1", "hint.order", "k-1", t);
    let indexed = [&early, &first, &second, &other_tenant, &klarna];
    for item in not_indexed.iter().chain(indexed.iter().copied()) {
        assert_eq!(store.put_new(item).await.unwrap(), PutOutcome::Inserted);
    }

    // What the index holds (read here with a test-side Scan of the index itself).
    let out = raw
        .scan()
        .table_name(&names.table)
        .index_name("by_hint")
        .send()
        .await
        .expect("scan of the index");
    let mut in_index: Vec<String> = out
        .items()
        .iter()
        .map(|m| m["pk"].as_s().unwrap().clone())
        .collect();
    in_index.sort();
    let mut expected: Vec<String> = indexed.iter().map(|i| i.key.to_string()).collect();
    expected.sort();
    assert_eq!(in_index, expected);
    assert_eq!(
        out.items()
            .iter()
            .find(|m| m["pk"].as_s().unwrap() == first.key.as_str())
            .map(|m| m["hint_scope"].as_s().unwrap().as_str()),
        Some("gopay#t1")
    );

    ops.take();
    let hints = store.hints_since("gopay", "t1", t, 100).await.unwrap();
    let got: Vec<(&str, &str, InboxState, i64)> = hints
        .iter()
        .map(|h| {
            (
                h.key.as_str(),
                h.object_id.as_str(),
                h.state,
                h.received_at_ms,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (first.key.as_str(), "101", InboxState::Received, t),
            (second.key.as_str(), "102", InboxState::Received, t + 1),
        ]
    );
    assert_eq!(ops.take(), ["Query", "BatchGetItem"]);
    // The limit keeps the oldest.
    let oldest = store.hints_since("gopay", "t1", 0, 2).await.unwrap();
    assert_eq!(
        oldest.iter().map(|h| h.key.clone()).collect::<Vec<_>>(),
        vec![early.key.clone(), first.key.clone()]
    );
    // Providers whose items are not indexed find nothing; neither does an unknown tenant.
    for (provider, tenant) in [("mollie", "t1"), ("stripe", "t1"), ("gopay", "t9")] {
        assert!(store
            .hints_since(provider, tenant, 0, 100)
            .await
            .unwrap()
            .is_empty());
    }
    let klarna_hints = store
        .hints_since("klarna-push", "t1", 0, 100)
        .await
        .unwrap();
    assert_eq!(klarna_hints.len(), 1);
    assert_eq!(klarna_hints[0].object_id, "k-1");

    // More than one BatchGetItem's worth: 130 hints of one tenant, read in order.
    for n in 0..130 {
        let item = stored("gopay", "t3", "hint.payment", &format!("3{n:03}"), t + n);
        store.put_new(&item).await.unwrap();
    }
    ops.take();
    let many = store.hints_since("gopay", "t3", t, 1_000).await.unwrap();
    assert_eq!(many.len(), 130);
    assert!(many
        .windows(2)
        .all(|w| w[0].received_at_ms < w[1].received_at_ms));
    let calls = ops.take();
    assert_eq!(calls, ["Query", "BatchGetItem", "BatchGetItem"]);
    assert!(!calls.iter().any(|o| o == "Scan"));
}

/// More hints since the checkpoint than one run reads ([`MAX_WATCHED_ITEMS`]): the
/// checkpoint stops at the last hint read instead of jumping to now, and the next run
/// goes on from there.
#[tokio::test]
async fn a_run_that_reads_the_most_hints_keeps_the_checkpoint_at_the_last_one_read() {
    let h = Harness::new(Kind::Embedded, 100).await;
    let base_secs = einmal::time::now_secs() - 3_600;
    // Concurrent puts share the embedded store's group commits.
    let mut puts = tokio::task::JoinSet::new();
    for n in 0..=MAX_WATCHED_ITEMS as i64 {
        let mut item = stored(
            "gopay",
            TENANT,
            "hint.payment",
            &format!("4{n:05}"),
            (base_secs + n) * 1000,
        );
        item.state = InboxState::Completed;
        let inbox = h.b.inbox.clone();
        puts.spawn(async move { inbox.put_new(&item).await.expect("put") });
    }
    while let Some(done) = puts.join_next().await {
        done.expect("put task");
    }

    let r = h.run("gopay").await;
    assert_eq!((r.fetched, r.ingested), (0, 0), "{r:?}");
    let last_read = base_secs + MAX_WATCHED_ITEMS as i64 - 1;
    assert_eq!(h.checkpoint("gopay").await, Some(last_read));
    // The next run reads the rest and moves on to now minus the overlap.
    let r = h.run("gopay").await;
    assert_eq!(r.error, None);
    let moved = h.checkpoint("gopay").await.expect("checkpoint");
    assert!(moved > last_read + 60, "{moved} <= {last_read}");
}
