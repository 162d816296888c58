//! A long outage of the store the processor writes to, then recovery: every event
//! completes, none is dead-lettered, every effect lands once — on both backends.
//!
//! Production waits out a 15-minute throttle with backoffs capped at 15 minutes and
//! `maxReceiveCount` 5; here the timings are scaled down by configuration: backoffs of
//! at most 1 s, a redrive after 3 receives, and an outage of 8 s — far longer than
//! the 3 receives the redrive allows would last if each failure spent one.
//! `bench/throttle.sh` runs the same scenario at full length (a 15-minute outage,
//! production backoffs) through `EINMAL_OUTAGE_SECS`, `EINMAL_OUTAGE_BACKOFF_BASE_MS`,
//! `EINMAL_OUTAGE_BACKOFF_MAX_MS` and `EINMAL_OUTAGE_MAX_RECEIVES`.
//! - AWS: every DynamoDB call (inbox, body and state tables) answers
//!   `ProvisionedThroughputExceededException` through a fault proxy in front of moto,
//!   so the SDK's own retries and our error mapping run as against AWS; the processor
//!   takes SQS batches of 10 as the Lambda would.
//! - Embedded: the state store is down (a full-port wrapper) while `run_local` runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use einmal::pipeline::process::{ProcessSettings, Processor};
use einmal_tests::fault_proxy::FaultProxy;
use einmal_tests::scenario::{self, orders_create, pi_succeeded, shopify_refund, Backend, Outage};

const ORDERS: u64 = 12;

fn max_receives() -> u32 {
    scenario::sized("EINMAL_OUTAGE_MAX_RECEIVES", 3) as u32
}

fn outage() -> Duration {
    Duration::from_secs(scenario::sized("EINMAL_OUTAGE_SECS", 8))
}

fn settings() -> ProcessSettings {
    ProcessSettings {
        lease_ms: 2_000,
        max_receive_count: max_receives(),
        backoff_base_ms: scenario::sized("EINMAL_OUTAGE_BACKOFF_BASE_MS", 50) as i64,
        backoff_max_ms: scenario::sized("EINMAL_OUTAGE_BACKOFF_MAX_MS", 1_000) as i64,
        ..ProcessSettings::default()
    }
}

/// Orders, their payments and one refund each, all acknowledged before the outage.
async fn ingest(b: &Backend) -> usize {
    b.seed(&[("SKU-OUT", 1_000)]).await;
    let ingestor = b.ingestor();
    let mut events = 0;
    for n in 0..ORDERS {
        let order = 7_000 + n;
        let id = order.to_string();
        for event in [
            orders_create(order, 1_700_000_000, &[("SKU-OUT", 2)], 200, "pending"),
            pi_succeeded(&id, &format!("pi_{order}"), 200, 1_700_000_010),
            shopify_refund(order, 70_000 + n, 50, 1_700_000_020),
        ] {
            assert!(!b.send(&ingestor, &event).await);
            events += 1;
        }
    }
    events
}

/// Run `processor` until `stop`: `run_local` on the embedded store, SQS batches of 10
/// on AWS.
fn spawn_processor(
    b: Arc<Backend>,
    processor: Arc<Processor>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stopped = stop;
        if b.name == "embedded" {
            processor
                .run_local("w", async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await;
            return;
        }
        while !*stopped.borrow() {
            if scenario::step(&b, &processor, "w").await.is_empty() {
                tokio::time::sleep(b.idle_poll).await;
            }
        }
    })
}

async fn outage_then_recovery(b: Arc<Backend>, processor: Processor, down: impl Fn(bool)) {
    let events = ingest(&b).await;
    down(true);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let run = spawn_processor(b.clone(), Arc::new(processor), stopped);
    tokio::time::sleep(outage()).await;
    // Nothing ended during the outage: it is not a permanent fact.
    down(false);
    let recovered = Instant::now();
    // Two of the longest backoffs: a postponed message comes back within one.
    let backoff_max = Duration::from_millis(settings().backoff_max_ms.unsigned_abs());
    let deadline = recovered + Duration::from_secs(120) + 2 * backoff_max;
    let items = loop {
        let items = b.items().await;
        if items.len() == events && items.iter().all(|i| i.state.is_terminal()) {
            break items;
        }
        assert!(
            Instant::now() < deadline,
            "{}: not drained after the outage",
            b.name
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    stop.send(true).unwrap();
    run.await.unwrap();
    println!(
        "{}: outage {:?}, every event terminal {:.1} s after recovery",
        b.name,
        outage(),
        recovered.elapsed().as_secs_f64()
    );

    let not_completed = scenario::not_completed(&items);
    assert!(not_completed.is_empty(), "{}: {not_completed:#?}", b.name);
    assert!(
        b.dead_letters().await.is_empty(),
        "{}: dead letters",
        b.name
    );
    // Effects once: stock taken once per order, one payment, one invoice and one
    // refund each.
    assert_eq!(b.on_hand("SKU-OUT").await, 1_000 - 2 * ORDERS as i64);
    for n in 0..ORDERS {
        let order = b.order(&(7_000 + n).to_string()).await;
        assert_eq!(
            (
                order.payments.len(),
                order.invoices.len(),
                order.refunds.len()
            ),
            (1, 1, 1),
            "{order:?}"
        );
        assert_eq!(
            (order.refunded_minor, order.loyalty_points),
            (50, 1),
            "{order:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_dynamodb_throttled_for_the_whole_outage_then_recovers() {
    let proxy = FaultProxy::start(&einmal_tests::moto::shared().endpoint).await;
    let b = Arc::new(scenario::aws_behind(max_receives(), &proxy).await);
    let processor = b.processor_with_settings(settings());
    let faults = proxy.faults.clone();
    outage_then_recovery(b, processor, move |down| faults.set_dynamodb_down(down)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_state_store_down_for_the_whole_outage_then_recovers() {
    let b = Arc::new(scenario::embedded(max_receives()).await);
    let down = Arc::new(AtomicBool::new(false));
    let state = Arc::new(Outage::new(b.state.clone(), down.clone()));
    let processor = b
        .processor_with(b.processing.clone(), state, 2_000)
        .with_settings(settings());
    outage_then_recovery(b, processor, move |on| down.store(on, Ordering::SeqCst)).await;
}
