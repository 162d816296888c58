//! PayPal's certificate budget (issue 23, item 3) through the real ingest pipeline:
//! genuine deliveries are accepted while unauthenticated requests with random
//! `CERT-…` names spend the fetch budget, and after a restart (a new verifier, as a
//! new process or Lambda instance has) with PayPal's certificate host down, because
//! the certificate that verified a delivery was kept in the store; on the embedded
//! store and on moto. A delivery the budget could not check is answered 503 with
//! `Retry-After`, nothing stored, and accepted on PayPal's retry.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use einmal::adapters::aws::AwsStore;
use einmal::adapters::embedded::EmbeddedStore;
use einmal::pipeline::ingest::Ingestor;
use einmal::ports::{CertificateCache, Inbox, Queue};
use einmal::providers::paypal::{PayPalOn, PayPalVerifier};
use einmal_tests::fixtures::all_items;
use einmal_tests::paypal::{config, delivery, forged, verifier, CertHost, CERT_URL, TENANT};
use einmal_tests::scenario::Kind;

einmal_tests::on_both_backends!(
    genuine_deliveries_pass_a_flood_of_random_names_and_a_restart_with_the_host_down,
    the_certificate_cache_port,
);

/// One process's view of a backend's store: inbox, queue and certificate cache.
struct Stores {
    inbox: Arc<dyn Inbox>,
    queue: Arc<dyn Queue>,
    certs: Arc<dyn CertificateCache>,
}

/// Where a backend's data lives between "processes".
enum Place {
    Embedded(tempfile::TempDir),
    Aws(einmal::adapters::aws::AwsNames),
}

impl Place {
    async fn new(kind: Kind) -> Place {
        match kind {
            Kind::Embedded => Place::Embedded(tempfile::tempdir().unwrap()),
            Kind::Aws => {
                let (_, names) =
                    einmal_tests::moto::aws_store(einmal_tests::moto::shared(), None).await;
                Place::Aws(names)
            }
        }
    }

    /// The store as a new process opens it.
    async fn open(&self) -> Stores {
        match self {
            Place::Embedded(dir) => {
                let store = Arc::new(EmbeddedStore::open(dir.path(), Default::default()).unwrap());
                Stores {
                    inbox: store.clone(),
                    queue: store.clone(),
                    certs: store,
                }
            }
            Place::Aws(names) => {
                let sdk = einmal_tests::moto::shared().sdk_config().await;
                let store = Arc::new(AwsStore::from_sdk_config(&sdk, names.clone()));
                Stores {
                    inbox: store.clone(),
                    queue: store.clone(),
                    certs: store,
                }
            }
        }
    }
}

/// A process: its store, its own verifier (persisting to the store) and the ingestor.
fn process(stores: &Stores, host: &Arc<CertHost>) -> (Ingestor, Arc<PayPalVerifier>) {
    let verifier = Arc::new(verifier(host).with_certificate_cache(stores.certs.clone()));
    let ingestor = Ingestor::new(config(), stores.inbox.clone(), stores.queue.clone())
        .with_provider(Arc::new(PayPalOn::new(verifier.clone())));
    (ingestor, verifier)
}

async fn flood(ingestor: &Ingestor, from: usize, now: i64) {
    for i in from..from + 12 {
        let answer = ingestor.ingest("paypal", TENANT, &forged(i, now)).await;
        assert!(
            [401, 503].contains(&answer.status),
            "a forged request is refused: {answer:?}"
        );
    }
}

async fn genuine_deliveries_pass_a_flood_of_random_names_and_a_restart_with_the_host_down(
    kind: Kind,
) {
    let place = Place::new(kind).await;
    let config = config();
    let host = CertHost::new();
    let now = einmal::time::now_secs();

    // First process: the first genuine delivery fetches the certificate and keeps it.
    let stores = place.open().await;
    {
        let (ingestor, _) = process(&stores, &host);
        let answer = ingestor
            .ingest("paypal", TENANT, &delivery(&config, "WH-FIRST", now))
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
        // 12 random names a minute, then genuine deliveries: all accepted.
        flood(&ingestor, 0, now).await;
        for n in 0..6 {
            let answer = ingestor
                .ingest(
                    "paypal",
                    TENANT,
                    &delivery(&config, &format!("WH-A{n}"), now),
                )
                .await;
            assert_eq!(answer.status, 200, "{answer:?}");
        }
    }
    assert_eq!(host.genuine_fetches(), 1);
    drop(stores);

    // A restart (a new process or Lambda instance: nothing in memory) with PayPal's
    // certificate host down, the flood first: the kept certificate verifies.
    host.set_down(true);
    let stores = place.open().await;
    {
        let (ingestor, _) = process(&stores, &host);
        flood(&ingestor, 100, now).await;
        for n in 0..6 {
            let answer = ingestor
                .ingest(
                    "paypal",
                    TENANT,
                    &delivery(&config, &format!("WH-B{n}"), now),
                )
                .await;
            assert_eq!(answer.status, 200, "{answer:?}");
        }
    }
    drop(stores);

    // Another restart, the host up: the flood spends what it can, the genuine
    // deliveries need no fetch at all.
    host.set_down(false);
    let stores = place.open().await;
    let (ingestor, _) = process(&stores, &host);
    flood(&ingestor, 200, now).await;
    for n in 0..6 {
        let answer = ingestor
            .ingest(
                "paypal",
                TENANT,
                &delivery(&config, &format!("WH-C{n}"), now),
            )
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    assert_eq!(
        host.genuine_fetches(),
        1,
        "fetched once, by the first process"
    );
    assert!(host.other_fetches() > 0, "the flood did reach the host");
    let stored = all_items(&*stores.inbox).await;
    assert_eq!(stored.len(), 19, "the genuine events and nothing else");
    assert!(stored
        .iter()
        .all(|i| !i.envelope.event_id.starts_with("WH-FORGED")));
}

async fn the_certificate_cache_port(kind: Kind) {
    let place = Place::new(kind).await;
    let now = einmal::time::now_secs();
    let other = "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-00000002";
    {
        let stores = place.open().await;
        let certs = &stores.certs;
        assert_eq!(certs.get_certificate(CERT_URL, now).await.unwrap(), None);
        certs
            .put_certificate(CERT_URL, b"first chain", now + 3600)
            .await
            .unwrap();
        // Replaced by a later put of the same URL.
        certs
            .put_certificate(CERT_URL, b"second chain", now + 7200)
            .await
            .unwrap();
        certs
            .put_certificate(other, b"expired", now - 1)
            .await
            .unwrap();
    }
    // Another process reads what the first kept; expired is absent, whatever the
    // store's own clean-up did yet.
    let stores = place.open().await;
    let certs = &stores.certs;
    assert_eq!(
        certs
            .get_certificate(CERT_URL, now)
            .await
            .unwrap()
            .as_deref(),
        Some(&b"second chain"[..])
    );
    assert_eq!(
        certs.get_certificate(CERT_URL, now + 7200).await.unwrap(),
        None
    );
    assert_eq!(certs.get_certificate(other, now).await.unwrap(), None);
    // No listing shows a certificate as an event.
    assert!(all_items(&*stores.inbox).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_the_budget_could_not_check_gets_503_and_passes_on_the_retry() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(dir.path(), Default::default()).unwrap());
    let config = config();
    let host = CertHost::new();
    let start = einmal::time::now_secs();
    let clock = Arc::new(AtomicI64::new(start * 1000));
    let now_ms = clock.clone();
    // A fresh instance whose store has never seen a PayPal certificate.
    let verifier = Arc::new(verifier(&host).with_certificate_cache(store.clone()));
    let ingestor = Ingestor::new(config.clone(), store.clone(), store.clone())
        .with_provider(Arc::new(PayPalOn::new(verifier)))
        .with_clock(move || now_ms.load(Ordering::SeqCst));

    // The flood comes first and spends the fetch budget.
    flood(&ingestor, 0, start).await;
    let answer = ingestor
        .ingest("paypal", TENANT, &delivery(&config, "WH-1", start))
        .await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.body["error"], "verification_unavailable");
    let retry_after = answer.retry_after_secs.expect("Retry-After");
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert!(all_items(&*store).await.is_empty(), "nothing stored");
    assert_eq!(host.genuine_fetches(), 0);

    // PayPal retries (a new transmission) once the budget is there again.
    let later = start + i64::try_from(retry_after).unwrap();
    clock.store(later * 1000, Ordering::SeqCst);
    let answer = ingestor
        .ingest("paypal", TENANT, &delivery(&config, "WH-1", later))
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let stored = all_items(&*store).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].envelope.event_id, "WH-1");
    // A forged request naming the genuine certificate, now fetched, is 401.
    let mut forged_sig = delivery(&config, "WH-2", later);
    forged_sig.headers.insert(
        "paypal-transmission-sig",
        http::HeaderValue::from_static("c2lnbmF0dXJl"),
    );
    let answer = ingestor.ingest("paypal", TENANT, &forged_sig).await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(all_items(&*store).await.len(), 1);
}
