//! `einmal serve` against hostile clients, through the real binary on a free port:
//! header trickling, idle keep-alive, slow and oversized bodies, broken framing,
//! undecodable paths, too many connections, and SIGTERM. The server runs with short
//! timeouts (flags) so no test sleeps long; every wait is bounded by a generous
//! [`GUARD`] that only a hang would reach, never a figure being measured.

use crate::common;

use common::repo;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Upper bound for anything to happen; a healthy run takes milliseconds.
const GUARD: Duration = Duration::from_secs(5);

struct Server {
    child: Child,
    addr: String,
    data_dir: tempfile::TempDir,
    stderr: PathBuf,
}

impl Server {
    fn start(flags: &[&str]) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data_dir = tempfile::tempdir().unwrap();
        let stderr = data_dir.path().join("serve.stderr");
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_einmal"))
            .args(["serve", "--addr", &addr, "--data-dir"])
            .arg(data_dir.path().join("store"))
            .args(flags)
            .current_dir(repo())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("serve starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "einmal serve did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server {
            child,
            addr,
            data_dir,
            stderr,
        }
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(GUARD)).unwrap();
        s
    }

    /// Every inbox item the store holds.
    fn stored(&self) -> Vec<serde_json::Value> {
        let out = Command::new(env!("CARGO_BIN_EXE_einmal"))
            .args(["events", "list", "--json", "--data-dir"])
            .arg(self.data_dir.path().join("store"))
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Read until the server closes the connection (EOF or reset); panics on [`GUARD`].
fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
            Err(e) => panic!("the server kept the connection open: {e}"),
        }
    }
}

/// Status and JSON body of one response (the whole stream up to its close).
fn parse(raw: &[u8]) -> (u16, serde_json::Value) {
    let text = String::from_utf8_lossy(raw);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP response: {text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "not JSON: {text:?}"
    );
    (status, serde_json::from_str(body).unwrap())
}

/// One raw request on a fresh connection, read to the close.
fn exchange(server: &Server, raw: &[u8]) -> (u16, serde_json::Value) {
    let mut s = server.connect();
    s.write_all(raw).unwrap();
    parse(&read_until_closed(&mut s))
}

#[test]
fn a_trickled_request_head_is_cut_off_after_the_header_timeout() {
    let server = Server::start(&["--header-read-timeout-ms", "300"]);
    let mut s = server.connect();
    s.write_all(b"POST /webhooks/stripe/demo HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    let answer = read_until_closed(&mut s);
    assert!(
        !String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 2"),
        "{answer:?}"
    );
    assert!(server.stored().is_empty());
}

#[test]
fn an_idle_keep_alive_connection_is_closed() {
    let server = Server::start(&["--header-read-timeout-ms", "300"]);
    let mut s = server.connect();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 17];
    s.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200 OK\r\n");
    // The connection stays usable for keep-alive, then idles out.
    read_until_closed(&mut s);
}

#[test]
fn a_slow_body_gets_408_and_nothing_is_stored() {
    let server = Server::start(&["--body-timeout-ms", "300"]);
    let mut s = server.connect();
    s.write_all(
        b"POST /webhooks/stripe/demo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":",
    )
    .unwrap();
    let (status, body) = parse(&read_until_closed(&mut s));
    assert_eq!(status, 408);
    assert_eq!(body["error"], "request_timeout");
    assert!(server.stored().is_empty());
}

#[test]
fn a_declared_length_over_the_limit_is_refused_before_the_body() {
    let server = Server::start(&[]);
    // No body byte is ever sent: the answer cannot depend on reading it.
    let (status, body) = exchange(
        &server,
        b"POST /webhooks/stripe/demo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n",
    );
    assert_eq!(status, 413);
    assert_eq!(body["error"], "payload_too_large");
    assert!(server.stored().is_empty());
}

#[test]
fn malformed_framing_and_undecodable_paths_get_json_errors() {
    let server = Server::start(&[]);
    let cases: &[(&str, &[u8], u16)] = &[
        (
            "a header line without a colon",
            b"POST /webhooks/stripe/demo HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
            400,
        ),
        (
            "a non-numeric Content-Length",
            b"POST /webhooks/stripe/demo HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n",
            400,
        ),
        (
            "not HTTP at all",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
            400,
        ),
        (
            "a raw non-ASCII byte in the path",
            b"POST /webhooks/str\xffipe/demo HTTP/1.1\r\nHost: x\r\n\r\n",
            400,
        ),
        (
            "a percent-encoded path that is not UTF-8",
            b"POST /webhooks/%FF%FE/demo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            400,
        ),
        (
            "a broken chunked body",
            b"POST /webhooks/stripe/demo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
            400,
        ),
        (
            "a method /healthz does not take",
            b"DELETE /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            405,
        ),
    ];
    for (what, raw, expected) in cases {
        let (status, body) = exchange(&server, raw);
        assert_eq!(status, *expected, "{what}: {body}");
        assert!(body["error"].is_string(), "{what}: {body}");
    }
    assert!(server.stored().is_empty());
}

#[test]
fn connections_over_the_limit_are_answered_503() {
    let server = Server::start(&["--max-connections", "2"]);
    // The readiness probe's connection (and a refused one) may still count until the
    // server notices its close: take a place again until it is granted.
    let deadline = Instant::now() + GUARD;
    let held: Vec<TcpStream> = (0..2)
        .map(|_| loop {
            let mut s = server.connect();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut line = [0u8; 17];
            s.read_exact(&mut line).unwrap();
            if &line == b"HTTP/1.1 200 OK\r\n" {
                break s;
            }
            assert!(Instant::now() < deadline, "no place: {line:?}");
            drop(s);
            std::thread::sleep(Duration::from_millis(20));
        })
        .collect();
    let (status, body) = exchange(&server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 503);
    assert_eq!(body["error"], "too_many_connections");
    // A closed connection frees its place (the server notices the close at once).
    drop(held);
    let deadline = Instant::now() + GUARD;
    loop {
        let mut s = server.connect();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let raw = read_until_closed(&mut s);
        if raw.starts_with(b"HTTP/1.1 200 ") {
            break;
        }
        assert!(Instant::now() < deadline, "no place freed: {raw:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_stops_gracefully_with_the_final_metrics_line() {
    let mut server = Server::start(&[]);
    // Something to count: an unknown route is a `not_found`.
    let (status, _) = exchange(
        &server,
        b"POST /webhooks/nope/demo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 404);
    let killed = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(exit) = server.child.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline, "serve ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = std::fs::read_to_string(&server.stderr).unwrap();
    assert!(exit.success(), "{exit:?}: {log}");
    let stopped = log
        .lines()
        .find_map(|l| l.strip_prefix("einmal: stopped; "))
        .unwrap_or_else(|| panic!("no final counters: {log}"));
    let counts: serde_json::Value = serde_json::from_str(stopped).unwrap();
    assert_eq!(counts["not_found"], 1);
    assert!(
        log.lines().any(|l| l.contains("\"metrics\"")),
        "no final metrics log line: {log}"
    );
}

#[test]
fn a_hint_over_the_tenants_limit_gets_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("einmal.toml");
    std::fs::write(
        &config,
        r#"
[[tenant]]
provider = "gopay"
tenant = "shop"
options = { path_token = "tok-1", access_token = "unused", max_hints_per_minute = "1" }
"#,
    )
    .unwrap();
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let hint = |id: u32| {
        format!("GET /webhooks/gopay/shop/tok-1?id={id} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    };
    let (status, _) = exchange(&server, hint(1).as_bytes());
    assert_eq!(status, 200);
    let mut s = server.connect();
    s.write_all(hint(2).as_bytes()).unwrap();
    let raw = read_until_closed(&mut s);
    let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    assert!(head.contains("\r\nretry-after: 60\r\n"), "{head}");
    let (status, body) = parse(&raw);
    assert_eq!(status, 429);
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(server.stored().len(), 1, "the refused hint stored nothing");
}

/// A signed Stripe delivery for the default configuration's `stripe/demo` tenant.
fn signed_stripe(event_id: &str, path: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"id":"{event_id}","object":"event","type":"payment_intent.succeeded","created":1700000000,"data":{{"object":{{"id":"pi_{event_id}","object":"payment_intent"}}}}}}"#
    );
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let mac = einmal::providers::sig::hmac_sha256(
        b"whsec_demo_stripe_secret",
        &[ts.as_bytes(), b".", body.as_bytes()],
    );
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nStripe-Signature: t={ts},v1={}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        hex::encode(mac),
        body.len()
    )
    .into_bytes()
}

#[test]
fn aliased_paths_and_extra_segments_are_refused_and_store_nothing() {
    let server = Server::start(&[]);
    // The genuine path is accepted (the deliveries below are signed alike).
    let (status, body) = exchange(
        &server,
        &signed_stripe("evt_alias_ok", "/webhooks/stripe/demo"),
    );
    assert_eq!(status, 200, "{body}");
    let huge = format!("/webhooks/stripe/{}", "d".repeat(20_000));
    for (n, path) in [
        "/webhooks/str%69pe/demo",
        "/webhooks/stripe/d%65mo",
        "/webhooks/stripe/demo/anything",
        "/webhooks/stripe/demo/a/b",
        huge.as_str(),
    ]
    .into_iter()
    .enumerate()
    {
        let (status, body) = exchange(&server, &signed_stripe(&format!("evt_alias_{n}"), path));
        assert_eq!(status, 404, "{}: {body}", &path[..path.len().min(40)]);
        assert_eq!(body["error"], "not_found");
    }
    let stored = server.stored();
    assert_eq!(stored.len(), 1, "only the genuine delivery: {stored:?}");
    // No log line takes the 20 kB segment whole.
    let log = std::fs::read_to_string(&server.stderr).unwrap();
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 2_048, "a log line of {longest} bytes");
}

/// A connection to `addr` from the local address `ip` (any of 127.0.0.0/8 is loopback
/// on Linux), so a test can play a second client.
fn connect_from(ip: &str, addr: &str) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let s = runtime
        .block_on(async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(format!("{ip}:0").parse().unwrap())?;
            let stream = socket.connect(addr.parse().unwrap()).await?;
            stream.into_std()
        })
        .expect("connect from a second loopback address");
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(GUARD)).unwrap();
    s
}

#[test]
fn a_peer_holding_its_connections_cannot_lock_out_another_peers_deliveries() {
    let server = Server::start(&["--max-connections-per-peer", "4", "--max-connections", "8"]);
    // Client A (127.0.0.1) holds as many keep-alive connections as it can get, and more.
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..12 {
        let mut s = server.connect();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut line = [0u8; 12];
        s.read_exact(&mut line).unwrap();
        match &line {
            b"HTTP/1.1 200" => held.push(s),
            b"HTTP/1.1 503" => refused += 1,
            other => panic!("{:?}", String::from_utf8_lossy(other)),
        }
    }
    assert!(held.len() <= 4, "A got {} connections", held.len());
    assert!(refused >= 8, "A was refused {refused} times");
    // Client B (127.0.0.2): every signed delivery is accepted and stored.
    let ids: Vec<String> = (0..10).map(|n| format!("evt_peer_b_{n}")).collect();
    for id in &ids {
        let mut s = connect_from("127.0.0.2", &server.addr);
        s.write_all(&signed_stripe(id, "/webhooks/stripe/demo"))
            .unwrap();
        let (status, body) = parse(&read_until_closed(&mut s));
        assert_eq!(status, 200, "{id}: {body}");
        assert_eq!(body["duplicate"], false, "{id}: {body}");
    }
    let stored = server.stored();
    for id in &ids {
        let key = format!("stripe#demo#{id}");
        assert!(stored.iter().any(|e| e["key"] == key), "{key} not stored");
    }
    drop(held);
}

#[test]
fn slow_large_bodies_beyond_the_memory_budget_get_503_and_the_server_serves_on() {
    let server = Server::start(&[
        "--max-body-bytes-in-flight",
        "2000000",
        "--body-timeout-ms",
        "1500",
    ]);
    // Eight slow 900 kB bodies at once: two fit the budget (and time out unfinished),
    // the other six are refused before a byte more is read, with Retry-After.
    let mut slow: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = server.connect();
            s.write_all(b"POST /webhooks/stripe/demo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 900000\r\n\r\n{\"id\":")
                .unwrap();
            s
        })
        .collect();
    let mut statuses = Vec::new();
    for s in &mut slow {
        let raw = read_until_closed(s);
        let (status, body) = parse(&raw);
        if status == 503 {
            assert_eq!(body["error"], "unavailable", "{body}");
            let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
            assert!(head.contains("\r\nretry-after: 5\r\n"), "{head}");
        }
        statuses.push(status);
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [408, 408, 503, 503, 503, 503, 503, 503]);
    // The budget is back: a genuine delivery is accepted.
    let (status, body) = exchange(
        &server,
        &signed_stripe("evt_after_budget", "/webhooks/stripe/demo"),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(server.stored().len(), 1);
}

/// `GET /metrics` on `addr` with an optional bearer token: status and body.
fn scrape(addr: &str, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(GUARD)).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let raw = String::from_utf8_lossy(&read_until_closed(&mut s)).into_owned();
    let status = raw.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
    (status, raw.split_once("\r\n\r\n").unwrap().1.to_owned())
}

/// The value of the sample `name` (no labels) in an exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
fn metrics_need_the_token_on_the_webhook_listener() {
    let token = "metrics-test-token-0123456789";
    let server = Server::start(&["--metrics-token", token]);
    let (status, _) = exchange(
        &server,
        &signed_stripe("evt_metrics_tok", "/webhooks/stripe/demo"),
    );
    assert_eq!(status, 200);
    let (status, body) = scrape(&server.addr, None);
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("einmal_"), "{body}");
    let (status, _) = scrape(&server.addr, Some("metrics-test-token-wrong-000"));
    assert_eq!(status, 401);
    let (status, text) = scrape(&server.addr, Some(token));
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        sample(&text, "einmal_webhooks_accepted_total"),
        Some(1.0),
        "{text}"
    );
    // A weak token stops the start.
    let weak = Command::new(env!("CARGO_BIN_EXE_einmal"))
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--metrics-token",
            "short",
            "--data-dir",
        ])
        .arg(server.data_dir.path().join("weak"))
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(!weak.status.success());
    assert!(String::from_utf8_lossy(&weak.stderr).contains("too short"));
}

#[test]
fn metrics_on_their_own_listener_are_absent_from_the_webhook_listener() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let server = Server::start(&["--metrics-addr", &metrics_addr]);
    let (status, _) = exchange(
        &server,
        &signed_stripe("evt_metrics_own", "/webhooks/stripe/demo"),
    );
    assert_eq!(status, 200);
    let (status, body) = scrape(&server.addr, None);
    assert_eq!(status, 404, "{body}");
    // Several scrapers at once all get the same, correct figures.
    let scrapers: Vec<_> = (0..8)
        .map(|_| {
            let addr = metrics_addr.clone();
            std::thread::spawn(move || scrape(&addr, None))
        })
        .collect();
    for scraper in scrapers {
        let (status, text) = scraper.join().unwrap();
        assert_eq!(status, 200, "{text}");
        assert_eq!(
            sample(&text, "einmal_webhooks_accepted_total"),
            Some(1.0),
            "{text}"
        );
        assert!(text.contains("# TYPE einmal_pending_items gauge"), "{text}");
    }
}
