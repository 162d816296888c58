//! PayPal certificate fetches cannot stall the receiver (issue 10, item 2).
//!
//! The production verifier (real HTTPS client, DigiCert roots) is installed with one
//! change: every fetch connects to a local "blackhole" that accepts TCP connections
//! and never answers, like an unanswered PayPal host. 50 concurrent PayPal requests
//! with fresh certificate URLs then run through the real ingest pipeline (embedded
//! store, a 2-worker runtime like `einmal serve` on 2 cores) while another provider's
//! requests are served. What is asserted is structural: the other requests complete
//! while the fetches hang, the blackhole sees no more connections than the fetch
//! bounds allow, nothing is stored for PayPal, every PayPal request is answered 503
//! with `Retry-After` (not checked is not forged: PayPal retries; issue 23), and an
//! unreachable host gets no further fetch. Latency figures come from
//! `bench/paypal_stall.sh`, not from here.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use einmal::adapters::embedded::EmbeddedStore;
use einmal::config::Config;
use einmal::pipeline::ingest::Ingestor;
use einmal::ports::{Inbox, Queue};
use einmal::providers::paypal::{
    self, Anchors, FetchLimits, HttpsCertSource, PayPalVerifier, DEFAULT_ROOTS_PEM, FETCH_TIMEOUT,
};
use einmal::request::WebhookRequest;
use einmal_tests::fixtures::{all_items, signed, stripe_body, STRIPE_SECRET};

/// A generous bound for what takes milliseconds; only a stall reaches it.
const GUARD: Duration = Duration::from_secs(5);

/// Accepts connections and holds them open without a byte of answer.
struct Blackhole {
    addr: SocketAddr,
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl Blackhole {
    fn start() -> Blackhole {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let held = Arc::new(Mutex::new(Vec::new()));
        let keep = held.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                keep.lock().unwrap().push(stream);
            }
        });
        Blackhole { addr, held }
    }

    fn connections(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}

fn config() -> Arc<Config> {
    let toml = format!(
        r#"
[[tenant]]
provider = "stripe"
tenant = "t1"
secrets = ["{STRIPE_SECRET}"]

[[tenant]]
provider = "paypal"
tenant = "t1"
secrets = ["-----BEGIN PRIVATE KEY----- unused here -----END PRIVATE KEY-----"]
options = {{ webhook_id = "4JH86294D6297924G" }}
"#
    );
    Arc::new(Config::from_toml(&toml).expect("config parses"))
}

/// A PayPal request that passes every check before the certificate, naming a fresh
/// certificate URL (its signature is garbage: it is never reached).
fn paypal_request(i: usize) -> WebhookRequest {
    let mut h = http::HeaderMap::new();
    let now = einmal::time::now_secs();
    let put = |h: &mut http::HeaderMap, k: &'static str, v: String| {
        h.insert(k, http::HeaderValue::from_str(&v).unwrap());
    };
    put(&mut h, "paypal-transmission-id", format!("tx-{i}"));
    put(
        &mut h,
        "paypal-transmission-time",
        einmal::time::format_rfc3339(now),
    );
    put(&mut h, "paypal-transmission-sig", "c2lnbmF0dXJl".into());
    put(
        &mut h,
        "paypal-cert-url",
        format!("https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-{i:08x}"),
    );
    put(&mut h, "paypal-auth-algo", "SHA256withRSA".into());
    WebhookRequest::post(
        h,
        format!(r#"{{"id":"WH-{i}","event_type":"PAYMENT.CAPTURE.COMPLETED"}}"#),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_fresh_certificate_urls_against_a_silent_host_stall_nothing() {
    let blackhole = Blackhole::start();
    let anchors = Anchors::from_pem(DEFAULT_ROOTS_PEM.as_bytes()).unwrap();
    let source = HttpsCertSource::connecting_to(blackhole.addr);
    assert!(
        paypal::install(PayPalVerifier::new(Arc::new(source), anchors)).is_ok(),
        "the verifier is installed before any use"
    );
    let limits = FetchLimits::default();

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(dir.path(), Default::default()).unwrap());
    let inbox: Arc<dyn Inbox> = store.clone();
    let queue: Arc<dyn Queue> = store;
    let config = config();
    let ingest = Arc::new(Ingestor::new(config.clone(), inbox.clone(), queue));

    let hanging: Vec<_> = (0..50)
        .map(|i| {
            let ingest = ingest.clone();
            tokio::spawn(async move { ingest.ingest("paypal", "t1", &paypal_request(i)).await })
        })
        .collect();
    // The fetches are out and hanging before the other provider is asked.
    tokio::time::timeout(GUARD, async {
        while blackhole.connections() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a certificate fetch reached the blackhole");

    for n in 0..10 {
        let id = format!("evt_during_{n}");
        let request = signed(&config, "stripe", "t1", &id, &stripe_body(&id, 0));
        let answer = tokio::time::timeout(GUARD, ingest.ingest("stripe", "t1", &request))
            .await
            .expect("a Stripe request completes while the certificate fetches hang");
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    assert!(
        hanging.iter().any(|t| !t.is_finished()),
        "the certificate fetches were still hanging meanwhile"
    );

    for task in hanging {
        let answer = tokio::time::timeout(FETCH_TIMEOUT + GUARD, task)
            .await
            .expect("a PayPal request ends within the fetch timeout")
            .unwrap();
        assert_eq!(answer.status, 503, "{}", answer.body);
        assert!(answer.retry_after_secs.is_some(), "{answer:?}");
    }
    let fetched = blackhole.connections();
    assert!(
        (1..=limits.max_concurrent.min(limits.burst as usize)).contains(&fetched),
        "{fetched} outbound fetches for 50 requests (bound {limits:?})"
    );

    // The host is marked unreachable: a fresh URL now costs no connection at all.
    let answer = tokio::time::timeout(GUARD, ingest.ingest("paypal", "t1", &paypal_request(99)))
        .await
        .expect("answered without a fetch");
    assert_eq!(answer.status, 503);
    assert!(answer.retry_after_secs.is_some(), "{answer:?}");
    assert_eq!(blackhole.connections(), fetched);

    let stored = all_items(&*inbox).await;
    assert_eq!(stored.len(), 10, "only the Stripe events are stored");
    assert!(stored.iter().all(|i| i.envelope.provider == "stripe"));
}
