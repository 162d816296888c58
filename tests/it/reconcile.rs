//! Reconciliation on the embedded store (and, for the never-delivered event, on moto)
//! with the reference domain and a fake Stripe API on loopback: an event that was
//! never delivered as a webhook is found, ingested once (`source = reconcile`) and
//! applied once; a second run changes nothing. Also:
//! paging through `has_more`, and an API error that leaves the checkpoint alone.
//! Shopify against a fake `orders.json` (an order version never delivered as a
//! webhook), and the differences report (paid at the provider, not paid here).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use einmal::config::Config;
use einmal::domain::reference::ReferenceDomain;
use einmal::domain::state::StateKey;
use einmal::envelope::InboxKey;
use einmal::pipeline::ingest::Ingestor;
use einmal::pipeline::process::Processor;
use einmal::ports::Source;
use einmal::ports::{Delivery, Queue, QueueError, QueueMessage};
use einmal::reconcile::{
    audit_record, shopify_create_event_id, shopify_event_id, Difference, ReconcileError,
    ReconcileOptions, Reconciler, DEFAULT_OVERLAP_SECS, PAGE_ATTEMPTS, PENDING_PROCESSING,
};
use einmal::time::parse_rfc3339;
use einmal_tests::fixtures::{SHOPIFY_SECRET, STRIPE_SECRET};
use einmal_tests::scenario::{
    self, drain, order_body, orders_create, pi_succeeded, shop_time, utc, Backend, Event, Kind,
};
use serde_json::{json, Value};

const TENANT: &str = "t1";
const API_KEY: &str = "sk_test_reconcile_51H";
const SHOPIFY_TOKEN: &str = "shpat_reconcile_token";
const ITEMS: [(&str, i64); 1] = [("RED-M", 1)];
const TOTAL: i64 = 2_500;

// ---------------------------------------------------------------------------
// The fake Stripe API: `GET /v1/events`, newest first, paged with `starting_after`.

#[derive(Default)]
struct FakeState {
    /// Event objects, newest first (as Stripe lists them).
    events: Vec<Value>,
    page_size: usize,
    fail_next: VecDeque<u16>,
    /// The query string of every authenticated call.
    queries: Vec<String>,
    /// Shopify order snapshots served by `orders.json`.
    orders: Vec<Value>,
    /// Orders per `orders.json` page (0: all on one page); pages link with
    /// `Link: <…page_info=N…>; rel="next"`.
    orders_page_size: usize,
    /// The `next` link of this page (1-based) points to another host.
    foreign_next_on_page: Option<usize>,
    /// `orders.json` page (1-based) → how many of its next requests answer this
    /// status instead (0: hang for 3 s, past the test's page timeout).
    page_faults: Vec<(usize, u16, usize)>,
}

#[derive(Clone)]
struct FakeStripe {
    base: String,
    state: Arc<Mutex<FakeState>>,
}

impl FakeStripe {
    async fn start(page_size: usize) -> FakeStripe {
        let state = Arc::new(Mutex::new(FakeState {
            page_size,
            ..Default::default()
        }));
        let app = Router::new().fallback(answer).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake API binds");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake API serves");
        });
        FakeStripe { base, state }
    }

    /// Publish the events (any order; listed newest first).
    fn publish(&self, events: &[&Event]) {
        let mut s = self.state.lock().unwrap();
        for e in events {
            s.events
                .push(serde_json::from_slice(&e.body).expect("stripe body"));
        }
        s.events
            .sort_by_key(|e| std::cmp::Reverse(e["created"].as_i64()));
    }

    /// Serve these Shopify orders (filtered by `updated_at_min`).
    fn publish_orders(&self, orders: Vec<Value>) {
        self.state.lock().unwrap().orders = orders;
    }

    fn fail_next(&self, status: u16) {
        self.state.lock().unwrap().fail_next.push_back(status);
    }

    /// Serve `orders.json` in pages of `size`; page `foreign` links to another host.
    fn page_orders(&self, size: usize, foreign: Option<usize>) {
        let mut s = self.state.lock().unwrap();
        s.orders_page_size = size;
        s.foreign_next_on_page = foreign;
    }

    /// The next `count` requests of `orders.json` page `page` answer `status`
    /// (0: hang past the page timeout).
    fn fault_page(&self, page: usize, status: u16, count: usize) {
        self.state
            .lock()
            .unwrap()
            .page_faults
            .push((page, status, count));
    }

    fn queries(&self) -> Vec<String> {
        self.state.lock().unwrap().queries.clone()
    }
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        let k = k.replace("%5B", "[").replace("%5D", "]");
        (k == name).then(|| v.to_string())
    })
}

async fn answer(
    State(state): State<Arc<Mutex<FakeState>>>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    if uri.path() == "/admin/api/2024-10/orders.json" {
        let fault = {
            let mut s = state.lock().unwrap();
            let page = orders_page_no(&s, &uri);
            let fault = s
                .page_faults
                .iter_mut()
                .find(|(p, _, n)| *p == page && *n > 0);
            fault.map(|(_, status, n)| {
                *n -= 1;
                *status
            })
        };
        match fault {
            Some(0) => {
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                return StatusCode::GATEWAY_TIMEOUT.into_response();
            }
            Some(status) => {
                let status = StatusCode::from_u16(status).expect("status");
                return (status, r#"{"errors":"boom"}"#).into_response();
            }
            None => return shopify_orders(&state, &headers, &uri),
        }
    }
    if uri.path() != "/v1/events" {
        return StatusCode::NOT_FOUND.into_response();
    }
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
    if auth != Some(&format!("Bearer {API_KEY}")) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let query = uri.query().unwrap_or_default().to_string();
    let mut s = state.lock().unwrap();
    s.queries.push(query.clone());
    if let Some(status) = s.fail_next.pop_front() {
        let status = StatusCode::from_u16(status).expect("status");
        return (status, r#"{"error":{"message":"boom"}}"#).into_response();
    }
    let gte: i64 = query_param(&query, "created[gte]")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let limit: usize = query_param(&query, "limit")
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let matching: Vec<&Value> = s
        .events
        .iter()
        .filter(|e| e["created"].as_i64().unwrap_or(0) >= gte)
        .collect();
    let start = match query_param(&query, "starting_after") {
        Some(after) => match matching.iter().position(|e| e["id"] == json!(after)) {
            Some(i) => i + 1,
            None => return StatusCode::BAD_REQUEST.into_response(),
        },
        None => 0,
    };
    let size = limit.min(s.page_size);
    let page: Vec<Value> = matching
        .iter()
        .skip(start)
        .take(size)
        .map(|e| (*e).clone())
        .collect();
    let has_more = start + page.len() < matching.len();
    let body = json!({"object": "list", "url": "/v1/events", "has_more": has_more, "data": page});
    ([("content-type", "application/json")], body.to_string()).into_response()
}

/// The 1-based page an `orders.json` request asks for.
fn orders_page_no(s: &FakeState, uri: &Uri) -> usize {
    let offset: usize = query_param(uri.query().unwrap_or_default(), "page_info")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    offset / s.orders_page_size.max(1) + 1
}

/// The fake Shopify `GET orders.json` (`updated_at_min` honoured; paged with
/// `page_info` = the offset when a page size is set).
fn shopify_orders(state: &Mutex<FakeState>, headers: &HeaderMap, uri: &Uri) -> Response {
    let token = headers
        .get("x-shopify-access-token")
        .and_then(|v| v.to_str().ok());
    if token != Some(SHOPIFY_TOKEN) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let query = uri.query().unwrap_or_default().to_string();
    let mut s = state.lock().unwrap();
    s.queries.push(query.clone());
    let min = query_param(&query, "updated_at_min")
        .map(|v| v.replace("%3A", ":").replace("%2B", "+"))
        .and_then(|v| parse_rfc3339(&v))
        .unwrap_or(0);
    let orders: Vec<Value> = s
        .orders
        .iter()
        .filter(|o| {
            o["updated_at"]
                .as_str()
                .and_then(parse_rfc3339)
                .is_some_and(|at| at >= min)
        })
        .cloned()
        .collect();
    if s.orders_page_size == 0 {
        let body = json!({ "orders": orders });
        return ([("content-type", "application/json")], body.to_string()).into_response();
    }
    let offset: usize = query_param(&query, "page_info")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let page: Vec<Value> = orders
        .iter()
        .skip(offset)
        .take(s.orders_page_size)
        .cloned()
        .collect();
    let page_no = offset / s.orders_page_size + 1;
    let mut response = (
        [("content-type", "application/json")],
        json!({ "orders": page }).to_string(),
    )
        .into_response();
    if offset + s.orders_page_size < orders.len() {
        let host = match s.foreign_next_on_page {
            Some(p) if p == page_no => "http://elsewhere.example".to_string(),
            _ => format!(
                "http://{}",
                headers
                    .get("host")
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("")
            ),
        };
        let next = format!(
            "<{host}/admin/api/2024-10/orders.json?limit=250&page_info={}>; rel=\"next\"",
            offset + s.orders_page_size
        );
        response
            .headers_mut()
            .insert("link", next.parse().expect("link header"));
    }
    response
}

// ---------------------------------------------------------------------------
// Setup

fn config(api_base: &str) -> Arc<Config> {
    let toml = format!(
        r#"
[[tenant]]
provider = "stripe"
tenant = "{TENANT}"
secrets = ["{STRIPE_SECRET}"]
options = {{ api_base = "{api_base}", api_key = "{API_KEY}" }}

[[tenant]]
provider = "shopify"
tenant = "{TENANT}"
secrets = ["{SHOPIFY_SECRET}"]
options = {{ shop_domain = "{}", api_base = "{api_base}", access_token = "{SHOPIFY_TOKEN}" }}
"#,
        scenario::SHOP
    );
    Arc::new(Config::from_toml(&toml).expect("config parses"))
}

struct Setup {
    b: Backend,
    api: FakeStripe,
    ingestor: Arc<Ingestor>,
    reconciler: Reconciler,
}

async fn setup(page_size: usize) -> Setup {
    setup_on(Kind::Embedded, page_size).await
}

async fn setup_on(kind: Kind, page_size: usize) -> Setup {
    let b = kind.backend(10).await;
    b.seed(&[("RED-M", 100)]).await;
    let api = FakeStripe::start(page_size).await;
    let ingestor = Arc::new(Ingestor::new(
        config(&api.base),
        b.inbox.clone(),
        b.queue.clone(),
    ));
    // Short page timing: a hung page times out after 1 s, retries pause 20 ms, 40 ms, ...
    let reconciler = Reconciler::new(
        ingestor.clone(),
        b.state.clone(),
        Arc::new(ReferenceDomain),
        einmal::https::HttpsClient::new(),
    )
    .with_page_timing(Duration::from_secs(1), Duration::from_millis(20));
    Setup {
        b,
        api,
        ingestor,
        reconciler,
    }
}

fn stripe_only() -> ReconcileOptions {
    ReconcileOptions {
        provider: Some("stripe".into()),
        tenant: Some(TENANT.into()),
        since: None,
    }
}

fn shopify_only() -> ReconcileOptions {
    ReconcileOptions {
        provider: Some("shopify".into()),
        tenant: Some(TENANT.into()),
        since: None,
    }
}

async fn stored_checkpoint(b: &Backend) -> Option<i64> {
    let record = b
        .record(&StateKey::new(TENANT, "checkpoint", "stripe"))
        .await;
    record.data.get("since").and_then(Value::as_i64)
}

/// Three orders exist (Shopify webhooks) and their three Stripe payments happened
/// `now - 300`, `- 200`, `- 100` seconds ago.
async fn three_orders_and_payments(s: &Setup) -> Vec<Event> {
    let now = einmal::time::now_secs();
    let p = s.b.processor(300);
    for id in [3001u64, 3002, 3003] {
        let create = orders_create(id, now - 3_600, &ITEMS, TOTAL, "pending");
        assert!(!s.b.send(&s.ingestor, &create).await);
    }
    drain(&s.b, &p).await;
    vec![
        pi_succeeded("3001", "pi_r1", TOTAL, now - 300),
        pi_succeeded("3002", "pi_r2", TOTAL, now - 200),
        pi_succeeded("3003", "pi_r3", TOTAL, now - 100),
    ]
}

// ---------------------------------------------------------------------------
// Tests

#[tokio::test]
async fn missed_event_is_ingested_once_and_applied_once() {
    missed_event_scenario(Kind::Embedded).await;
}

/// The same on DynamoDB + SQS (moto): the reconciled event goes through the AWS
/// adapters' conditional put and send, and the checkpoint is a DynamoDB state record.
#[tokio::test]
async fn missed_event_is_ingested_once_and_applied_once_on_moto() {
    missed_event_scenario(Kind::Aws).await;
}

async fn missed_event_scenario(kind: Kind) {
    let s = setup_on(kind, 100).await;
    let p = s.b.processor(300);
    let payments = three_orders_and_payments(&s).await;
    // Two are delivered as webhooks; the third is never delivered.
    for e in &payments[..2] {
        assert!(!s.b.send(&s.ingestor, e).await);
    }
    drain(&s.b, &p).await;
    assert!(
        !s.b.order("3003").await.is_paid(),
        "third order not paid yet"
    );
    s.api.publish(&payments.iter().collect::<Vec<_>>());
    let items_before = s.b.items().await.len();

    let reports = s.reconciler.run(&stripe_only()).await.expect("run");
    assert_eq!(reports.len(), 1, "{reports:?}");
    let r = &reports[0];
    assert_eq!(r.error, None);
    assert_eq!(
        (r.fetched, r.already_present, r.ingested),
        (3, 2, 1),
        "{r:?}"
    );
    let items = s.b.items().await;
    assert_eq!(items.len(), items_before + 1, "exactly one new inbox item");
    let reconciled: Vec<_> = items
        .iter()
        .filter(|i| i.source == Source::Reconcile)
        .collect();
    assert_eq!(reconciled.len(), 1);
    assert_eq!(reconciled[0].key, payments[2].inbox_key());
    assert_eq!(s.b.item(&payments[0]).await.source, Source::Webhook);

    drain(&s.b, &p).await;
    for id in ["3001", "3002", "3003"] {
        let order = s.b.order(id).await;
        assert!(order.is_paid(), "order {id} paid");
        assert_eq!(order.invoices.len(), 1, "order {id}: one invoice");
    }
    let state_after_first = s.b.business_state().await;
    let checkpoint = stored_checkpoint(&s.b).await.expect("checkpoint stored");
    assert_eq!(
        checkpoint,
        payments[2].body_created() - DEFAULT_OVERLAP_SECS,
        "newest created minus the overlap"
    );

    // Again: everything is present, nothing ingested, nothing applied.
    let reports = s.reconciler.run(&stripe_only()).await.expect("second run");
    let r = &reports[0];
    assert_eq!(r.error, None);
    assert_eq!(
        (r.fetched, r.already_present, r.ingested),
        (3, 3, 0),
        "{r:?}"
    );
    let handled = drain(&s.b, &p).await;
    assert!(handled.is_empty(), "nothing enqueued: {handled:?}");
    assert_eq!(s.b.items().await.len(), items_before + 1);
    assert_eq!(s.b.business_state().await, state_after_first);
    assert_eq!(stored_checkpoint(&s.b).await, Some(checkpoint));
    let json = serde_json::to_value(r).expect("report serializes");
    assert_eq!(json["ingested"], json!(0));
}

#[tokio::test]
async fn pages_through_has_more() {
    let s = setup(2).await;
    let payments = three_orders_and_payments(&s).await;
    s.api.publish(&payments.iter().collect::<Vec<_>>());

    let r = s
        .reconciler
        .reconcile_tenant(s.ingestor.config().tenant("stripe", TENANT).unwrap(), None)
        .await
        .expect("reconciles");
    assert_eq!((r.fetched, r.already_present, r.ingested), (3, 0, 3));
    let queries = s.api.queries();
    assert_eq!(queries.len(), 2, "two pages: {queries:?}");
    assert!(queries[0].contains("created%5Bgte%5D="), "{}", queries[0]);
    assert!(queries[0].contains("limit=100"), "{}", queries[0]);
    assert_eq!(query_param(&queries[0], "starting_after"), None);
    // Newest first: the second page starts after the second-newest event.
    assert_eq!(
        query_param(&queries[1], "starting_after").as_deref(),
        Some(payments[1].event_id.as_str())
    );
    let p = s.b.processor(300);
    drain(&s.b, &p).await;
    for id in ["3001", "3002", "3003"] {
        assert_eq!(s.b.order(id).await.invoices.len(), 1, "order {id}");
    }
}

#[tokio::test]
async fn api_error_is_clear_and_leaves_the_checkpoint() {
    let s = setup(100).await;
    let payments = three_orders_and_payments(&s).await;
    s.api.publish(&[&payments[0]]);
    let tenant = s
        .ingestor
        .config()
        .tenant("stripe", TENANT)
        .unwrap()
        .clone();

    // A first failure before any checkpoint exists: none is written. A 500 is
    // retried; one on every attempt fails the run and names the call.
    for _ in 0..PAGE_ATTEMPTS {
        s.api.fail_next(500);
    }
    let err = s
        .reconciler
        .reconcile_tenant(&tenant, None)
        .await
        .expect_err("a 500 on every attempt fails the run");
    assert!(matches!(err, ReconcileError::Page { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("500"), "{text}");
    assert!(text.starts_with("GET "), "{text}");
    assert!(text.contains("/v1/events (page 1)"), "{text}");
    assert!(
        text.contains(&format!("after {PAGE_ATTEMPTS} attempts")),
        "{text}"
    );
    assert!(!text.contains(API_KEY), "{text}");
    assert_eq!(stored_checkpoint(&s.b).await, None);
    assert!(s
        .b
        .items()
        .await
        .iter()
        .all(|i| i.source == Source::Webhook));

    // A successful run sets it; a later failure does not move it.
    s.reconciler
        .reconcile_tenant(&tenant, None)
        .await
        .expect("ok");
    let checkpoint = stored_checkpoint(&s.b).await.expect("checkpoint");
    s.api.publish(&[&payments[1], &payments[2]]);
    for _ in 0..PAGE_ATTEMPTS {
        s.api.fail_next(503);
    }
    let reports = s.reconciler.run(&stripe_only()).await.expect("run");
    let r = &reports[0];
    assert_eq!(r.checkpoint, None);
    let error = r.error.as_deref().expect("error reported");
    assert!(error.contains("503"), "{error}");
    assert_eq!(stored_checkpoint(&s.b).await, Some(checkpoint));
}

#[tokio::test]
async fn shopify_order_version_never_delivered_is_ingested_once() {
    let s = setup(100).await;
    let p = s.b.processor(300);
    let now = einmal::time::now_secs();
    // Both orders were created four days ago (outside the first run's 3-day window)
    // and delivered as `orders/create` webhooks.
    let created = now - 4 * 86_400;
    for id in [4001u64, 4002] {
        let create = orders_create(id, created, &ITEMS, TOTAL, "pending");
        assert!(!s.b.send(&s.ingestor, &create).await);
    }
    drain(&s.b, &p).await;
    assert_eq!(
        s.b.order("4002").await.shopify_updated_at,
        Some(utc(created))
    );
    // The shop lists both; 4002 was updated (paid) an hour ago and that
    // `orders/updated` webhook never came.
    let updated = now - 3_600;
    s.api.publish_orders(vec![
        order_body(4001, created, &ITEMS, TOTAL, "pending"),
        order_body(4002, updated, &ITEMS, TOTAL, "paid"),
    ]);
    let items_before = s.b.items().await.len();

    let reports = s
        .reconciler
        .run_with(&shopify_only(), Some(s.b.state.as_ref()))
        .await
        .expect("run");
    assert_eq!(reports.len(), 1, "{reports:?}");
    let r = &reports[0];
    assert_eq!(r.error, None);
    assert_eq!(
        (r.fetched, r.already_present, r.ingested),
        (1, 0, 1),
        "{r:?}"
    );
    let queries = s.api.queries();
    assert_eq!(queries.len(), 1, "{queries:?}");
    assert!(queries[0].contains("updated_at_min="), "{}", queries[0]);
    assert!(queries[0].contains("status=any"), "{}", queries[0]);
    let expected_key = InboxKey::new(
        "shopify",
        TENANT,
        &shopify_event_id(scenario::SHOP, "4002", &shop_time(updated)),
    );
    assert_eq!(r.ingested_events, vec![expected_key.as_str().to_owned()]);
    let items = s.b.items().await;
    assert_eq!(items.len(), items_before + 1, "exactly one new inbox item");
    let reconciled: Vec<_> = items
        .iter()
        .filter(|i| i.source == Source::Reconcile)
        .collect();
    assert_eq!(reconciled.len(), 1);
    assert_eq!(reconciled[0].key, expected_key);
    // Shopify says paid; we just ingested the version that says so.
    assert_eq!(
        r.differences,
        vec![Difference {
            provider: "shopify".into(),
            tenant: TENANT.into(),
            object_id: "4002".into(),
            order_id: "4002".into(),
            provider_status: "paid".into(),
            our_status: PENDING_PROCESSING.into(),
        }]
    );

    let handled = drain(&s.b, &p).await;
    assert_eq!(handled.len(), 1, "{handled:?}");
    assert_eq!(
        s.b.order("4002").await.shopify_updated_at,
        Some(utc(updated))
    );
    assert_eq!(
        s.b.order("4001").await.shopify_updated_at,
        Some(utc(created))
    );
    let state_after_first = s.b.business_state().await;

    // Again: the same version is present; nothing ingested, nothing applied.
    let reports = s
        .reconciler
        .run_with(&shopify_only(), Some(s.b.state.as_ref()))
        .await
        .expect("second run");
    let r = &reports[0];
    assert_eq!(r.error, None);
    assert_eq!(
        (r.fetched, r.already_present, r.ingested),
        (1, 1, 0),
        "{r:?}"
    );
    assert!(r.ingested_events.is_empty());
    let handled = drain(&s.b, &p).await;
    assert!(handled.is_empty(), "nothing enqueued: {handled:?}");
    assert_eq!(s.b.items().await.len(), items_before + 1);
    assert_eq!(s.b.business_state().await, state_after_first);
    // `orders/updated` carries no payment: until `orders/paid` arrives, the order is
    // still unpaid here, and the report says so.
    let ours = s.b.order("4002").await;
    assert!(!ours.is_paid());
    assert_eq!(r.differences.len(), 1, "{:?}", r.differences);
    assert_eq!(r.differences[0].our_status, "pending");
}

#[tokio::test]
async fn paid_at_stripe_but_not_here_is_a_difference_until_processed() {
    let s = setup(100).await;
    let p = s.b.processor(300);
    let payments = three_orders_and_payments(&s).await;
    for e in &payments[..2] {
        assert!(!s.b.send(&s.ingestor, e).await);
    }
    drain(&s.b, &p).await;
    s.api.publish(&payments.iter().collect::<Vec<_>>());

    let options = stripe_only();
    let reports = s
        .reconciler
        .run_with(&options, Some(s.b.state.as_ref()))
        .await
        .expect("run");
    let r = &reports[0];
    assert_eq!(r.ingested, 1, "{r:?}");
    assert_eq!(
        r.differences,
        vec![Difference {
            provider: "stripe".into(),
            tenant: TENANT.into(),
            object_id: "pi_r3".into(),
            order_id: "3003".into(),
            provider_status: "succeeded".into(),
            our_status: PENDING_PROCESSING.into(),
        }]
    );
    let audit = audit_record("ops", "scheduled", &options, &reports, 1_700_000_000_000);
    assert_eq!(audit.action, "reconcile");
    assert_eq!(
        audit.events,
        vec![payments[2].inbox_key().as_str().to_owned()]
    );
    assert_eq!(audit.selector["provider"], json!("stripe"));
    assert_eq!(audit.result["ingested"], json!(1));
    assert_eq!(audit.result["differences"], json!(1));

    drain(&s.b, &p).await;
    assert!(s.b.order("3003").await.is_paid());
    // Without the business store no differences are computed.
    let reports = s.reconciler.run(&options).await.expect("run without");
    assert!(reports[0].differences.is_empty());
    let reports = s
        .reconciler
        .run_with(&options, Some(s.b.state.as_ref()))
        .await
        .expect("second run");
    assert_eq!(reports[0].ingested, 0);
    assert!(
        reports[0].differences.is_empty(),
        "{:?}",
        reports[0].differences
    );
}

/// The queue of a fast processor: every send is processed at once (the processor
/// Lambda runs within milliseconds of the send), so an event the reconciler ingests is
/// applied before the run goes on.
struct ProcessedAtOnce {
    inner: Arc<dyn Queue>,
    processor: Processor,
}

impl ProcessedAtOnce {
    async fn process(&self) {
        loop {
            let batch = self
                .inner
                .receive(10, Duration::from_secs(30))
                .await
                .expect("receive");
            if batch.is_empty() {
                return;
            }
            scenario::settle_all(&self.processor, &batch, "fast").await;
        }
    }
}

#[async_trait::async_trait]
impl Queue for ProcessedAtOnce {
    async fn send(&self, message: &QueueMessage) -> Result<(), QueueError> {
        self.inner.send(message).await?;
        self.process().await;
        Ok(())
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

/// The difference a run repairs is reported even when the processor applies the
/// ingested event before the report is built: the business is read before the
/// ingest (README: "The report lists differences"), on both backends.
async fn repaired_difference_scenario(kind: Kind) {
    let s = setup_on(kind, 100).await;
    let p = s.b.processor(300);
    let payments = three_orders_and_payments(&s).await;
    for e in &payments[..2] {
        assert!(!s.b.send(&s.ingestor, e).await);
    }
    drain(&s.b, &p).await;
    s.api.publish(&payments.iter().collect::<Vec<_>>());
    let fast = Arc::new(ProcessedAtOnce {
        inner: s.b.queue.clone(),
        processor: s.b.processor(300),
    });
    let ingestor = Arc::new(Ingestor::new(config(&s.api.base), s.b.inbox.clone(), fast));
    let reconciler = Reconciler::new(
        ingestor,
        s.b.state.clone(),
        Arc::new(ReferenceDomain),
        einmal::https::HttpsClient::new(),
    )
    .with_page_timing(Duration::from_secs(1), Duration::from_millis(20));
    let business = s.b.state.as_ref();

    let options = stripe_only();
    let reports = reconciler
        .run_with(&options, Some(business))
        .await
        .expect("run");
    let r = &reports[0];
    assert_eq!(r.ingested, 1, "{r:?}");
    // Repaired during the run: the order is paid now, and the run says what it fixed.
    assert!(s.b.order("3003").await.is_paid());
    let repaired = Difference {
        provider: "stripe".into(),
        tenant: TENANT.into(),
        object_id: "pi_r3".into(),
        order_id: "3003".into(),
        provider_status: "succeeded".into(),
        our_status: PENDING_PROCESSING.into(),
    };
    assert_eq!(r.differences, vec![repaired.clone()], "{}", s.b.name);
    let audit = audit_record("ops", "scheduled", &options, &reports, 1_700_000_000_000);
    assert_eq!(audit.result["differences"], json!(1));
    assert_eq!(
        audit.result["difference_list"][0]["order_id"],
        json!("3003"),
        "{}",
        audit.result
    );
    // Nothing left to repair on the next run.
    let reports = reconciler
        .run_with(&options, Some(business))
        .await
        .expect("second run");
    assert_eq!(reports[0].ingested, 0);
    assert!(
        reports[0].differences.is_empty(),
        "{:?}",
        reports[0].differences
    );
}

#[tokio::test]
async fn a_difference_repaired_during_the_run_is_reported() {
    repaired_difference_scenario(Kind::Embedded).await;
}

#[tokio::test]
async fn a_difference_repaired_during_the_run_is_reported_on_moto() {
    repaired_difference_scenario(Kind::Aws).await;
}

trait Created {
    fn body_created(&self) -> i64;
}

impl Created for Event {
    fn body_created(&self) -> i64 {
        let body: Value = serde_json::from_slice(&self.body).expect("body");
        body["created"].as_i64().expect("created")
    }
}

// ---------------------------------------------------------------------------
// Shopify orders never delivered: created from the listed snapshot

#[tokio::test]
async fn shopify_order_never_created_by_webhook_is_created_once() {
    never_created_scenario(Kind::Embedded).await;
}

#[tokio::test]
async fn shopify_order_never_created_by_webhook_is_created_once_on_moto() {
    never_created_scenario(Kind::Aws).await;
}

/// Three orders the shop lists (paid) whose `orders/create` we never processed:
/// 5001 never comes as a webhook; 5002's real create arrives after the reconciled
/// one was applied; 5003's real create is applied between the run and the
/// processing of what it ingested. Each ends as one order, paid once, stock reserved
/// once, nothing dead-lettered.
async fn never_created_scenario(kind: Kind) {
    let s = setup_on(kind, 100).await;
    let p = s.b.processor(300);
    let now = einmal::time::now_secs();
    let created = now - 7_200;
    let updated = now - 3_600;
    let ids = [5001u64, 5002, 5003];
    s.api.publish_orders(
        ids.iter()
            .map(|id| order_body(*id, updated, &ITEMS, TOTAL, "paid"))
            .collect(),
    );

    let reports = s
        .reconciler
        .run_with(&shopify_only(), Some(s.b.state.as_ref()))
        .await
        .expect("run");
    let r = &reports[0];
    assert_eq!(r.error, None, "{r:?}");
    // Per order: a synthesized orders/create (the business does not know the order)
    // and the version as orders/updated.
    assert_eq!(
        (r.fetched, r.already_present, r.ingested),
        (6, 0, 6),
        "{r:?}"
    );
    for id in ids {
        let create = InboxKey::new(
            "shopify",
            TENANT,
            &shopify_create_event_id(scenario::SHOP, &id.to_string()),
        );
        assert!(
            r.ingested_events.contains(&create.as_str().to_owned()),
            "{id}: {:?}",
            r.ingested_events
        );
    }
    // 5003: the real create is applied before the reconciled events are processed
    // (they are held back meanwhile).
    let held = s.b.receive_all(Duration::from_secs(60)).await;
    assert_eq!(held.len(), 6);
    let real_5003 = orders_create(5003, created, &ITEMS, TOTAL, "paid");
    assert!(!s.b.send(&s.ingestor, &real_5003).await);
    let handled = scenario::step(&s.b, &p, "w").await;
    assert_eq!(handled.len(), 1, "{handled:?}");
    assert_eq!(handled[0].key, real_5003.inbox_key());
    assert_eq!(
        s.b.order("5003").await.shopify_updated_at,
        Some(utc(created))
    );
    for d in &held {
        s.b.queue
            .change_visibility(&d.receipt, Duration::ZERO)
            .await
            .expect("visible again");
    }
    drain(&s.b, &p).await;
    // 5002: its real create comes late, after the reconciled one was applied.
    let real_5002 = orders_create(5002, created, &ITEMS, TOTAL, "paid");
    assert!(!s.b.send(&s.ingestor, &real_5002).await);
    drain(&s.b, &p).await;

    assert!(s.b.dead_letters().await.is_empty());
    for id in ids {
        let o = s.b.order(&id.to_string()).await;
        assert!(o.shopify_created, "{id}");
        assert_eq!(
            o.shopify_updated_at,
            Some(utc(updated)),
            "{id}: newest version"
        );
        assert_eq!(o.stock_reserved.len(), 1, "{id}");
        assert_eq!(o.stock_reserved[0].quantity, 1, "{id}");
        assert_eq!((o.invoices.len(), o.paid_minor()), (1, TOTAL), "{id}");
    }
    assert_eq!(
        s.b.on_hand("RED-M").await,
        100 - 3,
        "stock reserved once per order"
    );
    let state_after_first = s.b.business_state().await;

    // Again: the orders are known now; only their versions are listed, all present.
    let reports = s
        .reconciler
        .run_with(&shopify_only(), Some(s.b.state.as_ref()))
        .await
        .expect("second run");
    let r = &reports[0];
    assert_eq!(r.error, None);
    assert_eq!(
        (r.fetched, r.already_present, r.ingested),
        (3, 3, 0),
        "{r:?}"
    );
    assert!(drain(&s.b, &p).await.is_empty());
    assert_eq!(s.b.business_state().await, state_after_first);
}

// ---------------------------------------------------------------------------
// Pages not read fail the run

#[tokio::test]
async fn unread_pages_fail_the_run_and_keep_the_checkpoint() {
    unread_pages_scenario(Kind::Embedded).await;
}

#[tokio::test]
async fn unread_pages_fail_the_run_and_keep_the_checkpoint_on_moto() {
    unread_pages_scenario(Kind::Aws).await;
}

async fn shopify_checkpoint(b: &Backend) -> Option<i64> {
    let record = b
        .record(&StateKey::new(TENANT, "checkpoint", "shopify"))
        .await;
    record.data.get("since").and_then(Value::as_i64)
}

/// Five listed orders in pages of two. A `next` link to another host after page 1,
/// a 401, and a 5xx on every attempt each fail the run, name the call, and keep the
/// checkpoint; a 5xx or a hung page that recovers within the attempts is retried and
/// the run reads every page.
async fn unread_pages_scenario(kind: Kind) {
    let s = setup_on(kind, 100).await;
    let p = s.b.processor(300);
    let now = einmal::time::now_secs();
    let ids = [5101u64, 5102, 5103, 5104, 5105];
    s.api.publish_orders(
        ids.iter()
            .enumerate()
            .map(|(i, id)| order_body(*id, now - 3_600 + i as i64, &ITEMS, TOTAL, "paid"))
            .collect(),
    );
    let tenant = s
        .ingestor
        .config()
        .tenant("shopify", TENANT)
        .unwrap()
        .clone();

    // Page 1 links to another host: not followed, and the run fails.
    s.api.page_orders(2, Some(1));
    let reports = s
        .reconciler
        .run_with(&shopify_only(), Some(s.b.state.as_ref()))
        .await
        .expect("run");
    let r = &reports[0];
    let error = r.error.as_deref().expect("the run fails");
    assert!(error.starts_with("GET "), "{error}");
    assert!(
        error.contains("/admin/api/2024-10/orders.json (page 1)"),
        "{error}"
    );
    assert!(
        error.contains("another host (http://elsewhere.example"),
        "{error}"
    );
    assert_eq!(r.checkpoint, None);
    assert_eq!(shopify_checkpoint(&s.b).await, None, "no checkpoint stored");
    let json = serde_json::to_value(r).expect("report serializes");
    assert_eq!(json["error"], json!(error));
    let queries = s.api.queries().len();
    assert_eq!(queries, 1, "the foreign page was not asked for");

    // Bad credentials: the message says which option to fix.
    s.api.page_orders(2, None);
    let mut bad = tenant.clone();
    bad.options
        .insert("access_token".into(), "shpat_wrong".into());
    let err = s
        .reconciler
        .reconcile_tenant(&bad, None)
        .await
        .expect_err("401 fails the run");
    let text = err.to_string();
    assert!(text.contains("answered 401"), "{text}");
    assert!(text.contains("tenant option `access_token`"), "{text}");
    assert!(!text.contains("shpat_wrong"), "{text}");

    // A complete run stores a checkpoint.
    s.reconciler
        .run_with(&shopify_only(), Some(s.b.state.as_ref()))
        .await
        .expect("complete run");
    let checkpoint = shopify_checkpoint(&s.b).await.expect("checkpoint");
    drain(&s.b, &p).await;
    // Newer versions of every order, so the next runs read all pages again.
    s.api.publish_orders(
        ids.iter()
            .enumerate()
            .map(|(i, id)| order_body(*id, now - 60 + i as i64, &ITEMS, TOTAL, "paid"))
            .collect(),
    );

    // Page 2 answers 503 on every attempt: the run fails after the retries.
    s.api.fault_page(2, 503, PAGE_ATTEMPTS as usize);
    let reports = s
        .reconciler
        .run_with(&shopify_only(), Some(s.b.state.as_ref()))
        .await
        .expect("run");
    let r = &reports[0];
    let error = r.error.as_deref().expect("the run fails");
    assert!(error.contains("orders.json (page 2)"), "{error}");
    assert!(error.contains("503"), "{error}");
    assert!(
        error.contains(&format!("after {PAGE_ATTEMPTS} attempts")),
        "{error}"
    );
    assert_eq!(
        shopify_checkpoint(&s.b).await,
        Some(checkpoint),
        "checkpoint kept"
    );

    // Failures that recover within the attempts: a hung page 1 (timed out), a 500
    // and a 502 on page 3 are retried, and the run reads every page.
    s.api.fault_page(1, 0, 1);
    s.api.fault_page(3, 500, 1);
    s.api.fault_page(3, 502, 1);
    let reports = s
        .reconciler
        .run_with(&shopify_only(), Some(s.b.state.as_ref()))
        .await
        .expect("run");
    let r = &reports[0];
    assert_eq!(r.error, None, "{r:?}");
    assert_eq!(r.fetched, ids.len(), "{r:?}");
    let moved = shopify_checkpoint(&s.b).await.expect("checkpoint");
    assert!(
        moved > checkpoint,
        "the checkpoint moves after a complete run"
    );
    drain(&s.b, &p).await;
    for id in ids {
        let o = s.b.order(&id.to_string()).await;
        assert_eq!(
            o.shopify_updated_at,
            Some(utc(now - 60 + (id - 5101) as i64))
        );
    }
}
