//! Every acknowledged event keeps its body. On AWS the receiver puts the event's item,
//! then the body's item; when the second put never happens the request is not
//! acknowledged, so the provider retries, and that retry (a duplicate of an item
//! without its body) stores the body and sends the pointer again, whatever became of
//! the item meanwhile (`received`, `retryable`, `dead_letter`). Meanwhile the
//! processor and the sweeper say "body missing". Each trigger runs through a fault
//! proxy in front of moto, through to the provider's retry and the effect applied
//! once. (The embedded store writes the body with the row, in one INSERT: nothing to
//! lose there.)

use std::time::Duration;

use einmal::pipeline::ingest::Ingestor;
use einmal::pipeline::process::{ProcessSettings, Processor};
use einmal::pipeline::sweep::{SweepSettings, Sweeper};
use einmal::ports::{InboxItem, InboxState, QueueMessage, BODY_MISSING};
use einmal_tests::fault_proxy::{Fault, FaultProxy};
use einmal_tests::scenario::{self, orders_create, Backend, Event, TENANT};

const PUT_ITEM: &str = "DynamoDB_20120810.PutItem";
/// The body item's put (its key starts with `body#`).
const BODY_PUT: &str = r#""S":"body#"#;
const SKU: &str = "SKU-BODY";

async fn setup() -> (FaultProxy, Backend, Ingestor) {
    let proxy = FaultProxy::start(&einmal_tests::moto::shared().endpoint).await;
    let b = scenario::aws_behind(3, &proxy).await;
    b.seed(&[(SKU, 100)]).await;
    let ingestor = b.ingestor();
    (proxy, b, ingestor)
}

fn order() -> Event {
    orders_create(8_100, 1_700_000_000, &[(SKU, 2)], 200, "pending")
}

/// One delivery of `event` by the provider; its answer's status.
async fn deliver(ingestor: &Ingestor, event: &Event) -> u16 {
    let request = event.request(&ingestor.config());
    ingestor
        .ingest(event.provider, TENANT, &request)
        .await
        .status
}

/// The event's item is stored, its body is not.
async fn stored_without_body(b: &Backend, event: &Event) -> InboxItem {
    let item = b
        .inbox
        .get(&event.inbox_key())
        .await
        .expect("inbox get")
        .expect("the event's item is stored");
    assert!(item.body.is_empty(), "no body item: {item:?}");
    item
}

/// The sweeper sends the pointer of the stuck `received` item (its receiver never did).
async fn sweep(b: &Backend) {
    Sweeper::new(
        b.inbox.clone(),
        b.sweep.clone(),
        b.processing.clone(),
        b.queue.clone(),
    )
    .with_settings(SweepSettings {
        stuck_after_ms: 0,
        ..Default::default()
    })
    .sweep_once(einmal::time::now_millis() + 1_000)
    .await;
}

/// Process messages until the item is in `state` (at most a few rounds).
async fn process_until(b: &Backend, p: &Processor, event: &Event, state: InboxState) -> InboxItem {
    for _ in 0..40 {
        scenario::step(b, p, "w").await;
        let item = b.item(event).await;
        if item.state == state {
            return item;
        }
        tokio::time::sleep(b.idle_poll).await;
    }
    panic!("never {state}: {:?}", b.item(event).await);
}

/// A processor whose retry horizon is over at once: a missing body is dead-lettered at
/// its first attempt (the provider's window, long in production, is over).
fn past_horizon(b: &Backend) -> Processor {
    b.processor_with_settings(ProcessSettings {
        retry_horizon_ms: Some(0),
        ..scenario::settings(2_000, b.max_receive_count)
    })
}

/// The provider's later retry is answered 200, stores the body, and the event
/// completes: the order exists and its stock was taken once.
async fn retry_completes(b: &Backend, ingestor: &Ingestor, event: &Event) {
    assert_eq!(deliver(ingestor, event).await, 200, "the provider's retry");
    let item = b.item(event).await;
    assert!(!item.body.is_empty(), "the retry stored the body: {item:?}");
    assert!(
        !item.state.is_terminal(),
        "taken back to be processed: {item:?}"
    );
    let p = b.processor(2_000);
    scenario::drain(b, &p).await;
    let item = b.item(event).await;
    assert_eq!(item.state, InboxState::Completed, "{item:?}");
    assert_eq!(b.on_hand(SKU).await, 98, "stock taken once");
    let order = b.order("8100").await;
    assert_eq!(order.stock_reserved.len(), 1, "{order:?}");
    // A further retry is a plain duplicate and changes nothing.
    assert_eq!(deliver(ingestor, event).await, 200);
    scenario::drain(b, &p).await;
    assert_eq!(b.on_hand(SKU).await, 98, "stock taken once");
}

/// The body's put fails (throttled on every SDK attempt): 503. The processor finds
/// the body missing and, past the retry horizon, dead-letters the event saying so; the
/// provider's retry takes it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_body_put_is_stored_by_the_providers_retry() {
    let (proxy, b, ingestor) = setup().await;
    let event = order();
    proxy
        .faults
        .add_rule(PUT_ITEM, BODY_PUT, Fault::Throttle, u32::MAX);
    assert_eq!(deliver(&ingestor, &event).await, 503);
    proxy.faults.clear_rules();
    stored_without_body(&b, &event).await;

    sweep(&b).await;
    let dead = process_until(&b, &past_horizon(&b), &event, InboxState::DeadLetter).await;
    let reason = dead.last_error.clone().unwrap_or_default();
    assert!(reason.starts_with(BODY_MISSING), "{reason}");

    retry_completes(&b, &ingestor, &event).await;
}

/// The receiver is killed between the two puts (the body's put never reaches the
/// table, no answer goes out). Its pointer later reaches the DLQ: the sweeper marks the
/// item `dead_letter` saying the body is missing; the provider's retry takes it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_killed_between_the_puts_loses_nothing() {
    let (proxy, b, ingestor) = setup().await;
    let event = order();
    proxy
        .faults
        .add_rule(PUT_ITEM, BODY_PUT, Fault::Hang, u32::MAX);
    let killed = tokio::time::timeout(Duration::from_secs(3), deliver(&ingestor, &event)).await;
    assert!(killed.is_err(), "the receiver died before it answered");
    proxy.faults.clear_rules();
    stored_without_body(&b, &event).await;

    let pointer = QueueMessage {
        pk: event.inbox_key(),
    };
    b.queue
        .send_dead_letter(&pointer)
        .await
        .expect("pointer in the DLQ");
    sweep(&b).await;
    let dead = b.item(&event).await;
    assert_eq!(dead.state, InboxState::DeadLetter, "{dead:?}");
    let reason = dead.last_error.clone().unwrap_or_default();
    assert!(reason.starts_with(BODY_MISSING), "{reason}");

    retry_completes(&b, &ingestor, &event).await;
}

/// Every SDK attempt of the event's put loses its answer (the first stored the item):
/// 503, and no body was ever put. The processor keeps the event `retryable` with the
/// reason; the provider's retry stores the body and sends the pointer again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answers_of_the_event_put_lose_no_body() {
    let (proxy, b, ingestor) = setup().await;
    let event = order();
    let key = event.inbox_key();
    let own_put = format!(r#""S":"{}""#, key.as_str());
    proxy
        .faults
        .add_rule(PUT_ITEM, &own_put, Fault::LostAnswer, u32::MAX);
    assert_eq!(deliver(&ingestor, &event).await, 503);
    proxy.faults.clear_rules();
    stored_without_body(&b, &event).await;

    sweep(&b).await;
    let waiting = process_until(&b, &b.processor(2_000), &event, InboxState::Retryable).await;
    let reason = waiting.last_error.clone().unwrap_or_default();
    assert!(reason.starts_with(BODY_MISSING), "{reason}");

    retry_completes(&b, &ingestor, &event).await;
}
