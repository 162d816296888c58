//! Thin-event providers end to end on the embedded store: Mollie classic (form POST
//! `id=tr_…`), GoPay (GET `?id=`) and Klarna KCO push (empty POST,
//! `?klarna_order_id=`). None of them signs anything: the request is a hint that the
//! path token admits into the inbox, and the processor fetches the authoritative state
//! from the provider's API (a fake API on loopback, whose states the tests change)
//! before any effect.
//!
//! The domain is the reference domain wrapped in a recorder, so each test checks both
//! what reached the domain (the fetched body under the un-prefixed type, never the
//! request) and the business outcome (one invoice / one `#paid` effect per order).
//! Should the reference domain not map a thin type, a tiny stand-in domain that books
//! `#paid` for paid states takes its place (see [`Recorder`]).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use einmal::config::Config;
use einmal::domain::reference::{order_key, Order, ReferenceDomain};
use einmal::domain::state::{StateKey, StateRecord};
use einmal::domain::{Change, Decision, Domain, DomainError, DomainEvent};
use einmal::envelope::InboxKey;
use einmal::lookup::HttpLookup;
use einmal::pipeline::ingest::Ingestor;
use einmal::pipeline::process::{ProcessSettings, Processor};
use einmal::ports::{InboxItem, InboxState};
use einmal::providers;
use einmal::request::WebhookRequest;
use einmal_tests::fake_thin_api::{Credentials, FakeThinApi};
use einmal_tests::scenario::{self, Backend};
use serde_json::{json, Value};

const TENANT: &str = "t1";
const MOLLIE_TOKEN: &str = "mollie-path-token-6f1c2a";
const GOPAY_TOKEN: &str = "gopay-path-token-91bd07";
const KLARNA_TOKEN: &str = "klarna-path-token-3e55aa";
const MOLLIE_KEY: &str = "test_mollie_api_key";
const GOPAY_ACCESS: &str = "gopay-oauth-access-token";
const KLARNA_USER: &str = "PK12345_abcdef";
const KLARNA_PASSWORD: &str = "klarna-secret";
/// 2023-11-14T22:13:20Z, on a minute boundary.
const T0_MS: i64 = 1_700_000_000_000 - 20_000;

// ---------------------------------------------------------------------------
// The fake provider API

fn credentials() -> Credentials {
    Credentials::new(MOLLIE_KEY, GOPAY_ACCESS, KLARNA_USER, KLARNA_PASSWORD)
}

fn mollie_payment(id: &str, status: &str, order: &str) -> Value {
    json!({"resource": "payment", "id": id, "mode": "test", "status": status,
           "amount": {"value": "49.90", "currency": "EUR"},
           "description": "Order", "metadata": {"order_id": order},
           "createdAt": "2023-11-14T22:10:00+00:00"})
}

fn gopay_payment(id: u64, state: &str, order: &str) -> Value {
    json!({"id": id, "order_number": order, "state": state, "amount": 4990,
           "currency": "CZK", "payer": {"contact": {"email": "x@example.com"}}})
}

fn klarna_order(id: &str, status: &str, order: &str) -> Value {
    json!({"order_id": id, "status": status, "fraud_status": "ACCEPTED",
           "merchant_reference1": order, "order_amount": 4990,
           "purchase_currency": "SEK"})
}

// ---------------------------------------------------------------------------
// A recording domain

/// Records what reached the domain, then delegates: to the reference domain when it
/// maps the type, else to a stand-in that books `{order}#paid` once for a paid state.
struct Recorder {
    seen: Mutex<Vec<(String, String, Value)>>,
}

const STAND_IN: &str = "thin-test-order";

fn uses_reference(provider: &str, event_type: &str) -> bool {
    ReferenceDomain::supports(provider, event_type)
}

/// The stand-in's reading of a fetched state: (order id, paid?).
fn stand_in_fact(provider: &str, body: &Value) -> Option<(String, bool)> {
    let (order, status) = match provider {
        "mollie" => (&body["metadata"]["order_id"], &body["status"]),
        "gopay" => (&body["order_number"], &body["state"]),
        _ => (&body["merchant_reference1"], &body["status"]),
    };
    let paid = matches!(status.as_str(), Some("paid" | "PAID" | "CAPTURED"));
    Some((order.as_str()?.to_string(), paid))
}

impl Recorder {
    fn seen(&self) -> Vec<(String, String, Value)> {
        self.seen.lock().unwrap().clone()
    }
}

impl Domain for Recorder {
    fn targets(&self, event: &DomainEvent<'_>) -> Result<Vec<StateKey>, DomainError> {
        let env = event.envelope;
        if uses_reference(&env.provider, &env.event_type) {
            return ReferenceDomain.targets(event);
        }
        let body: Value = serde_json::from_slice(event.body)
            .map_err(|e| DomainError::Permanent(format!("not JSON: {e}")))?;
        Ok(match stand_in_fact(&env.provider, &body) {
            Some((order, true)) => vec![StateKey::new(&env.tenant, STAND_IN, order)],
            _ => Vec::new(),
        })
    }

    fn decide(
        &self,
        event: &DomainEvent<'_>,
        current: &[StateRecord],
    ) -> Result<Decision, DomainError> {
        let env = event.envelope;
        let body: Value = serde_json::from_slice(event.body)
            .map_err(|e| DomainError::Permanent(format!("not JSON: {e}")))?;
        self.seen.lock().unwrap().push((
            env.provider.clone(),
            env.event_type.clone(),
            body.clone(),
        ));
        if uses_reference(&env.provider, &env.event_type) {
            return ReferenceDomain.decide(event, current);
        }
        match (stand_in_fact(&env.provider, &body), current) {
            (Some((order, true)), [record]) => Ok(Decision::Apply {
                changes: vec![Change {
                    key: record.key.clone(),
                    effect_key: format!("{}#{order}#paid", env.tenant),
                    data: json!({"order_id": order, "paid": true}),
                    keyed_on: None,
                }],
                result: format!("order {order} paid"),
            }),
            _ => Ok(Decision::Ignore {
                reason: "not paid".into(),
            }),
        }
    }
}

// ---------------------------------------------------------------------------
// The harness

struct Harness {
    b: Backend,
    api: FakeThinApi,
    clock: Arc<AtomicI64>,
    ingestor: Ingestor,
    processor: Processor,
    recorder: Arc<Recorder>,
}

fn config_toml(api_base: &str) -> String {
    format!(
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
provider = "gopay"
tenant = "no-token"
options = {{ access_token = "{GOPAY_ACCESS}", api_base = "{api_base}" }}

[[tenant]]
provider = "klarna-push"
tenant = "{TENANT}"
options = {{ path_token = "{KLARNA_TOKEN}", api_username = "{KLARNA_USER}", api_password = "{KLARNA_PASSWORD}", api_base = "{api_base}/" }}
"#
    )
}

impl Harness {
    async fn new() -> Harness {
        Self::with_horizon(None).await
    }

    /// The events are received at the harness clock's time (2023) while the processor
    /// runs on the real one: by default every event is past its retry horizon, and a
    /// transient failure ends it. `horizon` overrides that.
    async fn with_horizon(horizon: Option<i64>) -> Harness {
        let api = FakeThinApi::start(credentials()).await;
        let config = Arc::new(Config::from_toml(&config_toml(&api.base)).expect("config"));
        let b = scenario::embedded(4).await;
        let clock = Arc::new(AtomicI64::new(T0_MS));
        let now = clock.clone();
        let ingestor = Ingestor::new(config.clone(), b.inbox.clone(), b.queue.clone())
            .with_clock(move || now.load(Ordering::SeqCst));
        let recorder = Arc::new(Recorder {
            seen: Mutex::new(Vec::new()),
        });
        let lookup = HttpLookup::new();
        let processor = Processor::new(
            b.inbox.clone(),
            b.processing.clone(),
            b.queue.clone(),
            b.state.clone(),
            recorder.clone(),
        )
        .with_settings(ProcessSettings {
            retry_horizon_ms: horizon,
            ..scenario::settings(5_000, b.max_receive_count)
        })
        .with_jitter(|| 1.0)
        .with_lookup(Arc::new(lookup), config);
        Harness {
            b,
            api,
            clock,
            ingestor,
            processor,
            recorder,
        }
    }

    fn advance_secs(&self, secs: i64) {
        self.clock.fetch_add(secs * 1000, Ordering::SeqCst);
    }

    fn minute(&self) -> i64 {
        self.clock.load(Ordering::SeqCst) / 1000 / 60
    }

    async fn ingest(&self, provider: &str, request: &WebhookRequest) -> (u16, Value) {
        let r = self.ingestor.ingest(provider, TENANT, request).await;
        (r.status, r.body)
    }

    /// Ingest, expect 200, return `duplicate`.
    async fn hint(&self, provider: &str, request: &WebhookRequest) -> bool {
        let (status, body) = self.ingest(provider, request).await;
        assert_eq!(status, 200, "{provider}: {body}");
        body["duplicate"] == json!(true)
    }

    async fn drain(&self) {
        scenario::drain(&self.b, &self.processor).await;
    }

    async fn item(&self, provider: &str, id: &str, minute: i64) -> InboxItem {
        let key = InboxKey::new(provider, TENANT, &format!("{id}:hint:{minute}"));
        self.b
            .inbox
            .get(&key)
            .await
            .expect("inbox get")
            .unwrap_or_else(|| panic!("no inbox item {key}"))
    }

    /// How many times the order was paid: invoices (reference domain) or `#paid`
    /// effects (stand-in), cross-checked against the record's applied effect keys.
    async fn paid_effects(&self, provider: &str, kind: &str, order: &str) -> usize {
        let key = if uses_reference(provider, kind) {
            order_key(TENANT, order)
        } else {
            StateKey::new(TENANT, STAND_IN, order)
        };
        let record = self.b.record(&key).await;
        if !record.exists() {
            return 0;
        }
        let applied = record
            .applied
            .iter()
            .filter(|k| k.ends_with("#paid"))
            .count();
        if uses_reference(provider, kind) {
            let o: Order = serde_json::from_value(record.data).expect("order data");
            assert_eq!(o.invoices.len(), applied, "one invoice per #paid effect");
        }
        applied
    }
}

fn mollie_hint(id: &str, token: Option<&str>) -> WebhookRequest {
    let mut tenant = einmal::config::TenantConfig {
        provider: "mollie".into(),
        tenant: TENANT.into(),
        secrets: vec![],
        tolerance_secs: 300,
        options: Default::default(),
    };
    tenant
        .options
        .insert("path_token".into(), MOLLIE_TOKEN.into());
    let (headers, body) = providers::lookup("mollie")
        .unwrap()
        .signed_request(b"", &tenant, id, 0)
        .expect("classic mollie request");
    let mut r = WebhookRequest::post(headers, body);
    r.path_token = token.map(str::to_string);
    r
}

fn gopay_hint(id: u64, token: Option<&str>) -> WebhookRequest {
    WebhookRequest {
        method: http::Method::GET,
        headers: http::HeaderMap::new(),
        query: Some(format!("id={id}")),
        body: Default::default(),
        path_token: token.map(str::to_string),
    }
}

fn klarna_hint(id: &str, token: Option<&str>) -> WebhookRequest {
    let mut r = WebhookRequest::post(http::HeaderMap::new(), "");
    r.query = Some(format!("klarna_order_id={id}"));
    r.path_token = token.map(str::to_string);
    r
}

// ---------------------------------------------------------------------------
// (a) authentication of the URL

#[tokio::test]
async fn wrong_or_missing_path_token_is_401_and_stores_nothing() {
    let h = Harness::new().await;
    h.api.set(
        "/v2/payments/tr_a1",
        mollie_payment("tr_a1", "paid", "o-a1"),
    );
    let cases: Vec<(&str, &str, WebhookRequest)> = vec![
        ("mollie", TENANT, mollie_hint("tr_a1", None)),
        ("mollie", TENANT, mollie_hint("tr_a1", Some("wrong"))),
        ("mollie", TENANT, mollie_hint("tr_a1", Some(GOPAY_TOKEN))),
        ("gopay", TENANT, gopay_hint(1, None)),
        ("gopay", TENANT, gopay_hint(1, Some(MOLLIE_TOKEN))),
        // A tenant without a configured token never opens its endpoint.
        ("gopay", "no-token", gopay_hint(1, Some(GOPAY_TOKEN))),
        ("gopay", "no-token", gopay_hint(1, None)),
        ("klarna-push", TENANT, klarna_hint("k-1", None)),
        ("klarna-push", TENANT, klarna_hint("k-1", Some("x"))),
    ];
    for (provider, tenant, request) in &cases {
        let r = h.ingestor.ingest(provider, tenant, request).await;
        assert_eq!(r.status, 401, "{provider}/{tenant}: {}", r.body);
        assert_eq!(r.body["error"], "invalid_signature");
    }
    // GoPay delivers with GET only; Mollie and Klarna with POST only.
    let mut post = gopay_hint(1, Some(GOPAY_TOKEN));
    post.method = http::Method::POST;
    assert_eq!(h.ingest("gopay", &post).await.0, 405);
    let mut get = klarna_hint("k-1", Some(KLARNA_TOKEN));
    get.method = http::Method::GET;
    assert_eq!(h.ingest("klarna-push", &get).await.0, 405);
    // Authentic but malformed: 400, nothing stored either.
    let r = h
        .ingest("mollie", &mollie_hint("ord_1", Some(MOLLIE_TOKEN)))
        .await;
    assert_eq!(r.0, 400, "{}", r.1);

    assert!(h.b.items().await.is_empty(), "nothing stored");
    assert!(h
        .b
        .receive_all(std::time::Duration::from_secs(1))
        .await
        .is_empty());
    assert_eq!(h.api.total_calls(), 0, "no lookup for refused requests");
    assert_eq!(h.ingestor.metrics().snapshot().signature_failures, 9);
}

// ---------------------------------------------------------------------------
// (b) Mollie classic

#[tokio::test]
async fn mollie_forged_hint_changes_nothing_then_one_paid_effect() {
    let h = Harness::new().await;
    let (id, order, path) = ("tr_WDqYK6vllg", "m-1001", "/v2/payments/tr_WDqYK6vllg");
    h.api.set(path, mollie_payment(id, "open", order));

    // A forged "it's paid!" hint: the fetched state says open.
    let m0 = h.minute();
    assert!(!h.hint("mollie", &mollie_hint(id, Some(MOLLIE_TOKEN))).await);
    // The forger retries at once: same minute, deduplicated.
    assert!(h.hint("mollie", &mollie_hint(id, Some(MOLLIE_TOKEN))).await);
    h.drain().await;
    let item = h.item("mollie", id, m0).await;
    assert_eq!(item.state, InboxState::Ignored, "{:?}", item.result);
    assert_eq!(item.envelope.event_type, "hint.payment");
    assert_eq!(h.paid_effects("mollie", "payment", order).await, 0);
    assert_eq!(h.api.calls(path), 1);
    // The domain saw the fetched payment under `payment`, not the form body.
    let seen = h.recorder.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0],
        (
            "mollie".into(),
            "payment".into(),
            mollie_payment(id, "open", order)
        )
    );

    // The customer pays; Mollie calls again a minute later.
    h.api.set(path, mollie_payment(id, "paid", order));
    h.advance_secs(60);
    let m1 = h.minute();
    assert!(!h.hint("mollie", &mollie_hint(id, Some(MOLLIE_TOKEN))).await);
    h.drain().await;
    let item = h.item("mollie", id, m1).await;
    assert_eq!(item.state, InboxState::Completed, "{:?}", item.last_error);
    assert_eq!(h.paid_effects("mollie", "payment", order).await, 1);
    if uses_reference("mollie", "payment") {
        let o = h.b.order(order).await;
        assert_eq!(o.invoices.len(), 1);
        assert_eq!(o.invoices[0].amount_minor, 4990);
    }

    // Repeats: the same minute is a duplicate; a later one is a new hint whose
    // fetched state is still paid, and no second effect follows.
    assert!(h.hint("mollie", &mollie_hint(id, Some(MOLLIE_TOKEN))).await);
    h.advance_secs(90);
    let m2 = h.minute();
    assert!(!h.hint("mollie", &mollie_hint(id, Some(MOLLIE_TOKEN))).await);
    h.drain().await;
    let item = h.item("mollie", id, m2).await;
    assert!(
        matches!(item.state, InboxState::Completed | InboxState::Ignored),
        "{:?} {:?}",
        item.state,
        item.last_error
    );
    assert_eq!(h.paid_effects("mollie", "payment", order).await, 1);
    assert_eq!(h.b.items().await.len(), 3);
    assert_eq!(h.api.calls(path), 3);
}

// ---------------------------------------------------------------------------
// (c) GoPay

#[tokio::test]
async fn gopay_get_hint_is_fetched_and_paid_once() {
    let h = Harness::new().await;
    let (id, order) = (3_000_006_529u64, "g-2002");
    let path = format!("/api/payments/payment/{id}");
    h.api.set(&path, gopay_payment(id, "CREATED", order));

    let m0 = h.minute();
    assert!(!h.hint("gopay", &gopay_hint(id, Some(GOPAY_TOKEN))).await);
    h.drain().await;
    assert_eq!(
        h.item("gopay", &id.to_string(), m0).await.state,
        InboxState::Ignored
    );
    assert_eq!(h.paid_effects("gopay", "payment", order).await, 0);

    h.api.set(&path, gopay_payment(id, "PAID", order));
    h.advance_secs(60);
    let m1 = h.minute();
    assert!(!h.hint("gopay", &gopay_hint(id, Some(GOPAY_TOKEN))).await);
    // GoPay retries until it gets a 200: the same minute deduplicates.
    assert!(h.hint("gopay", &gopay_hint(id, Some(GOPAY_TOKEN))).await);
    h.drain().await;
    assert_eq!(
        h.item("gopay", &id.to_string(), m1).await.state,
        InboxState::Completed
    );
    assert_eq!(h.paid_effects("gopay", "payment", order).await, 1);

    h.advance_secs(300);
    assert!(!h.hint("gopay", &gopay_hint(id, Some(GOPAY_TOKEN))).await);
    h.drain().await;
    assert_eq!(h.paid_effects("gopay", "payment", order).await, 1);
    assert_eq!(h.api.calls(&path), 3);
    let seen = h.recorder.seen();
    assert!(seen
        .iter()
        .all(|(p, t, body)| p == "gopay" && t == "payment" && body["id"] == json!(id)));
}

// ---------------------------------------------------------------------------
// (d) Klarna KCO push

#[tokio::test]
async fn klarna_push_is_fetched_from_order_management_and_paid_once() {
    let h = Harness::new().await;
    let (id, order) = ("f3392f8b-6116-4073-ab96-e330819e2c07", "k-3003");
    let path = format!("/ordermanagement/v1/orders/{id}");
    h.api.set(&path, klarna_order(id, "CAPTURED", order));

    let m0 = h.minute();
    assert!(
        !h.hint("klarna-push", &klarna_hint(id, Some(KLARNA_TOKEN)))
            .await
    );
    h.drain().await;
    let item = h.item("klarna-push", id, m0).await;
    assert_eq!(item.state, InboxState::Completed, "{:?}", item.last_error);
    assert_eq!(item.envelope.event_type, "hint.order");
    assert_eq!(h.paid_effects("klarna-push", "order", order).await, 1);

    // Klarna pushes until acknowledged: later pushes change nothing.
    for _ in 0..3 {
        h.advance_secs(120);
        assert!(
            !h.hint("klarna-push", &klarna_hint(id, Some(KLARNA_TOKEN)))
                .await
        );
    }
    h.drain().await;
    assert_eq!(h.paid_effects("klarna-push", "order", order).await, 1);
    assert_eq!(h.api.calls(&path), 4);
    let seen = h.recorder.seen();
    assert_eq!(seen.len(), 4);
    assert!(seen
        .iter()
        .all(|(p, t, b)| p == "klarna-push" && t == "order" && b["order_id"] == json!(id)));
}

// ---------------------------------------------------------------------------
// (e) lookup failures

#[tokio::test]
async fn api_5xx_retries_then_applies_and_404_dead_letters() {
    // Retried for as long as the events live (the last part shows the horizon's end).
    let h = Harness::with_horizon(Some(i64::MAX / 4)).await;
    let (id, order, path) = ("tr_flaky01", "m-4004", "/v2/payments/tr_flaky01");
    h.api.set(path, mollie_payment(id, "paid", order));
    h.api.fail_next(path, &[500, 503]);

    let m0 = h.minute();
    assert!(!h.hint("mollie", &mollie_hint(id, Some(MOLLIE_TOKEN))).await);
    h.drain().await;
    let item = h.item("mollie", id, m0).await;
    assert_eq!(item.state, InboxState::Completed, "{:?}", item.last_error);
    // Two transient failures, then applied (a lease that ran out on a slow machine may
    // add an attempt and a lookup; the effect stays single).
    assert!(item.attempts >= 3, "{}", item.attempts);
    assert!(h.api.calls(path) >= 3);
    assert_eq!(h.paid_effects("mollie", "payment", order).await, 1);

    // An id the provider does not know (a forgery, or another account's): 404.
    let ghost = "tr_doesnotexist";
    assert!(
        !h.hint("mollie", &mollie_hint(ghost, Some(MOLLIE_TOKEN)))
            .await
    );
    h.drain().await;
    let item = h.item("mollie", ghost, m0).await;
    assert_eq!(item.state, InboxState::DeadLetter);
    assert_eq!(item.attempts, 1, "permanent: no retry");
    let error = item.last_error.unwrap_or_default();
    assert!(error.contains("404"), "{error}");
    assert!(!error.contains(MOLLIE_KEY), "no credential in errors");
    let key = InboxKey::new("mollie", TENANT, &format!("{ghost}:hint:{m0}"));
    assert!(h.b.dead_letters().await.contains(&key));

    // A 5xx of an event past its retry horizon ends it (here every event is: the
    // harness receives them in 2023).
    let h = Harness::new().await;
    let m0 = h.minute();
    let (id2, path2) = ("tr_down", "/v2/payments/tr_down");
    h.api.fail_next(path2, &[502; 10]);
    assert!(
        !h.hint("mollie", &mollie_hint(id2, Some(MOLLIE_TOKEN)))
            .await
    );
    h.drain().await;
    let item = h.item("mollie", id2, m0).await;
    assert_eq!(item.state, InboxState::DeadLetter);
    assert_eq!(h.api.calls(path2), 1);
    assert!(
        item.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("502"),
        "{:?}",
        item.last_error
    );
}

/// The provider API is down for a burst of distinct hints: the tenant's circuit opens
/// after 5 transient failures in a row, so the API sees a handful of calls instead of
/// one per hint and receive (20 hints × 4 receives = 80 without the breaker). The
/// items still retry and dead-letter as before, with the API's error in `last_error`.
#[tokio::test]
async fn an_api_that_stays_down_opens_the_circuit_instead_of_taking_every_retry() {
    let h = Harness::new().await;
    let ids: Vec<String> = (0..20).map(|i| format!("tr_down{i:02}")).collect();
    for id in &ids {
        h.api.fail_next(&format!("/v2/payments/{id}"), &[503; 10]);
        assert!(!h.hint("mollie", &mollie_hint(id, Some(MOLLIE_TOKEN))).await);
    }
    h.drain().await;
    let m0 = h.minute();
    for id in &ids {
        let item = h.item("mollie", id, m0).await;
        assert_eq!(item.state, InboxState::DeadLetter, "{id}");
        let error = item.last_error.unwrap_or_default();
        assert!(error.contains("503"), "{id}: {error}");
    }
    // 5 failures open it; at most 3 more were already in flight (4 per tenant at once).
    let calls = h.api.total_calls();
    assert!(
        (5..=8).contains(&calls),
        "{calls} API calls for 20 hints × 4 receives"
    );
}

#[tokio::test]
async fn hints_without_a_lookup_are_dead_lettered() {
    let h = Harness::new().await;
    let processor = Processor::new(
        h.b.inbox.clone(),
        h.b.processing.clone(),
        h.b.queue.clone(),
        h.b.state.clone(),
        h.recorder.clone(),
    )
    .with_settings(scenario::settings(5_000, h.b.max_receive_count));
    assert!(
        !h.hint("mollie", &mollie_hint("tr_nolookup", Some(MOLLIE_TOKEN)))
            .await
    );
    scenario::drain(&h.b, &processor).await;
    let item = h.item("mollie", "tr_nolookup", h.minute()).await;
    assert_eq!(item.state, InboxState::DeadLetter);
    assert!(item
        .last_error
        .unwrap_or_default()
        .contains("no resource lookup configured"));
    assert!(
        h.recorder.seen().is_empty(),
        "the domain never saw the hint"
    );
    assert_eq!(h.api.total_calls(), 0);
}
