//! End-to-end through the real binary: `einmal serve` on a free port with a temp
//! store, `einmal send` signing the demo samples, `einmal events` reading the store.

use crate::common;

use common::{einmal, repo};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Server {
    child: Child,
    url: String,
    data_dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        Server::start_in(tempfile::tempdir().unwrap())
    }

    /// `einmal serve` on the store in `data_dir` (a new one, or one a killed server left).
    fn start_in(data_dir: tempfile::TempDir) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_einmal"))
            .args(["serve", "--addr", &addr, "--data-dir"])
            .arg(data_dir.path())
            .current_dir(repo())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "einmal serve did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Server {
            child,
            url: format!("http://{addr}"),
            data_dir,
        }
    }

    fn dir(&self) -> &str {
        self.data_dir.path().to_str().unwrap()
    }

    /// SIGKILL (`kill -9`): no shutdown, no flush; the store it leaves is returned.
    fn kill(mut self) -> tempfile::TempDir {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
        std::mem::replace(&mut self.data_dir, tempfile::tempdir().unwrap())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Stock the demo tenant's two SKUs (10 red M, 5 blue L) in `data_dir`.
fn stock_the_demo_skus(data_dir: &str) {
    for (sku, qty) in [("SKU-RED-M", "10"), ("SKU-BLUE-L", "5")] {
        let out = einmal(&[
            "inventory",
            "set",
            "--tenant",
            "demo",
            sku,
            "--on-hand",
            qty,
            "--data-dir",
            data_dir,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn post(url: &str, body: &[u8], content_type: &str) -> (u16, serde_json::Value) {
    // A raw HTTP/1.1 request keeps the test free of client crates.
    use std::io::{Read, Write};
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = std::net::TcpStream::connect(host).unwrap();
    write!(
        s,
        "POST /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    let _ = s.write_all(body);
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp);
    let status: u16 = text.split(' ').nth(1).unwrap().parse().unwrap();
    let json = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (
        status,
        serde_json::from_str(json).unwrap_or(serde_json::Value::Null),
    )
}

#[test]
fn send_accepts_then_deduplicates_and_events_show_the_item() {
    let server = Server::start();
    // The Shopify sample orders this SKU; without stock it would (rightly) dead-letter.
    let seed = einmal(&[
        "inventory",
        "set",
        "--tenant",
        "demo",
        "SKU-RED-M",
        "--on-hand",
        "5",
        "--data-dir",
        server.dir(),
    ]);
    assert!(
        seed.status.success(),
        "{}",
        String::from_utf8_lossy(&seed.stderr)
    );
    for provider in ["stripe", "shopify", "github", "standard-webhooks"] {
        let first = einmal(&[
            "send",
            "--provider",
            provider,
            "--tenant",
            "demo",
            "--url",
            &server.url,
        ]);
        assert!(
            first.status.success(),
            "{provider}: {}",
            String::from_utf8_lossy(&first.stderr)
        );
        assert!(stdout(&first).starts_with("200 "), "{}", stdout(&first));
        assert!(stdout(&first).contains("\"duplicate\":false"));
        let again = einmal(&[
            "send",
            "--provider",
            provider,
            "--tenant",
            "demo",
            "--url",
            &server.url,
        ]);
        assert!(
            stdout(&again).contains("\"duplicate\":true"),
            "{}",
            stdout(&again)
        );
    }
    let other = einmal(&[
        "send",
        "--provider",
        "stripe",
        "--tenant",
        "demo",
        "--event-id",
        "evt_cli_2",
        "--url",
        &server.url,
    ]);
    assert!(stdout(&other).contains("\"event_id\":\"evt_cli_2\""));

    let show = einmal(&[
        "events",
        "show",
        "--provider",
        "stripe",
        "--tenant",
        "demo",
        "--event-id",
        "evt_demo_1",
        "--json",
        "--data-dir",
        server.dir(),
    ]);
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    let item: serde_json::Value = serde_json::from_str(&stdout(&show)).unwrap();
    assert_eq!(item["key"], "stripe#demo#evt_demo_1");
    assert_eq!(item["envelope"]["event_type"], "payment_intent.succeeded");
    assert_eq!(item["envelope"]["object_id"], "pi_demo_1");
    assert!(item.get("body").is_none(), "bodies only with --body");

    let list = einmal(&["events", "list", "--json", "--data-dir", server.dir()]);
    let items: Vec<serde_json::Value> = serde_json::from_str(&stdout(&list)).unwrap();
    assert_eq!(items.len(), 5);
    let list = einmal(&[
        "events",
        "list",
        "--state",
        "dead_letter",
        "--json",
        "--data-dir",
        server.dir(),
    ]);
    let items: Vec<serde_json::Value> = serde_json::from_str(&stdout(&list)).unwrap();
    assert!(items.is_empty(), "no sample may dead-letter: {items:?}");
}

#[test]
fn bad_http_input_gets_json_errors_and_nothing_is_stored() {
    let server = Server::start();
    let (status, json) = post(
        &format!("{}/webhooks/stripe/demo", server.url),
        b"{}",
        "application/json",
    );
    assert_eq!(
        (status, json["error"].as_str()),
        (401, Some("invalid_signature"))
    );
    let (status, json) = post(
        &format!("{}/webhooks/nope/demo", server.url),
        b"{}",
        "application/json",
    );
    assert_eq!((status, json["error"].as_str()), (404, Some("not_found")));
    let (status, json) = post(
        &format!("{}/elsewhere", server.url),
        b"{}",
        "application/json",
    );
    assert_eq!((status, json["error"].as_str()), (404, Some("not_found")));
    let big = vec![b'x'; 2 * 1024 * 1024];
    let (status, json) = post(
        &format!("{}/webhooks/stripe/demo", server.url),
        &big,
        "application/json",
    );
    assert_eq!(
        (status, json["error"].as_str()),
        (413, Some("payload_too_large"))
    );

    let list = einmal(&["events", "list", "--json", "--data-dir", server.dir()]);
    let items: Vec<serde_json::Value> = serde_json::from_str(&stdout(&list)).unwrap();
    assert!(items.is_empty());
}

/// `einmal send` signs with the tenant's secret only: destinations whose DSN and
/// signing secrets are not set where the sender runs do not stop it.
#[test]
fn send_needs_only_the_tenants_secret_not_the_destinations() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("einmal.toml");
    let demo = std::fs::read_to_string(repo().join("einmal.toml")).unwrap();
    std::fs::write(
        &config,
        format!(
            "{demo}\n[[destination]]\nname = \"db-for-send\"\ntenant = \"demo\"\nkind = \"postgres\"\n\
             events = [\"*\"]\ndsn = {{ env = \"EINMAL_TEST_UNSET_DSN\" }}\ntable = \"events\"\ntls = false\n\n\
             [[destination]]\nname = \"app-for-send\"\ntenant = \"demo\"\nkind = \"http\"\n\
             url = \"https://app.example/hooks\"\nevents = [\"*\"]\n\
             secrets = [{{ env = \"EINMAL_TEST_UNSET_HOOK_SECRET\" }}]\n"
        ),
    )
    .unwrap();
    // The whole configuration is refused where it would be served...
    let check = einmal(&["config", "check", "--config", config.to_str().unwrap()]);
    assert!(!check.status.success(), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("EINMAL_TEST_UNSET_DSN"),
        "{}",
        stdout(&check)
    );
    // ...and signs and sends as the provider would.
    let sent = einmal(&[
        "send",
        "--provider",
        "stripe",
        "--tenant",
        "demo",
        "--event-id",
        "evt_send_without_destination_secrets",
        "--config",
        config.to_str().unwrap(),
        "--url",
        &server.url,
    ]);
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert!(stdout(&sent).starts_with("200 "), "{}", stdout(&sent));
    assert!(
        stdout(&sent).contains("\"duplicate\":false"),
        "{}",
        stdout(&sent)
    );
}

#[test]
fn bad_cli_input_is_a_message_and_a_non_zero_exit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["events", "list", "--state", "bogus", "--data-dir", d],
            "unknown state",
        ),
        (
            vec!["send", "--provider", "nope", "--tenant", "demo"],
            "unknown provider",
        ),
        (
            vec!["send", "--provider", "stripe", "--tenant", "nobody"],
            "not configured",
        ),
        (
            vec![
                "send",
                "--provider",
                "stripe",
                "--tenant",
                "demo",
                "--event",
                "/no/such/file",
            ],
            "cannot read",
        ),
        (
            vec!["serve", "--config", "/no/such/config.toml", "--data-dir", d],
            "cannot read config",
        ),
        (
            vec![
                "events",
                "show",
                "--provider",
                "stripe",
                "--tenant",
                "demo",
                "--event-id",
                "evt_missing",
                "--data-dir",
                d,
            ],
            "no event",
        ),
    ];
    for (args, message) in cases {
        let out = einmal(&args);
        assert!(!out.status.success(), "{args:?} must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(message), "{args:?}: {err}");
    }
}

#[test]
fn serve_processes_events_and_orders_show_the_business_state() {
    let server = Server::start();
    let d = server.dir();
    stock_the_demo_skus(d);
    let create = einmal(&[
        "send",
        "--provider",
        "shopify",
        "--tenant",
        "demo",
        "--topic",
        "orders/create",
        "--event",
        "events/samples/domain/shopify-orders-create.json",
        "--event-id",
        "ev-create-1",
        "--url",
        &server.url,
    ]);
    assert!(stdout(&create).starts_with("200 "), "{}", stdout(&create));
    for _ in 0..2 {
        let pay = einmal(&[
            "send",
            "--provider",
            "stripe",
            "--tenant",
            "demo",
            "--event",
            "events/samples/domain/stripe-payment_intent.succeeded.json",
            "--url",
            &server.url,
        ]);
        assert!(stdout(&pay).starts_with("200 "), "{}", stdout(&pay));
    }

    // The processor loop inside `serve` applies them; wait until both are terminal.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let list = einmal(&[
            "events",
            "list",
            "--state",
            "completed",
            "--json",
            "--data-dir",
            d,
        ]);
        let done: Vec<serde_json::Value> = serde_json::from_str(&stdout(&list)).unwrap();
        if done.len() == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "events not processed: {}",
            stdout(&list)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let order = einmal(&[
        "orders",
        "show",
        "--tenant",
        "demo",
        "1001",
        "--json",
        "--data-dir",
        d,
    ]);
    assert!(
        order.status.success(),
        "{}",
        String::from_utf8_lossy(&order.stderr)
    );
    let order: serde_json::Value = serde_json::from_str(&stdout(&order)).unwrap();
    assert_eq!(order["payment_status"], "paid");
    assert_eq!(
        order["invoices"].as_array().unwrap().len(),
        1,
        "one invoice for two payment deliveries"
    );
    assert_eq!(order["notifications"].as_array().unwrap().len(), 1);
    let stock = einmal(&[
        "inventory",
        "show",
        "--tenant",
        "demo",
        "SKU-BLUE-L",
        "--json",
        "--data-dir",
        d,
    ]);
    let stock: serde_json::Value = serde_json::from_str(&stdout(&stock)).unwrap();
    assert_eq!(stock["on_hand"], 3, "two units reserved by the order");
    let missing = einmal(&[
        "orders",
        "show",
        "--tenant",
        "other",
        "1001",
        "--data-dir",
        d,
    ]);
    assert!(!missing.status.success(), "tenants are isolated");
}

#[test]
fn replay_needs_a_reason_and_every_replay_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let no_reason = einmal(&[
        "replay",
        "--provider",
        "stripe",
        "--tenant",
        "t1",
        "--event-id",
        "evt_1",
        "--data-dir",
        data_dir,
    ]);
    assert!(!no_reason.status.success());
    assert!(String::from_utf8_lossy(&no_reason.stderr).contains("--reason"));

    let missing = einmal(&[
        "replay",
        "--provider",
        "stripe",
        "--tenant",
        "t1",
        "--event-id",
        "evt_1",
        "--reason",
        "customer asked",
        "--actor",
        "ops-bob",
        "--data-dir",
        data_dir,
    ]);
    assert_eq!(
        missing.status.code(),
        Some(1),
        "a missing event is an error"
    );
    assert!(stdout(&missing).contains("missing"));

    let dry = einmal(&[
        "replay",
        "--bulk",
        "--state",
        "dead_letter",
        "--dry-run",
        "--data-dir",
        data_dir,
    ]);
    assert!(dry.status.success(), "a dry run needs no reason: {dry:?}");
    assert!(stdout(&dry).contains("dry run"));

    // Without $USER and --actor, a replay would be audited as nobody: refused, exit 2.
    let nobody = Command::new(env!("CARGO_BIN_EXE_einmal"))
        .args([
            "replay",
            "--provider",
            "stripe",
            "--tenant",
            "t1",
            "--event-id",
            "evt_1",
            "--reason",
            "customer asked",
            "--data-dir",
            data_dir,
        ])
        .env_remove("USER")
        .output()
        .unwrap();
    assert_eq!(nobody.status.code(), Some(2), "{nobody:?}");
    assert!(
        String::from_utf8_lossy(&nobody.stderr).contains("--actor is required when $USER is unset")
    );

    let audit = einmal(&["audit", "list", "--json", "--data-dir", data_dir]);
    assert!(audit.status.success());
    let records: serde_json::Value = serde_json::from_slice(&audit.stdout).unwrap();
    let records = records.as_array().unwrap();
    assert_eq!(records.len(), 1, "the dry run is not audited");
    assert_eq!(records[0]["actor"], "ops-bob");
    assert_eq!(records[0]["reason"], "customer asked");
    assert_eq!(records[0]["events"][0], "stripe#t1#evt_1");
    assert_eq!(records[0]["result"]["missing"], 1);

    let dlq = einmal(&["dlq", "list", "--json", "--data-dir", data_dir]);
    assert!(dlq.status.success());
    assert_eq!(stdout(&dlq).trim(), "[]");
}

/// One Shopify webhook through `einmal send` (body written to a temp file).
fn send_shopify(url: &str, dir: &Path, topic: &str, event_id: &str, body: serde_json::Value) {
    let file = dir.join(format!("{event_id}.json"));
    std::fs::write(&file, body.to_string()).unwrap();
    let out = einmal(&[
        "send",
        "--provider",
        "shopify",
        "--tenant",
        "demo",
        "--topic",
        topic,
        "--event",
        file.to_str().unwrap(),
        "--event-id",
        event_id,
        "--url",
        url,
    ]);
    assert!(
        stdout(&out).starts_with("200 "),
        "{topic} {event_id}: {} {}",
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn shopify_order(id: u64, updated_at: &str, financial: &str) -> serde_json::Value {
    serde_json::json!({
        "id": id, "name": format!("#{id}"), "order_number": id, "email": "jon@example.com",
        "created_at": "2026-11-30T10:00:00-05:00", "updated_at": updated_at,
        "currency": "EUR", "total_price": "20.00", "subtotal_price": "20.00",
        "financial_status": financial,
        "line_items": [{"id": id * 100, "sku": "SKU-RED-M", "quantity": 2, "title": "T-shirt",
                        "price": "10.00"}]
    })
}

/// Send `events` (topic, event id, body) through `einmal send`, `THREADS` at a time.
fn send_all(url: &str, dir: &Path, events: &[(&str, String, serde_json::Value)]) {
    const THREADS: usize = 8;
    std::thread::scope(|scope| {
        for chunk in events.chunks(events.len().div_ceil(THREADS)) {
            scope.spawn(move || {
                for (topic, id, body) in chunk {
                    send_shopify(url, dir, topic, id, body.clone());
                }
            });
        }
    });
}

/// `einmal serve` killed with SIGKILL while events wait for their orders (which come
/// 32 s later) and while the orders (the prerequisites) are being processed: after the
/// restart every effect is applied once and nothing is dead-lettered. A create killed mid-processing stays
/// under its dead lease for 30 s; its waiters wait without spending retries, and its
/// redelivery (committed or not before the kill) wakes them.
#[test]
fn serve_killed_with_prerequisites_in_flight_applies_every_effect() {
    const ORDERS: std::ops::Range<u64> = 7001..7031;
    let bodies = tempfile::tempdir().unwrap();
    let server = Server::start();
    let seed = einmal(&[
        "inventory",
        "set",
        "--tenant",
        "demo",
        "SKU-RED-M",
        "--on-hand",
        "100",
        "--data-dir",
        server.dir(),
    ]);
    assert!(
        seed.status.success(),
        "{}",
        String::from_utf8_lossy(&seed.stderr)
    );
    // The dependents first: fulfillment, refund, update of each order.
    let mut dependents = Vec::new();
    for id in ORDERS {
        dependents.push((
            "fulfillments/create",
            format!("ful-{id}"),
            serde_json::json!({"id": id * 10, "order_id": id, "status": "success",
                "created_at": "2026-11-30T11:00:00-05:00", "updated_at": "2026-11-30T11:00:00-05:00",
                "tracking_company": "UPS", "tracking_number": format!("1Z{id}"),
                "tracking_numbers": [format!("1Z{id}")]}),
        ));
        dependents.push((
            "refunds/create",
            format!("ref-{id}"),
            serde_json::json!({"id": id * 10 + 1, "order_id": id,
                "created_at": "2026-11-30T12:00:00-05:00", "restock": false,
                "transactions": [{"id": id * 100 + 1, "order_id": id, "kind": "refund",
                    "status": "success", "amount": "5.00", "currency": "EUR"}]}),
        ));
        dependents.push((
            "orders/updated",
            format!("upd-{id}"),
            shopify_order(id, "2026-11-30T10:30:00-05:00", "paid"),
        ));
    }
    send_all(&server.url, bodies.path(), &dependents);
    // Killed while they wait; the orders come more than 30 s later (providers deliver minutes to days out of order). Before waiting
    // existed, 5 receives with a 2 s base backoff dead-lettered them within 30 s.
    std::thread::sleep(Duration::from_secs(16));
    let server = Server::start_in(server.kill());
    std::thread::sleep(Duration::from_secs(16));
    // The prerequisites in a burst, killed as soon as the last one is acknowledged:
    // creates claimed, committed or waking their waiters stay behind for the restart.
    let creates: Vec<_> = ORDERS
        .map(|id| {
            (
                "orders/create",
                format!("create-{id}"),
                shopify_order(id, "2026-11-30T10:00:00-05:00", "paid"),
            )
        })
        .collect();
    send_all(&server.url, bodies.path(), &creates);
    let server = Server::start_in(server.kill());
    let d = server.dir().to_string();

    // Every event completes (a create left under a dead lease is reclaimed after it).
    let expected = ORDERS.count() * 4;
    let deadline = Instant::now() + Duration::from_secs(120);
    let items = loop {
        let list = einmal(&[
            "events",
            "list",
            "--json",
            "--limit",
            "1000",
            "--data-dir",
            &d,
        ]);
        let items: Vec<serde_json::Value> = serde_json::from_str(&stdout(&list)).unwrap();
        let states: Vec<&str> = items.iter().filter_map(|i| i["state"].as_str()).collect();
        assert!(
            !states.contains(&"dead_letter"),
            "dead-lettered: {:#?}",
            items
                .iter()
                .filter(|i| i["state"] == "dead_letter")
                .map(|i| (&i["key"], &i["last_error"]))
                .collect::<Vec<_>>()
        );
        if items.len() == expected && states.iter().all(|s| *s == "completed") {
            break items;
        }
        assert!(
            Instant::now() < deadline,
            "not all completed: {:?}",
            items
                .iter()
                .filter(|i| i["state"] != "completed")
                .map(|i| (&i["key"], &i["state"], &i["last_error"]))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(items.len(), expected);
    for id in ORDERS {
        let order = einmal(&[
            "orders",
            "show",
            "--tenant",
            "demo",
            &id.to_string(),
            "--json",
            "--data-dir",
            &d,
        ]);
        assert!(
            order.status.success(),
            "{}",
            String::from_utf8_lossy(&order.stderr)
        );
        let order: serde_json::Value = serde_json::from_str(&stdout(&order)).unwrap();
        assert_eq!(
            order["shipments"].as_array().unwrap().len(),
            1,
            "order {id}"
        );
        assert_eq!(order["refunds"].as_array().unwrap().len(), 1, "order {id}");
        assert_eq!(order["refunded_minor"], 500, "order {id}");
        assert_eq!(order["invoices"].as_array().unwrap().len(), 1, "order {id}");
    }
    let stock = einmal(&[
        "inventory",
        "show",
        "--tenant",
        "demo",
        "SKU-RED-M",
        "--json",
        "--data-dir",
        &d,
    ]);
    let stock: serde_json::Value = serde_json::from_str(&stdout(&stock)).unwrap();
    assert_eq!(
        stock["on_hand"],
        100 - 2 * ORDERS.count() as i64,
        "stock reserved once each"
    );
    let dlq = einmal(&["dlq", "list", "--json", "--data-dir", &d]);
    assert!(
        dlq.status.success(),
        "{}",
        String::from_utf8_lossy(&dlq.stderr)
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&stdout(&dlq)).unwrap(),
        serde_json::json!([]),
        "nothing dead-lettered"
    );
}

/// A `kill -9` of `einmal serve` between a request's inbox write and its queue send
/// leaves the event stored and never enqueued (the provider got no answer; its retry
/// inside the in-flight grace would send nothing). The next `einmal serve` enqueues it
/// as it starts: processed within seconds of the restart, not at the sweeper's
/// threshold.
#[test]
fn serve_enqueues_on_start_what_a_killed_serve_stored_but_never_sent() {
    use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
    use einmal::config::Config;
    use einmal::request::WebhookRequest;
    use std::sync::Arc;

    let data_dir = tempfile::tempdir().unwrap();
    let d = data_dir.path().to_str().unwrap().to_string();
    stock_the_demo_skus(&d);
    // The dead process: the same ingest path on the same store, dying at its send.
    let config = Arc::new(Config::load(&repo().join("einmal.toml")).expect("einmal.toml"));
    let body =
        std::fs::read(repo().join("events/samples/domain/shopify-orders-create.json")).unwrap();
    let provider = einmal::providers::lookup("shopify").unwrap();
    let tenant = config.tenant("shopify", "demo").unwrap();
    let headers = provider
        .sign(&body, tenant, "ev-killed-1", einmal::time::now_secs())
        .unwrap();
    let request = WebhookRequest::post(headers, body);
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store =
            Arc::new(EmbeddedStore::open(data_dir.path(), EmbeddedOptions::default()).unwrap());
        einmal_tests::fixtures::ingest_then_die(config, store, "shopify", "demo", &request).await;
    });
    let received = einmal(&[
        "events",
        "list",
        "--state",
        "received",
        "--json",
        "--data-dir",
        &d,
    ]);
    let received: Vec<serde_json::Value> = serde_json::from_str(&stdout(&received)).unwrap();
    assert_eq!(received.len(), 1, "stored, never enqueued: {received:?}");

    let restarted = Instant::now();
    let server = Server::start_in(data_dir);
    // Well inside the 60 s the sweeper would take: the start itself enqueues it.
    let deadline = restarted + Duration::from_secs(30);
    loop {
        let list = einmal(&[
            "events",
            "list",
            "--state",
            "completed",
            "--json",
            "--data-dir",
            &d,
        ]);
        let done: Vec<serde_json::Value> = serde_json::from_str(&stdout(&list)).unwrap();
        if done.len() == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not processed within 30 s of the restart: {}",
            stdout(&einmal(&["events", "list", "--json", "--data-dir", &d]))
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let stock = einmal(&[
        "inventory",
        "show",
        "--tenant",
        "demo",
        "SKU-BLUE-L",
        "--json",
        "--data-dir",
        &d,
    ]);
    let stock: serde_json::Value = serde_json::from_str(&stdout(&stock)).unwrap();
    assert_eq!(stock["on_hand"], 3, "two units reserved, once");
    drop(server);
}

/// Issue 23 item 9: data stored before ingest refused control characters (or written
/// by a destination's answer, a domain's result) is printed escaped by `events
/// list/show` and `dlq list/show`, as text and as JSON: no ESC, BEL or bidi override
/// reaches the terminal, and the JSON still decodes to the stored values.
#[test]
fn stored_control_characters_are_escaped_in_what_the_cli_prints() {
    use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
    use einmal::envelope::Envelope;
    use einmal::ports::{Inbox, InboxItem, InboxState, Source};
    use einmal::text::is_unsafe;

    let data_dir = tempfile::tempdir().unwrap();
    let d = data_dir.path().to_str().unwrap().to_string();
    let event_type = "payment_intent.succeeded\u{1b}[2J\u{1b}]0;owned\u{7}";
    let event_id = "evt_\u{202e}gnp.exe";
    let reason = "destination said: \u{1b}[31mFAIL\u{1b}[0m\u{9b}1A\u{2066}x";
    let body = "{\"note\":\"\u{202e}hidden\u{200b}\"}";
    let envelope = Envelope {
        provider: "stripe".into(),
        tenant: "demo".into(),
        event_id: event_id.into(),
        event_type: event_type.into(),
        object_id: Some("pi_\u{1b}1".into()),
        object_version: None,
        occurred_at: None,
        delivery_id: None,
    };
    let now = einmal::time::now_millis();
    let item = InboxItem {
        key: envelope.key(),
        envelope,
        state: InboxState::DeadLetter,
        source: Source::Webhook,
        attempts: 3,
        received_at_ms: now,
        updated_at_ms: now,
        expires_at: now / 1000 + 86_400,
        enqueue_failed: false,
        last_error: Some(reason.into()),
        last_error_class: Some("permanent\u{7}".into()),
        lease_until_ms: None,
        lease_owner: None,
        result: Some("result\u{1b}c".into()),
        body_encoding: einmal::body::BODY_ENCODING.to_string(),
        body_len: body.len() as u64,
        body: einmal::body::compress(body.as_bytes()).unwrap(),
        waiting: None,
        deliveries: Vec::new(),
        relay_due_ms: None,
    };
    let key = item.key.as_str().to_string();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = EmbeddedStore::open(data_dir.path(), EmbeddedOptions::default()).unwrap();
        store.put_new(&item).await.unwrap();
    });

    let runs: Vec<(&str, Vec<&str>)> = vec![
        ("events list", vec!["events", "list", "--data-dir", &d]),
        (
            "events show",
            vec![
                "events",
                "show",
                "--provider",
                "stripe",
                "--tenant",
                "demo",
                "--event-id",
                event_id,
                "--data-dir",
                &d,
            ],
        ),
        ("dlq list", vec!["dlq", "list", "--data-dir", &d]),
        ("dlq show", vec!["dlq", "show", &key, "--data-dir", &d]),
    ];
    for (what, args) in &runs {
        let out = einmal(args);
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = stdout(&out);
        assert!(
            !text.trim_end().chars().any(|c| is_unsafe(c) && c != '\n'),
            "{what} printed a raw control character: {text:?}"
        );
        assert!(text.contains("\\u{1b}[2J"), "{what}: {text}");
        assert!(text.contains("evt_\\u{202e}gnp.exe"), "{what}: {text}");
        if what.starts_with("dlq") {
            assert!(text.contains("\\u{1b}[31mFAIL"), "{what}: {text}");
            assert!(text.contains("\\u{9b}1A\\u{2066}x"), "{what}: {text}");
        }
        // The same as JSON: escaped as JSON escapes, the values unchanged.
        let mut json_args = args.clone();
        json_args.push("--json");
        if *what == "events show" {
            json_args.push("--body");
        }
        let out = einmal(&json_args);
        assert!(out.status.success(), "{what} --json");
        let text = stdout(&out);
        assert!(
            !text
                .chars()
                .any(|c| is_unsafe(c) && !c.is_ascii_whitespace()),
            "{what} --json printed a raw control character: {text:?}"
        );
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let one = if value.is_array() {
            value[0].clone()
        } else {
            value
        };
        let stored_type = one["event_type"]
            .as_str()
            .or(one["envelope"]["event_type"].as_str());
        assert_eq!(stored_type, Some(event_type), "{what} --json: {one}");
        if *what == "events show" {
            assert_eq!(one["body"], body, "{what} --json");
        }
    }
    // An error message quoting the stored key is escaped as well.
    let out = einmal(&["dlq", "show", &format!("{key}\u{1b}[2J"), "--data-dir", &d]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.trim_end().chars().any(|c| is_unsafe(c) && c != '\n'),
        "{err:?}"
    );
    assert!(err.contains("\\u{1b}[2J"), "{err}");
}
