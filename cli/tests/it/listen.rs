//! `einmal listen` through the real binary: a local axum app receives what `einmal
//! send` posted, signed with the secret `listen` printed first, and `listen` prints a
//! line naming the delivered event.

use crate::common;

use common::{http, http_host, repo};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;

use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;

type Received = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;

/// Kills `einmal listen` however the test ends.
struct Listening(Child);

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Poll `f` until it yields, failing with `what` after a generous deadline (a wait
/// for an outcome, not a timing assertion).
async fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `einmal listen` forwarding `payment_intent.*` to the app on `app_port`: the process,
/// its stdout lines after the first, the secret that first line printed, its address.
async fn start_listen(
    app_port: u16,
    data_dir: &tempfile::TempDir,
) -> (Listening, mpsc::Receiver<String>, String, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_einmal"))
        .args(["listen", "--forward-to"])
        .arg(format!("http://localhost:{app_port}/webhooks"))
        .args([
            "--events",
            "payment_intent.*",
            "--addr",
            &addr,
            "--data-dir",
        ])
        .arg(data_dir.path())
        .current_dir(repo())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("listen starts");
    let stdout = child.stdout.take().unwrap();
    let listening = Listening(child);
    let (lines_tx, lines) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = lines
        .recv_timeout(Duration::from_secs(60))
        .expect("listen prints its secret first");
    let secret = first
        .strip_prefix("Ready! Your webhook signing secret is ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_string();
    assert!(secret.starts_with("whsec_"), "{first}");
    wait_for("einmal listen to accept connections", || {
        std::net::TcpStream::connect(&addr).ok()
    })
    .await;
    (listening, lines, secret, addr)
}

/// The local app: records every request and answers with `answer(n)` for the n-th.
async fn start_app(answer: fn(usize) -> u16) -> (u16, Received) {
    let received: Received = Arc::default();
    let app = Router::new()
        .route(
            "/webhooks",
            post(
                move |State(seen): State<Received>, headers: HeaderMap, body: Bytes| async move {
                    let mut seen = seen.lock().unwrap();
                    seen.push((headers, body));
                    axum::http::StatusCode::from_u16(answer(seen.len())).unwrap()
                },
            ),
        )
        .with_state(received.clone());
    let app_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app_port = app_listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(app_listener, app).await.unwrap() });
    (app_port, received)
}

fn send(addr: &str, event_id: &str) {
    let sent = Command::new(env!("CARGO_BIN_EXE_einmal"))
        .args(["send", "--provider", "stripe", "--tenant", "demo"])
        .args(["--event-id", event_id, "--url"])
        .arg(format!("http://{addr}"))
        .current_dir(repo())
        .output()
        .expect("send runs");
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_forwards_a_sent_event_signed_with_the_printed_secret() {
    let (app_port, received) = start_app(|_| 200).await;
    let data_dir = tempfile::tempdir().unwrap();
    let (_listening, lines, secret, addr) = start_listen(app_port, &data_dir).await;
    send(&addr, "evt_listen_1");

    let (headers, body) = wait_for("the app to receive the event", || {
        received.lock().unwrap().first().cloned()
    })
    .await;
    standardwebhooks::Webhook::new(&secret)
        .unwrap()
        .verify(&body, &headers)
        .expect("the app verifies the delivery with the printed secret");
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(event["id"], "evt_listen_1");
    assert_eq!(headers["einmal-event-id"], "evt_listen_1");
    assert_eq!(headers["einmal-event-type"], "payment_intent.succeeded");

    let line = wait_for("listen's line for the delivery", || {
        lines.try_iter().find(|l| l.contains("evt_listen_1"))
    })
    .await;
    assert!(
        line.contains("stripe/demo  payment_intent.succeeded  evt_listen_1  --> [200]"),
        "{line}"
    );

    // `listen`'s console: `/console/` leads to it, a foreign Host name is refused.
    let slash = http("GET", &addr, "/console/", &[], "");
    assert_eq!(slash.status, 303, "{}", slash.head);
    assert!(
        slash
            .head
            .lines()
            .any(|l| l.eq_ignore_ascii_case("location: /console")),
        "{}",
        slash.head
    );
    assert_eq!(http("GET", &addr, "/console", &[], "").status, 200);
    let port = addr.rsplit(':').next().unwrap();
    let rebound = http_host(
        "GET",
        &addr,
        &format!("attacker.example:{port}"),
        "/console",
        &[],
        "",
    );
    assert_eq!(rebound.status, 421, "{}", rebound.head);
}

/// An app that answers 400 (the handler being fixed) gets the event again instead of
/// the event being dead-lettered: the second attempt's 200 delivers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_retries_an_event_the_app_answered_400() {
    let (app_port, received) = start_app(|n| if n == 1 { 400 } else { 200 }).await;
    let data_dir = tempfile::tempdir().unwrap();
    let (_listening, lines, _secret, addr) = start_listen(app_port, &data_dir).await;
    send(&addr, "evt_listen_400");
    let mut seen = Vec::new();
    let delivered = wait_for("the retried delivery's 200", || {
        seen.extend(lines.try_iter().filter(|l| l.contains("evt_listen_400")));
        seen.iter().find(|l| l.contains("--> [200]")).cloned()
    })
    .await;
    assert!(
        seen[0].contains("--> [retryable (status 400)"),
        "the first attempt is retryable: {seen:?}"
    );
    assert!(delivered.contains("evt_listen_400"));
    let bodies = received.lock().unwrap().len();
    assert!(bodies >= 2, "the app got it again after its 400: {bodies}");
}
