//! Nothing parked is forgotten, and no stale writer undoes a newer state (issue 21
//! item 7), on both backends, at the ports the processor and the sweeper use:
//! - the sweeper's waiting fallback pages through every parked item over its passes
//!   (`waiting_read_max`, `EINMAL_SWEEP_WAITING_READ_MAX`), however many there are;
//! - a stale run's finish never overwrites a park (the item would be in neither of the
//!   sweeper's indexes);
//! - the sweeper's DLQ marking applies only to the item as it read it, and never
//!   dead-letters an item another run is committing.

use einmal::ports::Handout;
use std::collections::BTreeSet;
use std::time::Duration;

use einmal::envelope::InboxKey;
use einmal::pipeline::sweep::{SweepSettings, Sweeper, DLQ_REASON};
use einmal::ports::{
    ClaimOutcome, Delivery, Finish, InboxItem, InboxState, ItemVersion, QueueMessage, WaitChange,
    Waiting,
};
use einmal_tests::on_both_backends;
use einmal_tests::scenario::{pi_succeeded, Backend, Event, Kind};

const HOUR_MS: i64 = 3_600_000;

fn event(n: usize) -> Event {
    pi_succeeded(
        &format!("77{n}"),
        &format!("pi_fence_{n}"),
        100,
        1_700_000_000,
    )
}

/// Every visible message, each hidden for a minute.
async fn messages(b: &Backend) -> Vec<Delivery> {
    b.receive_all(Duration::from_secs(60)).await
}

/// The message of `key` among the visible ones (a pointer is sent when none is).
async fn message_of(b: &Backend, key: &InboxKey) -> Delivery {
    let mut found = messages(b).await.into_iter().find(|d| d.message.pk == *key);
    if found.is_none() {
        let pointer = QueueMessage { pk: key.clone() };
        b.queue.send(&pointer).await.expect("send pointer");
        found = messages(b).await.into_iter().find(|d| d.message.pk == *key);
    }
    found.expect("a message of the item")
}

/// A run of `delivery` as the processor starts it (`begin`: a lease of `lease_ms` on
/// the embedded store, none on AWS).
async fn begin(
    b: &Backend,
    delivery: &Delivery,
    worker: &str,
    now: i64,
    lease_ms: i64,
) -> InboxItem {
    match b
        .processing
        .begin(delivery, worker, now, lease_ms)
        .await
        .expect("begin")
    {
        ClaimOutcome::Claimed(item) => *item,
        other => panic!("not handed out: {other:?}"),
    }
}

/// The run's finish as the processor writes it: under its lease, or unleased with the
/// item as the run read it.
async fn finish(b: &Backend, run: &InboxItem, worker: &str, f: &Finish) -> bool {
    b.processing
        .finish(&run.key, &Handout::of(run, worker), f)
        .await
        .expect("finish")
}

fn ending(state: InboxState, now_ms: i64) -> Finish {
    Finish {
        state,
        error_class: None,
        error: None,
        result: Some(format!("{state} by the test")),
        now_ms,
        wait: WaitChange::Keep,
        deliveries: None,
        relay_due_ms: None,
    }
}

fn park(on: &str, now_ms: i64) -> Finish {
    Finish {
        wait: WaitChange::Park(Waiting {
            on: on.to_owned(),
            since_ms: now_ms,
        }),
        error_class: Some("transient".into()),
        error: Some("waiting: the order first".into()),
        ..ending(InboxState::Waiting, now_ms)
    }
}

/// Whether one of the sweeper's indexes holds `key` (stuck or parked), so a lost
/// message can never leave it behind.
async fn swept(b: &Backend, key: &InboxKey) -> bool {
    let stuck = b.sweep.stuck(i64::MAX, 100).await.expect("stuck");
    let parked = b
        .sweep
        .waiting(i64::MAX, 100, 1_000)
        .await
        .expect("waiting");
    stuck.iter().any(|i| i.key == *key) || parked.due.contains(key)
}

/// Two runs of one event: the later-started one parks it, then the stale one
/// finishes `retryable` from what it read before the park. The park stands, and the
/// item stays in the waiters' index.
async fn a_stale_run_never_overwrites_a_park(kind: Kind) {
    let b = kind.backend(5).await;
    let ingestor = b.ingestor();
    let e = event(1);
    b.send(&ingestor, &e).await;
    let key = e.inbox_key();
    let now = einmal::time::now_millis();
    let first = message_of(&b, &key).await;
    // A short lease: the second run may claim on the embedded store.
    let stale = begin(&b, &first, "w1", now, 1).await;
    b.queue
        .send(&QueueMessage { pk: key.clone() })
        .await
        .expect("a second message");
    let second = message_of(&b, &key).await;
    let fresh = begin(&b, &second, "w2", now + 10, 60_000).await;
    assert!(finish(&b, &fresh, "w2", &park("t1#order#7701", now + 20)).await);

    let retry = Finish {
        error_class: Some("transient".into()),
        error: Some("throttled".into()),
        ..ending(InboxState::Retryable, now + 30)
    };
    assert!(
        !finish(&b, &stale, "w1", &retry).await,
        "{}: the stale run's finish must not apply",
        b.name
    );
    let item = b.item(&e).await;
    assert_eq!(item.state, InboxState::Waiting, "{}: {item:?}", b.name);
    assert!(swept(&b, &key).await, "{}: in no sweeper index", b.name);
}

/// The sweeper reads a parked item, then another run moves it on (`retryable`): the
/// DLQ marking of what it read no longer applies.
async fn the_dlq_marking_applies_only_to_the_item_as_read(kind: Kind) {
    let b = kind.backend(5).await;
    let ingestor = b.ingestor();
    let e = event(2);
    b.send(&ingestor, &e).await;
    let key = e.inbox_key();
    let now = einmal::time::now_millis();
    let run = begin(&b, &message_of(&b, &key).await, "w1", now, 60_000).await;
    assert!(finish(&b, &run, "w1", &park("t1#order#7702", now + 10)).await);
    let read = ItemVersion::of(&b.item(&e).await);

    let woken = begin(&b, &message_of(&b, &key).await, "w2", now + 20, 60_000).await;
    assert!(finish(&b, &woken, "w2", &ending(InboxState::Retryable, now + 30)).await);
    let marked = b
        .processing
        .mark_dead_letter(&key, DLQ_REASON, read, now + 40)
        .await
        .expect("mark");
    assert!(!marked, "{}: marked a version that is gone", b.name);
    assert_eq!(b.item(&e).await.state, InboxState::Retryable, "{}", b.name);
}

/// One message of an event reached the DLQ while another message's run is committing
/// the event: the sweeper's marking does not end it; the run's finish records the
/// outcome (embedded: its live lease keeps the marking off; AWS: the run finishes
/// over the marking of the version it began from).
async fn the_dlq_marking_never_ends_a_run_in_flight(kind: Kind) {
    let b = kind.backend(5).await;
    let ingestor = b.ingestor();
    let e = event(3);
    b.send(&ingestor, &e).await;
    let key = e.inbox_key();
    let now = einmal::time::now_millis();
    let run = begin(&b, &message_of(&b, &key).await, "w1", now, 60_000).await;

    b.queue
        .send_dead_letter(&QueueMessage { pk: key.clone() })
        .await
        .expect("a pointer in the DLQ");
    Sweeper::new(
        b.inbox.clone(),
        b.sweep.clone(),
        b.processing.clone(),
        b.queue.clone(),
    )
    .sweep_once(now + 1_000)
    .await;

    assert!(
        finish(&b, &run, "w1", &ending(InboxState::Completed, now + 2_000)).await,
        "{}: the committing run's finish applies",
        b.name
    );
    let item = b.item(&e).await;
    assert_eq!(item.state, InboxState::Completed, "{}: {item:?}", b.name);
}

/// Seven parked items, a pass bound of three index entries (or of three re-sends):
/// within three passes every one is re-sent (and re-parked by its re-run, as the
/// processor would).
async fn the_waiting_fallback_pages_through_every_parked_item(kind: Kind) {
    let read_bound = SweepSettings {
        waiting_recheck_ms: 0,
        waiting_read_max: 3,
        ..Default::default()
    };
    let send_bound = SweepSettings {
        waiting_recheck_ms: 0,
        batch: 3,
        ..Default::default()
    };
    for settings in [read_bound, send_bound] {
        pages_through_every_parked_item(kind, settings).await;
    }
}

async fn pages_through_every_parked_item(kind: Kind, settings: SweepSettings) {
    let b = kind.backend(5).await;
    let ingestor = b.ingestor();
    let now = einmal::time::now_millis();
    let mut parked = BTreeSet::new();
    for n in 0..7 {
        let e = event(10 + n);
        b.send(&ingestor, &e).await;
        let key = e.inbox_key();
        let run = begin(&b, &message_of(&b, &key).await, "w", now, 60_000).await;
        let since = now - HOUR_MS + n as i64;
        assert!(finish(&b, &run, "w", &park(&format!("t1#order#78{n}"), since)).await);
        parked.insert(key);
    }
    assert!(
        messages(&b).await.is_empty(),
        "parked items have no message"
    );

    let sweeper = Sweeper::new(
        b.inbox.clone(),
        b.sweep.clone(),
        b.processing.clone(),
        b.queue.clone(),
    )
    .with_settings(settings.clone());
    let mut resent = BTreeSet::new();
    for pass in 1..=3 {
        let at = now + pass * 1_000;
        let report = sweeper.sweep_once(at).await;
        assert!(report.waiters_rechecked <= 3, "{}: {report:?}", b.name);
        for delivery in messages(&b).await {
            resent.insert(delivery.message.pk.clone());
            // The re-run finds the prerequisite still missing and parks it anew.
            let run = begin(&b, &delivery, "w", at + 1, 60_000).await;
            let on = run.waiting.clone().expect("still parked").on;
            assert!(finish(&b, &run, "w", &park(&on, at + 2)).await);
            b.queue.ack(&delivery.receipt).await.expect("ack");
        }
    }
    assert_eq!(
        resent, parked,
        "{}: every parked item re-sent ({settings:?})",
        b.name
    );
}

on_both_backends!(
    a_stale_run_never_overwrites_a_park,
    the_dlq_marking_applies_only_to_the_item_as_read,
    the_dlq_marking_never_ends_a_run_in_flight,
    the_waiting_fallback_pages_through_every_parked_item,
);
