//! Thin hints are rate limited per tenant (issue 10, item 3), on both stores: a holder
//! of the path token sends 2,000 distinct hints in one burst; at most the tenant's
//! `max_hints_per_minute` are stored and enqueued, every other one is answered 429
//! with `Retry-After` and a JSON body and stores nothing. The clock is pinned, so the
//! figures do not depend on how fast the burst runs.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use einmal::config::Config;
use einmal::pipeline::ingest::Ingestor;
use einmal_tests::fixtures::{all_items, drain, gopay_hint};
use einmal_tests::scenario::{self, Backend};

const TOKEN: &str = "tok-gopay-burst";
const T0_MS: i64 = 1_764_400_000_000;

fn config(limit: Option<u32>) -> Arc<Config> {
    let limit = limit
        .map(|n| format!(", max_hints_per_minute = \"{n}\""))
        .unwrap_or_default();
    let toml = format!(
        r#"
[[tenant]]
provider = "gopay"
tenant = "shop"
options = {{ path_token = "{TOKEN}", access_token = "unused"{limit} }}

[[tenant]]
provider = "gopay"
tenant = "other"
options = {{ path_token = "{TOKEN}", access_token = "unused" }}
"#
    );
    Arc::new(Config::from_toml(&toml).expect("config parses"))
}

async fn burst_of_distinct_hints_stores_at_most_the_limit(b: Backend) {
    let clock = Arc::new(AtomicI64::new(T0_MS));
    let now = clock.clone();
    let ingest = Ingestor::new(config(None), b.inbox.clone(), b.queue.clone())
        .with_clock(move || now.load(Ordering::SeqCst));
    let limit = 600; // the default

    let mut accepted = 0;
    let mut limited = 0;
    for id in 0..2_000u64 {
        let r = ingest
            .ingest("gopay", "shop", &gopay_hint(3_000_000_000 + id, TOKEN))
            .await;
        match r.status {
            200 => accepted += 1,
            429 => {
                limited += 1;
                assert_eq!(r.body["error"], "rate_limited", "{}", r.body);
                assert!(r.body["message"].is_string());
                assert_eq!(r.retry_after_secs, Some(1), "600 a minute: one a 100 ms");
            }
            other => panic!("hint {id}: {other} {}", r.body),
        }
    }
    assert_eq!((accepted, limited), (limit, 2_000 - limit));
    let stored = all_items(&*b.inbox).await;
    assert_eq!(stored.len(), limit, "nothing stored beyond the limit");
    assert_eq!(
        drain(&*b.queue).await.len(),
        limit,
        "one message per stored hint"
    );
    assert_eq!(ingest.metrics().snapshot().rate_limited, 1_400);

    // A retry of a stored hint (same minute) is a duplicate, not refused: it stores
    // nothing new and gives its token back.
    clock.fetch_add(100, Ordering::SeqCst);
    let r = ingest
        .ingest("gopay", "shop", &gopay_hint(3_000_000_000, TOKEN))
        .await;
    assert_eq!(
        (r.status, &r.body["duplicate"]),
        (200, &serde_json::json!(true)),
        "{}",
        r.body
    );
    // The duplicate gave back the token the 100 ms refilled, so one new hint fits.
    let r = ingest
        .ingest("gopay", "shop", &gopay_hint(4_000_000_000, TOKEN))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = ingest
        .ingest("gopay", "shop", &gopay_hint(4_000_000_001, TOKEN))
        .await;
    assert_eq!(r.status, 429, "{}", r.body);

    // Another tenant has its own budget.
    let r = ingest
        .ingest("gopay", "other", &gopay_hint(5_000_000_000, TOKEN))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);

    // A minute later the bucket is full again: 600 more fit, not 601.
    clock.fetch_add(60_000, Ordering::SeqCst);
    let mut later = 0;
    for id in 0..(limit as u64 + 1) {
        if ingest
            .ingest("gopay", "shop", &gopay_hint(6_000_000_000 + id, TOKEN))
            .await
            .status
            == 200
        {
            later += 1;
        }
    }
    assert_eq!(later, limit);
    assert_eq!(all_items(&*b.inbox).await.len(), 2 * limit + 2);
}

async fn the_limit_is_configurable_per_tenant(b: Backend) {
    let ingest =
        Ingestor::new(config(Some(5)), b.inbox.clone(), b.queue.clone()).with_clock(|| T0_MS);
    let mut statuses = Vec::new();
    for id in 0..20 {
        statuses.push(
            ingest
                .ingest("gopay", "shop", &gopay_hint(1_000 + id, TOKEN))
                .await
                .status,
        );
    }
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 5);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 15);
    let r = ingest.ingest("gopay", "shop", &gopay_hint(99, TOKEN)).await;
    assert_eq!(r.retry_after_secs, Some(12), "5 a minute: one every 12 s");
    assert_eq!(all_items(&*b.inbox).await.len(), 5);
}

#[test]
fn an_invalid_limit_is_refused_at_load() {
    for bad in ["0", "many", "-5", "1.5"] {
        let toml = format!(
            r#"
[[tenant]]
provider = "gopay"
tenant = "shop"
options = {{ path_token = "{TOKEN}", max_hints_per_minute = "{bad}" }}
"#
        );
        let err = Config::from_toml(&toml).unwrap_err().to_string();
        assert!(err.contains("max_hints_per_minute"), "{bad}: {err}");
    }
}

macro_rules! on_both_stores {
    ($($scenario:ident),* $(,)?) => {
        mod embedded_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::scenario::embedded(4).await).await
                }
            )*
        }
        mod aws_moto {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::scenario::aws(4).await).await
                }
            )*
        }
    };
}

on_both_stores!(
    burst_of_distinct_hints_stores_at_most_the_limit,
    the_limit_is_configurable_per_tenant,
);
