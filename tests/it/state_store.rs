//! The state-store conformance suite: the same scenarios on the embedded store (a real
//! SQLite file in a temp dir) and on the DynamoDB adapter (moto on loopback), plus the
//! round trips the AWS adapter makes and the embedded store's durability across reopen.

use einmal::domain::state::{Commit, CommitAnswer, CommitOne};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use einmal::adapters::aws::DynamoStateStore;
use einmal::adapters::embedded::EmbeddedStateStore;
use einmal::domain::state::{
    CommitOutcome, ReadCheck, StateKey, StateRecord, StateStore, StateWrite, MAX_RECORD_BYTES,
};
use einmal::domain::{Change, Decision, Domain, DomainError, DomainEvent};
use einmal::envelope::Envelope;
use einmal::pipeline::process::{EffectError, EffectOutcome, Processor};
use einmal::ports::StoreError;
use einmal_tests::moto::{self, CallCounter, OperationLog};
use einmal_tests::scenario::Kind;
use serde_json::{json, Value};

/// One backend under test plus whatever keeps it alive.
pub struct Backend {
    pub store: Arc<dyn StateStore>,
    _keep: Box<dyn std::any::Any + Send>,
}

async fn embedded() -> Backend {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStateStore::open(dir.path()).expect("embedded state store opens");
    Backend {
        store: Arc::new(store),
        _keep: Box::new(dir),
    }
}

async fn aws() -> Backend {
    let store = moto::state_store(moto::shared(), None).await;
    Backend {
        store: Arc::new(store),
        _keep: Box::new(()),
    }
}

fn key(tenant: &str, kind: &str, id: &str) -> StateKey {
    StateKey::new(tenant, kind, id)
}

fn record(key: &StateKey, version: u64, data: Value, applied: &[&str]) -> StateRecord {
    StateRecord {
        key: key.clone(),
        version,
        data,
        applied: applied.iter().map(|s| s.to_string()).collect(),
    }
}

/// Write `data` (and `applied`) as the next version of what the caller saw.
fn next(seen: &StateRecord, data: Value, applied: &[&str]) -> StateWrite {
    StateWrite {
        record: record(&seen.key, seen.version + 1, data, applied),
        expected_version: seen.version,
    }
}

fn create(key: &StateKey, data: Value, applied: &[&str]) -> StateWrite {
    next(&StateRecord::missing(key.clone()), data, applied)
}

async fn load_one(store: &dyn StateStore, key: &StateKey) -> StateRecord {
    let mut records = store.load(std::slice::from_ref(key)).await.expect("load");
    assert_eq!(records.len(), 1);
    records.remove(0)
}

async fn commit(store: &dyn StateStore, writes: &[StateWrite]) -> CommitOutcome {
    store.commit(writes).await.expect("commit answers")
}

// ---------------------------------------------------------------------------
// Scenarios (both backends)

async fn missing_record_loads_as_version_zero(b: Backend) {
    let k = key("t1", "order", "nope");
    let r = load_one(&*b.store, &k).await;
    assert_eq!(r, StateRecord::missing(k));
    assert!(!r.exists());
    assert_eq!(r.data, Value::Null);
    assert!(r.applied.is_empty());
}

async fn create_commits_version_one_with_data_and_applied(b: Backend) {
    let k = key("t1", "order", "1001");
    let data = json!({"status": "paid", "total": 1999, "lines": [{"sku": "A", "qty": 2}]});
    let w = create(&k, data.clone(), &["t1#1001#pay#1"]);
    assert_eq!(commit(&*b.store, &[w]).await, CommitOutcome::Committed);
    let r = load_one(&*b.store, &k).await;
    assert_eq!(r.version, 1);
    assert!(r.exists());
    assert_eq!(r.key, k);
    assert_eq!(r.data, data);
    assert_eq!(r.applied, BTreeSet::from(["t1#1001#pay#1".to_string()]));
}

async fn second_create_conflicts_and_keeps_the_first(b: Backend) {
    let k = key("t1", "order", "1002");
    let first = create(&k, json!({"n": 1}), &["e1"]);
    assert_eq!(commit(&*b.store, &[first]).await, CommitOutcome::Committed);
    let second = create(&k, json!({"n": 2}), &["e2"]);
    assert_eq!(commit(&*b.store, &[second]).await, CommitOutcome::Conflict);
    let r = load_one(&*b.store, &k).await;
    assert_eq!((r.version, r.data), (1, json!({"n": 1})));
    assert_eq!(r.applied, BTreeSet::from(["e1".to_string()]));
}

async fn stale_update_conflicts_and_changes_nothing(b: Backend) {
    let k = key("t1", "order", "1003");
    commit(
        &*b.store,
        &[create(&k, json!({"status": "pending"}), &["e1"])],
    )
    .await;
    let v1 = load_one(&*b.store, &k).await;
    assert_eq!(
        commit(
            &*b.store,
            &[next(&v1, json!({"status": "paid"}), &["e1", "e2"])]
        )
        .await,
        CommitOutcome::Committed
    );
    let v2 = load_one(&*b.store, &k).await;
    assert_eq!(v2.version, 2);

    // A writer that still holds version 1 must not overwrite version 2.
    let stale = next(&v1, json!({"status": "cancelled"}), &["e1", "e3"]);
    assert_eq!(commit(&*b.store, &[stale]).await, CommitOutcome::Conflict);
    // Expecting a version that never existed conflicts as well.
    let ahead = StateWrite {
        record: record(&k, 10, json!({"status": "refunded"}), &[]),
        expected_version: 9,
    };
    assert_eq!(commit(&*b.store, &[ahead]).await, CommitOutcome::Conflict);
    // So does updating a record that does not exist.
    let ghost = key("t1", "order", "ghost");
    let update_missing = StateWrite {
        record: record(&ghost, 2, json!({}), &[]),
        expected_version: 1,
    };
    assert_eq!(
        commit(&*b.store, &[update_missing]).await,
        CommitOutcome::Conflict
    );
    assert!(!load_one(&*b.store, &ghost).await.exists());

    assert_eq!(load_one(&*b.store, &k).await, v2, "nothing changed");
}

async fn multi_record_commit_is_all_or_nothing(b: Backend) {
    let order = key("t1", "order", "2001");
    let sku = key("t1", "sku", "A");
    let invoice = key("t1", "invoice", "inv-2001");
    // Both created in one commit.
    let created = [
        create(&order, json!({"status": "pending"}), &[]),
        create(&sku, json!({"stock": 10}), &[]),
    ];
    assert_eq!(commit(&*b.store, &created).await, CommitOutcome::Committed);
    let loaded = b.store.load(&[order.clone(), sku.clone()]).await.unwrap();
    assert_eq!((loaded[0].version, loaded[1].version), (1, 1));
    let (order_v1, sku_v1) = (loaded[0].clone(), loaded[1].clone());

    // Another writer moves the SKU on.
    let sku_v2 = next(&sku_v1, json!({"stock": 9}), &["other"]);
    assert_eq!(commit(&*b.store, &[sku_v2]).await, CommitOutcome::Committed);
    let sku_now = load_one(&*b.store, &sku).await;

    // Order update is fine, SKU update is stale, invoice is new: none may happen.
    let mixed = [
        next(&order_v1, json!({"status": "paid"}), &["t1#2001#pay#1"]),
        next(&sku_v1, json!({"stock": 8}), &["t1#2001#pay#1"]),
        create(&invoice, json!({"total": 10}), &["t1#2001#pay#1"]),
    ];
    assert_eq!(commit(&*b.store, &mixed).await, CommitOutcome::Conflict);
    let after = b
        .store
        .load(&[order.clone(), sku.clone(), invoice.clone()])
        .await
        .unwrap();
    assert_eq!(after[0], order_v1, "order untouched");
    assert_eq!(after[1], sku_now, "sku untouched");
    assert!(!after[2].exists(), "invoice not created");

    // A create that collides with an existing record fails the whole commit too.
    let colliding = [
        next(&order_v1, json!({"status": "paid"}), &["e"]),
        create(&sku, json!({"stock": 0}), &["e"]),
    ];
    assert_eq!(commit(&*b.store, &colliding).await, CommitOutcome::Conflict);
    assert_eq!(load_one(&*b.store, &order).await, order_v1);

    // With current versions the same change commits, all records at once.
    let good = [
        next(&order_v1, json!({"status": "paid"}), &["t1#2001#pay#1"]),
        next(&sku_now, json!({"stock": 8}), &["other", "t1#2001#pay#1"]),
        create(&invoice, json!({"total": 10}), &["t1#2001#pay#1"]),
    ];
    assert_eq!(commit(&*b.store, &good).await, CommitOutcome::Committed);
    let after = b.store.load(&[order, sku, invoice]).await.unwrap();
    assert_eq!(
        after.iter().map(|r| r.version).collect::<Vec<_>>(),
        vec![2, 3, 1]
    );
    assert!(after.iter().all(|r| r.applied.contains("t1#2001#pay#1")));
    assert_eq!(after[1].data, json!({"stock": 8}));
}

async fn concurrent_increments_lose_no_update(b: Backend) {
    const WORKERS: usize = 20;
    const INCREMENTS: usize = 5;
    let counter = key("t1", "counter", "c1");
    assert_eq!(
        commit(&*b.store, &[create(&counter, json!({"n": 0}), &[])]).await,
        CommitOutcome::Committed
    );
    // 20 workers load, decide and commit concurrently; only the store's conditional
    // write (SQLite's transaction, moto's single-threaded request) stands between
    // them and a lost update.
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let store = b.store.clone();
        let counter = counter.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0usize;
            for i in 0..INCREMENTS {
                let effect = format!("w{worker}#i{i}");
                loop {
                    let seen = load_one(&*store, &counter).await;
                    // The guard a processor applies: an effect already on the record is done.
                    if seen.applied.contains(&effect) {
                        break;
                    }
                    let n = seen.data["n"].as_u64().expect("n is a number");
                    let mut applied = seen.applied.clone();
                    applied.insert(effect.clone());
                    let write = StateWrite {
                        record: StateRecord {
                            key: counter.clone(),
                            version: seen.version + 1,
                            data: json!({ "n": n + 1 }),
                            applied,
                        },
                        expected_version: seen.version,
                    };
                    let outcome = store.commit(&[write]).await.expect("commit answers");
                    match outcome {
                        CommitOutcome::Committed => break,
                        CommitOutcome::Conflict => {
                            conflicts += 1;
                            assert!(conflicts < 10_000, "no progress");
                            tokio::task::yield_now().await;
                        }
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for task in tasks {
        conflicts += task.await.expect("worker finished");
    }
    let total = WORKERS * INCREMENTS;
    let r = load_one(&*b.store, &counter).await;
    assert_eq!(
        r.data,
        json!({ "n": total }),
        "no lost update ({conflicts} conflicts)"
    );
    assert_eq!(r.version, total as u64 + 1);
    assert_eq!(r.applied.len(), total);
}

async fn list_returns_one_tenants_records_of_one_kind(b: Backend) {
    let mut writes = Vec::new();
    for id in ["o3", "o1", "o2"] {
        writes.push(create(
            &key("tenant-a", "order", id),
            json!({"id": id}),
            &[],
        ));
    }
    writes.push(create(&key("tenant-a", "invoice", "i1"), json!({}), &[]));
    writes.push(create(
        &key("tenant-b", "order", "o1"),
        json!({"b": true}),
        &[],
    ));
    writes.push(create(
        &key("tenant-b", "order", "b9"),
        json!({"b": true}),
        &[],
    ));
    // Prefix look-alikes must not leak into the listing either.
    writes.push(create(&key("tenant-a", "orders", "x"), json!({}), &[]));
    writes.push(create(&key("tenant-ab", "order", "x"), json!({}), &[]));
    assert_eq!(commit(&*b.store, &writes).await, CommitOutcome::Committed);

    let a = b.store.list("tenant-a", "order", 10).await.unwrap();
    let ids: Vec<&str> = a.iter().map(|r| r.key.id.as_str()).collect();
    assert_eq!(ids, ["o1", "o2", "o3"], "tenant A's orders, in key order");
    assert!(a
        .iter()
        .all(|r| r.key.tenant == "tenant-a" && r.key.kind == "order" && r.version == 1));
    assert_eq!(a[0].data, json!({"id": "o1"}));

    let bs = b.store.list("tenant-b", "order", 10).await.unwrap();
    assert_eq!(bs.len(), 2);
    assert!(bs.iter().all(|r| r.key.tenant == "tenant-b"), "{bs:?}");

    let limited = b.store.list("tenant-a", "order", 2).await.unwrap();
    assert_eq!(limited.len(), 2);
    assert_eq!(
        b.store.list("tenant-a", "invoice", 10).await.unwrap().len(),
        1
    );
    assert!(b
        .store
        .list("tenant-c", "order", 10)
        .await
        .unwrap()
        .is_empty());
    assert!(b
        .store
        .list("tenant-a", "sku", 10)
        .await
        .unwrap()
        .is_empty());
    // 0 = the default limit, not "nothing".
    assert_eq!(b.store.list("tenant-a", "order", 0).await.unwrap().len(), 3);
}

async fn applied_set_round_trips_empty_and_not(b: Backend) {
    let k = key("t1", "sku", "S1");
    commit(&*b.store, &[create(&k, json!({"stock": 1}), &[])]).await;
    let v1 = load_one(&*b.store, &k).await;
    assert!(v1.applied.is_empty());

    let many = ["t1#S1#reserve#o1", "t1#S1#reserve#o2", "t1#S1#restock#7"];
    commit(&*b.store, &[next(&v1, json!({"stock": 0}), &many)]).await;
    let v2 = load_one(&*b.store, &k).await;
    assert_eq!(
        v2.applied,
        many.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>()
    );

    // Back to empty (e.g. effect keys compacted away): the set really empties.
    commit(&*b.store, &[next(&v2, json!({"stock": 0}), &[])]).await;
    let v3 = load_one(&*b.store, &k).await;
    assert_eq!(v3.version, 3);
    assert!(v3.applied.is_empty());

    // Odd but legal effect keys survive byte for byte.
    let odd = ["ümlaut#ß", "with space", "a#b#c#1", "\"quoted\""];
    commit(&*b.store, &[next(&v3, json!(null), &odd)]).await;
    let v4 = load_one(&*b.store, &k).await;
    assert_eq!(v4.applied.len(), odd.len());
    assert!(odd.iter().all(|e| v4.applied.contains(*e)));
    assert_eq!(v4.data, Value::Null);
    assert!(v4.exists(), "null data does not mean missing");
}

async fn load_keeps_the_order_given_with_missing_and_repeated_keys(b: Backend) {
    let (x, y, z) = (
        key("t1", "order", "x"),
        key("t1", "order", "y"),
        key("t1", "order", "z"),
    );
    commit(
        &*b.store,
        &[create(&x, json!("X"), &[]), create(&z, json!("Z"), &[])],
    )
    .await;
    let got = b
        .store
        .load(&[z.clone(), y.clone(), x.clone(), z.clone()])
        .await
        .unwrap();
    let view: Vec<(&str, u64, Value)> = got
        .iter()
        .map(|r| (r.key.id.as_str(), r.version, r.data.clone()))
        .collect();
    assert_eq!(
        view,
        [
            ("z", 1, json!("Z")),
            ("y", 0, Value::Null),
            ("x", 1, json!("X")),
            ("z", 1, json!("Z"))
        ]
    );
    assert!(b.store.load(&[]).await.unwrap().is_empty());
    assert_eq!(commit(&*b.store, &[]).await, CommitOutcome::Committed);
}

async fn malformed_commits_are_errors_not_writes(b: Backend) {
    let k = key("t1", "order", "bad");
    let twice = [create(&k, json!(1), &[]), create(&k, json!(2), &[])];
    assert!(b.store.commit(&twice).await.is_err(), "same key twice");
    let not_newer = StateWrite {
        record: record(&k, 0, json!(1), &[]),
        expected_version: 0,
    };
    assert!(
        b.store.commit(&[not_newer]).await.is_err(),
        "version must grow"
    );
    assert!(!load_one(&*b.store, &k).await.exists());
}

async fn read_checks_hold_the_commit_to_the_versions_read(b: Backend) {
    let (written, read, never) = (
        key("t1", "plan", "x"),
        key("t1", "plan", "y"),
        key("t1", "plan", "z"),
    );
    assert_eq!(
        commit(&*b.store, &[create(&read, json!({"active": false}), &[])]).await,
        CommitOutcome::Committed
    );
    let y1 = load_one(&*b.store, &read).await;
    let checks = [
        ReadCheck {
            key: read.clone(),
            version: y1.version,
        },
        // A record read as missing must still be missing.
        ReadCheck {
            key: never.clone(),
            version: 0,
        },
    ];
    let x = create(&written, json!({"active": true}), &["x#activate"]);
    let out = b
        .store
        .commit_checked(std::slice::from_ref(&x), &checks)
        .await;
    assert_eq!(out.unwrap(), CommitOutcome::Committed);
    assert_eq!(
        load_one(&*b.store, &read).await,
        y1,
        "a check writes nothing"
    );

    // The read record changed since: the whole commit is refused.
    let x1 = load_one(&*b.store, &written).await;
    assert_eq!(
        commit(&*b.store, &[next(&y1, json!({"active": true}), &[])]).await,
        CommitOutcome::Committed
    );
    let stale = b
        .store
        .commit_checked(&[next(&x1, json!({"active": false}), &[])], &checks[..1])
        .await;
    assert_eq!(stale.unwrap(), CommitOutcome::Conflict);
    // The missing record appeared since: refused too.
    assert_eq!(
        commit(&*b.store, &[create(&never, json!(1), &[])]).await,
        CommitOutcome::Committed
    );
    let stale = b
        .store
        .commit_checked(&[next(&x1, json!({"active": false}), &[])], &checks[1..])
        .await;
    assert_eq!(stale.unwrap(), CommitOutcome::Conflict);
    assert_eq!(load_one(&*b.store, &written).await, x1, "nothing written");

    // A key both written and checked is a caller bug, refused before any write.
    let err = b
        .store
        .commit_checked(
            &[next(&x1, json!(2), &[])],
            &[ReadCheck {
                key: written.clone(),
                version: x1.version,
            }],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Rejected(_)), "{err}");
}

async fn a_record_over_the_item_limit_is_rejected_for_good(b: Backend) {
    let (big, small) = (key("t1", "sku", "big"), key("t1", "order", "small"));
    let too_big = json!("x".repeat(MAX_RECORD_BYTES + 1024));
    for writes in [
        vec![create(&big, too_big.clone(), &[])],
        vec![
            create(&small, json!(1), &[]),
            create(&big, too_big.clone(), &[]),
        ],
    ] {
        let err = b.store.commit(&writes).await.unwrap_err();
        // DynamoDB answers ValidationException; the embedded store refuses the same.
        assert!(matches!(err, StoreError::Rejected(_)), "{err}");
        let loaded = b.store.load(&[big.clone(), small.clone()]).await.unwrap();
        assert!(loaded.iter().all(|r| !r.exists()), "nothing written");
    }
    // Under the limit is fine (moto's own limit is ~405,000 bytes, DynamoDB's 400 KB).
    let fits = json!("x".repeat(MAX_RECORD_BYTES - 8192));
    assert_eq!(
        commit(&*b.store, &[create(&big, fits, &[])]).await,
        CommitOutcome::Committed
    );
}

macro_rules! conformance {
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

conformance!(
    missing_record_loads_as_version_zero,
    create_commits_version_one_with_data_and_applied,
    second_create_conflicts_and_keeps_the_first,
    stale_update_conflicts_and_changes_nothing,
    multi_record_commit_is_all_or_nothing,
    concurrent_increments_lose_no_update,
    list_returns_one_tenants_records_of_one_kind,
    applied_set_round_trips_empty_and_not,
    load_keeps_the_order_given_with_missing_and_repeated_keys,
    malformed_commits_are_errors_not_writes,
    read_checks_hold_the_commit_to_the_versions_read,
    a_record_over_the_item_limit_is_rejected_for_good,
);

// ---------------------------------------------------------------------------
// Both backends, through the processor's commit path: reads are guarded

/// A small custom domain: "activate plan {object_id} if plan {body} is inactive".
struct Plans {
    /// `false`: the domain opts its reads out of the guard (the unsafe old behaviour).
    guard_reads: bool,
}

impl Domain for Plans {
    fn targets(&self, event: &DomainEvent<'_>) -> Result<Vec<StateKey>, DomainError> {
        let plan = event.envelope.object_id.clone().unwrap_or_default();
        let other = String::from_utf8_lossy(event.body).into_owned();
        Ok(vec![key("t1", "plan", &plan), key("t1", "plan", &other)])
    }

    fn decide(
        &self,
        event: &DomainEvent<'_>,
        current: &[StateRecord],
    ) -> Result<Decision, DomainError> {
        let [plan, other] = current else {
            return Err(DomainError::Permanent("two plans expected".into()));
        };
        if other.data["active"] == json!(true) {
            return Ok(Decision::Ignore {
                reason: format!("plan {} is active", other.key.id),
            });
        }
        Ok(Decision::Apply {
            changes: vec![Change::new(
                plan.key.clone(),
                format!("t1#plan-{}#activated", plan.key.id),
                json!({"active": true}),
            )],
            result: format!(
                "plan {} activated ({})",
                plan.key.id, event.envelope.event_id
            ),
        })
    }

    fn guards_read(&self, _event: &DomainEvent<'_>, _record: &StateKey) -> bool {
        self.guard_reads
    }
}

/// Fault injection: the first two loads return only when both have read (two
/// decisions on the same snapshot, as two concurrent workers make them); commits then
/// reach the store one after the other, so the test shows the guard and not how the
/// server orders concurrent requests.
struct SameSnapshot {
    inner: Arc<dyn StateStore>,
    loads: AtomicUsize,
    both_read: tokio::sync::Barrier,
    one_commit_at_a_time: tokio::sync::Mutex<()>,
}

#[async_trait]
impl StateStore for SameSnapshot {
    async fn load(&self, keys: &[StateKey]) -> Result<Vec<StateRecord>, StoreError> {
        let records = self.inner.load(keys).await;
        if self.loads.fetch_add(1, Ordering::SeqCst) < 2 {
            self.both_read.wait().await;
        }
        records
    }
    async fn commit_each(&self, commits: &[Commit]) -> Vec<CommitAnswer> {
        let _one = self.one_commit_at_a_time.lock().await;
        self.inner.commit_each(commits).await
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

fn activate(plan: &str, unless_active: &str) -> (Envelope, Vec<u8>) {
    let envelope = Envelope {
        provider: "plans".into(),
        tenant: "t1".into(),
        event_id: format!("evt-activate-{plan}"),
        event_type: "plan.activate".into(),
        object_id: Some(plan.into()),
        object_version: None,
        occurred_at: None,
        delivery_id: None,
    };
    (envelope, unless_active.as_bytes().to_vec())
}

/// Two concurrent events "activate X if Y is inactive" and "activate Y if X is
/// inactive", decided on the same snapshot. Returns the active plans and outcomes.
async fn two_plans(kind: Kind, guard_reads: bool) -> (Vec<String>, Vec<String>) {
    let b = kind.backend(5).await;
    let state = Arc::new(SameSnapshot {
        inner: b.state.clone(),
        loads: AtomicUsize::new(0),
        both_read: tokio::sync::Barrier::new(2),
        one_commit_at_a_time: tokio::sync::Mutex::new(()),
    });
    // Two processes (within one, decisions on the same records take turns and could
    // never read the same snapshot).
    let processor = |state: Arc<SameSnapshot>| {
        Processor::new(
            b.inbox.clone(),
            b.processing.clone(),
            b.queue.clone(),
            state,
            Arc::new(Plans { guard_reads }),
        )
    };
    let (first, second) = (processor(state.clone()), processor(state));
    let ((ex, bx), (ey, by)) = (activate("x", "y"), activate("y", "x"));
    let event_x = DomainEvent {
        envelope: &ex,
        body: &bx,
    };
    let event_y = DomainEvent {
        envelope: &ey,
        body: &by,
    };
    let (x, y) = tokio::join!(
        first.decide_and_commit(&event_x),
        second.decide_and_commit(&event_y),
    );
    let outcomes = [x, y]
        .into_iter()
        .map(|o| match o {
            Ok(EffectOutcome::Committed(r)) => format!("committed: {r}"),
            Ok(EffectOutcome::Ignored(r)) => format!("ignored: {r}"),
            other => panic!("{other:?}"),
        })
        .collect();
    let active = b
        .state
        .load(&[key("t1", "plan", "x"), key("t1", "plan", "y")])
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.data["active"] == json!(true))
        .map(|r| r.key.id)
        .collect();
    (active, outcomes)
}

async fn exactly_one_of_two_plans_is_activated(kind: Kind) {
    let (active, outcomes) = two_plans(kind, true).await;
    assert_eq!(active.len(), 1, "{active:?} {outcomes:?}");
    let mut kinds: Vec<&str> = outcomes.iter().map(|o| &o[..7]).collect();
    kinds.sort();
    assert_eq!(kinds, ["committ", "ignored"], "{outcomes:?}");
    // The same race with the reads explicitly unguarded: both commit. This is what
    // every domain got before reads were guarded.
    let (active, outcomes) = two_plans(kind, false).await;
    assert_eq!(active, ["x", "y"], "{outcomes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_exactly_one_of_two_plans_is_activated() {
    exactly_one_of_two_plans_is_activated(Kind::Embedded).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aws_moto_exactly_one_of_two_plans_is_activated() {
    exactly_one_of_two_plans_is_activated(Kind::Aws).await
}

/// A decision whose record DynamoDB (or the embedded store) refuses as too large is a
/// permanent failure with the store's reason, not a retry.
async fn an_oversized_record_fails_the_event_permanently(kind: Kind) {
    struct Huge;
    impl Domain for Huge {
        fn targets(&self, _event: &DomainEvent<'_>) -> Result<Vec<StateKey>, DomainError> {
            Ok(vec![key("t1", "blob", "b")])
        }
        fn decide(
            &self,
            _event: &DomainEvent<'_>,
            current: &[StateRecord],
        ) -> Result<Decision, DomainError> {
            Ok(Decision::Apply {
                changes: vec![Change::new(
                    current[0].key.clone(),
                    "t1#blob-b#grow",
                    json!("x".repeat(MAX_RECORD_BYTES + 1024)),
                )],
                result: "grown".into(),
            })
        }
    }
    let b = kind.backend(5).await;
    let processor = Processor::new(
        b.inbox.clone(),
        b.processing.clone(),
        b.queue.clone(),
        b.state.clone(),
        Arc::new(Huge),
    );
    let (envelope, body) = activate("b", "-");
    let out = processor
        .decide_and_commit(&DomainEvent {
            envelope: &envelope,
            body: &body,
        })
        .await;
    match out {
        Err(EffectError::Permanent(reason)) => assert!(
            reason.contains("ValidationException") || reason.contains("exceeds"),
            "{reason}"
        ),
        other => panic!("expected a permanent failure, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_an_oversized_record_fails_the_event_permanently() {
    an_oversized_record_fails_the_event_permanently(Kind::Embedded).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aws_moto_an_oversized_record_fails_the_event_permanently() {
    an_oversized_record_fails_the_event_permanently(Kind::Aws).await
}

// ---------------------------------------------------------------------------
// AWS only: round trips, counted at the SDK's HTTP layer

async fn counted() -> (DynamoStateStore, CallCounter, OperationLog) {
    let counter = CallCounter::new();
    let log = OperationLog::new();
    let store =
        moto::state_store_logged(moto::shared(), Some(counter.clone()), Some(log.clone())).await;
    (store, counter, log)
}

/// Run `f` and return the operations it made (one per HTTP attempt).
async fn calls<T>(
    counter: &CallCounter,
    log: &OperationLog,
    f: impl std::future::Future<Output = T>,
) -> (T, Vec<String>) {
    counter.reset();
    log.take();
    let out = f.await;
    let ops = log.take();
    assert_eq!(counter.count(), ops.len(), "every call is logged once");
    (out, ops)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_load_is_one_call_for_one_or_several_keys() {
    let (store, counter, log) = counted().await;
    let keys: Vec<StateKey> = ["a", "b", "c"]
        .iter()
        .map(|id| key("t1", "order", id))
        .collect();
    store
        .commit(&[
            create(&keys[0], json!(1), &[]),
            create(&keys[2], json!(3), &[]),
        ])
        .await
        .unwrap();

    let (one, ops) = calls(&counter, &log, store.load(&keys[..1])).await;
    assert_eq!(ops, ["GetItem"], "load of 1 key");
    assert_eq!(one.unwrap()[0].version, 1);

    let (three, ops) = calls(&counter, &log, store.load(&keys)).await;
    assert_eq!(ops, ["BatchGetItem"], "load of 3 keys");
    let three = three.unwrap();
    assert_eq!(
        three.iter().map(|r| r.version).collect::<Vec<_>>(),
        [1, 0, 1]
    );

    // Repeated keys are fetched once: still one GetItem / one BatchGetItem.
    let (_, ops) = calls(
        &counter,
        &log,
        store.load(&[keys[1].clone(), keys[1].clone()]),
    )
    .await;
    assert_eq!(ops, ["GetItem"]);

    let (none, ops) = calls(&counter, &log, store.load(&[])).await;
    assert!(
        none.unwrap().is_empty() && ops.is_empty(),
        "no keys, no call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_load_of_more_than_a_batch_pages_in_chunks_of_100() {
    let (store, counter, log) = counted().await;
    let keys: Vec<StateKey> = (0..150)
        .map(|i| key("t1", "sku", &format!("s{i:03}")))
        .collect();
    let writes: Vec<StateWrite> = keys
        .iter()
        .step_by(2)
        .map(|k| create(k, json!({"k": k.id}), &[]))
        .collect();
    for chunk in writes.chunks(50) {
        assert_eq!(store.commit(chunk).await.unwrap(), CommitOutcome::Committed);
    }
    let (loaded, ops) = calls(&counter, &log, store.load(&keys)).await;
    assert_eq!(ops, ["BatchGetItem", "BatchGetItem"]);
    let loaded = loaded.unwrap();
    assert_eq!(loaded.len(), 150);
    for (i, r) in loaded.iter().enumerate() {
        assert_eq!(r.key, keys[i]);
        assert_eq!(r.exists(), i % 2 == 0, "{}", r.key.pk());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_commit_is_one_call_put_for_one_write_transaction_for_several() {
    let (store, counter, log) = counted().await;
    let (a, b) = (key("t1", "order", "a"), key("t1", "sku", "b"));

    let (out, ops) = calls(
        &counter,
        &log,
        store.commit(&[create(&a, json!(1), &["e1"])]),
    )
    .await;
    assert_eq!(out.unwrap(), CommitOutcome::Committed);
    assert_eq!(ops, ["PutItem"], "commit of 1 write");

    let (out, ops) = calls(
        &counter,
        &log,
        store.commit(&[create(&a, json!(1), &["e1"])]),
    )
    .await;
    assert_eq!(out.unwrap(), CommitOutcome::Conflict);
    assert_eq!(ops, ["PutItem"], "a conflict costs the same one call");

    let a1 = load_one(&store, &a).await;
    let writes = [
        next(&a1, json!(2), &["e1", "e2"]),
        create(&b, json!(1), &["e2"]),
    ];
    let (out, ops) = calls(&counter, &log, store.commit(&writes)).await;
    assert_eq!(out.unwrap(), CommitOutcome::Committed);
    assert_eq!(ops, ["TransactWriteItems"], "commit of 2 writes");

    let (out, ops) = calls(&counter, &log, store.commit(&writes)).await;
    assert_eq!(out.unwrap(), CommitOutcome::Conflict, "stale transaction");
    assert_eq!(ops, ["TransactWriteItems"]);

    let (out, ops) = calls(&counter, &log, store.commit(&[])).await;
    assert_eq!((out.unwrap(), ops.len()), (CommitOutcome::Committed, 0));

    let (out, ops) = calls(&counter, &log, store.list("t1", "order", 10)).await;
    assert_eq!(out.unwrap().len(), 1);
    assert_eq!(ops, ["Query"], "list queries the GSI, never scans");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_commit_of_more_than_100_writes_is_refused_without_a_call() {
    let (store, counter, log) = counted().await;
    let writes: Vec<StateWrite> = (0..101)
        .map(|i| create(&key("t1", "sku", &format!("s{i}")), json!(i), &[]))
        .collect();
    let (out, ops) = calls(&counter, &log, store.commit(&writes)).await;
    let err = out.unwrap_err().to_string();
    assert!(err.contains("101") && err.contains("100"), "{err}");
    assert!(ops.is_empty());
    // Exactly 100 is one transaction.
    let (out, ops) = calls(&counter, &log, store.commit(&writes[..100])).await;
    assert_eq!(out.unwrap(), CommitOutcome::Committed);
    assert_eq!(ops, ["TransactWriteItems"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_missing_table_is_unavailable() {
    let sdk = moto::shared().sdk_config().await;
    let store = DynamoStateStore::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        moto::unique_name("no-such-table"),
    );
    let k = key("t1", "order", "x");
    for result in [
        store.load(std::slice::from_ref(&k)).await.map(|_| ()),
        store
            .load(&[k.clone(), key("t1", "order", "y")])
            .await
            .map(|_| ()),
        store.commit(&[create(&k, json!(1), &[])]).await.map(|_| ()),
        store
            .commit(&[
                create(&k, json!(1), &[]),
                create(&key("t1", "o", "y"), json!(1), &[]),
            ])
            .await
            .map(|_| ()),
        store.list("t1", "order", 5).await.map(|_| ()),
    ] {
        let err = result.unwrap_err();
        assert!(
            matches!(err, einmal::ports::StoreError::Unavailable(_)),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_create_state_table_is_idempotent() {
    let sdk = moto::shared().sdk_config().await;
    let client = aws_sdk_dynamodb::Client::new(&sdk);
    let table = moto::unique_name("einmal-state-idem");
    einmal::adapters::aws::create_state_table(&client, &table)
        .await
        .unwrap();
    einmal::adapters::aws::create_state_table(&client, &table)
        .await
        .expect("second create accepts the existing table");
    let described = client
        .describe_table()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    let table_description = described.table().unwrap();
    assert!(table_description.global_secondary_indexes().is_empty());
    let keys: Vec<(&str, &str)> = table_description
        .key_schema()
        .iter()
        .map(|k| (k.attribute_name(), k.key_type().as_str()))
        .collect();
    assert_eq!(keys, einmal::adapters::aws::STATE_KEY_SCHEMA);
    let ttl = client
        .describe_time_to_live()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    assert_eq!(
        ttl.time_to_live_description()
            .and_then(|d| d.attribute_name()),
        Some("expires_at")
    );
}

// ---------------------------------------------------------------------------
// Embedded only: durability across reopen

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_commits_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (key("t1", "order", "a"), key("t1", "sku", "b"));
    {
        let store = EmbeddedStateStore::open(dir.path()).unwrap();
        let writes = [
            create(&a, json!({"status": "paid"}), &["e1"]),
            create(&b, json!({"stock": 3}), &[]),
        ];
        assert_eq!(
            store.commit(&writes).await.unwrap(),
            CommitOutcome::Committed
        );
        let a1 = load_one(&store, &a).await;
        store
            .commit(&[next(&a1, json!({"status": "shipped"}), &["e1", "e2"])])
            .await
            .unwrap();
    }
    let store = EmbeddedStateStore::open(dir.path()).unwrap();
    let loaded = store.load(&[a.clone(), b.clone()]).await.unwrap();
    assert_eq!(
        loaded[0],
        record(&a, 2, json!({"status": "shipped"}), &["e1", "e2"])
    );
    assert_eq!(loaded[1], record(&b, 1, json!({"stock": 3}), &[]));
    // The version guard still holds after reopen.
    let stale = create(&a, json!({}), &[]);
    assert_eq!(
        store.commit(&[stale]).await.unwrap(),
        CommitOutcome::Conflict
    );
    assert_eq!(store.list("t1", "order", 10).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_two_handles_on_one_directory_share_the_guards() {
    // E.g. `einmal serve` and an operator CLI on the same directory.
    let dir = tempfile::tempdir().unwrap();
    let one = EmbeddedStateStore::open(dir.path()).unwrap();
    let two = EmbeddedStateStore::open(dir.path()).unwrap();
    let k = key("t1", "order", "shared");
    assert_eq!(
        one.commit(&[create(&k, json!(1), &[])]).await.unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(
        two.commit(&[create(&k, json!(2), &[])]).await.unwrap(),
        CommitOutcome::Conflict
    );
    assert_eq!(load_one(&two, &k).await.data, json!(1));
}
