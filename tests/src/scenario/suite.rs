//! The framework's conformance scenarios for any domain: the same day of events
//! delivered in order (the clean pass), twice with duplicate SQS deliveries, to two
//! workers at once, through a crash between the business commit and the inbox finish,
//! and shuffled with copies to concurrent ingesters and processor loops. Each ends with
//! the domain's own invariant check and must reach the clean pass's business state.
//! A domain takes part by implementing [`Subject`]; the reference domain's
//! [`super::Stream`] does, and so does `examples/custom-domain` (`it/custom_domain.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use einmal::domain::state::{StateKey, StateRecord};
use einmal::domain::Domain;
use einmal::envelope::InboxKey;
use einmal::pipeline::process::{AckMode, MessageOutcome, Processor};
use einmal::ports::InboxState;
use serde_json::Value;

use super::{
    data_of, drain, drain_until, settle_all, step, Backend, Event, FinishFails, Handled, Kind, Rng,
    Until,
};

/// A domain under the conformance scenarios, with one day of its events.
#[async_trait]
pub trait Subject: Send + Sync {
    fn domain(&self) -> Arc<dyn Domain>;
    /// The day's events in business order (every prerequisite first), for tenant
    /// [`super::TENANT`] of [`super::config`]'s providers.
    fn events(&self) -> Vec<Event>;
    /// Records that exist before the first event (stock, ...), written out of band.
    async fn seed(&self, _b: &Backend) {}
    /// What must hold after any run, whatever the order, duplicates or crashes (every
    /// inbox item terminal included); returns the business records it checked.
    async fn check(&self, b: &Backend) -> BTreeMap<String, StateRecord>;
    /// The records a monitor re-reads during the shuffled run ([`Self::no_regression`]).
    fn watched(&self) -> Vec<StateKey> {
        Vec::new()
    }
    /// Panics if `after` regressed from `before` (a version going back, a fact lost).
    fn no_regression(
        &self,
        _before: &BTreeMap<String, StateRecord>,
        _after: &BTreeMap<String, StateRecord>,
    ) {
    }
}

/// Receives per message before redrive: high, so waits and conflicts never redrive.
pub const MAX_RECEIVES: u32 = 1_000;
/// A short lease, so a crashed worker's claims expire within the test.
pub const LEASE_MS: i64 = 300;

/// A fresh backend running the subject's domain, seeded.
pub async fn fresh(kind: Kind, subject: &dyn Subject) -> Backend {
    let b = kind
        .backend(MAX_RECEIVES)
        .await
        .with_domain(subject.domain());
    subject.seed(&b).await;
    b
}

/// Step until a message for `key` has been handled (it may be invisible for a while).
pub async fn until_handled(b: &Backend, p: &Processor, key: &InboxKey) -> Vec<Handled> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut all = Vec::new();
    loop {
        let got = step(b, p, "stepper").await;
        let seen = got.iter().any(|h| h.key == *key);
        all.extend(got);
        if seen {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "{}: {key} never came back",
            b.name
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every event once, in order, each processed before the next is sent: nothing waits,
/// nothing conflicts. The business data every other scenario must reach.
pub async fn clean_pass(kind: Kind, subject: &dyn Subject) -> BTreeMap<String, Value> {
    let b = fresh(kind, subject).await;
    let ingest = b.ingestor();
    let p = b.processor(LEASE_MS);
    for e in subject.events() {
        assert!(!b.send(&ingest, &e).await, "{}", e.event_id);
        let handled = until_handled(&b, &p, &e.inbox_key()).await;
        let outcomes: Vec<MessageOutcome> = handled.iter().map(|h| h.outcome).collect();
        assert_eq!(
            outcomes,
            [MessageOutcome::Ack],
            "{}: in order nothing waits",
            e.event_id
        );
    }
    data_of(&subject.check(&b).await)
}

/// The provider sends every event twice; SQS hands every message to two workers one
/// after the other; the provider retries once more after processing.
pub async fn duplicates(kind: Kind, subject: &dyn Subject) -> BTreeMap<String, Value> {
    let b = fresh(kind, subject).await;
    let ingest = b.ingestor();
    let p = b.processor(LEASE_MS);
    let events = subject.events();
    for e in &events {
        assert!(
            !b.send(&ingest, e).await,
            "{}: first delivery is new",
            e.event_id
        );
        assert!(
            b.send(&ingest, e).await,
            "{}: second is a duplicate",
            e.event_id
        );
    }
    let deliveries = b.receive_all(Duration::from_secs(30)).await;
    assert_eq!(deliveries.len(), events.len(), "one message per event");
    for d in &deliveries {
        p.process_message(d, "w1").await;
        let second = p.process_message(d, "w2").await;
        p.settle(d, second, AckMode::Delete).await;
    }
    drain(&b, &p).await;
    for e in &events {
        assert!(
            b.send(&ingest, e).await,
            "{}: a late retry is a duplicate",
            e.event_id
        );
    }
    assert!(
        b.receive_all(Duration::from_secs(30)).await.is_empty(),
        "nothing re-enqueued"
    );
    data_of(&subject.check(&b).await)
}

/// Two processors on the same messages at the same time.
pub async fn concurrent_workers(kind: Kind, subject: &dyn Subject) -> BTreeMap<String, Value> {
    let b = fresh(kind, subject).await;
    let ingest = b.ingestor();
    let events = subject.events();
    for e in &events {
        assert!(!b.send(&ingest, e).await, "{}", e.event_id);
    }
    let deliveries = b.receive_all(Duration::from_secs(30)).await;
    assert_eq!(deliveries.len(), events.len());
    let (p1, p2) = (b.processor(LEASE_MS), b.processor(LEASE_MS));
    let (h1, h2) = tokio::join!(
        settle_all(&p1, &deliveries, "p1"),
        settle_all(&p2, &deliveries, "p2"),
    );
    assert_eq!(h1.len() + h2.len(), 2 * events.len());
    drain(&b, &p1).await;
    data_of(&subject.check(&b).await)
}

/// Every decision commits and the process dies before the inbox finish: a worker
/// whose every `finish` fails takes each message once; a healthy one then takes over
/// after the lease and must find every effect already applied.
pub async fn crash_between_commit_and_finish(
    kind: Kind,
    subject: &dyn Subject,
) -> BTreeMap<String, Value> {
    let b = fresh(kind, subject).await;
    let ingest = b.ingestor();
    let events = subject.events();
    for e in &events {
        assert!(!b.send(&ingest, e).await, "{}", e.event_id);
    }
    let crashing = b.processor_with(
        Arc::new(FinishFails::new(b.processing.clone(), usize::MAX)),
        b.state.clone(),
        LEASE_MS,
    );
    let deliveries = b.receive_all(Duration::from_secs(30)).await;
    assert_eq!(deliveries.len(), events.len());
    for h in settle_all(&crashing, &deliveries, "crashing").await {
        assert!(
            matches!(h.outcome, MessageOutcome::Retry { .. }),
            "{}: a failed finish is retried: {:?}",
            h.key,
            h.outcome
        );
    }
    // On AWS nothing claims (the message carries the item): a crashed run leaves it
    // `received`; the embedded store claimed it.
    let crashed_state = if b.name == "aws" {
        InboxState::Received
    } else {
        InboxState::Processing
    };
    for e in &events {
        assert_eq!(b.item(e).await.state, crashed_state, "{}", e.event_id);
    }
    drain(&b, &b.processor(LEASE_MS)).await;
    data_of(&subject.check(&b).await)
}

/// What a shuffled run observed.
pub struct Replay {
    pub state: BTreeMap<String, StateRecord>,
    pub handled: Vec<Handled>,
    pub deliveries: usize,
    pub samples: usize,
    pub secs: f64,
}

/// Every event `copies` times in a seeded shuffled order: 4 tasks ingest while 3
/// processor loops drain the queue and a monitor watches for state regressions.
pub async fn shuffled(
    kind: Kind,
    subject: &dyn Subject,
    shuffle_seed: u64,
    copies: usize,
) -> Replay {
    let started = Instant::now();
    let events = subject.events();
    let n = events.len();
    let b = Arc::new(fresh(kind, subject).await);
    let mut deliveries: Vec<Event> = (0..copies).flat_map(|_| events.iter().cloned()).collect();
    Rng::new(shuffle_seed).shuffle(&mut deliveries);
    let ingestor = Arc::new(b.ingestor());
    let ingested = Arc::new(AtomicBool::new(false));
    let fresh_count = Arc::new(AtomicUsize::new(0));
    const INGESTERS: usize = 4;
    let mut ingest_tasks = Vec::new();
    for t in 0..INGESTERS {
        let mine: Vec<Event> = deliveries
            .iter()
            .skip(t)
            .step_by(INGESTERS)
            .cloned()
            .collect();
        let (b, ingestor, fresh_count) = (b.clone(), ingestor.clone(), fresh_count.clone());
        ingest_tasks.push(tokio::spawn(async move {
            for e in &mine {
                if !b.send(&ingestor, e).await {
                    fresh_count.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    let mut loops = Vec::new();
    for w in 0..3 {
        let (b, ingested) = (b.clone(), ingested.clone());
        loops.push(tokio::spawn(async move {
            let mut s = super::settings(2_000, MAX_RECEIVES);
            if kind == Kind::Aws {
                // SQS delays are whole seconds anyway: back off 1 s, then 2 s, rather
                // than re-polling a waiting event every second.
                (s.backoff_base_ms, s.backoff_max_ms) = (1_000, 2_000);
            }
            let p = b.processor_with_settings(s);
            let gate = move || ingested.load(Ordering::SeqCst);
            let until = Until {
                items: n,
                gate: &gate,
                timeout: Duration::from_secs(300),
            };
            drain_until(&b, &p, &format!("loop-{w}"), until).await
        }));
    }
    let keys = subject.watched();
    let mut seen = b.load_all(&keys).await;
    let mut samples = 0;
    let mut ingest_done = false;
    let mut handled = Vec::new();
    // The monitor runs here, between the tasks' progress checks (the subject is
    // borrowed, not 'static): it samples until every loop has finished.
    loop {
        tokio::time::sleep(b.idle_poll).await;
        let now = b.load_all(&keys).await;
        subject.no_regression(&seen, &now);
        seen = now;
        samples += 1;
        if !ingest_done && ingest_tasks.iter().all(|t| t.is_finished()) {
            for t in ingest_tasks.drain(..) {
                t.await.expect("ingest task");
            }
            ingested.store(true, Ordering::SeqCst);
            ingest_done = true;
        }
        if ingest_done && loops.iter().all(|l| l.is_finished()) {
            for l in loops.drain(..) {
                handled.extend(l.await.expect("processor loop"));
            }
            break;
        }
    }
    assert_eq!(
        fresh_count.load(Ordering::SeqCst),
        n,
        "each event stored once"
    );
    let state = subject.check(&b).await;
    let items = b.items().await;
    assert_eq!(items.len(), n);
    let open: Vec<String> = items
        .iter()
        .filter(|i| !matches!(i.state, InboxState::Completed | InboxState::Ignored))
        .map(|i| format!("{} {} {:?}", i.key, i.state, i.last_error))
        .collect();
    assert!(open.is_empty(), "only completed or ignored: {open:#?}");
    assert!(b.dead_letters().await.is_empty(), "the DLQ is empty");
    Replay {
        state,
        handled,
        deliveries: deliveries.len(),
        samples,
        secs: started.elapsed().as_secs_f64(),
    }
}

/// Every scenario on `kind`, each against the clean pass's business data (which
/// `expected`, when given, must equal).
pub async fn run_all(
    kind: Kind,
    subject: &dyn Subject,
    expected: Option<&BTreeMap<String, Value>>,
) {
    let clean = clean_pass(kind, subject).await;
    if let Some(expected) = expected {
        assert_eq!(
            &clean, expected,
            "the clean pass gives the expected business state"
        );
    }
    assert_eq!(duplicates(kind, subject).await, clean, "duplicates");
    assert_eq!(
        concurrent_workers(kind, subject).await,
        clean,
        "concurrent workers"
    );
    assert_eq!(
        crash_between_commit_and_finish(kind, subject).await,
        clean,
        "crash between commit and finish"
    );
    let r = shuffled(kind, subject, 7, 2).await;
    assert_eq!(data_of(&r.state), clean, "shuffled twice, concurrent");
}
