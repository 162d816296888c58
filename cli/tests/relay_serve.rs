//! `einmal serve` with an HTTP destination, killed with SIGKILL while deliveries are
//! in flight and restarted: every event is delivered, every call verifies with the
//! `standardwebhooks` crate, and the destination's dedup on `webhook-id` yields
//! exactly one effect per event. `einmal events show` prints the deliveries. A bad
//! destination stops `serve` at start, naming it.

mod common;

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
    let mut toml = std::fs::read_to_string(repo().join("einmal.toml")).unwrap();
    toml.push_str(&format!(
        "\n[[destination]]\nname = \"shop\"\ntenant = \"demo\"\nprovider = \"stripe\"\nkind = \"http\"\n\
         events = [\"customer.*\"]\nurl = \"{url}\"\nsecrets = [\"{SECRET}\"]\ntimeout_ms = 5000\n"
    ));
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
