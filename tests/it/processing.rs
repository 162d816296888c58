//! The processor engine on both backends: embedded (SQLite inbox + queue + state in a
//! temp dir) and AWS (DynamoDB + SQS in moto). The business domain is a small counter
//! domain defined here (a test double of the domain port, not of storage), so these
//! scenarios do not depend on the reference domain.
//!
//! Counter domain: `incr` on object X adds the body's `amount` to record
//! `tenant#counter#X`, effect key `tenant#X#incr#<object_version>`; `pair` does the
//! same on X and `X-mirror` in one atomic commit; `fail` is a permanent error; `wait`
//! waits while the shared `waits_left` is above zero, then acts like `incr`; anything
//! else is ignored. Transient failures come from the state store's `load`, failed the
//! first `load_failures` times (fault injection over the real store).

use einmal::ports::Handout;
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use einmal::adapters::aws::{create_state_table, DynamoStateStore};
use einmal::adapters::embedded::EmbeddedStateStore;
use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
use einmal::domain::state::{Commit, CommitAnswer, StateKey, StateRecord, StateStore};
use einmal::domain::{Change, Decision, Domain, DomainError, DomainEvent};
use einmal::envelope::{Envelope, InboxKey};
use einmal::pipeline::process::{AckMode, MessageOutcome, ProcessSettings, Processor};
use einmal::ports::{
    ClaimOutcome, Delivery, Finish, Inbox, InboxItem, InboxProcessing, InboxState, ItemVersion,
    PutOutcome, Queue, QueueMessage, Source, StoreError,
};
use einmal_tests::moto::{self, CallCounter, MAX_RECEIVE_COUNT};
use serde_json::json;

const TENANT: &str = "t1";

// ---------------------------------------------------------------------------
// The counter domain

#[derive(Default)]
struct CounterDomain {
    /// `wait` events wait while this is above zero (each decision takes one).
    waits_left: AtomicU32,
}

impl CounterDomain {
    fn key(tenant: &str, object: &str) -> StateKey {
        StateKey::new(tenant, "counter", object)
    }

    fn object(event: &DomainEvent<'_>) -> Result<String, DomainError> {
        event
            .envelope
            .object_id
            .clone()
            .ok_or_else(|| DomainError::Permanent("event without an object".into()))
    }

    fn amount(event: &DomainEvent<'_>) -> Result<i64, DomainError> {
        let body: serde_json::Value = serde_json::from_slice(event.body)
            .map_err(|e| DomainError::Permanent(format!("body is not JSON: {e}")))?;
        body["amount"]
            .as_i64()
            .ok_or_else(|| DomainError::Permanent("no amount".into()))
    }

    fn bump(event: &DomainEvent<'_>, record: &StateRecord, amount: i64) -> Change {
        let env = event.envelope;
        let count = record.data["count"].as_i64().unwrap_or(0) + amount;
        Change {
            key: record.key.clone(),
            effect_key: format!(
                "{}#{}#{}#{}",
                env.tenant,
                record.key.id,
                env.event_type,
                env.object_version.as_deref().unwrap_or("-")
            ),
            data: json!({ "count": count }),
            keyed_on: None,
        }
    }
}

impl Domain for CounterDomain {
    fn targets(&self, event: &DomainEvent<'_>) -> Result<Vec<StateKey>, DomainError> {
        let tenant = &event.envelope.tenant;
        match event.envelope.event_type.as_str() {
            "incr" | "wait" => Ok(vec![Self::key(tenant, &Self::object(event)?)]),
            "pair" => {
                let object = Self::object(event)?;
                Ok(vec![
                    Self::key(tenant, &object),
                    Self::key(tenant, &format!("{object}-mirror")),
                ])
            }
            "fail" => Err(DomainError::Permanent("unknown SKU sku-404".into())),
            _ => Ok(Vec::new()),
        }
    }

    fn decide(
        &self,
        event: &DomainEvent<'_>,
        current: &[StateRecord],
    ) -> Result<Decision, DomainError> {
        let kind = event.envelope.event_type.as_str();
        if kind == "wait"
            && self
                .waits_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(DomainError::Wait("the order is not paid yet".into()));
        }
        match kind {
            "incr" | "wait" | "pair" => {
                let amount = Self::amount(event)?;
                let changes: Vec<Change> = current
                    .iter()
                    .map(|r| Self::bump(event, r, amount))
                    .collect();
                let result = format!("{} += {amount}", current[0].key.pk());
                Ok(Decision::Apply { changes, result })
            }
            other => Ok(Decision::Ignore {
                reason: format!("unsupported event type {other}"),
            }),
        }
    }
}

// ---------------------------------------------------------------------------
// Backends

/// The real state store whose `load` is unavailable while `left` is above zero
/// (throttling, an outage): a transient error.
struct FlakyLoads {
    inner: Arc<dyn StateStore>,
    left: Arc<AtomicUsize>,
}

#[async_trait]
impl StateStore for FlakyLoads {
    async fn load(&self, keys: &[StateKey]) -> Result<Vec<StateRecord>, StoreError> {
        if self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(StoreError::Unavailable(
                "injected: state store throttled".into(),
            ));
        }
        self.inner.load(keys).await
    }
    // Every other method forwarded, so these scenarios run the production paths (read
    // checks, wait marks reported by the commit, commits gathered per batch).
    async fn mark_waited(&self, key: &StateKey, keep_until_ms: i64) -> Result<(), StoreError> {
        self.inner.mark_waited(key, keep_until_ms).await
    }
    fn gathers_commits(&self) -> bool {
        self.inner.gathers_commits()
    }
    async fn commit_each(&self, commits: &[Commit]) -> Vec<CommitAnswer> {
        self.inner.commit_each(commits).await
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

fn flaky(inner: Arc<dyn StateStore>) -> (Arc<dyn StateStore>, Arc<AtomicUsize>) {
    let left = Arc::new(AtomicUsize::new(0));
    let store = FlakyLoads {
        inner,
        left: left.clone(),
    };
    (Arc::new(store), left)
}

struct Backend {
    inbox: Arc<dyn Inbox>,
    processing: Arc<dyn InboxProcessing>,
    queue: Arc<dyn Queue>,
    state: Arc<dyn StateStore>,
    domain: Arc<CounterDomain>,
    /// The next this many state loads fail (transient).
    load_failures: Arc<AtomicUsize>,
    /// Every AWS call of the stores (AWS only).
    calls: Option<CallCounter>,
    /// The embedded store itself, for its commit counters (embedded only).
    embedded: Option<Arc<EmbeddedStore>>,
    _keep: Box<dyn Any + Send>,
}

async fn embedded() -> Backend {
    let dir = tempfile::tempdir().expect("temp dir");
    let options = EmbeddedOptions {
        max_receive_count: MAX_RECEIVE_COUNT,
    };
    let store = Arc::new(EmbeddedStore::open(dir.path(), options).expect("store opens"));
    let state = Arc::new(EmbeddedStateStore::new(store.clone()));
    let (state, load_failures) = flaky(state);
    Backend {
        inbox: store.clone(),
        processing: store.clone(),
        queue: store.clone(),
        state,
        domain: Arc::default(),
        load_failures,
        calls: None,
        embedded: Some(store),
        _keep: Box::new(dir),
    }
}

async fn aws() -> Backend {
    let moto = moto::shared();
    let counter = CallCounter::new();
    let (store, names) = moto::aws_store(moto, Some(counter.clone())).await;
    let sdk = moto.sdk_config().await;
    let state_table = format!("{}-state", names.table);
    create_state_table(&aws_sdk_dynamodb::Client::new(&sdk), &state_table)
        .await
        .expect("state table on moto");
    let client = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk)
            .interceptor(counter.clone())
            .build(),
    );
    let store = Arc::new(store);
    let state: Arc<dyn StateStore> = Arc::new(DynamoStateStore::new(client, state_table));
    let (state, load_failures) = flaky(state);
    Backend {
        inbox: store.clone(),
        processing: store.clone(),
        queue: store,
        state,
        domain: Arc::default(),
        load_failures,
        calls: Some(counter),
        embedded: None,
        _keep: Box::new(()),
    }
}

fn settings() -> ProcessSettings {
    ProcessSettings {
        lease_ms: 2_000,
        max_receive_count: MAX_RECEIVE_COUNT,
        backoff_base_ms: 100,
        backoff_max_ms: 250,
        max_conflict_retries: 5,
        wait_window_ms: None,
        retry_horizon_ms: None,
    }
}

impl Backend {
    /// Jitter pinned to 1.0: every backoff is its ceiling, so delays are predictable.
    fn processor_with(
        &self,
        processing: Arc<dyn InboxProcessing>,
        s: ProcessSettings,
    ) -> Processor {
        self.random_jitter_processor(processing, s)
            .with_jitter(|| 1.0)
    }

    /// The production jitter (uniformly random fractions).
    fn random_jitter_processor(
        &self,
        processing: Arc<dyn InboxProcessing>,
        s: ProcessSettings,
    ) -> Processor {
        Processor::new(
            self.inbox.clone(),
            processing,
            self.queue.clone(),
            self.state.clone(),
            self.domain.clone(),
        )
        .with_settings(s)
    }

    fn processor(&self, s: ProcessSettings) -> Processor {
        self.processor_with(self.processing.clone(), s)
    }

    /// [`Backend::deliver`] with the receiver's message ([`Queue::send_item`]: on AWS it
    /// carries the item and its body).
    async fn deliver_as_receiver(
        &self,
        event_id: &str,
        kind: &str,
        object: &str,
        version: &str,
        amount: i64,
    ) -> Delivery {
        let item = inbox_item(event_id, kind, object, version, amount);
        assert_eq!(
            self.inbox.put_new(&item).await.unwrap(),
            PutOutcome::Inserted
        );
        self.queue.send_item(&item, None).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut got = self
                .queue
                .receive(1, Duration::from_secs(60))
                .await
                .unwrap();
            if let Some(delivery) = got.pop() {
                assert_eq!(delivery.message.pk, item.key);
                return delivery;
            }
            assert!(Instant::now() < deadline, "the message never arrived");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Store an event in the inbox (as the receiver would), send its pointer and
    /// receive it back: a real delivery with a real receipt.
    async fn deliver(
        &self,
        event_id: &str,
        kind: &str,
        object: &str,
        version: &str,
        amount: i64,
    ) -> Delivery {
        let item = inbox_item(event_id, kind, object, version, amount);
        assert_eq!(
            self.inbox.put_new(&item).await.unwrap(),
            PutOutcome::Inserted
        );
        self.queue
            .send(&QueueMessage {
                pk: item.key.clone(),
            })
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut got = self
                .queue
                .receive(1, Duration::from_secs(60))
                .await
                .unwrap();
            if let Some(delivery) = got.pop() {
                assert_eq!(delivery.message.pk, item.key);
                return delivery;
            }
            assert!(Instant::now() < deadline, "the message never arrived");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn item(&self, key: &InboxKey) -> InboxItem {
        self.inbox
            .get(key)
            .await
            .unwrap()
            .expect("inbox item exists")
    }

    async fn record(&self, object: &str) -> StateRecord {
        let mut records = self
            .state
            .load(&[CounterDomain::key(TENANT, object)])
            .await
            .unwrap();
        records.remove(0)
    }

    async fn count(&self, object: &str) -> i64 {
        self.record(object).await.data["count"]
            .as_i64()
            .unwrap_or(0)
    }

    /// Dead letters now visible (and hidden again for a minute).
    async fn dead_letters(&self) -> Vec<Delivery> {
        let mut all = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let got = self
                .queue
                .receive_dead_letters(10, Duration::from_secs(60))
                .await
                .unwrap();
            if got.is_empty() && !all.is_empty() {
                break;
            }
            all.extend(got);
            if all.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        all
    }
}

fn inbox_item(event_id: &str, kind: &str, object: &str, version: &str, amount: i64) -> InboxItem {
    let envelope = Envelope {
        provider: "stripe".into(),
        tenant: TENANT.into(),
        event_id: event_id.into(),
        event_type: kind.into(),
        object_id: Some(object.into()),
        object_version: Some(version.into()),
        occurred_at: Some(1_764_400_000),
        delivery_id: None,
    };
    let body = json!({ "id": event_id, "type": kind, "amount": amount })
        .to_string()
        .into_bytes();
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

/// The same message delivered again with another receive count (no queue round trip).
fn redelivered(d: &Delivery, receive_count: u32) -> Delivery {
    Delivery {
        receive_count,
        ..d.clone()
    }
}

/// Fault injection: the first `finish` fails as if the store were unreachable
/// (a crash after the commit, before the inbox is finished).
struct FinishFailsOnce {
    inner: Arc<dyn InboxProcessing>,
    failed: AtomicBool,
}

#[async_trait]
impl InboxProcessing for FinishFailsOnce {
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
    async fn finish(
        &self,
        key: &InboxKey,
        run: &Handout,
        finish: &Finish,
    ) -> Result<bool, StoreError> {
        if !self.failed.swap(true, Ordering::SeqCst) {
            return Err(StoreError::Unavailable("injected: finish lost".into()));
        }
        self.inner.finish(key, run, finish).await
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

// ---------------------------------------------------------------------------
// The inbox processing port

async fn claim_lease_and_finish_on_the_port(b: Backend) {
    let item = inbox_item("evt_port", "incr", "c1", "v1", 1);
    b.inbox.put_new(&item).await.unwrap();
    let p = &b.processing;
    let claimed = match p.claim(&item.key, "w1", 10_000, 30_000).await.unwrap() {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    };
    assert_eq!(
        claimed.body, item.body,
        "the body comes back with the claim"
    );
    assert_eq!(claimed.state, InboxState::Processing);
    assert_eq!(claimed.attempts, 1);
    assert_eq!(claimed.lease_owner.as_deref(), Some("w1"));
    assert_eq!(claimed.lease_until_ms, Some(40_000));

    assert_eq!(
        p.claim(&item.key, "w2", 20_000, 30_000).await.unwrap(),
        ClaimOutcome::Leased { until_ms: 40_000 }
    );
    // w1 crashed: after its lease ran out, w2 claims (attempt 2).
    let again = match p.claim(&item.key, "w2", 40_000, 30_000).await.unwrap() {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    };
    assert_eq!(again.attempts, 2);
    assert_eq!(again.lease_owner.as_deref(), Some("w2"));

    let done = Finish {
        state: InboxState::Completed,
        error_class: None,
        error: None,
        result: Some("c1 += 1".into()),
        now_ms: 41_000,
        wait: Default::default(),
        deliveries: None,
        relay_due_ms: None,
    };
    assert!(
        !p.finish(&item.key, &Handout::leased("w1"), &done)
            .await
            .unwrap(),
        "the old owner cannot finish"
    );
    assert!(p
        .finish(&item.key, &Handout::leased("w2"), &done)
        .await
        .unwrap());
    assert!(
        !p.finish(&item.key, &Handout::leased("w2"), &done)
            .await
            .unwrap(),
        "finished once"
    );
    let stored = b.item(&item.key).await;
    assert_eq!(stored.state, InboxState::Completed);
    assert_eq!(stored.result.as_deref(), Some("c1 += 1"));
    assert_eq!((stored.lease_owner, stored.lease_until_ms), (None, None));
    assert_eq!(stored.updated_at_ms, 41_000);
    assert_eq!(stored.body, item.body);

    assert_eq!(
        p.claim(&item.key, "w3", 99_000, 30_000).await.unwrap(),
        ClaimOutcome::Finished(InboxState::Completed)
    );
    let missing = InboxKey::new("stripe", TENANT, "evt_never");
    assert_eq!(
        p.claim(&missing, "w3", 99_000, 30_000).await.unwrap(),
        ClaimOutcome::Missing
    );

    // Redrive bookkeeping: a waiting item is marked, a finished one is not.
    let waiting = inbox_item("evt_port_2", "incr", "c1", "v2", 1);
    b.inbox.put_new(&waiting).await.unwrap();
    for key in [&waiting.key, &item.key] {
        let seen = ItemVersion::of(&b.item(key).await);
        p.mark_dead_letter(key, "redriven after 3 receives", seen, 100_000)
            .await
            .unwrap();
    }
    let never = ItemVersion {
        state: InboxState::Queued,
        updated_at_ms: 1,
    };
    assert!(!p
        .mark_dead_letter(&missing, "redriven after 3 receives", never, 100_000)
        .await
        .unwrap());
    let w = b.item(&waiting.key).await;
    assert_eq!(w.state, InboxState::DeadLetter);
    assert_eq!(w.last_error.as_deref(), Some("redriven after 3 receives"));
    assert_eq!(b.item(&item.key).await.state, InboxState::Completed);
}

async fn retryable_then_completed_clears_the_last_error(b: Backend) {
    let item = inbox_item("evt_port_retry", "incr", "c1", "v1", 1);
    b.inbox.put_new(&item).await.unwrap();
    let p = &b.processing;
    assert!(matches!(
        p.claim(&item.key, "w1", 1_000, 5_000).await.unwrap(),
        ClaimOutcome::Claimed(_)
    ));
    let retry = Finish {
        state: InboxState::Retryable,
        error_class: Some("transient".into()),
        error: Some("waiting: payment first".into()),
        result: None,
        now_ms: 1_100,
        wait: Default::default(),
        deliveries: None,
        relay_due_ms: None,
    };
    assert!(p
        .finish(&item.key, &Handout::leased("w1"), &retry)
        .await
        .unwrap());
    let stored = b.item(&item.key).await;
    assert_eq!(stored.state, InboxState::Retryable);
    assert_eq!(stored.last_error_class.as_deref(), Some("transient"));
    assert_eq!(stored.lease_owner, None);
    // Retryable is claimable at once (the queue delay paces it, not the store).
    assert!(matches!(
        p.claim(&item.key, "w2", 1_200, 5_000).await.unwrap(),
        ClaimOutcome::Claimed(_)
    ));
    let done = Finish {
        state: InboxState::Completed,
        error_class: None,
        error: None,
        result: Some("ok".into()),
        now_ms: 1_300,
        wait: Default::default(),
        deliveries: None,
        relay_due_ms: None,
    };
    assert!(p
        .finish(&item.key, &Handout::leased("w2"), &done)
        .await
        .unwrap());
    let stored = b.item(&item.key).await;
    assert_eq!((stored.state, stored.attempts), (InboxState::Completed, 2));
    // A completed event carries no error; its attempts tell it was retried.
    assert_eq!((stored.last_error, stored.last_error_class), (None, None));
    assert_eq!(stored.result.as_deref(), Some("ok"));
}

// ---------------------------------------------------------------------------
// Engine scenarios

async fn same_message_twice_applies_once(b: Backend) {
    let processor = b.processor(settings());
    let d = b.deliver("evt_twice", "incr", "c1", "v1", 5).await;
    assert_eq!(
        processor.process_message(&d, "w1").await,
        MessageOutcome::Ack
    );
    assert_eq!(b.count("c1").await, 5);
    let item = b.item(&d.message.pk).await;
    assert_eq!(item.state, InboxState::Completed);
    assert_eq!(item.result.as_deref(), Some("t1#counter#c1 += 5"));
    assert_eq!(item.attempts, 1);

    // The same message again (SQS delivers at least once), by another worker.
    assert_eq!(
        processor.process_message(&redelivered(&d, 2), "w2").await,
        MessageOutcome::Ack
    );
    assert_eq!(b.count("c1").await, 5, "no second effect");
    assert_eq!(
        b.item(&d.message.pk).await.attempts,
        1,
        "a finished item is not claimed again"
    );

    // The same business event under another event id: the effect key guards it.
    let other = b.deliver("evt_twice_resent", "incr", "c1", "v1", 5).await;
    assert_eq!(
        processor.process_message(&other, "w1").await,
        MessageOutcome::Ack
    );
    assert_eq!(b.count("c1").await, 5);
    let item = b.item(&other.message.pk).await;
    assert_eq!(item.state, InboxState::Completed);
    assert_eq!(item.result.as_deref(), Some("already applied"));

    // A new version is a new effect.
    let next = b.deliver("evt_twice_v2", "incr", "c1", "v2", 2).await;
    assert_eq!(
        processor.process_message(&next, "w1").await,
        MessageOutcome::Ack
    );
    let record = b.record("c1").await;
    assert_eq!(record.data["count"], 7);
    assert_eq!(record.version, 2);
    assert_eq!(record.applied.len(), 2);
}

async fn concurrent_workers_on_one_message_apply_once(b: Backend) {
    let processor = Arc::new(b.processor(settings()));
    let d = b.deliver("evt_race", "incr", "c1", "v1", 1).await;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let processor = processor.clone();
            let d = d.clone();
            tokio::spawn(async move { processor.process_message(&d, &format!("w{i}")).await })
        })
        .collect();
    let mut acks = 0;
    for t in tasks {
        match t.await.unwrap() {
            MessageOutcome::Ack => acks += 1,
            MessageOutcome::LeaveForLater { delay } => {
                assert!(delay <= Duration::from_millis(2_500))
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(acks >= 1);
    assert_eq!(b.count("c1").await, 1, "one effect");
    let item = b.item(&d.message.pk).await;
    assert_eq!((item.state, item.attempts), (InboxState::Completed, 1));
}

async fn concurrent_events_on_one_record_all_apply(b: Backend) {
    let s = ProcessSettings {
        max_receive_count: 100,
        ..settings()
    };
    let processor = Arc::new(b.random_jitter_processor(b.processing.clone(), s));
    let mut pending = Vec::new();
    for i in 0..8 {
        pending.push(
            b.deliver(&format!("evt_hot_{i}"), "incr", "hot", &format!("v{i}"), 1)
                .await,
        );
    }
    // Version conflicts are decided again; what still loses comes back as a retry.
    for round in 1..=10u32 {
        let tasks: Vec<_> = pending
            .iter()
            .map(|d| {
                let processor = processor.clone();
                let d = redelivered(d, round);
                tokio::spawn(async move { (d.clone(), processor.process_message(&d, "w").await) })
            })
            .collect();
        let mut again = Vec::new();
        for t in tasks {
            let (d, outcome) = t.await.unwrap();
            match outcome {
                MessageOutcome::Ack => {}
                MessageOutcome::Retry { .. } | MessageOutcome::LeaveForLater { .. } => {
                    again.push(d)
                }
                MessageOutcome::DeadLetterNow => panic!("dead-lettered under contention"),
            }
        }
        pending = again;
        if pending.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(pending.is_empty(), "{} events never applied", pending.len());
    let record = b.record("hot").await;
    assert_eq!(record.data["count"], 8);
    assert_eq!(record.applied.len(), 8);
}

async fn multi_record_effects_commit_together_once(b: Backend) {
    let processor = b.processor(settings());
    let d = b.deliver("evt_pair", "pair", "p1", "v1", 3).await;
    assert_eq!(
        processor.process_message(&d, "w1").await,
        MessageOutcome::Ack
    );
    assert_eq!((b.count("p1").await, b.count("p1-mirror").await), (3, 3));
    let again = b.deliver("evt_pair_resent", "pair", "p1", "v1", 3).await;
    assert_eq!(
        processor.process_message(&again, "w1").await,
        MessageOutcome::Ack
    );
    assert_eq!((b.count("p1").await, b.count("p1-mirror").await), (3, 3));
    assert_eq!(
        b.item(&again.message.pk).await.result.as_deref(),
        Some("already applied")
    );
}

async fn crash_after_claim_is_taken_over_after_the_lease(b: Backend) {
    let s = ProcessSettings {
        lease_ms: 300,
        ..settings()
    };
    let processor = b.processor(s);
    let d = b.deliver("evt_crash_claim", "incr", "c1", "v1", 1).await;
    // A worker claims and dies.
    let now = einmal::time::now_millis();
    assert!(matches!(
        b.processing
            .claim(&d.message.pk, "dead-worker", now, 300)
            .await
            .unwrap(),
        ClaimOutcome::Claimed(_)
    ));
    // While its lease lives, the message goes back to the queue until the lease ends.
    match processor.process_message(&redelivered(&d, 2), "w2").await {
        MessageOutcome::LeaveForLater { delay } => {
            assert!(
                delay > Duration::from_millis(200) && delay <= Duration::from_millis(600),
                "{delay:?}"
            )
        }
        other => panic!("expected LeaveForLater, got {other:?}"),
    }
    assert_eq!(b.count("c1").await, 0);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(
        processor.process_message(&redelivered(&d, 3), "w2").await,
        MessageOutcome::Ack
    );
    assert_eq!(b.count("c1").await, 1);
    let item = b.item(&d.message.pk).await;
    // Embedded counts claims (the dead worker's and w2's). AWS starts without a claim
    // and counts the message's receives (3, the one left for later included), or the
    // stored count + 1 where that is more.
    let attempts = if b.calls.is_some() { 3 } else { 2 };
    assert_eq!(
        (item.state, item.attempts),
        (InboxState::Completed, attempts)
    );
}

async fn crash_after_commit_before_finish_has_no_second_effect(b: Backend) {
    let s = ProcessSettings {
        lease_ms: 300,
        ..settings()
    };
    let faulty: Arc<dyn InboxProcessing> = Arc::new(FinishFailsOnce {
        inner: b.processing.clone(),
        failed: AtomicBool::new(false),
    });
    let crashing = b.processor_with(faulty, s.clone());
    let d = b.deliver("evt_crash_commit", "incr", "c1", "v1", 1).await;
    match crashing.process_message(&d, "w1").await {
        // Not before the lease ends: the item is still leased to w1.
        MessageOutcome::Retry { delay } => {
            assert!(delay >= Duration::from_millis(300), "{delay:?}")
        }
        other => panic!("expected Retry, got {other:?}"),
    }
    assert_eq!(b.count("c1").await, 1, "the effect was committed");
    // Embedded: still leased to w1. AWS (the backend that counts calls): started
    // without a lease, the item is as it was; the message's visibility holds it.
    let expected = if b.calls.is_some() {
        InboxState::Received
    } else {
        InboxState::Processing
    };
    assert_eq!(b.item(&d.message.pk).await.state, expected);

    tokio::time::sleep(Duration::from_millis(350)).await;
    let processor = b.processor(s);
    assert_eq!(
        processor.process_message(&redelivered(&d, 2), "w2").await,
        MessageOutcome::Ack
    );
    assert_eq!(b.count("c1").await, 1, "no second effect");
    let item = b.item(&d.message.pk).await;
    assert_eq!(item.state, InboxState::Completed);
    assert_eq!(item.result.as_deref(), Some("already applied"));
    assert_eq!(item.attempts, 2);
}

async fn permanent_error_dead_letters_at_once(b: Backend) {
    let processor = b.processor(settings());
    let d = b.deliver("evt_fail", "fail", "c1", "v1", 1).await;
    let outcome = processor.process_message(&d, "w1").await;
    assert_eq!(outcome, MessageOutcome::DeadLetterNow);
    let item = b.item(&d.message.pk).await;
    assert_eq!(item.state, InboxState::DeadLetter);
    assert_eq!(item.last_error_class.as_deref(), Some("permanent"));
    assert!(
        item.last_error
            .as_deref()
            .unwrap()
            .contains("unknown SKU sku-404"),
        "{item:?}"
    );
    assert_eq!(item.lease_owner, None);

    // The caller moves the pointer: DLQ send, then delete the original.
    assert!(!processor.settle(&d, outcome, AckMode::Delete).await);
    let dead = b.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message.pk, d.message.pk);
    assert!(b
        .queue
        .receive(10, Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(b.count("c1").await, 0);
}

async fn transient_errors_back_off_then_succeed(b: Backend) {
    let s = ProcessSettings {
        max_receive_count: 10,
        ..settings()
    };
    let processor = b.processor(s.clone());
    b.load_failures.store(4, Ordering::SeqCst);
    let d = b.deliver("evt_flaky", "incr", "c1", "v1", 1).await;
    let mut delays = Vec::new();
    for n in 1..=4 {
        match processor.process_message(&redelivered(&d, n), "w1").await {
            MessageOutcome::Retry { delay } => delays.push(delay.as_millis()),
            other => panic!("attempt {n}: expected Retry, got {other:?}"),
        }
        let item = b.item(&d.message.pk).await;
        assert_eq!(item.state, InboxState::Retryable);
        assert_eq!(item.attempts, n);
        assert_eq!(item.last_error_class.as_deref(), Some("transient"));
        assert!(item.last_error.as_deref().unwrap().contains("throttled"));
    }
    // Doubling from the base, bounded by the maximum (jitter pinned to its ceiling).
    assert_eq!(delays, [100, 200, 250, 250]);
    assert_eq!(
        processor.process_message(&redelivered(&d, 5), "w1").await,
        MessageOutcome::Ack
    );
    assert_eq!(b.count("c1").await, 1);
    let item = b.item(&d.message.pk).await;
    assert_eq!((item.state, item.attempts), (InboxState::Completed, 5));

    // With real full jitter every delay stays within its ceiling.
    let jittered = b.random_jitter_processor(b.processing.clone(), s.clone());
    b.load_failures.store(6, Ordering::SeqCst);
    let d = b.deliver("evt_flaky_jitter", "incr", "c2", "v1", 1).await;
    for n in 1..=6u32 {
        match jittered.process_message(&redelivered(&d, n), "w1").await {
            MessageOutcome::Retry { delay } => {
                assert!(
                    delay.as_millis() as i64 <= s.backoff_cap_ms(n),
                    "attempt {n}: {delay:?}"
                )
            }
            other => panic!("attempt {n}: expected Retry, got {other:?}"),
        }
    }

    // On a real queue the retry is a fresh message, visible after the delay: the
    // received one is gone, and the redrive's receive count starts again.
    b.load_failures.store(1, Ordering::SeqCst);
    let d = b.deliver("evt_flaky_queue", "incr", "c3", "v1", 1).await;
    let outcome = processor.process_message(&d, "w1").await;
    assert!(matches!(outcome, MessageOutcome::Retry { .. }));
    assert!(
        !processor.settle(&d, outcome, AckMode::Delete).await,
        "replaced by the postponed message"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let back = loop {
        // (SQS delays are whole seconds: the 100 ms delay becomes 1 s there.)
        let mut got = b.queue.receive(1, Duration::from_secs(60)).await.unwrap();
        if let Some(back) = got.pop() {
            break back;
        }
        assert!(
            Instant::now() < deadline,
            "the retried message never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(back.message.pk, d.message.pk);
    assert_eq!((back.receive_count, back.postponed), (1, 1));
    let outcome = processor.process_message(&back, "w1").await;
    assert_eq!(outcome, MessageOutcome::Ack);
    assert!(!processor.settle(&back, outcome, AckMode::Delete).await);
    assert_eq!(b.count("c3").await, 1);
}

/// Transient failures are retried past every receive SQS allows (each retry is a
/// fresh message, [`einmal::ports::Queue::postpone`]); only once the event is older
/// than its retry horizon (the provider has stopped retrying too) is it dead-lettered.
async fn retries_exhausted_dead_letter(b: Backend) {
    let processor = b.processor(settings());
    b.load_failures.store(100, Ordering::SeqCst);
    let d = b.deliver("evt_exhaust", "incr", "c1", "v1", 1).await;
    for n in 1..=2 * MAX_RECEIVE_COUNT {
        let outcome = processor.process_message(&redelivered(&d, n), "w1").await;
        assert!(
            matches!(outcome, MessageOutcome::Retry { .. }),
            "{n}: {outcome:?}"
        );
        assert_eq!(b.item(&d.message.pk).await.state, InboxState::Retryable);
    }
    // Past the horizon: the transient failure ends the event, so inbox and DLQ agree.
    let horizon = b
        .processor(ProcessSettings {
            retry_horizon_ms: Some(60_000),
            ..settings()
        })
        .with_clock(|| einmal::time::now_millis() + 120_000);
    let last = redelivered(&d, 1);
    let outcome = horizon.process_message(&last, "w1").await;
    assert_eq!(outcome, MessageOutcome::DeadLetterNow);
    let item = b.item(&d.message.pk).await;
    assert_eq!(item.state, InboxState::DeadLetter);
    assert_eq!(item.last_error_class.as_deref(), Some("transient"));
    let error = item.last_error.unwrap();
    assert!(
        error.starts_with("retries exhausted: transient failures for")
            && error.contains("throttled"),
        "{error}"
    );
    assert!(!horizon.settle(&last, outcome, AckMode::Delete).await);
    assert_eq!(b.dead_letters().await.len(), 1);
    b.load_failures.store(0, Ordering::SeqCst);
    assert_eq!(b.count("c1").await, 0);
}

/// A custom domain's `Wait` parks the event, even on the last receive SQS allows, and
/// spends no receive: the message is deleted. The commit of another event on the
/// record it waits on wakes it (a new pointer), and it is applied once.
async fn a_wait_parks_and_a_commit_on_its_record_wakes_it(b: Backend) {
    let processor = b.processor(settings());
    b.domain.waits_left.store(1, Ordering::SeqCst);
    let d = b.deliver("evt_waits", "wait", "c1", "v1", 5).await;
    let last = redelivered(&d, MAX_RECEIVE_COUNT);
    let outcome = processor.process_message(&last, "w1").await;
    assert_eq!(outcome, MessageOutcome::Ack, "parked: the message goes");
    assert!(!processor.settle(&last, outcome, AckMode::Delete).await);
    let item = b.item(&d.message.pk).await;
    assert_eq!(item.state, InboxState::Waiting);
    let waiting = item.waiting.expect("what it waits for");
    assert_eq!(waiting.on, CounterDomain::key(TENANT, "c1").pk());
    assert_eq!(
        item.last_error.as_deref(),
        Some("waiting: the order is not paid yet")
    );
    assert!(b
        .queue
        .receive(10, Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
    assert!(b.dead_letters().await.is_empty());

    // Another event commits on c1: its waiter gets a new pointer.
    let incr = b.deliver("evt_unblocks", "incr", "c1", "v2", 1).await;
    assert_eq!(
        processor.process_message(&incr, "w1").await,
        MessageOutcome::Ack
    );
    processor
        .settle(&incr, MessageOutcome::Ack, AckMode::Delete)
        .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let woken = loop {
        let mut got = b.queue.receive(1, Duration::from_secs(60)).await.unwrap();
        if let Some(woken) = got.pop() {
            break woken;
        }
        assert!(Instant::now() < deadline, "the waiter was never woken");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(woken.message.pk, d.message.pk);
    assert_eq!(woken.receive_count, 1, "a fresh message: no receive spent");
    assert_eq!(
        processor.process_message(&woken, "w1").await,
        MessageOutcome::Ack
    );
    let item = b.item(&d.message.pk).await;
    assert_eq!((item.state, item.waiting), (InboxState::Completed, None));
    assert_eq!(b.count("c1").await, 6);
    assert!(b.dead_letters().await.is_empty());
}

async fn unsupported_and_missing_events_are_acknowledged(b: Backend) {
    let processor = b.processor(settings());
    let d = b
        .deliver("evt_other", "customer.updated", "c1", "v1", 1)
        .await;
    assert_eq!(
        processor.process_message(&d, "w1").await,
        MessageOutcome::Ack
    );
    let item = b.item(&d.message.pk).await;
    assert_eq!(item.state, InboxState::Ignored);
    assert_eq!(
        item.result.as_deref(),
        Some("unsupported event type customer.updated")
    );

    let gone = Delivery {
        message: QueueMessage {
            pk: InboxKey::new("stripe", TENANT, "evt_expired"),
        },
        receipt: d.receipt.clone(),
        receive_count: 1,
        item: None,
        postponed: 0,
    };
    assert_eq!(
        processor.process_message(&gone, "w1").await,
        MessageOutcome::Ack
    );
}

async fn a_batch_survives_its_bad_records(b: Backend) {
    let processor = b.processor(settings());
    let good = b.deliver("evt_batch_good", "incr", "c1", "v1", 1).await;
    let bad = b.deliver("evt_batch_bad", "fail", "c1", "v2", 1).await;
    let ignored = b.deliver("evt_batch_other", "other", "c1", "v3", 1).await;
    let outcomes = processor
        .process_batch(&[good.clone(), bad.clone(), ignored.clone()], "w1")
        .await;
    assert_eq!(
        outcomes,
        vec![
            (good.receipt, MessageOutcome::Ack),
            (bad.receipt, MessageOutcome::DeadLetterNow),
            (ignored.receipt, MessageOutcome::Ack),
        ]
    );
    assert_eq!(b.count("c1").await, 1);
}

async fn run_local_drains_the_queue(b: Backend) {
    let processor = Arc::new(b.processor(settings()));
    let mut keys = Vec::new();
    for i in 0..5 {
        let item = inbox_item(
            &format!("evt_loop_{i}"),
            "incr",
            "loop",
            &format!("v{i}"),
            1,
        );
        b.inbox.put_new(&item).await.unwrap();
        b.queue
            .send(&QueueMessage {
                pk: item.key.clone(),
            })
            .await
            .unwrap();
        keys.push(item.key);
    }
    let failing = inbox_item("evt_loop_fail", "fail", "loop", "vx", 1);
    b.inbox.put_new(&failing).await.unwrap();
    b.queue
        .send(&QueueMessage {
            pk: failing.key.clone(),
        })
        .await
        .unwrap();

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = {
        let processor = processor.clone();
        tokio::spawn(async move {
            processor
                .run_local("local-1", async {
                    let _ = stopped.await;
                })
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut done = 0;
        for key in &keys {
            if b.item(key).await.state == InboxState::Completed {
                done += 1;
            }
        }
        if done == keys.len() && b.item(&failing.key).await.state == InboxState::DeadLetter {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "run_local did not finish the events ({done} done)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), worker)
        .await
        .expect("run_local stops on shutdown")
        .unwrap();
    assert_eq!(b.count("loop").await, 5);
    assert!(
        b.queue
            .receive(10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty(),
        "all acknowledged"
    );
    let dead = b.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message.pk, failing.key);
}

macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod embedded_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario(super::embedded().await).await
                }
            )*
        }
        mod aws_moto {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario(super::aws().await).await
                }
            )*
        }
    };
}

on_both_backends!(
    claim_lease_and_finish_on_the_port,
    retryable_then_completed_clears_the_last_error,
    same_message_twice_applies_once,
    concurrent_workers_on_one_message_apply_once,
    concurrent_events_on_one_record_all_apply,
    multi_record_effects_commit_together_once,
    crash_after_claim_is_taken_over_after_the_lease,
    crash_after_commit_before_finish_has_no_second_effect,
    permanent_error_dead_letters_at_once,
    transient_errors_back_off_then_succeed,
    retries_exhausted_dead_letter,
    a_wait_parks_and_a_commit_on_its_record_wakes_it,
    unsupported_and_missing_events_are_acknowledged,
    a_batch_survives_its_bad_records,
    a_batch_with_competing_events_applies_each_once,
    run_local_drains_the_queue,
);

/// Several events of one batch on the same records: on the embedded store their
/// commits are gathered into one call, where all but one of each record's conflict
/// and decide again; every effect is applied once.
async fn a_batch_with_competing_events_applies_each_once(b: Backend) {
    let processor = b.processor(settings());
    let mut batch = Vec::new();
    for i in 0..4 {
        batch.push(
            b.deliver(&format!("evt_race_a{i}"), "incr", "ra", &format!("v{i}"), 1)
                .await,
        );
        batch.push(
            b.deliver(&format!("evt_race_b{i}"), "pair", "rb", &format!("v{i}"), 2)
                .await,
        );
    }
    // The same message twice in the batch: one run leaves it to the other.
    batch.push(batch[0].clone());
    let outcomes = processor.process_batch(&batch, "w1").await;
    for (i, (_, outcome)) in outcomes.iter().take(8).enumerate() {
        assert_eq!(*outcome, MessageOutcome::Ack, "event {i}");
    }
    assert_eq!(b.count("ra").await, 4);
    assert_eq!(b.count("rb").await, 8);
    assert_eq!(b.count("rb-mirror").await, 8);
    for d in &batch {
        assert_eq!(b.item(&d.message.pk).await.state, InboxState::Completed);
    }
}

/// The business commits of a batch reach the embedded store's writer as one job: a
/// single fsynced transaction carries the effects of every event in it. The gather
/// wait is an hour, so only the runs themselves complete the group and the count
/// does not depend on timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_commits_its_effects_under_one_fsync() {
    let b = embedded().await;
    let store = b.embedded.clone().expect("embedded store");
    let processor = b
        .processor(settings())
        .with_commit_gather(Duration::from_secs(3600));
    let mut batch = Vec::new();
    for i in 0..12 {
        let object = format!("one-{i}");
        batch.push(
            b.deliver(&format!("evt_one_{i}"), "incr", &object, "v1", 1)
                .await,
        );
    }
    batch.push(b.deliver("evt_one_pair", "pair", "one-pair", "v1", 3).await);
    batch.push(b.deliver("evt_one_bad", "fail", "one-bad", "v1", 1).await);
    batch.push(
        b.deliver("evt_one_other", "other", "one-other", "v1", 1)
            .await,
    );
    let before = store.commit_stats();
    let outcomes = processor.process_batch(&batch, "w1").await;
    let after = store.commit_stats();
    let expected: Vec<MessageOutcome> = (0..13)
        .map(|_| MessageOutcome::Ack)
        .chain([MessageOutcome::DeadLetterNow, MessageOutcome::Ack])
        .collect();
    let got: Vec<MessageOutcome> = outcomes.into_iter().map(|(_, o)| o).collect();
    assert_eq!(got, expected);
    for i in 0..12 {
        assert_eq!(b.count(&format!("one-{i}")).await, 1);
    }
    assert_eq!(b.count("one-pair").await, 3);
    assert_eq!(b.count("one-pair-mirror").await, 3);
    assert_eq!(
        after.fsynced_effects - before.fsynced_effects,
        1,
        "one fsync for the batch's 13 business commits: {before:?} -> {after:?}"
    );
}

// ---------------------------------------------------------------------------
// Cost

/// AWS calls for one event, counted at the SDK's HTTP layer against moto.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_calls_per_processed_event() {
    let b = aws().await;
    let calls = b.calls.clone().expect("AWS backend counts calls");
    let processor = b.processor(settings());

    let d = b
        .deliver_as_receiver("evt_cost", "incr", "c1", "v1", 1)
        .await;
    assert!(d.item.is_some(), "the message carries the item");
    let before = calls.count();
    assert_eq!(
        processor.process_message(&d, "w1").await,
        MessageOutcome::Ack
    );
    let single = calls.count() - before;
    // No claim (the message carries the item and its body), load (GetItem), commit
    // (conditional PutItem, which returns the record's wait marks: nobody waits, so
    // no waiters' Query), finish (UpdateItem). SQS deletes unreported records for the
    // Lambda.
    assert_eq!(single, 3, "load + commit + finish");

    let before = calls.count();
    assert_eq!(
        processor.process_message(&redelivered(&d, 2), "w1").await,
        MessageOutcome::Ack
    );
    let duplicate = calls.count() - before;
    // A redelivery reads the item (it may have moved on since the send): finished,
    // nothing more to do.
    assert_eq!(
        duplicate, 1,
        "a redelivered message: the item's read finds it completed"
    );

    let pair = b
        .deliver_as_receiver("evt_cost_pair", "pair", "p1", "v1", 1)
        .await;
    let before = calls.count();
    assert_eq!(
        processor.process_message(&pair, "w1").await,
        MessageOutcome::Ack
    );
    let two_records = calls.count() - before;
    assert_eq!(two_records, 3, "BatchGetItem + TransactWriteItems + finish");

    let ignored = b
        .deliver_as_receiver("evt_cost_ignored", "other", "c1", "v1", 1)
        .await;
    let before = calls.count();
    assert_eq!(
        processor.process_message(&ignored, "w1").await,
        MessageOutcome::Ack
    );
    let ignore = calls.count() - before;
    assert_eq!(ignore, 1, "the finish");

    // A pointer alone (a wake, a re-send, a replay): one read of the item and one of
    // its body instead of the carried copy.
    let pointer = b.deliver("evt_cost_pointer", "incr", "c2", "v1", 1).await;
    assert!(pointer.item.is_none());
    let before = calls.count();
    assert_eq!(
        processor.process_message(&pointer, "w1").await,
        MessageOutcome::Ack
    );
    assert_eq!(
        calls.count() - before,
        5,
        "2 reads + load + commit + finish"
    );

    println!(
        "AWS calls per event: single-record effect {single}, two-record effect {two_records}, \
         ignored {ignore}, duplicate message {duplicate}"
    );
}
