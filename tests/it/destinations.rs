//! The relay end to end on the embedded store: the processor delivers right after its
//! commit through the real `HttpSink` to a real axum server on loopback
//! (`einmal_tests::destination_server`), which verifies every call with the
//! `standardwebhooks` crate and applies each `webhook-id` once; `Relay::run_due`
//! retries. Failing, stalling, 429 and 4xx destinations, a destination down for a
//! while, per-object order, the reference domain's notifications, and replay. Reloads:
//! a destination added (and a secret rotated) by a configuration reload, a removed
//! destination's grace period, and inline delivery cut at the invocation's deadline.
//!
//! Every case runs on both backends: the embedded store and DynamoDB + SQS on moto
//! (`embedded_store::…`, `aws_moto::…`).
//!
//! Waiting is by condition (poll until the store says so, with a generous deadline),
//! never by a fixed sleep or a timed assertion.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use einmal::adapters::aws::{
    create_audit_table, create_queues, create_state_table, create_tables, AwsStore, DynamoAuditLog,
    DynamoStateStore,
};
use einmal::adapters::embedded::{
    EmbeddedAuditLog, EmbeddedOptions, EmbeddedStateStore, EmbeddedStore,
};
use einmal::audit::AuditLog;
use einmal::config::Config;
use einmal::config::Secret;
use einmal::config_source::{ConfigLoader, ConfigSource};
use einmal::destinations::http::HttpDestination;
use einmal::destinations::http::HttpSink;
use einmal::destinations::Output;
use einmal::destinations::{
    delivery_key, output_delivery_key, BodyFormat, DestinationConfig, DestinationKind, Sink,
};
use einmal::domain::reference::ReferenceDomain;
use einmal::domain::state::{StateKey, StateRecord, StateStore};
use einmal::domain::{Change, Decision, Domain, DomainError, DomainEvent};
use einmal::envelope::Envelope;
use einmal::envelope::InboxKey;
use einmal::https::HttpsClient;
use einmal::pipeline::process::{AckMode, Processor};
use einmal::pipeline::relay::{
    Relay, RelayError, RelaySettings, RetryPolicy, SinkFactory, LEFT_FOR_RELAY,
};
use einmal::pipeline::replay::{ItemOutcome, Operator, Replayer};
use einmal::ports::{
    DeliveryState, DeliveryStatus, InboxFilter, InboxItem, InboxRelay, InboxState, InboxStore,
    OrderClaim, OrderGate, OrderRelease, QueueMessage, Source, StoreError,
};
use einmal_tests::destination_server::{Answer, Call, DestinationServer, SECRET};
use einmal_tests::moto;
use einmal_tests::scenario::Kind;
use serde_json::json;

const TENANT: &str = "t1";
const DEADLINE: Duration = Duration::from_secs(90);

/// Every event is ignored (and so still delivered): the relay, not a domain, is tested.
struct IgnoreAll;

impl Domain for IgnoreAll {
    fn targets(&self, _event: &DomainEvent<'_>) -> Result<Vec<StateKey>, DomainError> {
        Ok(Vec::new())
    }
    fn decide(
        &self,
        _event: &DomainEvent<'_>,
        _current: &[StateRecord],
    ) -> Result<Decision, DomainError> {
        Ok(Decision::Ignore {
            reason: "relay test".into(),
        })
    }
}

struct HttpSinks(HttpsClient);

#[async_trait]
impl SinkFactory for HttpSinks {
    async fn build(&self, d: &DestinationConfig) -> Result<Arc<dyn Sink>, RelayError> {
        match &d.kind {
            DestinationKind::Http(http) => HttpSink::new(http, &self.0)
                .map(|s| Arc::new(s) as Arc<dyn Sink>)
                .map_err(|e| RelayError::config(d, e.to_string())),
            other => Err(RelayError::config(
                d,
                format!("no {} sink here", other.name()),
            )),
        }
    }
}

fn destination(name: &str, url: &str) -> DestinationConfig {
    DestinationConfig {
        name: name.into(),
        tenant: TENANT.into(),
        provider: None,
        events: vec!["*".into()],
        outputs: Vec::new(),
        ordered: false,
        max_attempts: 50,
        max_age: Duration::from_secs(3600),
        kind: DestinationKind::Http(HttpDestination {
            url: url.into(),
            secrets: vec![Secret::new(SECRET)],
            body: BodyFormat::Original,
            timeout: Duration::from_millis(500),
            allow_private: false,
        }),
    }
}

/// Fast retries for tests; the policy's shape is unit-tested in `pipeline::relay`.
fn settings(order_window_ms: u64) -> RelaySettings {
    RelaySettings {
        policy: RetryPolicy {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(200),
        },
        lease: Duration::from_secs(10),
        order_window: Duration::from_millis(order_window_ms),
        destination_grace: Duration::from_secs(3600),
    }
}

struct Rig {
    _keep: Box<dyn std::any::Any + Send + Sync>,
    store: Arc<dyn InboxStore>,
    processor: Processor,
    relay: Arc<Relay>,
    audit: Arc<dyn AuditLog>,
}

/// The stores of one backend: inbox + queue, business state, audit log.
async fn stores(
    kind: Kind,
) -> (
    Arc<dyn InboxStore>,
    Arc<dyn StateStore>,
    Arc<dyn AuditLog>,
    Box<dyn std::any::Any + Send + Sync>,
) {
    match kind {
        Kind::Embedded => {
            let dir = tempfile::tempdir().unwrap();
            let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
            let state = EmbeddedStateStore::open(dir.path()).unwrap();
            let audit = EmbeddedAuditLog::open(dir.path()).unwrap();
            (
                Arc::new(store),
                Arc::new(state),
                Arc::new(audit),
                Box::new(dir),
            )
        }
        Kind::Aws => {
            let moto = moto::shared();
            let sdk = moto.sdk_config().await;
            let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
            let name = moto::unique_name("einmal-dest");
            create_tables(&dynamodb, &name).await.unwrap();
            let names = create_queues(&aws_sdk_sqs::Client::new(&sdk), &name, 5)
                .await
                .unwrap();
            let state_table = format!("{name}-state");
            create_state_table(&dynamodb, &state_table).await.unwrap();
            let audit_table = format!("{name}-audit");
            create_audit_table(&dynamodb, &audit_table).await.unwrap();
            let store = AwsStore::new(dynamodb.clone(), aws_sdk_sqs::Client::new(&sdk), names);
            (
                Arc::new(store),
                Arc::new(DynamoStateStore::new(dynamodb.clone(), state_table)),
                Arc::new(DynamoAuditLog::new(dynamodb, audit_table)),
                Box::new(()),
            )
        }
    }
}

/// The configuration a test switches to; the source reloads it on every call.
struct Switch(std::sync::Mutex<Config>);

#[async_trait]
impl ConfigLoader for Switch {
    async fn load(&self) -> Result<Config, String> {
        Ok(self.0.lock().unwrap().clone())
    }
}

impl Switch {
    fn set(&self, config: Config) {
        *self.0.lock().unwrap() = config;
    }
}

/// The tenant `t1` of Stripe and `destinations` (name, url, secret, answers: all HTTP).
fn tenant_config(destinations: &[(&str, &str, &str)]) -> Config {
    let mut toml = format!(
        "[[tenant]]\nprovider = \"stripe\"\ntenant = \"{TENANT}\"\nsecrets = [\"whsec_test\"]\n"
    );
    for (name, url, secret) in destinations {
        toml.push_str(&format!(
            "\n[[destination]]\nname = \"{name}\"\ntenant = \"{TENANT}\"\nkind = \"http\"\n\
             events = [\"*\"]\nurl = \"{url}\"\nsecrets = [\"{secret}\"]\ntimeout_ms = 10000\n\
             max_attempts = 1000\n"
        ));
    }
    Config::from_toml(&toml).unwrap()
}

impl Rig {
    /// A rig whose relay follows `switch` (reloaded on every look, as the Lambdas'
    /// 60 s refresh does after its TTL).
    async fn reloading(kind: Kind, switch: Arc<Switch>, settings: RelaySettings) -> Rig {
        let (store, state, audit, keep) = stores(kind).await;
        let initial = switch.load().await.unwrap();
        let source = ConfigSource::refreshing(initial, switch, Duration::ZERO);
        let relay = Relay::reloading(
            store.clone(),
            source,
            Arc::new(HttpSinks(HttpsClient::new())),
            settings,
        )
        .await
        .unwrap();
        let relay = Arc::new(relay);
        let processor = Processor::from_store(store.clone(), state, Arc::new(IgnoreAll))
            .with_relay(relay.clone());
        Rig {
            _keep: keep,
            store,
            processor,
            relay,
            audit,
        }
    }

    async fn new(
        kind: Kind,
        destinations: Vec<DestinationConfig>,
        domain: Arc<dyn Domain>,
        settings: RelaySettings,
    ) -> Rig {
        Self::with_relay_store(kind, destinations, domain, settings, |store| store).await
    }

    /// [`Rig::new`] whose relay reaches the store through `wrap` (a fault layer).
    async fn with_relay_store(
        kind: Kind,
        destinations: Vec<DestinationConfig>,
        domain: Arc<dyn Domain>,
        settings: RelaySettings,
        wrap: impl FnOnce(Arc<dyn InboxRelay>) -> Arc<dyn InboxRelay>,
    ) -> Rig {
        let (store, state, audit, keep) = stores(kind).await;
        let relay = Relay::build(
            wrap(store.clone()),
            &destinations,
            Arc::new(HttpSinks(HttpsClient::new())),
            settings,
        )
        .await
        .unwrap();
        let relay = Arc::new(relay);
        let processor =
            Processor::from_store(store.clone(), state, domain).with_relay(relay.clone());
        Rig {
            _keep: keep,
            store,
            processor,
            relay,
            audit,
        }
    }

    async fn ingest(&self, item: &InboxItem) {
        self.store.put_new(item).await.unwrap();
        self.store
            .send(&QueueMessage {
                pk: item.key.clone(),
            })
            .await
            .unwrap();
    }

    /// Process every queued message (concurrently, as a batch), until the queue is empty.
    async fn process_all(&self) {
        loop {
            let batch = self
                .store
                .receive(10, Duration::from_secs(30))
                .await
                .unwrap();
            if batch.is_empty() {
                return;
            }
            let outcomes = self.processor.process_batch(&batch, "w1").await;
            for (d, (_, outcome)) in batch.iter().zip(outcomes) {
                self.processor.settle(d, outcome, AckMode::Delete).await;
            }
        }
    }

    /// Every stored item with its body (a listing on AWS leaves the body in its own
    /// item; `get` reads it).
    async fn items(&self) -> Vec<InboxItem> {
        let listed = self
            .store
            .list(&InboxFilter {
                limit: 10_000,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut items = Vec::with_capacity(listed.len());
        for item in listed {
            let key = item.envelope.key();
            items.push(
                self.store
                    .get(&key)
                    .await
                    .unwrap()
                    .expect("listed, so stored"),
            );
        }
        items
    }

    /// Run the relay's retry pass until `done` holds for the stored items.
    async fn relay_until(&self, what: &str, done: impl Fn(&[InboxItem]) -> bool) -> Vec<InboxItem> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let items = self.items().await;
            if done(&items) {
                return items;
            }
            assert!(
                Instant::now() < deadline,
                "relay never got to: {what}; {items:#?}"
            );
            self.relay
                .run_due(einmal::time::now_millis(), 100)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn all_in(items: &[InboxItem], state: DeliveryState) -> bool {
    !items.is_empty()
        && items
            .iter()
            .all(|i| !i.deliveries.is_empty() && i.deliveries.iter().all(|d| d.state == state))
}

fn event(
    provider: &str,
    event_id: &str,
    event_type: &str,
    object: &str,
    version: &str,
) -> InboxItem {
    let envelope = Envelope {
        provider: provider.into(),
        tenant: TENANT.into(),
        event_id: event_id.into(),
        event_type: event_type.into(),
        object_id: Some(object.into()),
        object_version: Some(version.into()),
        occurred_at: Some(1_764_400_000),
        delivery_id: None,
    };
    let body = json!({"id": event_id, "type": event_type, "object": object, "version": version});
    item_with_body(envelope, body.to_string().into_bytes())
}

fn item_with_body(envelope: Envelope, body: Vec<u8>) -> InboxItem {
    let now = einmal::time::now_millis();
    InboxItem {
        key: envelope.key(),
        envelope,
        state: InboxState::Received,
        source: Source::Webhook,
        attempts: 0,
        received_at_ms: now,
        updated_at_ms: now,
        expires_at: now / 1000 + 86_400,
        enqueue_failed: false,
        last_error: None,
        last_error_class: None,
        lease_until_ms: None,
        lease_owner: None,
        result: None,
        body_encoding: einmal::body::BODY_ENCODING.into(),
        body_len: body.len() as u64,
        body: einmal::body::compress(&body).unwrap(),
        waiting: None,
        deliveries: Vec::new(),
        relay_due_ms: None,
    }
}

/// Every call verified; every applied id is the delivery key of one stored event.
fn assert_exactly_once(server: &DestinationServer, items: &[InboxItem], destination: &str) {
    assert!(
        server.calls().iter().all(|c| c.verified),
        "a call did not verify"
    );
    let effects = server.effects();
    assert_eq!(effects.len(), items.len(), "one effect per event");
    for item in items {
        let e = &item.envelope;
        let key = delivery_key(destination, &e.provider, &e.tenant, &e.event_id);
        let call = effects
            .get(&key)
            .unwrap_or_else(|| panic!("no effect for {}", e.event_id));
        assert_eq!(
            call.idempotency_key.as_deref(),
            Some(format!("\"{key}\"").as_str())
        );
        // The original body, byte for byte.
        let raw = einmal::body::decompress(&item.body, item.body_len as usize).unwrap();
        assert_eq!(call.body, raw);
    }
}

async fn failures_429_and_timeouts_are_retried_until_every_event_is_delivered_once(kind: Kind) {
    // Calls 1-3 fail, 4 is a 429 with Retry-After: 1, 5 stalls past the timeout.
    let n = Arc::new(AtomicUsize::new(0));
    let counter = n.clone();
    let server =
        DestinationServer::start(move |_, _| match counter.fetch_add(1, Ordering::SeqCst) {
            0..=2 => Answer::Status(503, "busy"),
            3 => Answer::TooMany(1),
            4 => Answer::Stall(Duration::from_secs(2)),
            _ => Answer::Ok,
        })
        .await;
    let rig = Rig::new(
        kind,
        vec![destination("shop", &server.url)],
        Arc::new(IgnoreAll),
        settings(0),
    )
    .await;
    let events: Vec<InboxItem> = (0..12)
        .map(|i| {
            event(
                "stripe",
                &format!("evt_{i}"),
                "customer.updated",
                &format!("cus_{i}"),
                "1",
            )
        })
        .collect();
    for e in &events {
        rig.ingest(e).await;
    }
    rig.process_all().await;
    // Some deliveries failed inline: they wait in the backlog, nothing is lost.
    let backlog = rig.relay.backlog(einmal::time::now_millis()).await.unwrap();
    assert!(
        backlog
            .per_destination
            .get("shop")
            .is_some_and(|(n, _)| *n >= 1),
        "{backlog:?}"
    );
    let items = rig
        .relay_until("every delivery delivered", |items| {
            all_in(items, DeliveryState::Delivered)
        })
        .await;
    assert_exactly_once(&server, &items, "shop");
    assert!(items
        .iter()
        .all(|i| i.state == InboxState::Ignored && i.relay_due_ms.is_none()));
    // The failed calls were retried with the same id; the 429's retry came after its
    // Retry-After.
    let calls = server.calls();
    assert!(calls.len() >= 17, "{} calls", calls.len());
    let too_many = calls
        .iter()
        .find(|c| c.answer == Answer::TooMany(1))
        .unwrap();
    let next = calls
        .iter()
        .find(|c| c.id == too_many.id && c.at > too_many.at)
        .expect("the 429 was retried");
    assert!(next.at.duration_since(too_many.at) >= Duration::from_secs(1));
    let retried = items
        .iter()
        .filter(|i| i.deliveries[0].attempts > 1)
        .count();
    assert!(
        retried >= 4,
        "{retried} deliveries needed more than one attempt"
    );
    let backlog = rig.relay.backlog(einmal::time::now_millis()).await.unwrap();
    assert!(backlog.per_destination.is_empty(), "{backlog:?}");
    let tally = rig.relay.drain_tally();
    assert_eq!(tally.delivered.get("shop"), Some(&12));
    assert!(tally.failed.get("shop").is_some_and(|n| *n >= 5));
}

async fn a_4xx_dead_letters_with_its_status_and_replay_redelivers_with_the_same_key(kind: Kind) {
    let server = DestinationServer::start(|_, nth| match nth {
        1 => Answer::Status(422, "invalid order reference ord_9"),
        _ => Answer::Ok,
    })
    .await;
    let rig = Rig::new(
        kind,
        vec![destination("crm", &server.url)],
        Arc::new(IgnoreAll),
        settings(0),
    )
    .await;
    let e = event("stripe", "evt_422", "customer.created", "cus_1", "1");
    rig.ingest(&e).await;
    rig.process_all().await;
    let item = rig.store.get(&e.key).await.unwrap().unwrap();
    let d = &item.deliveries[0];
    assert_eq!(
        (d.state, d.attempts, d.last_status),
        (DeliveryState::DeadLetter, 1, Some(422))
    );
    let detail = d.detail.as_deref().unwrap();
    assert!(
        detail.contains("permanent") && detail.contains("invalid order reference"),
        "{detail}"
    );
    assert_eq!(item.relay_due_ms, None);
    assert!(server.effects().is_empty());
    // The event is finished (ignored by this domain), not a dead letter, yet its
    // dead-lettered delivery is listed (the store's index of them) and counted per
    // destination (the DeliveryDeadLetters gauge).
    assert_eq!(item.state, InboxState::Ignored);
    let e2 = event("stripe", "evt_422b", "customer.created", "cus_2", "1");
    rig.ingest(&e2).await;
    rig.process_all().await;
    let dead_keys = || async {
        let dead = rig.store.relay_dead(100).await.unwrap();
        let mut keys: Vec<InboxKey> = dead.into_iter().map(|i| i.key).collect();
        keys.sort();
        keys
    };
    let deadline = Instant::now() + DEADLINE;
    while dead_keys().await != vec![e.key.clone(), e2.key.clone()] {
        assert!(
            Instant::now() < deadline,
            "never listed: {:?}",
            dead_keys().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let backlog = rig.relay.backlog(einmal::time::now_millis()).await.unwrap();
    assert_eq!(backlog.dead_letters.get("crm"), Some(&2), "{backlog:?}");
    let emf = backlog
        .emf(&["crm".to_string()], "stack", 1)
        .render()
        .join("\n");
    assert!(emf.contains("\"DeliveryDeadLetters\":2"), "{emf}");

    // Replay of the finished event re-schedules its dead-lettered delivery, audited.
    let replayer = Replayer::from_store(rig.store.clone(), rig.audit.clone());
    let operator = Operator {
        actor: "test".into(),
        reason: "crm fixed".into(),
    };
    let report = replayer.replay_one(&e.key, false, &operator).await.unwrap();
    assert_eq!(report.outcomes[0].1, ItemOutcome::Redelivered);
    assert_eq!(report.summary.redelivered, 1);
    assert!(report.audit_id.is_some());
    // The audit record says what happened: nothing replayed, one redelivered.
    let audit = rig.audit.list(0).await.unwrap();
    assert_eq!(
        (
            &audit[0].result["replayed"],
            &audit[0].result["redelivered"]
        ),
        (&json!(0), &json!(1))
    );
    // Several at once (the console's selection): each the same way, one audit record.
    let report = replayer
        .replay_keys(&[e2.key.clone(), e2.key.clone()], &operator)
        .await
        .unwrap();
    assert_eq!(
        report.outcomes,
        vec![(e2.key.clone(), ItemOutcome::Redelivered)]
    );
    let audited = rig.audit.list(10).await.unwrap();
    assert_eq!(audited.len(), 2, "one record per replay");
    assert_eq!(audited[0].events, vec![e2.key.as_str().to_string()]);
    let items = rig
        .relay_until("the replayed deliveries delivered", |items| {
            all_in(items, DeliveryState::Delivered)
        })
        .await;
    assert_exactly_once(&server, &items, "crm");
    let calls = server.calls();
    assert_eq!(calls.len(), 4);
    for id in ["evt_422", "evt_422b"] {
        let key = delivery_key("crm", "stripe", TENANT, id);
        let of = calls.iter().filter(|c| c.id == key).count();
        assert_eq!(of, 2, "the same key on replay: {id}");
    }
    // Delivered: listed and counted no more.
    let deadline = Instant::now() + DEADLINE;
    while !dead_keys().await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "still listed: {:?}",
            dead_keys().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let backlog = rig.relay.backlog(einmal::time::now_millis()).await.unwrap();
    assert!(backlog.dead_letters.is_empty(), "{backlog:?}");
}

async fn a_destination_down_keeps_events_pending_then_gets_every_one(kind: Kind) {
    let down = Arc::new(AtomicBool::new(true));
    let is_down = down.clone();
    let server = DestinationServer::start(move |_, _| {
        if is_down.load(Ordering::SeqCst) {
            Answer::Status(503, "maintenance")
        } else {
            Answer::Ok
        }
    })
    .await;
    let rig = Rig::new(
        kind,
        vec![destination("erp", &server.url)],
        Arc::new(IgnoreAll),
        settings(0),
    )
    .await;
    let events: Vec<InboxItem> = (0..20)
        .map(|i| {
            event(
                "shopify",
                &format!("evt_{i}"),
                "orders/updated",
                &format!("{i}"),
                "1",
            )
        })
        .collect();
    for e in &events {
        rig.ingest(e).await;
    }
    rig.process_all().await;
    // Retried while down: still pending, each with its next attempt scheduled.
    let items = rig
        .relay_until("three attempts each while down", |items| {
            items.len() == 20
                && items
                    .iter()
                    .all(|i| i.deliveries[0].attempts >= 3 && i.relay_due_ms.is_some())
        })
        .await;
    assert!(items
        .iter()
        .all(|i| i.deliveries[0].state == DeliveryState::Pending
            && i.deliveries[0].last_status == Some(503)));
    let backlog = rig.relay.backlog(einmal::time::now_millis()).await.unwrap();
    assert_eq!(backlog.per_destination["erp"].0, 20);
    assert!(server.effects().is_empty());
    let emf = backlog
        .emf(&["erp".to_string()], "test", 0)
        .render()
        .join("\n");
    assert!(
        emf.contains("\"DeliveryBacklog\":20") && emf.contains("\"Destination\":\"erp\""),
        "{emf}"
    );

    down.store(false, Ordering::SeqCst);
    let items = rig
        .relay_until("everything delivered after the outage", |items| {
            all_in(items, DeliveryState::Delivered)
        })
        .await;
    assert_exactly_once(&server, &items, "erp");
    let backlog = rig.relay.backlog(einmal::time::now_millis()).await.unwrap();
    assert!(backlog.per_destination.is_empty());
}

/// Shopify-style versions: `updated_at` of the order.
fn version(v: usize) -> String {
    format!("2026-11-30T10:{v:02}:00Z")
}

async fn an_ordered_destination_gets_each_objects_versions_in_order_and_a_failing_object_holds_only_itself(
    kind: Kind,
) {
    const OBJECTS: usize = 8;
    const VERSIONS: usize = 5;
    let hold = Arc::new(AtomicBool::new(true));
    let holding = hold.clone();
    // Object 0's oldest version fails until released; everything else succeeds, with
    // a short pause so a second call of the same object would overlap.
    let server = DestinationServer::start(move |call: &Call, _| {
        if call.object_id.as_deref() == Some("obj-0")
            && call.object_version.as_deref() == Some(version(1).as_str())
            && holding.load(Ordering::SeqCst)
        {
            Answer::Status(500, "boom")
        } else {
            Answer::Ok
        }
    })
    .await;
    let mut ordered = destination("ledger", &server.url);
    ordered.ordered = true;
    // A window long enough that every shuffled event is processed inside it.
    let rig = Rig::new(kind, vec![ordered], Arc::new(IgnoreAll), settings(3_000)).await;
    let mut events = Vec::new();
    for o in 0..OBJECTS {
        for v in 1..=VERSIONS {
            events.push(event(
                "shopify",
                &format!("o{o}-v{v}"),
                "orders/updated",
                &format!("obj-{o}"),
                &version(v),
            ));
        }
    }
    // Shuffled deterministically: a stride walk over the list.
    let n = events.len();
    let shuffled: Vec<&InboxItem> = (0..n).map(|i| &events[(i * 17 + 5) % n]).collect();
    for e in shuffled {
        rig.ingest(e).await;
    }
    rig.process_all().await;
    let object_done = |items: &[InboxItem], o: usize| {
        items
            .iter()
            .filter(|i| i.envelope.object_id.as_deref() == Some(format!("obj-{o}").as_str()))
            .all(|i| {
                i.deliveries
                    .iter()
                    .all(|d| d.state != DeliveryState::Pending)
            })
    };
    let items = rig
        .relay_until("every object but the failing one done", |items| {
            items.len() == n && (1..OBJECTS).all(|o| object_done(items, o))
        })
        .await;
    // The failing object is held: its first version retrying, the later ones waiting.
    assert!(!object_done(&items, 0));
    let held = rig.relay.backlog(einmal::time::now_millis()).await.unwrap();
    assert_eq!(held.held_objects, 1);
    assert_eq!(held.per_destination["ledger"].0, VERSIONS as u64);
    assert!(server
        .effects()
        .values()
        .all(|c| c.object_id.as_deref() != Some("obj-0")));

    hold.store(false, Ordering::SeqCst);
    let items = rig
        .relay_until("the failing object done too", |items| {
            (0..OBJECTS).all(|o| object_done(items, o))
        })
        .await;
    // Every version delivered (none arrived after a newer one was sent), in order,
    // one call in flight per object.
    assert!(all_in(&items, DeliveryState::Delivered), "{items:#?}");
    assert_exactly_once(&server, &items, "ledger");
    let mut applied: Vec<Call> = server.effects().into_values().collect();
    applied.sort_by_key(|c| c.at);
    for o in 0..OBJECTS {
        let versions: Vec<String> = applied
            .iter()
            .filter(|c| c.object_id.as_deref() == Some(format!("obj-{o}").as_str()))
            .filter_map(|c| c.object_version.clone())
            .collect();
        let expected: Vec<String> = (1..=VERSIONS).map(version).collect();
        assert_eq!(versions, expected, "obj-{o} out of order");
    }
    assert!(
        server.max_in_flight().values().all(|n| *n == 1),
        "{:?}",
        server.max_in_flight()
    );

    // A straggler older than what the destination has is superseded, never sent.
    let late = event("shopify", "o3-v0", "orders/updated", "obj-3", &version(0));
    rig.ingest(&late).await;
    rig.process_all().await;
    let item = rig.store.get(&late.key).await.unwrap().unwrap();
    assert_eq!(item.deliveries[0].state, DeliveryState::Superseded);
    assert_eq!(item.deliveries[0].attempts, 0);
    assert!(server
        .calls()
        .iter()
        .all(|c| c.object_version != Some(version(0))));
}

fn payment_succeeded(order: &str, pi: &str) -> InboxItem {
    let event_id = format!("evt_ps_{pi}");
    let body = json!({
        "id": event_id, "object": "event", "type": "payment_intent.succeeded", "created": 1_764_400_000,
        "data": {"object": {"id": pi, "object": "payment_intent", "amount": 2_000,
            "amount_received": 2_000, "currency": "eur", "status": "succeeded",
            "metadata": {"order_id": order}}}
    });
    let envelope = Envelope {
        provider: "stripe".into(),
        tenant: TENANT.into(),
        event_id,
        event_type: "payment_intent.succeeded".into(),
        object_id: Some(pi.into()),
        object_version: None,
        occurred_at: Some(1_764_400_000),
        delivery_id: None,
    };
    item_with_body(envelope, body.to_string().into_bytes())
}

async fn notifications_are_delivered_once_per_dedup_key(kind: Kind) {
    let server = DestinationServer::start(|_, _| Answer::Ok).await;
    let mut notify = destination("mailer", &server.url);
    notify.events = Vec::new();
    notify.outputs = vec!["notification.*".into()];
    let rig = Rig::new(
        kind,
        vec![notify],
        Arc::new(ReferenceDomain::new()),
        settings(0),
    )
    .await;
    // Two payments of one order: one "payment received" notification.
    let first = payment_succeeded("1001", "pi_1");
    let second = payment_succeeded("1001", "pi_2");
    rig.ingest(&first).await;
    rig.process_all().await;
    rig.ingest(&second).await;
    rig.process_all().await;
    // A forced replay re-runs the decision ("already applied") and finds the same output.
    let replayer = Replayer::from_store(rig.store.clone(), rig.audit.clone());
    let operator = Operator {
        actor: "test".into(),
        reason: "re-run".into(),
    };
    replayer
        .replay_one(&first.key, true, &operator)
        .await
        .unwrap();
    rig.process_all().await;

    let effects = server.effects();
    assert_eq!(effects.len(), 1, "{effects:?}");
    let key = output_delivery_key("mailer", TENANT, "t1#order-1001#paid");
    let call = &effects[&key];
    assert_eq!(call.event_type, "notification.payment_received");
    assert_eq!(call.object_id.as_deref(), Some("1001"));
    let body: serde_json::Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(
        (body["order_id"].as_str(), body["payment_status"].as_str()),
        (Some("1001"), Some("paid"))
    );
    assert!(server.calls().iter().all(|c| c.verified && c.id == key));
    let first = rig.store.get(&first.key).await.unwrap().unwrap();
    let d = &first.deliveries[0];
    assert_eq!(
        (d.state, d.key.as_str()),
        (DeliveryState::Delivered, key.as_str())
    );
    assert_eq!(
        d.output.as_ref().map(|o| o.kind.as_str()),
        Some("notification.payment_received")
    );
    // The second payment's decision notified nothing new.
    let second = rig.store.get(&second.key).await.unwrap().unwrap();
    assert!(second.deliveries.is_empty(), "{:?}", second.deliveries);
}

/// A Stripe event (no object version) of one payment intent, stamped at `created`.
fn stripe_event(event_id: &str, event_type: &str, pi: &str, created: i64) -> InboxItem {
    let envelope = Envelope {
        provider: "stripe".into(),
        tenant: TENANT.into(),
        event_id: event_id.into(),
        event_type: event_type.into(),
        object_id: Some(pi.into()),
        object_version: None,
        occurred_at: Some(created),
        delivery_id: None,
    };
    let body = json!({"id": event_id, "type": event_type, "created": created,
        "data": {"object": {"id": pi, "object": "payment_intent"}}});
    item_with_body(envelope, body.to_string().into_bytes())
}

async fn an_ordered_destination_delivers_ties_and_events_without_a_version(kind: Kind) {
    const INTENTS: usize = 10;
    let server = DestinationServer::start(|_, _| Answer::Ok).await;
    let mut ordered = destination("ledger", &server.url);
    ordered.ordered = true;
    let rig = Rig::new(kind, vec![ordered], Arc::new(IgnoreAll), settings(0)).await;
    // Each intent's `processing` goes out first; then its `succeeded`, stamped in the
    // same second, with an event id that sorts before the first one's.
    let processing: Vec<InboxItem> = (0..INTENTS)
        .map(|i| {
            stripe_event(
                &format!("evt_{i}_b"),
                "payment_intent.processing",
                &format!("pi_{i}"),
                1_764_400_000,
            )
        })
        .collect();
    for e in &processing {
        rig.ingest(e).await;
    }
    rig.process_all().await;
    rig.relay_until("every processing event delivered", |items| {
        all_in(items, DeliveryState::Delivered)
    })
    .await;
    for i in 0..INTENTS {
        let succeeded = stripe_event(
            &format!("evt_{i}_a"),
            "payment_intent.succeeded",
            &format!("pi_{i}"),
            1_764_400_000,
        );
        rig.ingest(&succeeded).await;
    }
    rig.process_all().await;
    let items = rig
        .relay_until("every event settled", |items| {
            items.len() == 2 * INTENTS
                && items.iter().all(|i| {
                    i.deliveries
                        .iter()
                        .all(|d| d.state != DeliveryState::Pending)
                })
        })
        .await;
    // None superseded: the shop learns of every payment.
    assert!(all_in(&items, DeliveryState::Delivered), "{items:#?}");
    assert_exactly_once(&server, &items, "ledger");
    let mut applied: Vec<Call> = server.effects().into_values().collect();
    applied.sort_by_key(|c| c.at);
    for i in 0..INTENTS {
        let types: Vec<&str> = applied
            .iter()
            .filter(|c| c.object_id.as_deref() == Some(format!("pi_{i}").as_str()))
            .map(|c| c.event_type.as_str())
            .collect();
        assert_eq!(
            types,
            ["payment_intent.processing", "payment_intent.succeeded"],
            "pi_{i}"
        );
    }
}

/// The relay's port with `order_release` refused while `failing` is set (the store
/// throttled or unreachable just then); everything else passes through.
struct ReleaseRefused {
    inner: Arc<dyn InboxRelay>,
    failing: Arc<AtomicBool>,
}

#[async_trait]
impl InboxRelay for ReleaseRefused {
    async fn relay_due(&self, now_ms: i64, limit: usize) -> Result<Vec<InboxKey>, StoreError> {
        self.inner.relay_due(now_ms, limit).await
    }
    async fn relay_pending(&self, limit: usize) -> Result<Vec<InboxItem>, StoreError> {
        self.inner.relay_pending(limit).await
    }
    async fn relay_dead(&self, limit: usize) -> Result<Vec<InboxItem>, StoreError> {
        self.inner.relay_dead(limit).await
    }
    async fn claim_relay(
        &self,
        key: &InboxKey,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Option<InboxItem>, StoreError> {
        self.inner.claim_relay(key, owner, now_ms, lease_ms).await
    }
    async fn finish_relay(
        &self,
        key: &InboxKey,
        owner: &str,
        deliveries: &[DeliveryStatus],
        relay_due_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.inner
            .finish_relay(key, owner, deliveries, relay_due_ms, now_ms)
            .await
    }
    async fn order_acquire(
        &self,
        claim: &OrderClaim,
        now_ms: i64,
    ) -> Result<OrderGate, StoreError> {
        self.inner.order_acquire(claim, now_ms).await
    }
    async fn order_release(
        &self,
        release: &OrderRelease,
        now_ms: i64,
    ) -> Result<Option<InboxKey>, StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("throttled (injected)".into()));
        }
        self.inner.order_release(release, now_ms).await
    }
}

async fn a_release_the_store_refused_is_retried_and_the_object_counted_held(kind: Kind) {
    let server = DestinationServer::start(|_, _| Answer::Ok).await;
    let mut ordered = destination("ledger", &server.url);
    ordered.ordered = true;
    let failing = Arc::new(AtomicBool::new(true));
    let injected = failing.clone();
    let rig = Rig::with_relay_store(
        kind,
        vec![ordered],
        Arc::new(IgnoreAll),
        settings(0),
        move |inner| {
            Arc::new(ReleaseRefused {
                inner,
                failing: injected,
            })
        },
    )
    .await;
    let v1 = event("shopify", "o-v1", "orders/updated", "obj-r", &version(1));
    let v2 = event("shopify", "o-v2", "orders/updated", "obj-r", &version(2));
    rig.ingest(&v1).await;
    rig.process_all().await;
    // v1 went out but its turn could not be handed back: it owes the release, and the
    // object counts as held.
    let stored = rig.store.get(&v1.key).await.unwrap().unwrap();
    let d = &stored.deliveries[0];
    assert_eq!((d.state, d.release_owed), (DeliveryState::Delivered, true));
    assert!(stored.relay_due_ms.is_some(), "the relay comes back for it");
    let backlog = rig.relay.backlog(einmal::time::now_millis()).await.unwrap();
    assert_eq!(backlog.held_objects, 1);
    rig.ingest(&v2).await;
    rig.process_all().await;
    // The store answers again: the relay's pass releases v1 and v2 follows, well
    // before v1's queue entry would go stale (the destination's max_age, an hour).
    failing.store(false, Ordering::SeqCst);
    let items = rig
        .relay_until("v2 delivered after the owed release", |items| {
            all_in(items, DeliveryState::Delivered)
                && items
                    .iter()
                    .all(|i| i.deliveries.iter().all(|d| !d.release_owed))
        })
        .await;
    assert_exactly_once(&server, &items, "ledger");
    let backlog = rig.relay.backlog(einmal::time::now_millis()).await.unwrap();
    assert_eq!(backlog.held_objects, 0);
}

/// One order's "paid" effect, whichever provider reports it, with one notification
/// under the effect's key: a second provider's event finds it applied and re-emits it.
struct PaidOnce;

const PAID_EFFECT: &str = "t1#order-7#paid";

impl Domain for PaidOnce {
    fn targets(&self, _event: &DomainEvent<'_>) -> Result<Vec<StateKey>, DomainError> {
        Ok(vec![StateKey::new(TENANT, "order", "7")])
    }
    fn decide(
        &self,
        event: &DomainEvent<'_>,
        _current: &[StateRecord],
    ) -> Result<Decision, DomainError> {
        Ok(Decision::Apply {
            changes: vec![Change::new(
                StateKey::new(TENANT, "order", "7"),
                PAID_EFFECT,
                json!({"paid_by": event.envelope.provider}),
            )],
            result: "paid".into(),
        })
    }
    fn outputs(&self, _event: &DomainEvent<'_>, changes: &[Change]) -> Vec<Output> {
        changes
            .iter()
            .map(|c| Output {
                kind: "notification.payment_received".into(),
                key: c.effect_key.clone(),
                object_id: Some("7".into()),
                data: json!({"order_id": "7"}),
            })
            .collect()
    }
}

async fn an_output_re_emitted_by_another_providers_event_keeps_its_key(kind: Kind) {
    let server = DestinationServer::start(|_, _| Answer::Ok).await;
    let mut notify = destination("mailer", &server.url);
    notify.events = Vec::new();
    notify.outputs = vec!["notification.*".into()];
    let rig = Rig::new(kind, vec![notify], Arc::new(PaidOnce), settings(0)).await;
    // Stripe's payment applies the effect and emits the notification; Shopify's
    // orders/paid of the same order finds it applied and emits it again.
    let stripe = event(
        "stripe",
        "evt_paid",
        "payment_intent.succeeded",
        "pi_7",
        "1",
    );
    let shopify = event("shopify", "sh_paid", "orders/paid", "7", "1");
    rig.ingest(&stripe).await;
    rig.process_all().await;
    rig.ingest(&shopify).await;
    rig.process_all().await;
    let items = rig
        .relay_until("both events' deliveries settled", |items| {
            items.len() == 2
                && items.iter().all(|i| {
                    i.deliveries
                        .iter()
                        .all(|d| d.state != DeliveryState::Pending)
                })
        })
        .await;
    let keys: Vec<&str> = items
        .iter()
        .flat_map(|i| i.deliveries.iter().map(|d| d.key.as_str()))
        .collect();
    let key = output_delivery_key("mailer", TENANT, PAID_EFFECT);
    assert_eq!(keys, [key.as_str(), key.as_str()], "{items:#?}");
    // The destination applied it once.
    let effects = server.effects();
    assert_eq!(effects.keys().collect::<Vec<_>>(), [&key]);
}

/// A destination added by a reload gets the events after it, without a restart, and a
/// rotated secret signs from the reload on. Before the reload the relay had only the
/// old set: `crm` would never be delivered to, and `shop` would keep the old secret.
async fn a_destination_added_by_a_reload_gets_deliveries_signed_with_its_rotated_secret(
    kind: Kind,
) {
    let old_secret = "whsec_QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=";
    let shop = DestinationServer::start(|_, _| Answer::Ok).await;
    let crm = DestinationServer::start(|_, _| Answer::Ok).await;
    let switch = Arc::new(Switch(std::sync::Mutex::new(tenant_config(&[(
        "shop", &shop.url, old_secret,
    )]))));
    let rig = Rig::reloading(kind, switch.clone(), settings(0)).await;
    rig.ingest(&event("stripe", "evt_r1", "customer.updated", "cus_1", "1"))
        .await;
    rig.process_all().await;
    // The old secret no longer verifies at the shop: 401, dead-lettered, no effect.
    assert!(!shop.calls().is_empty() && shop.calls().iter().all(|c| !c.verified));
    assert!(shop.effects().is_empty());

    switch.set(tenant_config(&[
        ("shop", &shop.url, SECRET),
        ("crm", &crm.url, SECRET),
    ]));
    rig.ingest(&event("stripe", "evt_r2", "customer.updated", "cus_1", "2"))
        .await;
    rig.process_all().await;
    let items = rig
        .relay_until("evt_r2 delivered to both", |items| {
            items
                .iter()
                .filter(|i| i.envelope.event_id == "evt_r2")
                .all(|i| {
                    i.deliveries.len() == 2
                        && i.deliveries
                            .iter()
                            .all(|d| d.state == DeliveryState::Delivered)
                })
        })
        .await;
    let r2: Vec<_> = items
        .into_iter()
        .filter(|i| i.envelope.event_id == "evt_r2")
        .collect();
    assert_exactly_once(&crm, &r2, "crm");
    let shop_key = delivery_key("shop", "stripe", TENANT, "evt_r2");
    assert!(
        shop.effects()[&shop_key].verified,
        "the rotated secret signs"
    );
    assert_eq!(shop.effects().len(), 1);
}

/// A destination removed by a reload: its pending delivery is kept through the grace
/// period (never attempted), then dead-lettered naming it. Before, it was
/// dead-lettered at the first pass ("destination no longer configured").
async fn a_removed_destination_keeps_its_pending_delivery_through_the_grace_then_dead_letters(
    kind: Kind,
) {
    let shop = DestinationServer::start(|_, _| Answer::Status(503, "down")).await;
    let switch = Arc::new(Switch(std::sync::Mutex::new(tenant_config(&[(
        "shop", &shop.url, SECRET,
    )]))));
    let grace = RelaySettings {
        destination_grace: Duration::from_millis(1500),
        ..settings(0)
    };
    let rig = Rig::reloading(kind, switch.clone(), grace).await;
    rig.ingest(&event("stripe", "evt_g1", "customer.updated", "cus_1", "1"))
        .await;
    rig.process_all().await;
    assert_eq!(
        rig.items().await[0].deliveries[0].state,
        DeliveryState::Pending
    );
    switch.set(tenant_config(&[]));
    let calls_before = shop.calls().len();
    let kept = rig
        .relay_until("the delivery kept through the grace", |items| {
            items[0].deliveries[0]
                .detail
                .as_deref()
                .is_some_and(|d| d.contains("kept until its grace period ends"))
        })
        .await;
    assert_eq!(kept[0].deliveries[0].state, DeliveryState::Pending);
    let dead = rig
        .relay_until("the delivery dead-lettered after the grace", |items| {
            items[0].deliveries[0].state == DeliveryState::DeadLetter
        })
        .await;
    assert_eq!(
        dead[0].deliveries[0].detail.as_deref(),
        Some("destination shop no longer configured")
    );
    assert_eq!(
        shop.calls().len(),
        calls_before,
        "never attempted once removed"
    );
}

/// Inline delivery ends at the deadline the processor is given (the Lambda's
/// remaining time less a margin): the event completes, its delivery to a slow
/// destination is left pending for the relay, which delivers it, once. Before, the
/// processor waited for the sink (a Lambda sink's 30 s outlasting the invocation).
async fn inline_delivery_stops_at_the_deadline_and_leaves_the_rest_to_the_relay(kind: Kind) {
    let slow = DestinationServer::start(|_, nth| match nth {
        1 => Answer::Stall(Duration::from_secs(5)),
        _ => Answer::Ok,
    })
    .await;
    let switch = Arc::new(Switch(std::sync::Mutex::new(tenant_config(&[(
        "slow", &slow.url, SECRET,
    )]))));
    let rig = Rig::reloading(kind, switch, settings(0)).await;
    let item = event("stripe", "evt_d1", "customer.updated", "cus_1", "1");
    rig.ingest(&item).await;
    let batch = rig
        .store
        .receive(10, Duration::from_secs(30))
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_millis(300);
    let outcomes = rig
        .processor
        .process_batch_until(&batch, &[], "w1", Some(until))
        .await;
    for (d, (_, outcome)) in batch.iter().zip(outcomes) {
        rig.processor.settle(d, outcome, AckMode::Delete).await;
    }
    let stored = rig.store.get(&item.key).await.unwrap().unwrap();
    assert_eq!(stored.state, InboxState::Ignored, "the event is finished");
    assert_eq!(stored.deliveries[0].state, DeliveryState::Pending);
    assert_eq!(stored.deliveries[0].detail.as_deref(), Some(LEFT_FOR_RELAY));
    assert!(stored.relay_due_ms.is_some(), "due for the relay");
    let items = rig
        .relay_until("the relay delivers it", |items| {
            all_in(items, DeliveryState::Delivered)
        })
        .await;
    assert_exactly_once(&slow, &items, "slow");
}

macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod embedded_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::$case(super::Kind::Embedded).await
                }
            )*
        }
        mod aws_moto {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::$case(super::Kind::Aws).await
                }
            )*
        }
    };
}

on_both_backends!(
    a_destination_added_by_a_reload_gets_deliveries_signed_with_its_rotated_secret,
    a_removed_destination_keeps_its_pending_delivery_through_the_grace_then_dead_letters,
    inline_delivery_stops_at_the_deadline_and_leaves_the_rest_to_the_relay,
    failures_429_and_timeouts_are_retried_until_every_event_is_delivered_once,
    a_4xx_dead_letters_with_its_status_and_replay_redelivers_with_the_same_key,
    a_destination_down_keeps_events_pending_then_gets_every_one,
    an_ordered_destination_gets_each_objects_versions_in_order_and_a_failing_object_holds_only_itself,
    notifications_are_delivered_once_per_dedup_key,
    an_ordered_destination_delivers_ties_and_events_without_a_version,
    a_release_the_store_refused_is_retried_and_the_object_counted_held,
    an_output_re_emitted_by_another_providers_event_keeps_its_key,
);
