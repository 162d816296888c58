//! Dead letters, replay and audit on both backends (embedded SQLite; DynamoDB + SQS
//! in moto): a permanently failing event is fixed and replayed by one call, with an
//! audit record, and a second replay changes nothing; a bulk replay of many completed
//! events shows progress and leaves the business state exactly as it was; a dry run
//! changes nothing and writes no audit record; a replay whose pointer was never sent
//! is sent by the sweeper.

use einmal::domain::state::CommitOne;
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use einmal::adapters::aws::{create_audit_table, DynamoAuditLog};
use einmal::adapters::aws::{create_queues, create_tables, AwsStore};
use einmal::adapters::aws::{create_state_table, DynamoStateStore};
use einmal::adapters::embedded::{EmbeddedAuditLog, EmbeddedStateStore};
use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
use einmal::audit::AuditLog;
use einmal::domain::reference::{order_key, seed_sku, sku_key, ReferenceDomain, Sku, ORDER, SKU};
use einmal::domain::state::{CommitOutcome, StateRecord, StateStore};
use einmal::envelope::InboxKey;
use einmal::pipeline::ingest::Ingestor;
use einmal::pipeline::process::Processor;
use einmal::pipeline::replay::{BulkSelector, ItemOutcome, Operator, Replayer};
use einmal::pipeline::sweep::Sweeper;
use einmal::ports::{
    DeadLetterQueue, Inbox, InboxFilter, InboxItem, InboxProcessing, InboxReplay, InboxState,
    InboxSweep, Queue, QueueError, QueueMessage,
};
use einmal::time::now_millis;
use einmal_tests::fixtures::FailingQueue;
use einmal_tests::moto;
use einmal_tests::scenario::{
    self, data_of, orders_create, pi_succeeded, settle_all, Event, Kind, TENANT,
};
use serde_json::json;

const RED: &str = "SKU-RED-M";
const NOPE: &str = "SKU-NOPE";
const MAX_RECEIVES: u32 = 10;
const LEASE_MS: i64 = 2_000;

/// The ports of one backend, plus the replay service and audit log.
struct Rig {
    name: &'static str,
    inbox: Arc<dyn Inbox>,
    processing: Arc<dyn InboxProcessing>,
    queue: Arc<dyn Queue>,
    dead_letters: Arc<dyn DeadLetterQueue>,
    replay: Arc<dyn InboxReplay>,
    sweep: Arc<dyn InboxSweep>,
    state: Arc<dyn StateStore>,
    audit: Arc<dyn AuditLog>,
    replayer: Replayer,
    idle_poll: Duration,
    _keep: Box<dyn Any + Send + Sync>,
}

async fn rig(kind: Kind) -> Rig {
    match kind {
        Kind::Embedded => {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = Arc::new(
                EmbeddedStore::open(
                    dir.path(),
                    EmbeddedOptions {
                        max_receive_count: MAX_RECEIVES,
                    },
                )
                .expect("store opens"),
            );
            let state = Arc::new(EmbeddedStateStore::open(dir.path()).expect("state opens"));
            let audit: Arc<dyn AuditLog> =
                Arc::new(EmbeddedAuditLog::open(dir.path()).expect("audit log opens"));
            let replayer = Replayer::new(
                store.clone(),
                store.clone(),
                store.clone(),
                store.clone(),
                audit.clone(),
            );
            Rig {
                name: "embedded",
                inbox: store.clone(),
                processing: store.clone(),
                queue: store.clone(),
                dead_letters: store.clone(),
                replay: store.clone(),
                sweep: store,
                state,
                audit,
                replayer,
                idle_poll: Duration::from_millis(10),
                _keep: Box::new(dir),
            }
        }
        Kind::Aws => {
            let moto = moto::shared();
            let sdk = moto.sdk_config().await;
            let name = moto::unique_name("einmal-replay");
            let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
            let sqs = aws_sdk_sqs::Client::new(&sdk);
            create_tables(&dynamodb, &name).await.expect("inbox table");
            let names = create_queues(&sqs, &name, MAX_RECEIVES)
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
            let store = Arc::new(AwsStore::new(dynamodb.clone(), sqs, names));
            let state = Arc::new(DynamoStateStore::new(dynamodb.clone(), state_table));
            let audit: Arc<dyn AuditLog> = Arc::new(DynamoAuditLog::new(dynamodb, audit_table));
            let inbox: Arc<dyn Inbox> = store.clone();
            let replayer = Replayer::new(
                inbox.clone(),
                store.clone(),
                store.clone(),
                store.clone(),
                audit.clone(),
            );
            Rig {
                name: "aws",
                inbox,
                processing: store.clone(),
                queue: store.clone(),
                dead_letters: store.clone(),
                replay: store.clone(),
                sweep: store,
                state,
                audit,
                replayer,
                idle_poll: Duration::from_millis(100),
                _keep: Box::new(()),
            }
        }
    }
}

impl Rig {
    fn ingestor(&self) -> Ingestor {
        Ingestor::new(scenario::config(), self.inbox.clone(), self.queue.clone())
    }

    fn processor(&self) -> Processor {
        Processor::new(
            self.inbox.clone(),
            self.processing.clone(),
            self.queue.clone(),
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

    async fn send(&self, ingestor: &Ingestor, event: &Event) {
        let request = event.request(&ingestor.config());
        let response = ingestor.ingest(event.provider, TENANT, &request).await;
        assert_eq!(
            response.status, 200,
            "{}: {}",
            event.event_id, response.body
        );
    }

    async fn item(&self, key: &InboxKey) -> InboxItem {
        self.inbox
            .get(key)
            .await
            .expect("inbox get")
            .unwrap_or_else(|| panic!("no inbox item {key}"))
    }

    async fn items(&self) -> Vec<InboxItem> {
        self.inbox
            .list(&InboxFilter {
                limit: 100_000,
                ..Default::default()
            })
            .await
            .expect("inbox list")
    }

    async fn on_hand(&self, sku: &str) -> i64 {
        let record = self
            .state
            .load(&[sku_key(TENANT, sku)])
            .await
            .expect("load")
            .remove(0);
        let sku: Sku = serde_json::from_value(record.data).expect("sku data");
        sku.on_hand
    }

    async fn business_state(&self) -> BTreeMap<String, StateRecord> {
        let mut keys = Vec::new();
        for kind in [ORDER, SKU] {
            let listed = self
                .state
                .list(TENANT, kind, 100_000)
                .await
                .expect("state list");
            keys.extend(listed.into_iter().map(|r| r.key));
        }
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

    /// Dead-letter pointers now; they are released again at once.
    async fn dead_letters(&self) -> Vec<InboxKey> {
        let mut all = Vec::new();
        let mut receipts = Vec::new();
        loop {
            let got = self
                .queue
                .receive_dead_letters(10, Duration::from_secs(30))
                .await
                .expect("receive dead letters");
            if got.is_empty() {
                break;
            }
            for d in got {
                all.push(d.message.pk);
                receipts.push(d.receipt);
            }
        }
        for r in receipts {
            self.dead_letters
                .release_dead_letter(&r)
                .await
                .expect("release");
        }
        all
    }

    /// Process with `workers` concurrent loops until the queue is empty and every item
    /// is terminal.
    async fn drain(&self, workers: usize) {
        let p = Arc::new(self.processor());
        let visibility = Duration::from_millis(LEASE_MS as u64 + 250);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let mut tasks = tokio::task::JoinSet::new();
            for w in 0..workers {
                let (p, queue) = (p.clone(), self.queue.clone());
                tasks.spawn(async move {
                    let mut n = 0;
                    loop {
                        let batch = queue.receive(10, visibility).await.expect("receive");
                        if batch.is_empty() {
                            return n;
                        }
                        n += settle_all(&p, &batch, &format!("w{w}")).await.len();
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
            let items = self.items().await;
            if items.iter().all(|i| i.state.is_terminal()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}: drain timed out: {:?}",
                self.name,
                items
                    .iter()
                    .filter(|i| !i.state.is_terminal())
                    .map(|i| (i.key.as_str().to_string(), i.state))
                    .take(5)
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(self.idle_poll).await;
        }
    }
}

fn operator(reason: &str) -> Operator {
    Operator {
        actor: "ops-alice".into(),
        reason: reason.into(),
    }
}

fn unknown_sku_order() -> Event {
    orders_create(
        5001,
        1_764_600_000,
        &[(RED, 1), (NOPE, 2)],
        5_000,
        "pending",
    )
}

// ---------------------------------------------------------------------------
// 1. Dead letter -> fix -> one replay -> completed once; a second replay is a no-op

async fn dead_letter_is_fixed_and_replayed_once(kind: Kind) {
    let r = rig(kind).await;
    r.seed(RED, 10).await;
    let ingest = r.ingestor();
    let event = unknown_sku_order();
    let key = event.inbox_key();
    r.send(&ingest, &event).await;
    r.drain(1).await;

    let item = r.item(&key).await;
    assert_eq!(item.state, InboxState::DeadLetter, "{}", r.name);
    assert!(item
        .last_error
        .as_deref()
        .unwrap()
        .contains("unknown SKU SKU-NOPE"));
    assert_eq!(
        r.dead_letters().await,
        std::slice::from_ref(&key),
        "{}: in the DLQ",
        r.name
    );
    assert!(!r
        .state
        .load(&[order_key(TENANT, "5001")])
        .await
        .unwrap()
        .remove(0)
        .exists());

    // The fix: the SKU is added.
    r.seed(NOPE, 5).await;
    // One replay call.
    let report = r
        .replayer
        .replay_one(&key, false, &operator("SKU-NOPE was missing, added"))
        .await
        .expect("replay");
    assert_eq!(report.outcomes, [(key.clone(), ItemOutcome::Replayed)]);
    assert_eq!(report.summary.replayed, 1);
    assert_eq!(report.summary.dead_letters_removed, 1, "{}", r.name);
    let requeued = r.item(&key).await;
    assert_eq!(requeued.state, InboxState::Queued);
    assert_eq!(requeued.attempts, item.attempts, "attempts kept");
    assert_eq!(requeued.last_error, item.last_error, "last error kept");
    assert!(r.dead_letters().await.is_empty(), "{}: DLQ emptied", r.name);

    r.drain(1).await;
    let done = r.item(&key).await;
    assert_eq!(done.state, InboxState::Completed, "{}", r.name);
    assert_eq!(
        (&done.last_error, &done.last_error_class),
        (&None, &None),
        "{}: the old permanent error is cleared",
        r.name
    );
    let real_result = done.result.clone().expect("a result");
    assert!(!real_result.starts_with("already applied"), "{real_result}");
    assert_eq!((r.on_hand(RED).await, r.on_hand(NOPE).await), (9, 3));
    let after_first = data_of(&r.business_state().await);

    let audit = r.audit.list(0).await.expect("audit list");
    assert_eq!(audit.len(), 1);
    let rec = &audit[0];
    assert_eq!(rec.actor, "ops-alice");
    assert_eq!(rec.action, "replay");
    assert_eq!(rec.reason, "SKU-NOPE was missing, added");
    assert_eq!(rec.events, [key.as_str().to_string()]);
    assert_eq!(rec.selector["pk"], json!(key.as_str()));
    assert_eq!(rec.result["replayed"], json!(1));
    assert_eq!(Some(rec.id.clone()), report.audit_id);

    // Replaying again changes nothing; the audit log records the no-op.
    let again = r
        .replayer
        .replay_one(&key, false, &operator("again"))
        .await
        .expect("replay again");
    assert_eq!(again.outcomes, [(key.clone(), ItemOutcome::AlreadyDone)]);
    assert!(r
        .queue
        .receive(10, Duration::from_secs(1))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(r.item(&key).await, done, "{}: item untouched", r.name);
    let audit = r.audit.list(0).await.expect("audit list");
    assert_eq!(audit.len(), 2);
    assert_eq!(
        (audit[0].reason.as_str(), &audit[0].result["already_done"]),
        ("again", &json!(1))
    );

    // Forced: the handler runs again, the effect keys still stop a second movement.
    let forced = r
        .replayer
        .replay_one(&key, true, &operator("forced re-run"))
        .await
        .expect("forced replay");
    assert_eq!(forced.outcomes, [(key.clone(), ItemOutcome::Replayed)]);
    r.drain(1).await;
    let rerun = r.item(&key).await;
    assert_eq!(rerun.state, InboxState::Completed);
    assert_eq!(
        rerun.result.as_deref(),
        Some(real_result.as_str()),
        "{}: the forced re-run keeps the event's result",
        r.name
    );
    assert_eq!(
        (r.on_hand(RED).await, r.on_hand(NOPE).await),
        (9, 3),
        "no second movement"
    );
    assert_eq!(data_of(&r.business_state().await), after_first);
    assert_eq!(r.audit.list(0).await.unwrap().len(), 3);
}

// ---------------------------------------------------------------------------
// 2. Bulk replay of many completed events: progress, same business state

async fn bulk_replay_shows_progress_and_keeps_the_business_state(kind: Kind) {
    let r = rig(kind).await;
    // moto answers each call in milliseconds but the processor makes ~10 per event:
    // 1,000 events take minutes there, so moto runs 100 (embedded runs 1,000).
    let n: usize = match kind {
        Kind::Embedded => 1_000,
        Kind::Aws => 100,
    };
    let ingest = Arc::new(r.ingestor());
    let events: Vec<Event> = (0..n)
        .map(|i| {
            pi_succeeded(
                &format!("{}", 70_000 + i),
                &format!("pi_bulk_{i}"),
                1_000 + i as i64,
                1_764_600_000 + i as i64,
            )
        })
        .collect();
    let started = Instant::now();
    for chunk in events.chunks(50) {
        let mut tasks = tokio::task::JoinSet::new();
        for e in chunk.iter().cloned() {
            let ingest = ingest.clone();
            tasks.spawn(async move {
                let request = e.request(&ingest.config());
                let response = ingest.ingest(e.provider, TENANT, &request).await;
                assert_eq!(response.status, 200, "{}", response.body);
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("ingest task");
        }
    }
    r.drain(8).await;
    let items = r.items().await;
    assert_eq!(items.len(), n);
    assert!(
        items.iter().all(|i| i.state == InboxState::Completed),
        "{}: {:?}",
        r.name,
        items.iter().find(|i| i.state != InboxState::Completed)
    );
    let before = r.business_state().await;
    assert_eq!(before.len(), n, "one order per event");

    // Dry run first: reports, changes nothing, no audit record.
    let selector = BulkSelector {
        provider: Some("stripe".into()),
        tenant: Some(TENANT.into()),
        event_type: Some("payment_intent.succeeded".into()),
        state: Some(InboxState::Completed),
        force: true,
        ..Default::default()
    };
    let mut dry_calls = 0usize;
    let dry = r
        .replayer
        .replay_bulk(&selector, true, &operator("dry"), &mut |_| dry_calls += 1)
        .await
        .expect("dry run");
    assert_eq!(
        (dry.summary.matched, dry.summary.replayed, dry_calls),
        (n, n, n)
    );
    assert!(dry.audit_id.is_none());
    assert!(r.audit.list(0).await.unwrap().is_empty());
    assert!(r
        .queue
        .receive(10, Duration::from_secs(1))
        .await
        .unwrap()
        .is_empty());

    // The real thing.
    let calls = AtomicUsize::new(0);
    let mut last = (0, 0);
    let report = r
        .replayer
        .replay_bulk(
            &selector,
            false,
            &operator("re-run stripe payments"),
            &mut |p| {
                calls.fetch_add(1, Ordering::Relaxed);
                assert_eq!(p.done, last.0 + 1, "progress counts up");
                last = (p.done, p.total);
            },
        )
        .await
        .expect("bulk replay");
    assert_eq!(
        calls.load(Ordering::Relaxed),
        n,
        "{}: one progress call per item",
        r.name
    );
    assert_eq!(last, (n, n));
    assert_eq!((report.summary.matched, report.summary.replayed), (n, n));
    let attempts_before: BTreeMap<InboxKey, u32> =
        items.iter().map(|i| (i.key.clone(), i.attempts)).collect();
    r.drain(8).await;
    let items = r.items().await;
    assert!(items.iter().all(|i| i.state == InboxState::Completed));
    // Each ran again (not "exactly twice": a claim slower than its lease on a busy
    // machine is claimed once more, which changes nothing else).
    assert!(
        items.iter().all(|i| i.attempts > attempts_before[&i.key]),
        "{}: each ran again",
        r.name
    );
    let after = r.business_state().await;
    assert_eq!(
        data_of(&after),
        data_of(&before),
        "{}: same business state",
        r.name
    );
    let audit = r.audit.list(0).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].action, "replay-bulk");
    assert_eq!(audit[0].events.len(), n);
    assert_eq!(audit[0].result["replayed"], json!(n));
    assert_eq!(
        audit[0].selector["event_type"],
        json!("payment_intent.succeeded")
    );
    eprintln!(
        "{}: {n} events ingested, processed, bulk-replayed in {:?}",
        r.name,
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------
// 3. A dry run changes nothing and writes no audit record

async fn dry_run_changes_nothing(kind: Kind) {
    let r = rig(kind).await;
    r.seed(RED, 10).await;
    let ingest = r.ingestor();
    let events: Vec<Event> = (0..3)
        .map(|i| {
            orders_create(
                6000 + i,
                1_764_600_000,
                &[(RED, 1), (NOPE, 1)],
                2_000,
                "pending",
            )
        })
        .collect();
    for e in &events {
        r.send(&ingest, e).await;
    }
    r.drain(1).await;
    let before = r.items().await;
    assert!(before.iter().all(|i| i.state == InboxState::DeadLetter));
    let business = data_of(&r.business_state().await);
    let mut calls = 0;
    let report = r
        .replayer
        .replay_bulk(
            &BulkSelector {
                state: Some(InboxState::DeadLetter),
                ..Default::default()
            },
            true,
            &operator("just looking"),
            &mut |_| calls += 1,
        )
        .await
        .expect("dry run");
    assert_eq!(
        (report.summary.matched, report.summary.replayed, calls),
        (3, 3, 3)
    );
    assert!(report.summary.dry_run && report.audit_id.is_none());
    assert_eq!(r.items().await, before, "{}: items untouched", r.name);
    assert_eq!(data_of(&r.business_state().await), business);
    assert!(r.audit.list(0).await.unwrap().is_empty(), "no audit record");
    assert!(r
        .queue
        .receive(10, Duration::from_secs(1))
        .await
        .unwrap()
        .is_empty());
    let mut dlq = r.dead_letters().await;
    dlq.sort();
    let mut keys: Vec<InboxKey> = events.iter().map(Event::inbox_key).collect();
    keys.sort();
    assert_eq!(dlq, keys, "{}: dead letters still there", r.name);
}

// ---------------------------------------------------------------------------
// 4. A replay whose send fails (or whose CLI dies between the requeue and the send)
// leaves the item `queued` with no message: the sweeper counts it in the backlog and,
// once stale, sends its pointer; it runs once more with no second effect.

async fn replay_without_its_send_is_sent_by_the_sweeper(kind: Kind) {
    let r = rig(kind).await;
    r.seed(RED, 10).await;
    let ingest = r.ingestor();
    let event = orders_create(5101, 1_764_600_000, &[(RED, 2)], 2_000, "pending");
    let key = event.inbox_key();
    r.send(&ingest, &event).await;
    r.drain(1).await;
    let first = r.item(&key).await;
    assert_eq!(first.state, InboxState::Completed, "{}", r.name);
    let business = data_of(&r.business_state().await);

    let failing: Arc<dyn Queue> = Arc::new(FailingQueue::new(r.queue.clone(), vec![1]));
    let replayer = Replayer::new(
        r.inbox.clone(),
        r.replay.clone(),
        failing,
        r.dead_letters.clone(),
        r.audit.clone(),
    );
    let report = replayer
        .replay_one(&key, true, &operator("re-run; its send fails"))
        .await
        .expect("replay");
    assert_eq!(report.outcomes, [(key.clone(), ItemOutcome::Failed)]);
    let queued = r.item(&key).await;
    assert_eq!(queued.state, InboxState::Queued, "{}", r.name);
    assert!(
        r.queue
            .receive(10, Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty(),
        "{}: no message was sent",
        r.name
    );

    let sweeper = Sweeper::new(
        r.inbox.clone(),
        r.sweep.clone(),
        r.processing.clone(),
        r.queue.clone(),
    );
    // In the backlog at once; not stuck yet.
    let early = sweeper.sweep_once(queued.updated_at_ms + 1_000).await;
    assert_eq!(
        (early.backlog_count, early.stuck_count, early.reenqueued),
        (1, 0, 0),
        "{}: {early:?}",
        r.name
    );
    // A minute later (the sweeper runs every minute) it is stuck and sent.
    let late = sweeper.sweep_once(queued.updated_at_ms + 61_000).await;
    assert_eq!(
        (late.backlog_count, late.stuck_count, late.reenqueued),
        (1, 1, 1),
        "{}: {late:?}",
        r.name
    );
    r.drain(1).await;
    let done = r.item(&key).await;
    assert_eq!(done.state, InboxState::Completed, "{}", r.name);
    assert!(done.attempts > first.attempts, "{}: it ran again", r.name);
    assert_eq!(r.on_hand(RED).await, 8, "{}: stock moved once", r.name);
    assert_eq!(
        data_of(&r.business_state().await),
        business,
        "{}: no second effect",
        r.name
    );
}

// ---------------------------------------------------------------------------
// 5. A sweep while a dead-letter replay runs: the old dead letter must not send the
// replayed item back to `dead_letter` (its new message would then be refused).

/// Fault injection: every pointer sent through it is followed, before `send` returns, by
/// one sweeper pass: the sweep runs right after the replay's requeue and send, before
/// anything else the replay does.
struct SweepAfterSend {
    inner: Arc<dyn Queue>,
    sweeper: Sweeper,
}

#[async_trait::async_trait]
impl Queue for SweepAfterSend {
    async fn send(&self, message: &QueueMessage) -> Result<(), QueueError> {
        self.inner.send(message).await?;
        self.sweeper.sweep_once(now_millis()).await;
        Ok(())
    }
    async fn receive(
        &self,
        max: u32,
        visibility: Duration,
    ) -> Result<Vec<einmal::ports::Delivery>, QueueError> {
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
    async fn postpone(
        &self,
        delivery: &einmal::ports::Delivery,
        delay: Duration,
    ) -> Result<(), QueueError> {
        self.inner.postpone(delivery, delay).await
    }
    async fn send_dead_letter(&self, message: &QueueMessage) -> Result<(), QueueError> {
        self.inner.send_dead_letter(message).await
    }
    async fn receive_dead_letters(
        &self,
        max: u32,
        visibility: Duration,
    ) -> Result<Vec<einmal::ports::Delivery>, QueueError> {
        self.inner.receive_dead_letters(max, visibility).await
    }
}

impl Rig {
    fn sweeper(&self) -> Sweeper {
        Sweeper::new(
            self.inbox.clone(),
            self.sweep.clone(),
            self.processing.clone(),
            self.queue.clone(),
        )
    }

    /// The unknown-SKU order dead-lettered, its pointer in the DLQ, the SKU then added.
    async fn fixed_dead_letter(&self) -> InboxKey {
        self.seed(RED, 10).await;
        let event = unknown_sku_order();
        let key = event.inbox_key();
        self.send(&self.ingestor(), &event).await;
        self.drain(1).await;
        assert_eq!(self.item(&key).await.state, InboxState::DeadLetter);
        assert_eq!(self.dead_letters().await, std::slice::from_ref(&key));
        self.seed(NOPE, 5).await;
        key
    }
}

async fn sweep_during_a_dead_letter_replay_keeps_it_replayed(kind: Kind) {
    let r = rig(kind).await;
    let key = r.fixed_dead_letter().await;
    let queue: Arc<dyn Queue> = Arc::new(SweepAfterSend {
        inner: r.queue.clone(),
        sweeper: r.sweeper(),
    });
    let replayer = Replayer::new(
        r.inbox.clone(),
        r.replay.clone(),
        queue,
        r.dead_letters.clone(),
        r.audit.clone(),
    );
    let report = replayer
        .replay_one(&key, false, &operator("SKU added; a sweep runs meanwhile"))
        .await
        .expect("replay");
    assert_eq!(report.outcomes, [(key.clone(), ItemOutcome::Replayed)]);
    assert_eq!(report.summary.dead_letters_removed, 1, "{}", r.name);
    assert_eq!(
        r.item(&key).await.state,
        InboxState::Queued,
        "{}: the sweep left the replayed item alone",
        r.name
    );

    r.drain(1).await;
    let done = r.item(&key).await;
    assert_eq!(done.state, InboxState::Completed, "{}", r.name);
    assert_eq!(
        (r.on_hand(RED).await, r.on_hand(NOPE).await),
        (9, 3),
        "{}: applied once",
        r.name
    );
    assert!(r.dead_letters().await.is_empty(), "{}: DLQ empty", r.name);
    // A later sweep changes nothing.
    let after = r.sweeper().sweep_once(now_millis() + 120_000).await;
    assert_eq!(after.dead_lettered, 0, "{}: {after:?}", r.name);
    assert_eq!(r.item(&key).await, done, "{}", r.name);
}

// ---------------------------------------------------------------------------
// 6. A dead-letter replay whose send fails ends `queued` with no dead letter: the
// sweeper re-sends it (and does not mark it `dead_letter` again); it completes once.

async fn dead_letter_replay_whose_send_fails_is_sent_by_the_sweeper(kind: Kind) {
    let r = rig(kind).await;
    let key = r.fixed_dead_letter().await;
    let failing: Arc<dyn Queue> = Arc::new(FailingQueue::new(r.queue.clone(), vec![1]));
    let replayer = Replayer::new(
        r.inbox.clone(),
        r.replay.clone(),
        failing,
        r.dead_letters.clone(),
        r.audit.clone(),
    );
    let report = replayer
        .replay_one(&key, false, &operator("SKU added; the send fails"))
        .await
        .expect("replay");
    assert_eq!(report.outcomes, [(key.clone(), ItemOutcome::Failed)]);
    let queued = r.item(&key).await;
    assert_eq!(queued.state, InboxState::Queued, "{}", r.name);

    let swept = r.sweeper().sweep_once(queued.updated_at_ms + 61_000).await;
    assert_eq!(
        (swept.reenqueued, swept.dead_lettered),
        (1, 0),
        "{}: {swept:?}",
        r.name
    );
    r.drain(1).await;
    assert_eq!(
        r.item(&key).await.state,
        InboxState::Completed,
        "{}",
        r.name
    );
    assert_eq!(
        (r.on_hand(RED).await, r.on_hand(NOPE).await),
        (9, 3),
        "{}: applied once",
        r.name
    );
    assert!(r.dead_letters().await.is_empty(), "{}: DLQ empty", r.name);
}

macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod embedded_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario(super::Kind::Embedded).await
                }
            )*
        }
        mod aws_moto {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario(super::Kind::Aws).await
                }
            )*
        }
    };
}

on_both_backends!(
    dead_letter_is_fixed_and_replayed_once,
    bulk_replay_shows_progress_and_keeps_the_business_state,
    dry_run_changes_nothing,
    replay_without_its_send_is_sent_by_the_sweeper,
    sweep_during_a_dead_letter_replay_keeps_it_replayed,
    dead_letter_replay_whose_send_fails_is_sent_by_the_sweeper,
);
