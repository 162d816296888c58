//! The embedded store's operations through the real binary: the retention purge of
//! `einmal serve` (aged with the test-only clock override), `einmal store stats`,
//! `einmal backup` while serving, `einmal restore` refusing a running store.

use crate::common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{einmal, repo};
use serde_json::Value;

struct Serve {
    child: Child,
    url: String,
}

impl Serve {
    /// `einmal serve` on `dir`, its purge clock `offset_secs` ahead.
    fn start(dir: &Path, offset_secs: i64) -> Serve {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_einmal"))
            .args(["serve", "--addr", &addr, "--data-dir"])
            .arg(dir)
            .current_dir(repo())
            .env("RUST_LOG", "warn")
            .env("EINMAL_TEST_CLOCK_OFFSET_SECS", offset_secs.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "einmal serve did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Serve {
            child,
            url: format!("http://{addr}"),
        }
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

fn send_payment(url: &str) -> String {
    ok(&einmal(&[
        "send",
        "--provider",
        "stripe",
        "--tenant",
        "demo",
        "--event",
        "events/samples/domain/stripe-payment_intent.succeeded.json",
        "--event-id",
        "evt_store_ops_1",
        "--url",
        url,
    ]))
}

fn stats(dir: &str) -> Value {
    serde_json::from_str(&ok(&einmal(&[
        "--json",
        "store",
        "stats",
        "--data-dir",
        dir,
    ])))
    .unwrap()
}

fn inbox_rows(stats: &Value) -> u64 {
    stats["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["table"] == "inbox")
        .unwrap()["rows"]
        .as_u64()
        .unwrap()
}

/// Wait until a purge pass of the running serve is recorded after `after_ms`.
fn purged_since(dir: &str, after: Option<u64>) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = stats(dir);
        if s["last_purge_ms"].as_u64().is_some() && s["last_purge_ms"].as_u64() != after {
            return s;
        }
        assert!(Instant::now() < deadline, "no purge pass: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn serve_purges_what_expired_keeps_business_records_and_still_deduplicates_within_retention() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    ok(&einmal(&[
        "inventory",
        "set",
        "--tenant",
        "demo",
        "SKU-RED-M",
        "--on-hand",
        "7",
        "--data-dir",
        d,
    ]));
    let serve = Serve::start(dir.path(), 0);
    assert!(send_payment(&serve.url).starts_with("200 "));
    let first = purged_since(d, None);
    assert_eq!(inbox_rows(&first), 1);
    serve.stop();

    // Five days later (inside Stripe's 3 + 7 days): kept, a late retry is a duplicate.
    let serve = Serve::start(dir.path(), 5 * 86_400);
    let later = purged_since(d, first["last_purge_ms"].as_u64());
    assert_eq!(inbox_rows(&later), 1, "{later}");
    assert!(send_payment(&serve.url).contains("\"duplicate\":true"));
    serve.stop();

    // Past the retention (30 days configured): the event goes, the stock stays.
    let serve = Serve::start(dir.path(), 31 * 86_400);
    let aged = purged_since(d, later["last_purge_ms"].as_u64());
    assert_eq!(inbox_rows(&aged), 0, "{aged}");
    assert_eq!(aged["oldest_item_received_ms"], Value::Null);
    let stock: Value = serde_json::from_str(&ok(&einmal(&[
        "inventory",
        "show",
        "--tenant",
        "demo",
        "SKU-RED-M",
        "--json",
        "--data-dir",
        d,
    ])))
    .unwrap();
    assert_eq!(stock["on_hand"], 7, "business records are never purged");
    // The human form names every figure.
    let human = ok(&einmal(&["store", "stats", "--data-dir", d]));
    for line in [
        "inbox           0 rows",
        "state ",
        "wal ",
        "next purge      in ",
    ] {
        assert!(human.contains(line), "{line}: {human}");
    }
    // The same figures on /metrics.
    let addr = serve.url.trim_start_matches("http://").to_string();
    let metrics = common::http("GET", &addr, "/metrics", &[], "");
    assert_eq!(metrics.status, 200);
    for name in [
        "einmal_store_rows{table=\"inbox\"} 0",
        "einmal_store_file_bytes ",
        "einmal_store_writes_failing 0",
    ] {
        assert!(metrics.body.contains(name), "{name}: {}", metrics.body);
    }
    serve.stop();
}

#[test]
fn backup_while_serving_and_restore_refuses_a_running_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let serve = Serve::start(dir.path(), 0);
    assert!(send_payment(&serve.url).starts_with("200 "));
    let copies = tempfile::tempdir().unwrap();
    let copy = copies.path().join("einmal-backup.sqlite");
    let copy_s = copy.to_str().unwrap();
    let backup = einmal(&["backup", "--to", copy_s, "--data-dir", d]);
    let said = text(&backup.stderr);
    assert!(backup.status.success(), "{said}");
    assert!(said.contains("backup: 100%"), "{said}");
    assert!(said.contains("integrity check ok"), "{said}");
    // Never over an existing file.
    let again = einmal(&["backup", "--to", copy_s, "--data-dir", d]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again.stderr));

    let refused = einmal(&["restore", "--from", copy_s, "--data-dir", d]);
    assert_eq!(refused.status.code(), Some(4));
    assert!(text(&refused.stderr).contains("stop it before restoring"));
    serve.stop();

    // Stopped: restored in place, the old store kept beside it.
    let restored = einmal(&["--json", "restore", "--from", copy_s, "--data-dir", d]);
    let answer: Value = serde_json::from_str(&ok(&restored)).unwrap();
    assert_eq!(answer["inbox_items"], 1, "{answer}");
    assert!(Path::new(answer["replaced"].as_str().unwrap()).exists());
    let serve = Serve::start(dir.path(), 0);
    assert!(send_payment(&serve.url).contains("\"duplicate\":true"));
    serve.stop();

    // A damaged copy is refused before anything is touched.
    let junk = copies.path().join("junk.sqlite");
    std::fs::write(&junk, vec![0x42; 4096]).unwrap();
    let bad = einmal(&["restore", "--from", junk.to_str().unwrap(), "--data-dir", d]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    assert_eq!(inbox_rows(&stats(d)), 1);
}

/// One signed request over its own connection; `None` if serve did not answer (killed).
fn post_signed(addr: &str, path: &str, headers: &http::HeaderMap, body: &[u8]) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {}\r\n", v.to_str().ok()?));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).ok()?;
    String::from_utf8_lossy(&resp)
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

/// Signed Shopify `orders/create` (paid, one unit of SKU-RED-M) of order `id`.
struct Orders {
    provider: &'static dyn einmal::providers::Provider,
    tenant: einmal::config::TenantConfig,
}

impl Orders {
    fn new() -> Orders {
        let config = einmal::config::Config::load(&repo().join("einmal.toml")).unwrap();
        Orders {
            provider: einmal::providers::lookup("shopify").unwrap(),
            tenant: config.tenant("shopify", "demo").unwrap().clone(),
        }
    }

    /// Send order `id` to `addr`; whether serve acknowledged it (200).
    fn send(&self, addr: &str, id: u64) -> bool {
        let body = serde_json::json!({
            "id": id, "name": format!("#{id}"), "order_number": id, "email": "jon@example.com",
            "created_at": "2026-11-30T10:00:00-05:00", "updated_at": "2026-11-30T10:00:00-05:00",
            "currency": "EUR", "total_price": "10.00", "subtotal_price": "10.00",
            "financial_status": "paid",
            "line_items": [{"id": id * 100, "sku": "SKU-RED-M", "quantity": 1, "title": "T-shirt",
                            "price": "10.00"}]
        })
        .to_string();
        let headers = self
            .provider
            .sign(
                body.as_bytes(),
                &self.tenant,
                &format!("bk-{id}"),
                einmal::time::now_secs(),
            )
            .unwrap();
        post_signed(addr, "/webhooks/shopify/demo", &headers, body.as_bytes()) == Some(200)
    }
}

fn addr_of(serve: &Serve) -> String {
    serve.url.trim_start_matches("http://").to_string()
}

/// Every event of `dir`, through `events list --all`.
fn all_events(dir: &str) -> Vec<Value> {
    serde_json::from_str(&ok(&einmal(&[
        "events",
        "list",
        "--all",
        "--json",
        "--data-dir",
        dir,
    ])))
    .unwrap()
}

/// The Shopify webhook id of an event (the last part of its key).
fn webhook_id(event: &Value) -> String {
    let key = event["key"].as_str().unwrap();
    key.rsplit(':').next().unwrap().to_string()
}

/// `einmal backup` taken while signed orders stream in, `einmal serve` killed with
/// SIGKILL afterwards, the copy restored into a new data dir and served: every order
/// acknowledged before the backup started is there and completes, the provider's
/// retries of the later ones are applied once, and each order has one invoice and
/// moved the stock once.
#[test]
fn backup_under_load_restores_every_event_acked_before_it_and_resumes_without_doubling() {
    use std::collections::BTreeSet;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Mutex;

    const STOCK: i64 = 100_000;
    const FIRST_ORDER: u64 = 42_000;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    ok(&einmal(&[
        "inventory",
        "set",
        "--tenant",
        "demo",
        "SKU-RED-M",
        "--on-hand",
        &STOCK.to_string(),
        "--data-dir",
        d,
    ]));
    let orders = Orders::new();
    let serve = Serve::start(dir.path(), 0);
    let addr = addr_of(&serve);
    let next = AtomicU64::new(FIRST_ORDER);
    let stop = AtomicBool::new(false);
    let acked = Mutex::new(BTreeSet::new());
    let copies = tempfile::tempdir().unwrap();
    let copy = copies.path().join("under-load.sqlite");
    let acked_before = std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    let id = next.fetch_add(1, Ordering::SeqCst);
                    if orders.send(&addr, id) {
                        acked.lock().unwrap().insert(id);
                    }
                }
            });
        }
        let wait_for_acks = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(60);
            while acked.lock().unwrap().len() < n {
                assert!(Instant::now() < deadline, "fewer than {n} orders acked");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        wait_for_acks(150);
        let before = acked.lock().unwrap().clone();
        let backup = einmal(&["backup", "--to", copy.to_str().unwrap(), "--data-dir", d]);
        assert!(backup.status.success(), "{}", text(&backup.stderr));
        // The stream goes on after the copy, then the machine dies.
        wait_for_acks(before.len() + 150);
        serve.stop();
        stop.store(true, Ordering::SeqCst);
        before
    });
    let attempted: Vec<u64> = (FIRST_ORDER..next.into_inner()).collect();
    let acked = acked.into_inner().unwrap();
    assert!(acked.len() >= acked_before.len() + 150);

    let restored_dir = tempfile::tempdir().unwrap();
    let d2 = restored_dir.path().to_str().unwrap();
    ok(&einmal(&[
        "restore",
        "--from",
        copy.to_str().unwrap(),
        "--data-dir",
        d2,
    ]));
    let in_copy: BTreeSet<u64> = all_events(d2)
        .iter()
        .map(|e| webhook_id(e).trim_start_matches("bk-").parse().unwrap())
        .collect();
    let missing: Vec<_> = acked_before.difference(&in_copy).collect();
    assert!(
        missing.is_empty(),
        "acked before the backup, not in it: {missing:?}"
    );

    let serve = Serve::start(restored_dir.path(), 0);
    let addr = addr_of(&serve);
    // The provider retries what it has no ack for and what the lost store acked.
    let retried: Vec<u64> = attempted
        .iter()
        .copied()
        .filter(|id| !acked_before.contains(id))
        .collect();
    std::thread::scope(|scope| {
        for chunk in retried.chunks(retried.len().div_ceil(4)) {
            let (orders, addr) = (&orders, &addr);
            scope.spawn(move || {
                for id in chunk {
                    assert!(orders.send(addr, *id), "retry of order {id} not acked");
                }
            });
        }
    });

    // Every order ends completed: the restored ones resume, the retries are processed.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let events = all_events(d2);
        let dead: Vec<_> = events
            .iter()
            .filter(|e| e["state"] == "dead_letter")
            .map(|e| (&e["key"], &e["last_error"]))
            .collect();
        assert!(dead.is_empty(), "dead-lettered: {dead:?}");
        let completed = events.iter().filter(|e| e["state"] == "completed").count();
        if events.len() == attempted.len() && completed == events.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{completed} of {} events completed, {} expected",
            events.len(),
            attempted.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Business data: one invoice per order, the stock moved once per order.
    std::thread::scope(|scope| {
        for chunk in attempted.chunks(attempted.len().div_ceil(4)) {
            scope.spawn(move || {
                for id in chunk {
                    let order: Value = serde_json::from_str(&ok(&einmal(&[
                        "orders",
                        "show",
                        "--tenant",
                        "demo",
                        &id.to_string(),
                        "--json",
                        "--data-dir",
                        d2,
                    ])))
                    .unwrap();
                    assert_eq!(order["invoices"].as_array().unwrap().len(), 1, "order {id}");
                }
            });
        }
    });
    let stock: Value = serde_json::from_str(&ok(&einmal(&[
        "inventory",
        "show",
        "--tenant",
        "demo",
        "SKU-RED-M",
        "--json",
        "--data-dir",
        d2,
    ])))
    .unwrap();
    assert_eq!(
        stock["on_hand"],
        STOCK - attempted.len() as i64,
        "one unit reserved once per order"
    );
    serve.stop();
}

/// `events list` over more events than one store page (1,000): `--limit` is honoured
/// past a page (and says where the rest starts), `--all` streams every event once.
#[test]
fn events_list_honours_a_limit_over_a_page_and_all_streams_every_page() {
    use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
    use std::collections::BTreeSet;
    use std::sync::Arc;

    const EVENTS: usize = 2_100;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let config = Arc::new(einmal::config::Config::load(&repo().join("einmal.toml")).unwrap());
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = Arc::new(EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap());
        let ingestor = Arc::new(einmal::pipeline::ingest::Ingestor::new(
            config.clone(),
            store.clone(),
            store,
        ));
        let mut sends = tokio::task::JoinSet::new();
        for i in 0..EVENTS {
            let (ingestor, config) = (ingestor.clone(), config.clone());
            sends.spawn(async move {
                let id = format!("evt_page_{i}");
                let body = einmal_tests::fixtures::stripe_body(&id, 200);
                let request = einmal_tests::fixtures::signed(&config, "stripe", "demo", &id, &body);
                ingestor.ingest("stripe", "demo", &request).await.status
            });
        }
        while let Some(status) = sends.join_next().await {
            assert_eq!(status.unwrap(), 200);
        }
    });
    let keys = |out: &Output| -> Vec<String> {
        let items: Vec<Value> = serde_json::from_str(&ok(out)).unwrap();
        items
            .iter()
            .map(|i| i["key"].as_str().unwrap().to_string())
            .collect()
    };

    let all = keys(&einmal(&[
        "events",
        "list",
        "--all",
        "--json",
        "--data-dir",
        d,
    ]));
    assert_eq!(all.len(), EVENTS);
    let distinct: BTreeSet<_> = all.iter().cloned().collect();
    assert_eq!(distinct.len(), EVENTS, "no event twice across pages");
    let text_lines = ok(&einmal(&["events", "list", "--all", "--data-dir", d]));
    assert_eq!(text_lines.lines().count(), EVENTS);

    // A limit over a page: that many, then the cursor of the rest on stderr.
    let limited = einmal(&[
        "events",
        "list",
        "--limit",
        "1500",
        "--json",
        "--data-dir",
        d,
    ]);
    let first = keys(&limited);
    assert_eq!(first, all[..1500]);
    let said = text(&limited.stderr);
    let cursor = said
        .split("--cursor ")
        .nth(1)
        .unwrap_or_else(|| panic!("no cursor: {said}"))
        .trim();
    let rest = keys(&einmal(&[
        "events",
        "list",
        "--all",
        "--cursor",
        cursor,
        "--json",
        "--data-dir",
        d,
    ]));
    assert_eq!(rest, all[1500..]);
    // All of them: nothing more to say.
    let exact = einmal(&[
        "events",
        "list",
        "--limit",
        "5000",
        "--json",
        "--data-dir",
        d,
    ]);
    assert_eq!(keys(&exact).len(), EVENTS);
    assert!(
        !text(&exact.stderr).contains("--cursor"),
        "{}",
        text(&exact.stderr)
    );
    // --all is instead of --limit.
    let both = einmal(&["events", "list", "--all", "--limit", "5", "--data-dir", d]);
    assert_eq!(both.status.code(), Some(2));
}
