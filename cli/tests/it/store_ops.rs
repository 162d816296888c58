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
