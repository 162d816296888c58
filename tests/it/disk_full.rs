//! A full disk under `einmal serve`'s embedded store (simulated with SQLite's
//! `max_page_count` on the writer's connection, the same `SQLITE_FULL` a full file
//! system gives): the receiver answers 503 (the provider delivers again), nothing
//! acknowledged is lost, the processor waits without ending any event, and
//! everything resumes when space returns — every effect exactly once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
use einmal_tests::scenario::{self, orders_create, pi_succeeded, Event, TENANT};

async fn status(ingestor: &einmal::pipeline::ingest::Ingestor, event: &Event) -> u16 {
    let request = event.request(&ingestor.config());
    ingestor
        .ingest(event.provider, TENANT, &request)
        .await
        .status
}

fn order_events(n: u64) -> [Event; 2] {
    let order = 9_000 + n;
    [
        orders_create(order, 1_700_000_000, &[("SKU-FULL", 1)], 100, "pending"),
        pi_succeeded(
            &order.to_string(),
            &format!("pi_{order}"),
            100,
            1_700_000_010,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_503_loses_nothing_acked_and_resumes_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap());
    let b = Arc::new(scenario::embedded_on(store.clone(), 5, Box::new(())));
    b.seed(&[("SKU-FULL", 1_000)]).await;
    let ingestor = b.ingestor();
    let mut acked = Vec::new();
    for n in 0..5 {
        for event in order_events(n) {
            assert_eq!(status(&ingestor, &event).await, 200);
            acked.push(event);
        }
    }

    // The disk fills: the file may not grow past what it has now.
    let pages = store.stats().await.unwrap().page_count;
    store.limit_pages(Some(pages)).await.unwrap();
    let mut refused = Vec::new();
    let mut n = 5;
    while refused.is_empty() {
        assert!(n < 5_000, "the capped store never refused a write");
        for event in order_events(n) {
            match status(&ingestor, &event).await {
                200 => acked.push(event),
                503 => refused.push(event),
                other => panic!("{other} for {}", event.event_id),
            }
        }
        n += 1;
    }
    assert!(
        store.writes_failing(),
        "the refusal is visible (metric, log)"
    );
    // Nothing acknowledged was lost to the refusal.
    for event in &acked {
        b.item(event).await;
    }

    // The processor runs while the disk is full: it waits, it ends nothing.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let processor = Arc::new(b.processor(2_000));
    let run = {
        let processor = processor.clone();
        let mut stopped = stopped;
        tokio::spawn(async move {
            processor
                .run_local("w", async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(b.dead_letters().await.is_empty());

    // Space returns; the provider delivers the refused events again.
    store.limit_pages(None).await.unwrap();
    for event in &refused {
        assert_eq!(status(&ingestor, event).await, 200, "{}", event.event_id);
    }
    let all: Vec<&Event> = acked.iter().chain(&refused).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let items = b.items().await;
        if items.len() == all.len() && items.iter().all(|i| i.state.is_terminal()) {
            let not_completed = scenario::not_completed(&items);
            assert!(not_completed.is_empty(), "{not_completed:#?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not drained after the disk recovered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.send(true).unwrap();
    run.await.unwrap();
    assert!(!store.writes_failing());
    assert!(b.dead_letters().await.is_empty());
    // Every order's stock taken once, every payment recorded once.
    let orders = all.len() as i64 / 2;
    assert_eq!(b.on_hand("SKU-FULL").await, 1_000 - orders);
    for n in 0..orders as u64 {
        let order = b.order(&(9_000 + n).to_string()).await;
        assert_eq!(order.payments.len(), 1, "{order:?}");
    }
}
