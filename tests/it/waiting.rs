//! Waiting for a prerequisite (issue 9 part 2), on both backends: an event whose
//! prerequisite is missing is parked (`waiting`), spends no receive budget, is woken by
//! the commit that creates the prerequisite, and is dead-lettered only after its wait
//! window, with the reason. Time beyond a few seconds passes on an injected clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use einmal::domain::reference::order_key;
use einmal::pipeline::process::Processor;
use einmal::pipeline::sweep::{SweepSettings, Sweeper};
use einmal::ports::InboxState;
use einmal_tests::on_both_backends;
use einmal_tests::scenario::{
    self, drain, fulfillment, orders_create, orders_updated, shopify_refund, step, Backend, Event,
    Kind, TENANT,
};

const SKU: &str = "SKU-RED-M";
/// Few receives: before waiting existed, a waiting event was dead-lettered after these.
const MAX_RECEIVES: u32 = 3;
const LEASE_MS: i64 = 5_000;
const MINUTE_MS: i64 = 60_000;
const HOUR_MS: i64 = 60 * MINUTE_MS;

/// An injected clock: starts at the real time and moves only when told.
#[derive(Clone)]
struct Clock(Arc<AtomicI64>);

impl Clock {
    fn new() -> Clock {
        Clock(Arc::new(AtomicI64::new(einmal::time::now_millis())))
    }
    fn now(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
    fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

fn processor(b: &Backend, clock: &Clock) -> Processor {
    let clock = clock.clone();
    b.processor_with_settings(scenario::settings(LEASE_MS, MAX_RECEIVES))
        .with_clock(move || clock.now())
}

/// Process until the queue has stayed empty for a while: long enough for every retry
/// the test settings allow (backoff ≤ 20 ms; SQS rounds a delay up to 1 s) to come
/// back, so an event that retried instead of parking would use up its receives here.
async fn settle(b: &Backend, p: &Processor) {
    let quiet = if b.name == "aws" {
        Duration::from_secs(3)
    } else {
        Duration::from_millis(300)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut quiet_since = Instant::now();
    loop {
        if !step(b, p, "settle").await.is_empty() {
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= quiet {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: the queue never went quiet",
            b.name
        );
        tokio::time::sleep(b.idle_poll).await;
    }
}

async fn assert_waiting_on(b: &Backend, event: &Event, order: &str) {
    let item = b.item(event).await;
    assert_eq!(
        item.state,
        InboxState::Waiting,
        "{}: {} {:?}",
        b.name,
        event.kind,
        item.last_error
    );
    let waiting = item.waiting.expect("a parked item says what it waits for");
    assert_eq!(waiting.on, order_key(TENANT, order).pk());
    assert!(
        item.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("waiting:")),
        "{:?}",
        item.last_error
    );
}

/// The dependent events first, their order 1 s, 45 s and 10 min later (on the injected
/// clock): each applied once, nothing dead-lettered, no waiter left.
async fn late_prerequisites_are_applied_once(kind: Kind) {
    let b = kind.backend(MAX_RECEIVES).await;
    b.seed(&[(SKU, 100)]).await;
    let clock = Clock::new();
    let p = processor(&b, &clock);
    let ingestor = b.ingestor();
    let t0 = 1_700_000_000;
    for (n, (order, late_ms)) in [(1001u64, 1_000), (1002, 45_000), (1003, 10 * MINUTE_MS)]
        .into_iter()
        .enumerate()
    {
        let id = order.to_string();
        let at = t0 + n as i64 * 1000;
        let dependents = [
            fulfillment(order, order * 10, &format!("1Z{order}"), at + 30),
            shopify_refund(order, order * 10 + 1, 500, at + 20),
            orders_updated(order, at + 10, &[(SKU, 2)], 2000),
        ];
        for event in &dependents {
            assert!(!b.send(&ingestor, event).await);
        }
        settle(&b, &p).await;
        for event in &dependents {
            assert_waiting_on(&b, event, &id).await;
        }

        clock.advance(late_ms);
        let create = orders_create(order, at, &[(SKU, 2)], 2000, "paid");
        assert!(!b.send(&ingestor, &create).await);
        // Only the create is in the queue; its commit wakes the three waiters.
        drain(&b, &p).await;

        for event in dependents.iter().chain([&create]) {
            let item = b.item(event).await;
            assert_eq!(
                item.state,
                InboxState::Completed,
                "{}: {} {:?}",
                b.name,
                event.kind,
                item.last_error
            );
            assert_eq!(item.waiting, None, "woken and done: no waiter left");
        }
        let o = b.order(&id).await;
        assert_eq!(o.shipments.len(), 1, "{}: order {id}", b.name);
        assert_eq!(o.refunds.len(), 1);
        assert_eq!(o.refunded_minor, 500);
        assert_eq!(o.shopify_updated_at, Some(scenario::utc(at + 10)));
    }
    assert_eq!(
        b.on_hand(SKU).await,
        100 - 3 * 2,
        "stock reserved once per order"
    );
    assert!(
        b.dead_letters().await.is_empty(),
        "{}: nothing dead-lettered",
        b.name
    );
    let sweep = Sweeper::new(
        b.inbox.clone(),
        b.sweep.clone(),
        b.processing.clone(),
        b.queue.clone(),
    )
    .sweep_once(clock.now())
    .await;
    assert_eq!((sweep.waiting_count, sweep.oldest_waiting_age_ms), (0, 0));
}

/// A waiter whose order never comes: still waiting (and re-checked by the sweeper)
/// within the window, dead-lettered once the window (Shopify: 1 day) has run out,
/// with the reason.
async fn a_waiter_without_prerequisite_is_dead_lettered_after_the_window(kind: Kind) {
    let b = kind.backend(MAX_RECEIVES).await;
    let clock = Clock::new();
    let p = processor(&b, &clock);
    let sweeper = Sweeper::new(
        b.inbox.clone(),
        b.sweep.clone(),
        b.processing.clone(),
        b.queue.clone(),
    )
    .with_settings(SweepSettings::default());
    let orphan = fulfillment(2001, 20_010, "1Z2001", 1_700_000_000);
    assert!(!b.send(&b.ingestor(), &orphan).await);
    settle(&b, &p).await;
    assert_waiting_on(&b, &orphan, "2001").await;
    let parked_at = b.item(&orphan).await.waiting.unwrap().since_ms;
    assert_eq!(parked_at, clock.now());

    // 23 hours later: the sweeper sees it and re-sends it; it still waits.
    clock.advance(23 * HOUR_MS);
    let report = sweeper.sweep_once(clock.now()).await;
    assert_eq!(report.waiting_count, 1, "{}", b.name);
    assert_eq!(report.oldest_waiting_age_ms, 23 * HOUR_MS);
    assert_eq!(report.waiters_rechecked, 1);
    settle(&b, &p).await;
    assert_waiting_on(&b, &orphan, "2001").await;
    let item = b.item(&orphan).await;
    assert_eq!(
        item.waiting.unwrap().since_ms,
        parked_at,
        "the wait counts from the first park"
    );
    // Re-checked just now: the next pass leaves it alone.
    let report = sweeper.sweep_once(clock.now()).await;
    assert_eq!((report.waiting_count, report.waiters_rechecked), (1, 0));

    // Past the window: the next re-check dead-letters it with the reason.
    clock.advance(HOUR_MS + MINUTE_MS);
    let report = sweeper.sweep_once(clock.now()).await;
    assert_eq!(report.waiters_rechecked, 1);
    settle(&b, &p).await;
    let item = b.item(&orphan).await;
    assert_eq!(item.state, InboxState::DeadLetter, "{}", b.name);
    assert_eq!(
        item.last_error.as_deref(),
        Some("waited 24h (window 24h) for waiting: fulfillment before order 2001 exists")
    );
    assert_eq!(item.waiting, None);
    assert_eq!(b.dead_letters().await, vec![orphan.inbox_key()]);
    let report = sweeper.sweep_once(clock.now()).await;
    assert_eq!(report.waiting_count, 0);
}

/// A configured window replaces the provider's.
async fn a_configured_wait_window_applies(kind: Kind) {
    let b = kind.backend(MAX_RECEIVES).await;
    let clock = Clock::new();
    let mut settings = scenario::settings(LEASE_MS, MAX_RECEIVES);
    settings.wait_window_ms = Some(30 * MINUTE_MS);
    let p = {
        let clock = clock.clone();
        b.processor_with_settings(settings)
            .with_clock(move || clock.now())
    };
    let orphan = shopify_refund(3001, 30_011, 700, 1_700_000_000);
    assert!(!b.send(&b.ingestor(), &orphan).await);
    settle(&b, &p).await;
    assert_waiting_on(&b, &orphan, "3001").await;
    clock.advance(31 * MINUTE_MS);
    let sweeper = Sweeper::new(
        b.inbox.clone(),
        b.sweep.clone(),
        b.processing.clone(),
        b.queue.clone(),
    );
    assert_eq!(sweeper.sweep_once(clock.now()).await.waiters_rechecked, 1);
    settle(&b, &p).await;
    let item = b.item(&orphan).await;
    assert_eq!(item.state, InboxState::DeadLetter);
    assert!(
        item.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("waited 31m (window 30m) for waiting: refund")),
        "{:?}",
        item.last_error
    );
}

on_both_backends!(
    late_prerequisites_are_applied_once,
    a_waiter_without_prerequisite_is_dead_lettered_after_the_window,
    a_configured_wait_window_applies,
);
