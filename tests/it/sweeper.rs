//! The sweeper on both backends (embedded SQLite; DynamoDB + SQS in moto): a stored
//! but never enqueued event, a receiver killed between put and send, a crashed
//! worker's lease, finished items left alone,
//! dead letters marked, and (on moto) index queries only, never a scan; a claim and
//! a retry leave the sweeper's index entry alone.

use einmal::ports::Handout;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use einmal::pipeline::ingest::Ingestor;
use einmal::pipeline::sweep::{SweepSettings, Sweeper};
use einmal::ports::{
    ClaimOutcome, Finish, Inbox, InboxProcessing, InboxReplay, InboxState, InboxSweep, ItemVersion,
    Queue, QueueMessage, RequeueOutcome,
};
use einmal_tests::fixtures::{self, FailingQueue};
use einmal_tests::moto::{self, OperationLog};
use einmal_tests::scenario::{self, check_invariants, drain, sample, Backend, Kind};

const RED: &str = "SKU-RED-M";
const BLUE: &str = "SKU-BLUE-L";
const SEEDS: [(&str, i64); 2] = [(RED, 10), (BLUE, 5)];
const MAX_RECEIVES: u32 = 10;
const LEASE_MS: i64 = 300;

async fn fresh(kind: Kind) -> Backend {
    let b = kind.backend(MAX_RECEIVES).await;
    b.seed(&SEEDS).await;
    b
}

fn sweeper(b: &Backend) -> Sweeper {
    Sweeper::new(
        b.inbox.clone(),
        b.sweep.clone(),
        b.processing.clone(),
        b.queue.clone(),
    )
}

/// Deliver `orders/create` while the queue send fails: 503, stored, never enqueued.
async fn store_without_enqueue(b: &Backend) -> scenario::Event {
    let failing: Arc<dyn Queue> = Arc::new(FailingQueue::new(b.queue.clone(), vec![1]));
    let ingest = Ingestor::new(scenario::config(), b.inbox.clone(), failing);
    let create = sample("shopify-orders-create");
    let response = ingest
        .ingest(
            "shopify",
            scenario::TENANT,
            &create.request(&scenario::config()),
        )
        .await;
    assert_eq!(response.status, 503, "{}: {}", b.name, response.body);
    assert_eq!(b.item(&create).await.state, InboxState::Received);
    create
}

async fn assert_created_once(b: &Backend, create: &scenario::Event) {
    let item = b.item(create).await;
    assert_eq!(item.state, InboxState::Completed, "{}", b.name);
    assert_eq!((b.on_hand(RED).await, b.on_hand(BLUE).await), (9, 3));
    check_invariants(b, &SEEDS).await;
}

// 1. Stored, never enqueued: one sweep re-enqueues it.
async fn stored_but_never_enqueued_is_processed_after_one_sweep(kind: Kind) {
    let b = fresh(kind).await;
    let create = store_without_enqueue(&b).await;
    assert!(b.receive_all(Duration::from_secs(1)).await.is_empty());
    let s = sweeper(&b);
    let stored = b.item(&create).await;

    // Not stuck yet: nothing happens.
    let early = s.sweep_once(stored.updated_at_ms + 1_000).await;
    assert_eq!((early.reenqueued, early.backlog_count), (0, 1), "{early:?}");

    let now = stored.updated_at_ms + SweepSettings::default().stuck_after_ms + 1;
    let report = s.sweep_once(now).await;
    assert_eq!(report.reenqueued, 1, "{}: {report:?}", b.name);
    assert_eq!(report.backlog_count, 1);
    assert_eq!(
        report.oldest_pending_age_ms,
        SweepSettings::default().stuck_after_ms + 1
    );
    drain(&b, &b.processor(LEASE_MS)).await;
    assert_created_once(&b, &create).await;
}

// 2. A crashed worker's lease: released by the sweep, the event completes.
async fn crashed_workers_lease_is_released_and_the_event_completes(kind: Kind) {
    let b = fresh(kind).await;
    let create = sample("shopify-orders-create");
    assert!(!b.send(&b.ingestor(), &create).await);
    // The worker receives the message, claims the item and dies; its message is lost.
    let deliveries = b.receive_all(Duration::from_secs(60)).await;
    assert_eq!(deliveries.len(), 1);
    let claimed_at = einmal::time::now_millis() - 10_000;
    let claim = b
        .processing
        .claim(&create.inbox_key(), "crashed", claimed_at, LEASE_MS)
        .await
        .expect("claim");
    assert!(matches!(claim, ClaimOutcome::Claimed(_)), "{claim:?}");
    b.queue.ack(&deliveries[0].receipt).await.expect("ack");

    let s = sweeper(&b);
    let lease_end = claimed_at + LEASE_MS;
    let early = s.sweep_once(lease_end + 1_000).await;
    assert_eq!(early.leases_released, 0, "{early:?}");
    let report = s
        .sweep_once(lease_end + SweepSettings::default().stuck_after_ms + 1)
        .await;
    assert_eq!(
        (report.leases_released, report.reenqueued),
        (1, 0),
        "{}: {report:?}",
        b.name
    );
    drain(&b, &b.processor(LEASE_MS)).await;
    assert_created_once(&b, &create).await;
    // The crashed attempt counts (a claim slower than the short test lease may add one).
    assert!(b.item(&create).await.attempts >= 2);
}

// 3. A completed item is never re-enqueued.
async fn completed_items_are_never_reenqueued(kind: Kind) {
    let b = fresh(kind).await;
    let create = sample("shopify-orders-create");
    assert!(!b.send(&b.ingestor(), &create).await);
    drain(&b, &b.processor(LEASE_MS)).await;
    assert_created_once(&b, &create).await;

    let far = einmal::time::now_millis() + 30 * 24 * 3600 * 1000;
    let report = sweeper(&b).sweep_once(far).await;
    assert_eq!(
        (
            report.reenqueued,
            report.leases_released,
            report.dead_lettered,
            report.backlog_count
        ),
        (0, 0, 0, 0),
        "{}: {report:?}",
        b.name
    );
    assert!(b.receive_all(Duration::from_secs(1)).await.is_empty());
    assert_created_once(&b, &create).await;
}

// 4. A pointer in the DLQ marks its item dead_letter; the message stays for replay.
async fn dead_lettered_pointer_marks_the_item(kind: Kind) {
    let b = fresh(kind).await;
    let create = sample("shopify-orders-create");
    assert!(!b.send(&b.ingestor(), &create).await);
    let deliveries = b.receive_all(Duration::from_secs(60)).await;
    assert_eq!(deliveries.len(), 1);
    b.queue
        .send_dead_letter(&QueueMessage {
            pk: create.inbox_key(),
        })
        .await
        .expect("to the DLQ");
    b.queue.ack(&deliveries[0].receipt).await.expect("ack");

    let s = sweeper(&b);
    let report = s.sweep_once(einmal::time::now_millis()).await;
    assert_eq!(report.dead_lettered, 1, "{}: {report:?}", b.name);
    let item = b.item(&create).await;
    assert_eq!(item.state, InboxState::DeadLetter);
    assert_eq!(
        item.last_error.as_deref(),
        Some(einmal::pipeline::sweep::DLQ_REASON)
    );
    // Still in the DLQ, visible again.
    let dlq = b
        .queue
        .receive_dead_letters(10, Duration::from_secs(1))
        .await
        .expect("DLQ receive");
    assert_eq!(dlq.len(), 1, "{}: the dead letter stays for replay", b.name);
    assert_eq!(dlq[0].message.pk, create.inbox_key());
    // Terminal now: a later pass neither marks nor re-enqueues it.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let again = s.sweep_once(einmal::time::now_millis() + 3_600_000).await;
    assert_eq!(
        (again.dead_lettered, again.reenqueued, again.backlog_count),
        (0, 0, 0),
        "{again:?}"
    );
}

// 5. The receiver dies between its put and its send (a kill -9 at that instant): the
// provider got no answer, and its retry inside the in-flight grace sends nothing
// either (the first request might still be sending). The sweep a minute later (the
// sweeper runs every minute) sends it.
async fn receiver_killed_between_put_and_send_is_sent_at_the_next_sweep(kind: Kind) {
    let b = fresh(kind).await;
    let create = sample("shopify-orders-create");
    let config = scenario::config();
    fixtures::ingest_then_die(
        config.clone(),
        b.inbox.clone(),
        "shopify",
        scenario::TENANT,
        &create.request(&config),
    )
    .await;
    let stored = b.item(&create).await;
    assert_eq!(
        (stored.state, stored.enqueue_failed),
        (InboxState::Received, false)
    );
    assert!(
        b.send(&b.ingestor(), &create).await,
        "the retry: a duplicate"
    );
    assert!(
        b.receive_all(Duration::from_secs(1)).await.is_empty(),
        "{}: nothing sent",
        b.name
    );

    let report = sweeper(&b).sweep_once(stored.updated_at_ms + 61_000).await;
    assert_eq!(
        (report.stuck_count, report.reenqueued),
        (1, 1),
        "{}: {report:?}",
        b.name
    );
    drain(&b, &b.processor(LEASE_MS)).await;
    assert_created_once(&b, &create).await;
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
    stored_but_never_enqueued_is_processed_after_one_sweep,
    crashed_workers_lease_is_released_and_the_event_completes,
    completed_items_are_never_reenqueued,
    dead_lettered_pointer_marks_the_item,
    receiver_killed_between_put_and_send_is_sent_at_the_next_sweep,
);

// 5. On DynamoDB the sweep reads through the index: one Query per shard, then the
// candidates by key (BatchGetItem); never a Scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aws_sweep_queries_the_index_and_never_scans() {
    let operations = OperationLog::new();
    let b = scenario::aws_logged(MAX_RECEIVES, Some(operations.clone())).await;
    b.seed(&SEEDS).await;
    let create = store_without_enqueue(&b).await;
    let stored = b.item(&create).await;
    let calls = b.calls.clone().expect("aws counts calls");
    operations.take();
    calls.reset();

    let report = sweeper(&b)
        .sweep_once(stored.updated_at_ms + SweepSettings::default().stuck_after_ms + 1)
        .await;
    assert_eq!(report.reenqueued, 1, "{report:?}");
    let ops = operations.take();
    assert_eq!(calls.count(), ops.len(), "{ops:?}");
    assert!(!ops.iter().any(|op| op == "Scan"), "{ops:?}");
    // One Query per shard of the pending index, one per shard of the waiters' index.
    assert_eq!(
        ops.iter().filter(|op| *op == "Query").count(),
        32,
        "{ops:?}"
    );
    // One pending item: one BatchGetItem reads it.
    assert_eq!(
        ops.iter().filter(|op| *op == "BatchGetItem").count(),
        1,
        "{ops:?}"
    );
    // The waiting pass reads where the last one stopped (one GetItem of its cursor
    // item); a pass that read every shard leaves the cursor as it was (no write).
    assert_eq!(
        ops.iter().filter(|op| *op == "GetItem").count(),
        1,
        "{ops:?}"
    );
    let dynamodb: Vec<&String> = ops
        .iter()
        .filter(|op| !matches!(op.as_str(), "SendMessage" | "ReceiveMessage"))
        .collect();
    assert!(
        dynamodb
            .iter()
            .all(|op| matches!(op.as_str(), "Query" | "BatchGetItem" | "GetItem")),
        "{ops:?}"
    );

    drain(&b, &b.processor(LEASE_MS)).await;
    assert_created_once(&b, &create).await;
}

/// The sweeper index's key attributes of one raw inbox item: `(sweep_shard, received_at_ms)`.
async fn index_key(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
    pk: &str,
) -> (Option<String>, Option<String>) {
    let item = dynamodb
        .get_item()
        .table_name(table)
        .key("pk", AttributeValue::S(pk.to_string()))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem")
        .item
        .expect("the item exists");
    let text = |name: &str| match item.get(name) {
        Some(AttributeValue::S(v)) | Some(AttributeValue::N(v)) => Some(v.clone()),
        _ => None,
    };
    (text("sweep_shard"), text("received_at_ms"))
}

// 6. The index key is written when the item enters (put, replay) and leaves (terminal
// finish, dead letter) only: a claim and a retryable finish leave it exactly as it was,
// so DynamoDB writes no index entry for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_claim_and_retry_leave_the_index_key_alone() {
    let (store, names) = moto::aws_store(moto::shared(), None).await;
    let dynamodb = store.dynamodb().clone();
    let table = names.table.clone();
    let store = Arc::new(store);
    let cfg = fixtures::config();
    let ingest = Ingestor::new(cfg.clone(), store.clone(), store.clone());
    let body = fixtures::stripe_body("evt_index_1", 1000);
    let response = ingest
        .ingest(
            "stripe",
            "t1",
            &fixtures::signed(&cfg, "stripe", "t1", "", &body),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.body);
    let stored = store
        .list(&Default::default())
        .await
        .expect("list")
        .pop()
        .expect("stored");
    let key = stored.key.clone();
    let pk = key.as_str().to_string();

    let entered = index_key(&dynamodb, &table, &pk).await;
    let (shard, received) = entered.clone();
    let shard = shard.expect("a pending item carries its shard");
    assert!(shard.starts_with("p#"), "{shard}");
    assert_eq!(received, Some(stored.received_at_ms.to_string()));

    // Claim: received -> processing.
    let now = stored.received_at_ms + 10;
    let claim = store.claim(&key, "w1", now, 60_000).await.expect("claim");
    assert!(matches!(claim, ClaimOutcome::Claimed(_)), "{claim:?}");
    assert_eq!(index_key(&dynamodb, &table, &pk).await, entered, "claim");

    // Retryable finish: processing -> retryable.
    let retry = Finish {
        state: InboxState::Retryable,
        error_class: Some("transient".into()),
        error: Some("try later".into()),
        result: None,
        now_ms: now + 10,
        wait: Default::default(),
        deliveries: None,
        relay_due_ms: None,
    };
    assert!(store
        .finish(&key, &Handout::leased("w1"), &retry)
        .await
        .expect("finish"));
    assert_eq!(index_key(&dynamodb, &table, &pk).await, entered, "retry");

    // Still found by the sweeper, from the table's current item.
    let stuck = store.stuck(now + 1_000, 10).await.expect("stuck");
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0].state, InboxState::Retryable);
    // A live lease is not stuck; an expired one is.
    let claim = store
        .claim(&key, "w2", now + 20, 60_000)
        .await
        .expect("claim");
    assert!(matches!(claim, ClaimOutcome::Claimed(_)), "{claim:?}");
    assert_eq!(index_key(&dynamodb, &table, &pk).await, entered, "reclaim");
    assert!(store
        .stuck(now + 1_000, 10)
        .await
        .expect("stuck")
        .is_empty());
    assert_eq!(store.stuck(now + 70_000, 10).await.expect("stuck").len(), 1);

    // Terminal: leaves the index, and the sweeper no longer sees it.
    let done = Finish {
        state: InboxState::Completed,
        error_class: None,
        error: None,
        result: Some("done".into()),
        now_ms: now + 30,
        wait: Default::default(),
        deliveries: None,
        relay_due_ms: None,
    };
    assert!(store
        .finish(&key, &Handout::leased("w2"), &done)
        .await
        .expect("finish"));
    let left = index_key(&dynamodb, &table, &pk).await;
    assert_eq!(left.0, None, "a terminal item leaves the index");
    assert!(store.stuck(i64::MAX, 10).await.expect("stuck").is_empty());

    // A forced replay puts it back under the same shard: pending again.
    let requeued = store.requeue(&key, true, now + 40).await.expect("requeue");
    assert!(
        matches!(requeued, RequeueOutcome::Requeued { .. }),
        "{requeued:?}"
    );
    assert_eq!(index_key(&dynamodb, &table, &pk).await, entered, "replay");

    // A dead letter leaves it again.
    let seen = ItemVersion::of(&store.get(&key).await.expect("get").expect("item"));
    assert!(store
        .mark_dead_letter(&key, "poison", seen, now + 50)
        .await
        .expect("dead letter"));
    assert_eq!(
        index_key(&dynamodb, &table, &pk).await.0,
        None,
        "dead letter"
    );
}

// 7. Many pending items that do not qualify (live leases) never hide a stuck one
// behind them, whatever the page size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_sweep_looks_past_live_leases() {
    let (store, _names) = moto::aws_store(moto::shared(), None).await;
    let store = Arc::new(store);
    let cfg = fixtures::config();
    let ingest = Ingestor::new(cfg.clone(), store.clone(), store.clone());
    for i in 0..12 {
        let body = fixtures::stripe_body(&format!("evt_lease_{i:02}"), 10);
        let response = ingest
            .ingest(
                "stripe",
                "t1",
                &fixtures::signed(&cfg, "stripe", "t1", "", &body),
            )
            .await;
        assert_eq!(response.status, 200, "{}", response.body);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut items = store.list(&Default::default()).await.expect("list");
    items.sort_by_key(|i| i.received_at_ms);
    let newest = items.pop().expect("items");
    let now = newest.received_at_ms + 1_000;
    // Every older item is held by a live lease; the newest stays `received`.
    for item in &items {
        let claim = store
            .claim(&item.key, "live", now, 600_000)
            .await
            .expect("claim");
        assert!(matches!(claim, ClaimOutcome::Claimed(_)), "{claim:?}");
    }
    let stuck = store.stuck(now + 1, 1).await.expect("stuck");
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0].key, newest.key);
    assert_eq!(stuck[0].state, InboxState::Received);
}
