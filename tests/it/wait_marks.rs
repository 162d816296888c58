//! Wait marks on the AWS state store (moto): an event about to park marks the record
//! it waits on, and the commit that next writes the record reports the mark, so the
//! processor asks the waiters' index only then (no waiters Query on the common path,
//! `capacity::`). These tests prove that no wake is lost in the races: a park between
//! a committer's load and its commit, a transaction over marked and unmarked records,
//! and a commit whose wake was cut off (the mark is gone with it).

use einmal::domain::state::{Commit, CommitAnswer, CommitOne};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use einmal::adapters::aws::{create_state_table, DynamoStateStore};
use einmal::domain::state::{
    CommitOutcome, ReadCheck, StateKey, StateRecord, StateStore, StateWrite, Waiters,
};
use einmal::ports::{InboxState, StoreError};
use einmal_tests::moto;
use einmal_tests::scenario::{
    self, drain, orders_create, settle_all, shopify_refund, step, TENANT,
};
use serde_json::json;
use tokio::sync::Notify;

async fn store() -> DynamoStateStore {
    let sdk = moto::shared().sdk_config().await;
    let client = aws_sdk_dynamodb::Client::new(&sdk);
    let table = moto::unique_name("einmal-marks");
    create_state_table(&client, &table).await.expect("table");
    DynamoStateStore::new(client, table)
}

fn write(loaded: &StateRecord, data: serde_json::Value) -> StateWrite {
    let mut record = loaded.clone();
    record.version = loaded.version + 1;
    record.data = data;
    StateWrite {
        record,
        expected_version: loaded.version,
    }
}

async fn one(s: &DynamoStateStore, key: &StateKey) -> StateRecord {
    s.load(std::slice::from_ref(key)).await.expect("load")[0].clone()
}

fn marked(keys: &[&StateKey]) -> Waiters {
    Waiters::Marked(keys.iter().map(|k| (*k).clone()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_reports_the_mark_it_removes_and_only_that() {
    let s = store().await;
    let key = StateKey::new(TENANT, "order", "1001");
    let far = einmal::time::now_millis() + 86_400_000;

    // A mark on a record that does not exist is no record.
    s.mark_waited(&key, far).await.unwrap();
    s.mark_waited(&key, far)
        .await
        .expect("marking twice is fine");
    let missing = one(&s, &key).await;
    assert!(!missing.exists());
    assert!(s.list(TENANT, "order", 0).await.unwrap().is_empty());

    // The create is accepted over the mark-only item and reports the mark.
    let w = write(&missing, json!({"status": "new"}));
    let outcome = s.commit_waking(&[w], &[]).await.unwrap();
    assert_eq!(outcome, (CommitOutcome::Committed, marked(&[&key])));
    // The mark went with that commit.
    let v1 = one(&s, &key).await;
    assert_eq!((v1.version, v1.data.clone()), (1, json!({"status": "new"})));
    let outcome = s.commit_waking(&[write(&v1, json!(2))], &[]).await.unwrap();
    assert_eq!(outcome, (CommitOutcome::Committed, marked(&[])));

    // The race: an event parks (marks) after the committer loaded, before it commits.
    let loaded = one(&s, &key).await;
    s.mark_waited(&key, far).await.unwrap();
    let after_mark = one(&s, &key).await;
    assert_eq!(
        after_mark, loaded,
        "a mark changes neither version nor data"
    );
    // A stale commit still conflicts, and leaves the mark for the next one.
    let stale = StateWrite {
        expected_version: 1,
        ..write(&loaded, json!("stale"))
    };
    let outcome = s.commit_waking(&[stale], &[]).await.unwrap();
    assert_eq!(outcome.0, CommitOutcome::Conflict);
    let outcome = s
        .commit_waking(&[write(&loaded, json!(3))], &[])
        .await
        .unwrap();
    assert_eq!(outcome, (CommitOutcome::Committed, marked(&[&key])));
    assert_eq!(s.list(TENANT, "order", 0).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_reports_its_marked_records_and_still_guards_versions() {
    let s = store().await;
    let far = einmal::time::now_millis() + 86_400_000;
    let (a, b, c) = (
        StateKey::new(TENANT, "order", "a"),
        StateKey::new(TENANT, "sku", "b"),
        StateKey::new(TENANT, "order", "c"),
    );
    s.mark_waited(&a, far).await.unwrap();
    let loaded = s.load(&[a.clone(), b.clone()]).await.unwrap();
    let writes = [write(&loaded[0], json!(1)), write(&loaded[1], json!(1))];
    let outcome = s.commit_waking(&writes, &[]).await.unwrap();
    assert_eq!(outcome, (CommitOutcome::Committed, marked(&[&a])));

    // b marked, a stale: the version guard wins, nothing is written, b keeps its mark.
    s.mark_waited(&b, far).await.unwrap();
    let now = s.load(&[a.clone(), b.clone()]).await.unwrap();
    let stale_a = StateWrite {
        expected_version: 0,
        ..write(&now[0], json!("stale"))
    };
    let outcome = s
        .commit_waking(&[stale_a, write(&now[1], json!("lost"))], &[])
        .await
        .unwrap();
    assert_eq!(outcome.0, CommitOutcome::Conflict);
    assert_eq!(s.load(&[a.clone(), b.clone()]).await.unwrap(), now);

    // A read check of a record that does not exist passes over its mark-only item.
    s.mark_waited(&c, far).await.unwrap();
    let check = ReadCheck {
        key: c.clone(),
        version: 0,
    };
    let writes = [write(&now[0], json!(2)), write(&now[1], json!(2))];
    let outcome = s.commit_waking(&writes, &[check]).await.unwrap();
    assert_eq!(outcome, (CommitOutcome::Committed, marked(&[&b])));
    assert!(!one(&s, &c).await.exists());
}

/// The Dynamo store, except that the first commit waits for `go` after telling
/// `loaded` (the decision is made, the commit not sent), or loses its answer after
/// committing (`lose_answer`: a crash right after the commit).
struct Gate {
    inner: Arc<dyn StateStore>,
    loaded: Arc<Notify>,
    go: Arc<Notify>,
    lose_answer: bool,
    commits: AtomicUsize,
}

#[async_trait]
impl StateStore for Gate {
    async fn load(&self, keys: &[StateKey]) -> Result<Vec<StateRecord>, StoreError> {
        self.inner.load(keys).await
    }
    async fn commit_each(&self, commits: &[Commit]) -> Vec<CommitAnswer> {
        let first = self.commits.fetch_add(1, Ordering::SeqCst) == 0;
        if first && !self.lose_answer {
            self.loaded.notify_one();
            self.go.notified().await;
        }
        let answers = self.inner.commit_each(commits).await;
        if first && self.lose_answer {
            return answers
                .into_iter()
                .map(|_| Err(StoreError::Unavailable("injected: answer lost".into())))
                .collect();
        }
        answers
    }
    fn gathers_commits(&self) -> bool {
        self.inner.gathers_commits()
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

fn gate(inner: Arc<dyn StateStore>, lose_answer: bool) -> Arc<Gate> {
    Arc::new(Gate {
        inner,
        loaded: Arc::new(Notify::new()),
        go: Arc::new(Notify::new()),
        lose_answer,
        commits: AtomicUsize::new(0),
    })
}

/// A refund parks on its order while the order's create has loaded (order missing)
/// and not committed yet: the refund's re-check after parking still sees no order,
/// so only the create's commit, which finds the refund's mark, can wake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_between_the_prerequisites_load_and_commit_is_woken_by_that_commit() {
    let b = scenario::aws(3).await;
    b.seed(&[("SKU-RED-M", 100)]).await;
    let create = orders_create(2001, 1_700_000_000, &[("SKU-RED-M", 1)], 1000, "paid");
    let refund = shopify_refund(2001, 20_011, 300, 1_700_000_100);
    let ingestor = b.ingestor();
    for event in [&create, &refund] {
        assert!(!b.send(&ingestor, event).await);
    }
    let all = b.receive_all(Duration::from_secs(30)).await;
    let pick = |e: &scenario::Event| {
        all.iter()
            .find(|d| d.message.pk == e.inbox_key())
            .cloned()
            .expect("its message")
    };
    let (create_msg, refund_msg) = (pick(&create), pick(&refund));

    let gated = gate(b.state.clone(), false);
    let committer = b.processor_with(b.processing.clone(), gated.clone(), 30_000);
    let parker = b.processor(30_000);
    let park = async {
        gated.loaded.notified().await;
        settle_all(&parker, &[refund_msg], "parker").await;
        assert_eq!(b.item(&refund).await.state, InboxState::Waiting);
        gated.go.notify_one();
    };
    let create_batch = [create_msg];
    let (_, handled) = tokio::join!(park, settle_all(&committer, &create_batch, "committer"));
    assert_eq!(handled.len(), 1);

    // Only the wake the create's commit sent is in the queue.
    drain(&b, &parker).await;
    for event in [&create, &refund] {
        let item = b.item(event).await;
        assert_eq!(item.state, InboxState::Completed, "{:?}", item.last_error);
    }
    let order = b.order("2001").await;
    assert_eq!((order.refunds.len(), order.refunded_minor), (1, 300));
}

/// The create commits (removing the refund's mark) and its answer is lost before it
/// could wake anyone: the retry finds the change applied and asks the waiters' index
/// regardless, so the refund is still woken (without the sweeper).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_cut_off_after_the_commit_is_sent_by_the_redelivery() {
    let b = scenario::aws(3).await;
    b.seed(&[("SKU-RED-M", 100)]).await;
    let create = orders_create(2002, 1_700_000_000, &[("SKU-RED-M", 1)], 1000, "paid");
    let refund = shopify_refund(2002, 20_021, 300, 1_700_000_100);
    let ingestor = b.ingestor();
    let plain = b.processor(30_000);
    assert!(!b.send(&ingestor, &refund).await);
    let handled = step(&b, &plain, "parker").await;
    assert_eq!(handled.len(), 1);
    assert_eq!(b.item(&refund).await.state, InboxState::Waiting);

    let lossy = b.processor_with(b.processing.clone(), gate(b.state.clone(), true), 30_000);
    assert!(!b.send(&ingestor, &create).await);
    drain(&b, &lossy).await;
    for event in [&create, &refund] {
        let item = b.item(event).await;
        assert_eq!(item.state, InboxState::Completed, "{:?}", item.last_error);
    }
}
