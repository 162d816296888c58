//! A best-selling SKU: many Shopify `orders/create` of one SKU from concurrent clients
//! while the processors drain, on both backends. Contention is never a failure: every
//! order completes, none is dead-lettered, and the stock is exact.
//!
//! On the embedded store one processor runs `run_local` (as `einmal serve` does: 8
//! batches of 64 in flight, their commits gathered), so within the process the
//! decisions on the SKU take turns on its lane. On DynamoDB two processors take SQS
//! batches of 10 side by side, as two concurrent Lambda invocations would: their
//! conflicts cross processes and are decided again while the record keeps moving. The queue redrives after 2 receives,
//! so a conflict that spent receives would dead-letter orders.
//!
//! `bench/hot-sku-moto.sh` runs the AWS case at full size (12,000 orders, 8 and 64
//! clients) through `EINMAL_HOT_ORDERS` and `EINMAL_HOT_CLIENTS`; each case prints its
//! time until every order is terminal, orders/s and conflicts per order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use einmal::pipeline::process::Processor;
use einmal_tests::scenario::{self, orders_create, Kind, TENANT};

const SKU: &str = "SKU-HOT";
const STOCK: i64 = 1_000_000;
/// A redelivery budget that contention alone would exhaust at once.
const MAX_RECEIVES: u32 = 2;

async fn hot_sku(kind: Kind, orders: u64, clients: usize, processors: usize) {
    let orders = scenario::sized("EINMAL_HOT_ORDERS", orders);
    let clients = scenario::sized("EINMAL_HOT_CLIENTS", clients as u64) as usize;
    let b = Arc::new(kind.backend(MAX_RECEIVES).await);
    b.seed(&[(SKU, STOCK)]).await;
    let settings = scenario::settings(30_000, MAX_RECEIVES);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let processors: Vec<Arc<Processor>> = (0..processors)
        .map(|_| Arc::new(b.processor_with_settings(settings.clone())))
        .collect();
    let started = Instant::now();
    let runs: Vec<_> = processors
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, processor)| {
            let mut stopped = stopped.clone();
            let b = b.clone();
            tokio::spawn(async move {
                let worker = format!("w{i}");
                match b.name {
                    // `einmal serve`'s loop.
                    "embedded" => {
                        let shutdown = async move {
                            let _ = stopped.wait_for(|s| *s).await;
                        };
                        processor.run_local(&worker, shutdown).await;
                    }
                    // A Lambda invocation after the other: SQS batches of 10.
                    _ => {
                        while !*stopped.borrow() {
                            if scenario::step(&b, &processor, &worker).await.is_empty() {
                                tokio::time::sleep(b.idle_poll).await;
                            }
                        }
                    }
                }
            })
        })
        .collect();

    let next = Arc::new(AtomicU64::new(0));
    let senders: Vec<_> = (0..clients)
        .map(|_| {
            let (b, next) = (b.clone(), next.clone());
            tokio::spawn(async move {
                let ingestor = b.ingestor();
                loop {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    if n >= orders {
                        break;
                    }
                    let order =
                        orders_create(10_000 + n, 1_700_000_000, &[(SKU, 1)], 100, "pending");
                    let request = order.request(&ingestor.config());
                    let answer = ingestor.ingest(order.provider, TENANT, &request).await;
                    assert_eq!(answer.status, 200, "{}", answer.body);
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.unwrap();
    }

    // Generous: moto answers one call at a time (~5 orders/s with two processors).
    let deadline = Instant::now() + Duration::from_secs(300 + orders / 2);
    // A full listing on moto is a Scan that holds its one thread for seconds at this
    // size, stalling the processors: look at the SKU's record (one read) until the stock
    // has moved for every order (or the deadline), then list to check every order.
    while b.on_hand(SKU).await > STOCK - orders as i64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pause = Duration::from_millis(200).max(Duration::from_millis(orders / 4));
    let items = loop {
        let items = b.items_up_to(orders as usize + 100).await;
        if items.len() as u64 == orders && items.iter().all(|i| i.state.is_terminal()) {
            break items;
        }
        let open = items.iter().filter(|i| !i.state.is_terminal()).count();
        assert!(
            Instant::now() < deadline,
            "{}: {open} of {} orders not terminal",
            b.name,
            items.len()
        );
        tokio::time::sleep(pause).await;
    };
    let elapsed = started.elapsed();
    stop.send(true).unwrap();
    for run in runs {
        run.await.unwrap();
    }
    let conflicts: u64 = processors
        .iter()
        .map(|p| p.metrics().drain().conflicts)
        .sum();
    println!(
        "{}: {orders} orders of one SKU, {clients} clients, {} processor(s): every order \
         terminal after {:.1} s, {:.0} orders/s, {:.2} conflicts per order",
        b.name,
        processors.len(),
        elapsed.as_secs_f64(),
        orders as f64 / elapsed.as_secs_f64(),
        conflicts as f64 / orders as f64
    );

    let not_completed = scenario::not_completed(&items);
    assert!(
        not_completed.is_empty(),
        "{}: {} orders not completed: {:#?}",
        b.name,
        not_completed.len(),
        &not_completed[..not_completed.len().min(5)]
    );
    assert!(
        b.dead_letters().await.is_empty(),
        "{}: dead letters",
        b.name
    );
    assert_eq!(
        b.on_hand(SKU).await,
        STOCK - orders as i64,
        "{}: stock moved once per order",
        b.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_hot_sku_8_clients() {
    hot_sku(Kind::Embedded, 3_000, 8, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_hot_sku_64_clients() {
    hot_sku(Kind::Embedded, 3_000, 64, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_hot_sku_two_processors() {
    hot_sku(Kind::Aws, 100, 8, 2).await;
}
