//! The operator's event search (`Inbox::search`, `Inbox::count_states`) on both
//! backends: the embedded store on its SQLite file and the AWS adapter on moto. Events
//! go in through the real receiver path (signed requests, the `Ingestor`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use einmal::pipeline::ingest::Ingestor;
use einmal::ports::{Inbox, InboxFilter, InboxPage, InboxQuery, InboxState, Queue, SearchError};
use einmal::time::now_millis;
use einmal_tests::fixtures::{config, signed};

pub struct Backend {
    inbox: Arc<dyn Inbox>,
    queue: Arc<dyn Queue>,
    _keep: Box<dyn std::any::Any + Send>,
}

async fn embedded() -> Backend {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(
        einmal::adapters::embedded::EmbeddedStore::open(dir.path(), Default::default())
            .expect("embedded store opens"),
    );
    Backend {
        inbox: store.clone(),
        queue: store,
        _keep: Box::new(dir),
    }
}

async fn aws() -> Backend {
    let (store, _names) = einmal_tests::moto::aws_store(einmal_tests::moto::shared(), None).await;
    let store = Arc::new(store);
    Backend {
        inbox: store.clone(),
        queue: store,
        _keep: Box::new(()),
    }
}

const TYPES: [&str; 2] = ["payment_intent.succeeded", "charge.refunded"];

/// Event `i` of `tenant`: type `TYPES[i % 2]`, object `pi_{i % 3}`.
async fn ingest(b: &Backend, tenant: &str, i: usize) {
    let body = serde_json::json!({
        "id": format!("evt_{tenant}_{i}"), "object": "event", "type": TYPES[i % 2],
        "created": 1764400000,
        "data": {"object": {"id": format!("pi_{}", i % 3), "object": "payment_intent",
                 "amount": 100 + i, "metadata": {"order_id": format!("order-{i}")}}}
    })
    .to_string()
    .into_bytes();
    let cfg = config();
    let ingestor = Ingestor::new(cfg.clone(), b.inbox.clone(), b.queue.clone());
    let resp = ingestor
        .ingest("stripe", tenant, &signed(&cfg, "stripe", tenant, "", &body))
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
}

fn query(f: impl FnOnce(&mut InboxQuery)) -> InboxQuery {
    let mut q = InboxQuery::default();
    f(&mut q);
    q
}

/// Every page of `q` (the cursor followed to its end), each page's keys collected.
async fn all_pages(inbox: &dyn Inbox, mut q: InboxQuery) -> (Vec<String>, usize) {
    let mut keys = Vec::new();
    let mut pages = 0;
    loop {
        let InboxPage { items, next_cursor } = inbox.search(&q).await.expect("search");
        pages += 1;
        // 0 asks for the stores' default page of 100.
        let limit = if q.filter.limit == 0 {
            100
        } else {
            q.filter.limit
        };
        assert!(items.len() <= limit, "a page holds at most its limit");
        keys.extend(items.into_iter().map(|i| i.key.as_str().to_owned()));
        match next_cursor {
            Some(c) => q.cursor = Some(c),
            None => return (keys, pages),
        }
        assert!(pages < 100, "the cursor must come to an end");
    }
}

async fn keys_of(inbox: &dyn Inbox, q: InboxQuery) -> HashSet<String> {
    let (keys, _) = all_pages(inbox, q).await;
    let set: HashSet<String> = keys.iter().cloned().collect();
    assert_eq!(set.len(), keys.len(), "no item twice across pages");
    set
}

fn expected(
    tenant: &str,
    range: impl Iterator<Item = usize>,
    keep: impl Fn(usize) -> bool,
) -> HashSet<String> {
    range
        .filter(|i| keep(*i))
        .map(|i| format!("stripe#{tenant}#evt_{tenant}_{i}"))
        .collect()
}

async fn filters_and_the_cursor_find_exactly_the_matching_events(b: Backend) {
    // Two waves with a time boundary between them, and a second tenant.
    for i in 0..6 {
        ingest(&b, "t1", i).await;
    }
    let end_of_first = now_millis();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let start_of_second = now_millis();
    for i in 6..12 {
        ingest(&b, "t1", i).await;
    }
    for i in 0..3 {
        ingest(&b, "t2", i).await;
    }
    let inbox = &*b.inbox;
    let t1 = |q: &mut InboxQuery| {
        q.filter.tenant = Some("t1".into());
        q.filter.limit = 5;
    };

    // Paging through everything of t1, 5 at a time: every event once, in 3+ pages.
    let (keys, pages) = all_pages(inbox, query(t1)).await;
    assert_eq!(
        keys.iter().cloned().collect::<HashSet<_>>(),
        expected("t1", 0..12, |_| true)
    );
    assert_eq!(keys.len(), 12);
    assert!(
        pages >= 3,
        "12 events at 5 a page take at least 3 pages, took {pages}"
    );

    let by_type = keys_of(
        inbox,
        query(|q| {
            t1(q);
            q.event_type = Some("charge.refunded".into());
        }),
    )
    .await;
    assert_eq!(by_type, expected("t1", 0..12, |i| i % 2 == 1));

    let by_object = keys_of(
        inbox,
        query(|q| {
            t1(q);
            q.object_id = Some("pi_1".into());
        }),
    )
    .await;
    assert_eq!(by_object, expected("t1", 0..12, |i| i % 3 == 1));

    let type_and_object = keys_of(
        inbox,
        query(|q| {
            t1(q);
            q.event_type = Some("payment_intent.succeeded".into());
            q.object_id = Some("pi_0".into());
        }),
    )
    .await;
    assert_eq!(type_and_object, expected("t1", 0..12, |i| i % 6 == 0));

    let second_wave = keys_of(
        inbox,
        query(|q| {
            t1(q);
            q.since_ms = Some(start_of_second);
        }),
    )
    .await;
    assert_eq!(second_wave, expected("t1", 6..12, |_| true));
    let first_wave = keys_of(
        inbox,
        query(|q| {
            t1(q);
            q.until_ms = Some(end_of_first + 1);
        }),
    )
    .await;
    assert_eq!(first_wave, expected("t1", 0..6, |_| true));

    let other_tenant = keys_of(inbox, query(|q| q.filter.tenant = Some("t2".into()))).await;
    assert_eq!(other_tenant, expected("t2", 0..3, |_| true));
    let nobody = keys_of(inbox, query(|q| q.object_id = Some("pi_none".into()))).await;
    assert!(nobody.is_empty());
    let none_dead = keys_of(
        inbox,
        query(|q| q.filter.state = Some(InboxState::DeadLetter)),
    )
    .await;
    assert!(none_dead.is_empty());

    // A cursor the store did not hand out is the caller's error, not a store failure.
    for bad in ["not a cursor", "eyJ2Ijo5fQ"] {
        let err = inbox
            .search(&query(|q| q.cursor = Some(bad.into())))
            .await
            .expect_err("a made-up cursor is refused");
        assert!(matches!(err, SearchError::InvalidCursor(_)), "{bad}: {err}");
    }
}

async fn counts_by_state_cover_every_state_and_the_scope(b: Backend) {
    for i in 0..4 {
        ingest(&b, "t1", i).await;
    }
    ingest(&b, "t2", 0).await;
    let counts = |provider: Option<&str>, tenant: Option<&str>| {
        let filter = InboxFilter {
            provider: provider.map(Into::into),
            tenant: tenant.map(Into::into),
            ..Default::default()
        };
        let inbox = b.inbox.clone();
        async move { inbox.count_states(&filter).await.expect("counts") }
    };
    let all = counts(None, None).await;
    assert!(!all.truncated);
    assert_eq!(
        all.counts.len(),
        InboxState::ALL.len(),
        "every state, zeros included"
    );
    let total = |c: &einmal::ports::StateCounts| c.counts.iter().map(|(_, n)| n).sum::<u64>();
    assert_eq!(total(&all), 5);
    // Freshly received events are received or queued, nothing else yet.
    for (state, n) in &all.counts {
        if !matches!(state, InboxState::Received | InboxState::Queued) {
            assert_eq!(*n, 0, "{state}");
        }
    }
    assert_eq!(total(&counts(Some("stripe"), Some("t1")).await), 4);
    assert_eq!(total(&counts(None, Some("t2")).await), 1);
    assert_eq!(total(&counts(Some("shopify"), None).await), 0);
}

macro_rules! both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::embedded().await).await
                }
            )*
        }
        mod aws_moto {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::aws().await).await
                }
            )*
        }
    };
}

both_backends!(
    filters_and_the_cursor_find_exactly_the_matching_events,
    counts_by_state_cover_every_state_and_the_scope,
);
