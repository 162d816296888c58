//! Upgrades of the embedded store: a file written by the previous release (committed
//! under `tests/fixtures/`) opens, is migrated and serves; a file of a newer release
//! is refused with a message. (Version 1 → 2 is tested on a synthesized file in
//! `shared/src/adapters/embedded/schema.rs`.)
//!
//! `store-v2-before-purge.sqlite` is schema version 2 as the release before the
//! retention purge wrote it: no `inbox_by_expiry`, no `order_cursor_by_updated`, no
//! `store_meta`, `auto_vacuum = NONE`; it holds completed events with their business
//! records and two events still queued. Regenerate it (only when a release changes
//! the schema) with `cargo test -p einmal-tests --test it -- store_upgrade::generate
//! --ignored`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore, PurgeSettings, DB_FILE};
use einmal::ports::InboxState;
use einmal_tests::scenario::{self, orders_create, pi_succeeded, Event};

const FIXTURE: &str = "store-v2-before-purge.sqlite";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(FIXTURE)
}

fn events() -> (Vec<Event>, Vec<Event>) {
    let processed = vec![
        orders_create(31_001, 1_700_000_000, &[("SKU-UP", 2)], 200, "pending"),
        pi_succeeded("31001", "pi_31001", 200, 1_700_000_010),
    ];
    let queued = vec![
        orders_create(31_002, 1_700_000_000, &[("SKU-UP", 1)], 100, "pending"),
        pi_succeeded("31002", "pi_31002", 100, 1_700_000_010),
    ];
    (processed, queued)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_the_previous_release_opens_migrates_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture(), dir.path().join(DB_FILE)).unwrap();
    let store = Arc::new(EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap());
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.schema_version, EmbeddedStore::schema_version());
    assert_eq!(stats.rows("inbox"), Some(4));
    assert_eq!(
        stats.auto_vacuum, "none",
        "switching needs a VACUUM: kept as it was"
    );
    let b = Arc::new(scenario::embedded_on(store.clone(), 5, Box::new(())));
    let (processed, queued) = events();
    for event in &processed {
        assert_eq!(b.item(event).await.state, InboxState::Completed);
    }
    // It serves: a late duplicate is recognised, the queued events are processed.
    let ingestor = b.ingestor();
    assert!(b.send(&ingestor, &processed[1]).await, "a duplicate");
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    let processor = b.processor(2_000);
    let run = tokio::spawn(async move {
        processor
            .run_local("w", async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    for event in &queued {
        while !b.item(event).await.state.is_terminal() {
            assert!(
                Instant::now() < deadline,
                "{} not processed",
                event.event_id
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(b.item(event).await.state, InboxState::Completed);
    }
    stop_tx.send(true).unwrap();
    run.await.unwrap();
    assert_eq!(
        b.on_hand("SKU-UP").await,
        100 - 3,
        "each order's stock once"
    );
    // The purge works on it (the migration added its index and table).
    let report = store
        .purge_expired(
            einmal::time::now_millis(),
            &PurgeSettings::for_retention(30),
        )
        .await
        .unwrap();
    assert_eq!(report.inbox_items, 0, "nothing has expired");
    assert!(store.stats().await.unwrap().last_purge_ms.is_some());
}

#[tokio::test]
async fn a_store_of_a_newer_release_is_refused_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture(), dir.path().join(DB_FILE)).unwrap();
    rusqlite::Connection::open(dir.path().join(DB_FILE))
        .unwrap()
        .execute_batch("PRAGMA user_version = 3")
        .unwrap();
    let err = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("schema version 3 is newer than this build's")
            && message.contains("newer einmal"),
        "{message}"
    );
    // Refused without a change: the file still says 3.
    let version: i64 = rusqlite::Connection::open(dir.path().join(DB_FILE))
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 3);
}

/// Writes the fixture (see the module documentation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn generate() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Arc::new(EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap());
        let b = Arc::new(scenario::embedded_on(store.clone(), 5, Box::new(())));
        b.seed(&[("SKU-UP", 100)]).await;
        let ingestor = b.ingestor();
        let (processed, queued) = events();
        for event in &processed {
            b.send(&ingestor, event).await;
        }
        let processor = b.processor(2_000);
        while !scenario::step(&b, &processor, "gen").await.is_empty() {}
        for event in &queued {
            b.send(&ingestor, event).await;
        }
    }
    let path = dir.path().join(DB_FILE);
    // What the release before the purge did not have.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            "DROP INDEX inbox_by_expiry; DROP INDEX order_cursor_by_updated; \
             DROP TABLE store_meta; PRAGMA auto_vacuum = NONE; VACUUM; \
             PRAGMA journal_mode = DELETE;",
        )
        .unwrap();
    std::fs::create_dir_all(fixture().parent().unwrap()).unwrap();
    std::fs::copy(&path, fixture()).unwrap();
}
