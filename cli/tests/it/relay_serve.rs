//! `einmal serve` with an HTTP destination, killed with SIGKILL while deliveries are
//! in flight and restarted: every event is delivered, every call verifies with the
//! `standardwebhooks` crate, and the destination's dedup on `webhook-id` yields
//! exactly one effect per event. `einmal events show` prints the deliveries. A bad
//! destination stops `serve` at start, naming it; an unreachable one does not: with
//! its PostgreSQL down, `serve` acks every webhook and delivers each once the
//! database is up. SIGHUP reloads the configuration, destinations and their secrets
//! included.

use crate::common;

use common::{einmal, repo};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use einmal::destinations::delivery_key;
use einmal_tests::destination_server::{Answer, DestinationServer, SECRET};

const EVENTS: usize = 20;

/// The demo configuration plus one HTTP destination for the demo Stripe tenant.
fn config_with_destination(dir: &Path, url: &str) -> PathBuf {
    config_with(dir, &http_destination("shop", url, SECRET))
}

fn http_destination(name: &str, url: &str, secret: &str) -> String {
    format!(
        "\n[[destination]]\nname = \"{name}\"\ntenant = \"demo\"\nprovider = \"stripe\"\nkind = \"http\"\n\
         events = [\"customer.*\"]\nurl = \"{url}\"\nsecrets = [\"{secret}\"]\ntimeout_ms = 5000\n\
         max_attempts = 1000\n"
    )
}

/// The demo configuration plus `destinations` (TOML), written to `dir/einmal.toml`.
fn config_with(dir: &Path, destinations: &str) -> PathBuf {
    let mut toml = std::fs::read_to_string(repo().join("einmal.toml")).unwrap();
    toml.push_str(destinations);
    let path = dir.join("einmal.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(data_dir: &Path, config: &Path) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_einmal"))
            .args(["serve", "--addr", &addr, "--data-dir"])
            .arg(data_dir)
            .arg("--config")
            .arg(config)
            .current_dir(repo())
            .env("RUST_LOG", "warn")
            .env("EINMAL_RELAY_BACKOFF_BASE_MS", "100")
            .env("EINMAL_RELAY_BACKOFF_CAP_MS", "400")
            .env("EINMAL_RELAY_LEASE_MS", "3000")
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
        }
    }

    /// SIGHUP: reload the configuration.
    fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    /// SIGKILL (`kill -9`): no shutdown, no flush.
    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn send_stripe(url: &str, dir: &Path, config: &Path, i: usize) {
    let body = serde_json::json!({
        "id": format!("evt_k{i}"), "object": "event", "type": "customer.updated",
        "created": 1_764_400_000 + i as i64,
        "data": {"object": {"id": format!("cus_{i}"), "object": "customer"}}
    });
    let file = dir.join(format!("evt_k{i}.json"));
    std::fs::write(&file, body.to_string()).unwrap();
    let out = einmal(&[
        "send",
        "--provider",
        "stripe",
        "--tenant",
        "demo",
        "--event",
        file.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--url",
        url,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("200 "),
        "evt_k{i}: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_killed_during_delivery_delivers_every_event_exactly_once_after_restart() {
    // The first call of each id fails; later ones take a moment, so the kill finds
    // deliveries in flight.
    let destination = DestinationServer::start(|_, nth| match nth {
        1 => Answer::Status(503, "warming up"),
        _ => Answer::Stall(Duration::from_millis(200)),
    })
    .await;
    let data = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let config = config_with_destination(files.path(), &destination.url);
    let server = Server::start(data.path(), &config);
    let (url, dir, cfg) = (
        server.url.clone(),
        files.path().to_path_buf(),
        config.clone(),
    );
    tokio::task::spawn_blocking(move || {
        for i in 0..EVENTS {
            send_stripe(&url, &dir, &cfg, i);
        }
    })
    .await
    .unwrap();
    // Kill once deliveries are under way (some retried, some not yet made).
    let deadline = Instant::now() + Duration::from_secs(60);
    while destination.calls().len() < EVENTS / 2 {
        assert!(Instant::now() < deadline, "no deliveries started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill();
    let before_restart = destination.effects().len();
    assert!(
        before_restart < EVENTS,
        "everything was delivered before the kill"
    );

    let _server = Server::start(data.path(), &config);
    let deadline = Instant::now() + Duration::from_secs(120);
    while destination.effects().len() < EVENTS {
        assert!(
            Instant::now() < deadline,
            "{} of {EVENTS} delivered after the restart",
            destination.effects().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let calls = destination.calls();
    assert!(calls.iter().all(|c| c.verified), "a call did not verify");
    let effects = destination.effects();
    for i in 0..EVENTS {
        let key = delivery_key("shop", "stripe", "demo", &format!("evt_k{i}"));
        assert!(effects.contains_key(&key), "evt_k{i} not delivered");
    }
    assert_eq!(effects.len(), EVENTS, "one effect per event");

    // The store records it: wait until the restarted relay wrote the last outcome.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let show = einmal(&[
            "events",
            "show",
            "--provider",
            "stripe",
            "--tenant",
            "demo",
            "--event-id",
            "evt_k0",
            "--data-dir",
            data.path().to_str().unwrap(),
        ]);
        let text = String::from_utf8_lossy(&show.stdout).into_owned();
        if text.contains("delivery shop delivered") {
            assert!(
                text.contains("status=200") && text.contains("attempts="),
                "{text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "events show: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn a_bad_destination_stops_serve_naming_it() {
    let files = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    // A remote plain-http URL: refused at start.
    let config = config_with_destination(files.path(), "http://example.com/hook");
    let out = einmal(&[
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--data-dir",
        data.path().to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("shop"), "{stderr}");
    assert!(!stderr.contains(SECRET), "{stderr}");
}

/// PostgreSQL is down when `serve` starts and while every webhook arrives: `serve`
/// starts anyway, acks each (200), and once the database is up delivers each event
/// exactly once (a row and a key per event). Before the fix, `serve` exited 4 at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_its_postgres_down_acks_every_webhook_and_delivers_each_once_when_it_is_up() {
    let Some(mut pg) = einmal_tests::postgres::PgServer::private_or_skip() else {
        return;
    };
    let db = pg.create_database("serve_down").await;
    tokio::task::block_in_place(|| pg.stop());
    let data = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let config = config_with(
        files.path(),
        &format!(
            "\n[[destination]]\nname = \"warehouse\"\ntenant = \"demo\"\nprovider = \"stripe\"\n\
             kind = \"postgres\"\nevents = [\"customer.*\"]\ndsn = \"{}\"\ntable = \"einmal_events\"\n\
             max_attempts = 1000\n",
            pg.dsn(&db)
        ),
    );
    let server = Server::start(data.path(), &config);
    let (url, dir, cfg) = (
        server.url.clone(),
        files.path().to_path_buf(),
        config.clone(),
    );
    tokio::task::spawn_blocking(move || {
        for i in 0..EVENTS {
            send_stripe(&url, &dir, &cfg, i);
        }
        // A provider's retry of one of them: acked as a duplicate.
        send_stripe(&url, &dir, &cfg, 0);
    })
    .await
    .unwrap();

    tokio::task::block_in_place(|| pg.restart());
    let client = pg.client(&db).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut rows = 0;
    while rows < EVENTS as i64 {
        assert!(
            Instant::now() < deadline,
            "{rows} of {EVENTS} delivered after PostgreSQL came up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The sink creates the table on its first connection.
        rows = match client
            .query_one("SELECT count(*) FROM einmal_events", &[])
            .await
        {
            Ok(row) => row.get(0),
            Err(_) => 0,
        };
    }
    // Give a wrongly repeated delivery the chance to land before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let keys: std::collections::BTreeSet<String> = client
        .query("SELECT key FROM einmal_events", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let expected: std::collections::BTreeSet<String> = (0..EVENTS)
        .map(|i| delivery_key("warehouse", "stripe", "demo", &format!("evt_k{i}")))
        .collect();
    assert_eq!(keys, expected, "one row per event");
    let count = |sql: &'static str| {
        let client = &client;
        async move { client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert_eq!(
        count("SELECT count(*) FROM einmal_events").await,
        EVENTS as i64
    );
    assert_eq!(
        count("SELECT count(*) FROM einmal_applied").await,
        EVENTS as i64
    );
    drop(server);
}

/// A malformed DSN is a configuration error: `serve` stops at start with exit 4,
/// naming the destination, never printing the password.
#[test]
fn a_malformed_postgres_dsn_stops_serve_with_exit_4_naming_it() {
    let files = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = config_with(
        files.path(),
        "\n[[destination]]\nname = \"warehouse\"\ntenant = \"demo\"\nkind = \"postgres\"\n\
         events = [\"*\"]\ndsn = \"host=127.0.0.1 port=abc password=hunter2-secret\"\ntable = \"events\"\n",
    );
    let out = einmal(&[
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--data-dir",
        data.path().to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(4));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warehouse") && stderr.contains("dsn"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// SIGHUP reloads the configuration: a destination added there receives the events
/// that come after, signed with its secret, and a destination's rotated secret signs
/// its deliveries from then on, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_a_destination_and_rotates_a_secret_without_a_restart() {
    let old_secret = "whsec_QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=";
    let shop = DestinationServer::start(|_, _| Answer::Ok).await;
    let crm = DestinationServer::start(|_, _| Answer::Ok).await;
    let data = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let config = config_with(
        files.path(),
        &http_destination("shop", &shop.url, old_secret),
    );
    let server = Server::start(data.path(), &config);
    let (url, dir) = (server.url.clone(), files.path().to_path_buf());
    let send = |i: usize| {
        let (url, dir, cfg) = (url.clone(), dir.clone(), config.clone());
        tokio::task::spawn_blocking(move || send_stripe(&url, &dir, &cfg, i))
    };
    send(0).await.unwrap();
    // Signed with the old secret, which the shop no longer accepts (401, no effect).
    wait_for(|| !shop.calls().is_empty(), "the first event at shop").await;
    assert!(shop.calls().iter().all(|c| !c.verified));
    assert!(shop.effects().is_empty());

    // The shop's secret rotated, a second destination added; then SIGHUP.
    config_with(
        files.path(),
        &format!(
            "{}{}",
            http_destination("shop", &shop.url, SECRET),
            http_destination("crm", &crm.url, SECRET)
        ),
    );
    server.hangup();
    // The reload is logged, not acknowledged: send until the new set is in force.
    let mut i = 1;
    while crm.effects().is_empty() {
        assert!(i < 50, "the added destination never received an event");
        send(i).await.unwrap();
        i += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let last = format!("evt_k{}", i - 1);
    let shop_key = delivery_key("shop", "stripe", "demo", &last);
    let crm_key = delivery_key("crm", "stripe", "demo", &last);
    wait_for(
        || shop.effects().contains_key(&shop_key) && crm.effects().contains_key(&crm_key),
        "the last event at both",
    )
    .await;
    assert!(
        shop.effects()[&shop_key].verified,
        "the rotated secret signs"
    );
    assert!(crm.effects()[&crm_key].verified);
    assert!(crm.calls().iter().all(|c| c.verified));
    drop(server);
}

async fn wait_for(done: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Run `einmal` with `args` against the data dir, expecting success; its stdout.
fn ok(args: &[&str], data: &Path) -> String {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--data-dir", data.to_str().unwrap()]);
    let out = einmal(&all);
    assert!(
        out.status.success(),
        "einmal {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A destination that refuses for good (410 Gone, with a terminal escape in its
/// answer): the event is processed (`ignored` by the demo domain), its delivery
/// dead-lettered. `dlq list` shows the
/// delivery (escaped), `events list --delivery-state dead_letter` the event; once the
/// destination is fixed, a replay delivers it exactly once and both listings are empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_delivery_is_listed_and_a_replay_delivers_it_once_fixed() {
    let fixed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let destination = DestinationServer::start({
        let fixed = fixed.clone();
        move |_, _| match fixed.load(std::sync::atomic::Ordering::SeqCst) {
            true => Answer::Ok,
            false => Answer::Status(410, "gone \u{1b}[2J for good"),
        }
    })
    .await;
    let data = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let config = config_with_destination(files.path(), &destination.url);
    let server = Server::start(data.path(), &config);
    let (url, dir, cfg) = (
        server.url.clone(),
        files.path().to_path_buf(),
        config.clone(),
    );
    tokio::task::spawn_blocking(move || send_stripe(&url, &dir, &cfg, 900))
        .await
        .unwrap();
    let d = data.path();
    let show = ["events", "show", "--provider", "stripe", "--tenant", "demo"];
    let show: Vec<&str> = show.into_iter().chain(["--event-id", "evt_k900"]).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = ok(&show, d);
        if text.contains("delivery shop dead_letter") {
            // Processed (the demo domain ignores customer events): no dead letter.
            assert!(text.starts_with("stripe#demo#evt_k900  ignored"), "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "never dead-lettered: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // dlq list: no dead-lettered event, one dead-lettered delivery, escaped.
    let text = ok(&["dlq", "list"], d);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    let line = lines[0];
    assert!(
        line.starts_with("stripe#demo#evt_k900  delivery shop "),
        "{line}"
    );
    assert!(line.contains("attempts=1 status=410"), "{line}");
    assert!(line.contains("gone"), "{line}");
    assert!(
        !line.contains('\u{1b}'),
        "the answer's escape reached the terminal: {line:?}"
    );
    assert_eq!(
        ok(&["dlq", "list", "--events"], d),
        "",
        "no event is dead-lettered"
    );
    assert_eq!(ok(&["dlq", "list", "--destination", "other"], d), "");
    let listed: serde_json::Value =
        serde_json::from_str(&ok(&["dlq", "list", "--json"], d)).unwrap();
    let entries = listed.as_array().unwrap();
    assert_eq!(entries.len(), 1, "{listed}");
    let entry = &entries[0];
    assert_eq!(entry["kind"], "delivery");
    assert_eq!(entry["id"], "stripe#demo#evt_k900");
    assert_eq!(entry["destination"], "shop");
    assert_eq!(entry["event_state"], "ignored");
    assert_eq!(entry["state"], "dead_letter");
    assert_eq!(entry["attempts"], 1);
    assert_eq!(entry["last_status"], 410);
    let reason = entry["reason"].as_str().unwrap();
    assert!(
        reason.contains("gone") && !reason.contains('\u{1b}'),
        "{reason}"
    );
    assert!(reason.chars().count() <= 130, "bounded: {reason}");

    // events list --delivery-state: the processed event, with the delivery.
    let text = ok(&["events", "list", "--delivery-state", "dead_letter"], d);
    assert!(text.starts_with("stripe#demo#evt_k900  ignored"), "{text}");
    assert!(text.contains("\n  delivery shop dead_letter"), "{text}");
    let shop = [
        "events",
        "list",
        "--delivery-state",
        "dead_letter",
        "--destination",
    ];
    let with = |name| -> Vec<&str> { shop.iter().copied().chain([name]).collect() };
    assert!(ok(&with("shop"), d).contains("evt_k900"));
    assert_eq!(ok(&with("other"), d), "");
    assert_eq!(
        ok(&["events", "list", "--delivery-state", "pending"], d),
        ""
    );
    assert_eq!(
        ok(&["events", "list", "--state", "dead_letter"], d),
        "",
        "the event itself is no dead letter"
    );

    // Fixed, replayed (audited): delivered once, listed nowhere.
    fixed.store(true, std::sync::atomic::Ordering::SeqCst);
    let replay = [
        "replay",
        "--provider",
        "stripe",
        "--tenant",
        "demo",
        "--event-id",
        "evt_k900",
    ];
    let replay: Vec<&str> = replay
        .into_iter()
        .chain(["--reason", "destination fixed", "--actor", "ops"])
        .collect();
    assert!(ok(&replay, d).contains("redelivered"));
    let key = delivery_key("shop", "stripe", "demo", "evt_k900");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ok(&show, d).contains("delivery shop delivered") {
        assert!(Instant::now() < deadline, "the replay was never delivered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(destination.effects().len(), 1);
    assert!(destination.effects().contains_key(&key));
    assert_eq!(ok(&["dlq", "list"], d), "");
    assert_eq!(
        ok(&["events", "list", "--delivery-state", "dead_letter"], d),
        ""
    );
    drop(server);
}
