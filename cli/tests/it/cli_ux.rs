//! What a user of the `einmal` binary relies on, through the real binary with its
//! output piped (as in a script or CI log): no progress redraws off a terminal, a dry
//! run that says "would", one exit code per kind of failure, `--json` errors, a
//! mistyped --data-dir refused, completions and the man page, `einmal setup`.

use crate::common;

use common::{einmal, repo};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
use einmal::config_source::ConfigSource;
use einmal::pipeline::ingest::Ingestor;
use einmal_tests::scenario::{self, stripe_event, TENANT};
use serde_json::{json, Value};

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The one JSON error object `--json` prints on stderr.
fn json_error(o: &Output) -> Value {
    serde_json::from_str(stderr(o).trim())
        .unwrap_or_else(|e| panic!("stderr is not one JSON object ({e}): {}", stderr(o)))
}

/// `n` Stripe events stored and enqueued (state `queued`) in a store in `dir`.
async fn ingest(dir: &Path, n: usize) {
    let store = Arc::new(EmbeddedStore::open(dir, EmbeddedOptions::default()).unwrap());
    let config = scenario::config();
    let ingestor = Ingestor::from_store(ConfigSource::fixed(config.clone()), store);
    for i in 0..n {
        let event = stripe_event(
            "payment_intent.succeeded",
            &format!("evt_ux_{i}"),
            1_700_000_000 + i as i64,
            json!({"id": format!("pi_{i}"), "object": "payment_intent", "metadata": {"order_id": format!("o{i}")}}),
        );
        let response = ingestor
            .ingest("stripe", TENANT, &event.request(&config))
            .await;
        assert_eq!(response.status, 200, "{response:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_piped_bulk_replay_draws_no_progress_and_a_dry_run_says_would() {
    let dir = tempfile::tempdir().unwrap();
    ingest(dir.path(), 40).await;
    let data_dir = dir.path().to_str().unwrap();
    let bulk = |extra: &[&str]| {
        let mut args = vec![
            "replay",
            "--bulk",
            "--reason",
            "ux test",
            "--actor",
            "ops-ux",
            "--data-dir",
            data_dir,
        ];
        args.extend_from_slice(extra);
        einmal(&args)
    };

    let dry = bulk(&["--dry-run"]);
    assert!(dry.status.success(), "{}{}", stdout(&dry), stderr(&dry));
    for out in [stdout(&dry), stderr(&dry)] {
        assert!(!out.contains('\r'), "a redraw off a terminal: {out:?}");
    }
    assert!(stderr(&dry).is_empty(), "{}", stderr(&dry));
    let summary = stdout(&dry);
    assert!(summary.contains("would replay 40"), "{summary}");
    assert!(!summary.contains("replayed="), "{summary}");

    let real = bulk(&[]);
    assert!(real.status.success(), "{}{}", stdout(&real), stderr(&real));
    assert!(!stdout(&real).contains('\r') && !stderr(&real).contains('\r'));
    assert!(stderr(&real).is_empty(), "{}", stderr(&real));
    assert!(stdout(&real).contains("replayed=40"), "{}", stdout(&real));
    assert!(!stdout(&real).contains("would"), "{}", stdout(&real));

    // The same through --json: one JSON document on stdout, nothing on stderr.
    let dry = bulk(&["--dry-run", "--json"]);
    let report: Value = serde_json::from_slice(&dry.stdout).expect("JSON report");
    assert_eq!(report["summary"]["dry_run"], true);
    assert_eq!(report["summary"]["replayed"], 40);
    assert!(stderr(&dry).is_empty(), "{}", stderr(&dry));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_of_failure_has_its_exit_code_and_json_error() {
    let dir = tempfile::tempdir().unwrap();
    ingest(dir.path(), 1).await;
    let data_dir = dir.path().to_str().unwrap();

    // 0: found, and with the global --json before the subcommand the data is JSON.
    let out = einmal(&["--json", "events", "list", "--data-dir", data_dir]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let items: Value = serde_json::from_slice(&out.stdout).expect("JSON list");
    assert_eq!(items.as_array().map(Vec::len), Some(1));

    // 2: usage, from clap and from the command's own checks.
    let out = einmal(&["events", "list", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--no-such-flag"), "{}", stderr(&out));
    let out = einmal(&["--json", "events", "list", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
    let err = json_error(&out);
    assert_eq!(err["error"]["code"], "usage");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--no-such-flag"),
        "{err}"
    );
    let out = einmal(&[
        "replay",
        "--bulk",
        "--reason",
        " ",
        "--json",
        "--data-dir",
        data_dir,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(json_error(&out)["error"]["code"], "usage");

    // 3: not found, an event and an order.
    let show = |json: bool| {
        let mut args = vec![
            "events",
            "show",
            "--provider",
            "stripe",
            "--tenant",
            TENANT,
            "--event-id",
            "evt_nope",
            "--data-dir",
            data_dir,
        ];
        if json {
            args.push("--json");
        }
        einmal(&args)
    };
    let out = show(false);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no event stripe#"),
        "{}",
        stderr(&out)
    );
    let out = show(true);
    assert_eq!(out.status.code(), Some(3));
    let err = json_error(&out);
    assert_eq!(err["error"]["code"], "not_found");
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let out = einmal(&[
        "orders",
        "show",
        "--tenant",
        TENANT,
        "o-nope",
        "--data-dir",
        data_dir,
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));

    // 4: failure: the AWS backend without its names fails before any AWS call.
    let out = Command::new(env!("CARGO_BIN_EXE_einmal"))
        .args(["--json", "events", "list", "--backend", "aws"])
        .env_remove("EINMAL_INBOX_TABLE")
        .env_remove("EINMAL_QUEUE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let err = json_error(&out);
    assert_eq!(err["error"]["code"], "failure");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("EINMAL_INBOX_TABLE"),
        "{err}"
    );

    // 1: the command ran and the answer is no: a replay of a missing event.
    let out = einmal(&[
        "replay",
        "--provider",
        "stripe",
        "--tenant",
        TENANT,
        "--event-id",
        "evt_nope",
        "--reason",
        "check",
        "--actor",
        "ops",
        "--data-dir",
        data_dir,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));

    // The codes are documented in --help.
    let help = einmal(&["--help"]);
    assert!(help.status.success());
    for line in ["Exit codes:", "2  usage", "3  not found", "4  failure"] {
        assert!(stdout(&help).contains(line), "{line}: {}", stdout(&help));
    }
}

/// `--backend aws` with every name set but no credentials anywhere: the message names
/// the variables to set (not the SDK's error), exit 2 (usage), before any AWS call.
#[test]
fn the_aws_backend_without_credentials_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "").unwrap();
    let run = |json: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_einmal"));
        if json {
            command.arg("--json");
        }
        for var in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AWS_DEFAULT_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_ROLE_ARN",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        ] {
            command.env_remove(var);
        }
        command
            .args(["events", "list", "--backend", "aws"])
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_CONFIG_FILE", &empty)
            .env("AWS_SHARED_CREDENTIALS_FILE", &empty)
            .env("AWS_REGION", "us-east-1")
            // Nothing listens there: a call made anyway would fail otherwise.
            .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
            .env("EINMAL_INBOX_TABLE", "einmal")
            .env("EINMAL_QUEUE_URL", "http://127.0.0.1:9/123456789012/einmal")
            .env(
                "EINMAL_DLQ_URL",
                "http://127.0.0.1:9/123456789012/einmal-dlq",
            )
            .output()
            .unwrap()
    };
    let expected = "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
                    (moto accepts any), or AWS_PROFILE";
    let out = run(false);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stderr(&out).trim(), format!("einmal: {expected}"));
    let out = run(true);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = json_error(&out);
    assert_eq!(err["error"]["code"], "usage");
    assert_eq!(err["error"]["message"], expected);
}

#[test]
fn a_data_dir_that_does_not_exist_is_an_error_not_a_new_store() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("einmal-dta");
    let typo_str = typo.to_str().unwrap();
    for args in [
        vec!["events", "list", "--data-dir", typo_str],
        vec!["dlq", "list", "--data-dir", typo_str],
        vec!["audit", "list", "--data-dir", typo_str],
        vec![
            "inventory",
            "show",
            "--tenant",
            "demo",
            "SKU",
            "--data-dir",
            typo_str,
        ],
        vec![
            "replay",
            "--bulk",
            "--reason",
            "r",
            "--dry-run",
            "--data-dir",
            typo_str,
        ],
    ] {
        let out = einmal(&args);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(typo_str), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("einmal setup"),
            "a hint: {}",
            stderr(&out)
        );
        assert!(!typo.exists(), "{args:?} created {typo_str}");
    }

    // `einmal setup` creates it (then reports it exists), and the commands read it.
    let out = einmal(&["setup", "--data-dir", typo_str]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("created"), "{}", stdout(&out));
    let out = einmal(&["setup", "--data-dir", typo_str]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("exists"), "{}", stdout(&out));
    let out = einmal(&["events", "list", "--json", "--data-dir", typo_str]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        json!([])
    );
}

const SUBCOMMANDS: &[&str] = &[
    "serve",
    "listen",
    "config",
    "reconcile",
    "send",
    "events",
    "orders",
    "inventory",
    "dlq",
    "replay",
    "audit",
    "setup",
    "completions",
    "man",
];

#[test]
fn completions_name_every_subcommand_and_parse_in_their_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = einmal(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell} completion lacks {sub}");
        }
    }
    // The bash script parses and registers its completion function.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("einmal.bash");
    std::fs::write(&script, einmal(&["completions", "bash"]).stdout).unwrap();
    let check = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p einmal", script.display()))
        .output()
        .expect("bash runs");
    assert!(check.status.success(), "{}", stderr(&check));
    assert!(stdout(&check).contains("einmal"), "{}", stdout(&check));
    let out = einmal(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_man_page_is_roff_naming_every_subcommand() {
    let out = einmal(&["man"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = stdout(&out);
    assert!(page.starts_with(".ie") || page.starts_with(".TH"), "{page}");
    assert!(page.contains(".TH einmal 1"), "{page}");
    assert!(page.contains(".SH SUBCOMMANDS"), "{page}");
    for sub in SUBCOMMANDS {
        assert!(
            page.contains(&format!("einmal\\-{sub}(1)")),
            "man page lacks {sub}"
        );
    }
    assert!(page.contains("Exit codes"), "{page}");
    // `man` itself renders it when installed (Debian's man-db reads a file with -l).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("einmal.1");
    std::fs::write(&file, &out.stdout).unwrap();
    if let Ok(rendered) = Command::new("man")
        .arg("-l")
        .arg(&file)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
    {
        if rendered.status.success() {
            assert!(
                stdout(&rendered).contains("SUBCOMMANDS"),
                "{}",
                stdout(&rendered)
            );
        }
    }
    // One page per command into a directory.
    let out = einmal(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    for page in [
        "einmal.1",
        "einmal-serve.1",
        "einmal-replay.1",
        "einmal-events-list.1",
    ] {
        assert!(dir.path().join(page).is_file(), "{page}");
    }
}

/// `einmal serve` on a free port with a new store; killed on drop.
struct Serve {
    child: std::process::Child,
    addr: String,
    dir: tempfile::TempDir,
}

impl Serve {
    fn start() -> Serve {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_einmal"))
            .args(["serve", "--addr", &addr, "--data-dir"])
            .arg(dir.path().join("store"))
            .current_dir(repo())
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("serve starts");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "einmal serve did not listen"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Serve { child, addr, dir }
    }

    /// One HTTP/1.1 request; the status and the body.
    fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.addr).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut resp = Vec::new();
        let _ = s.read_to_end(&mut resp);
        let text = String::from_utf8_lossy(&resp).into_owned();
        let status = text.split(' ').nth(1).unwrap().parse().unwrap();
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (status, body.to_string())
    }

    fn send(&self, extra: &[&str]) -> Output {
        let url = format!("http://{}", self.addr);
        let mut args = vec![
            "send",
            "--provider",
            "stripe",
            "--tenant",
            "demo",
            "--url",
            &url,
        ];
        args.extend_from_slice(extra);
        einmal(&args)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = &self.dir;
    }
}

/// The value of the sample `name` (no labels) in an exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
fn serve_exposes_the_emf_catalogue_at_metrics_in_prometheus_text() {
    let serve = Serve::start();
    assert!(serve.send(&[]).status.success());
    assert!(stdout(&serve.send(&[])).contains("\"duplicate\":true"));
    // With --json, send prints the status and the answer as one JSON object.
    let second = serve.send(&["--event-id", "evt_metrics_2", "--json"]);
    assert!(second.status.success(), "{}", stderr(&second));
    let answer: Value = serde_json::from_slice(&second.stdout).expect("JSON");
    assert_eq!(answer["status"], 200, "{answer}");
    assert_eq!(answer["response"]["duplicate"], false, "{answer}");
    // No signature: refused and counted.
    let (status, _) = serve.request("POST", "/webhooks/stripe/demo", "{\"id\":\"evt_x\"}");
    assert!((400..500).contains(&status), "a 4xx: {status}");

    // The worker's figures arrive when it has processed both events.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let text = loop {
        let (status, text) = serve.request("GET", "/metrics", "");
        assert_eq!(status, 200, "{text}");
        let done = sample(&text, "einmal_events_completed_total").unwrap_or(0.0)
            + sample(&text, "einmal_events_ignored_total").unwrap_or(0.0);
        // The backlog gauges are read from the store at most every few seconds.
        if done >= 2.0 && sample(&text, "einmal_pending_items") == Some(0.0) {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not processed: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(
        sample(&text, "einmal_webhooks_accepted_total"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "einmal_webhooks_duplicate_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "einmal_signature_failures_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "einmal_dead_letters_total"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "einmal_processing_time_milliseconds_count"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(sample(&text, "einmal_pending_items"), Some(0.0), "{text}");
    assert_eq!(
        sample(&text, "einmal_oldest_pending_age_seconds"),
        Some(0.0),
        "{text}"
    );
    for line in [
        "# HELP einmal_webhooks_accepted WebhooksAccepted",
        "# TYPE einmal_webhooks_accepted counter",
        "# TYPE einmal_processing_time_milliseconds histogram",
        "# TYPE einmal_pending_items gauge",
        "# TYPE einmal_oldest_pending_age_seconds gauge",
        "# TYPE einmal_payment_within_slo histogram",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
    // Counters only grow: a second scrape with nothing new reads the same.
    let (_, again) = serve.request("GET", "/metrics", "");
    assert_eq!(
        sample(&again, "einmal_webhooks_accepted_total"),
        Some(2.0),
        "{again}"
    );
}

#[test]
fn the_commands_that_print_data_print_json_with_json() {
    let out = einmal(&["--json", "config", "check"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["valid"], true, "{report}");
    assert!(report["tenants"].as_u64().unwrap() > 0, "{report}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[tenant]]\nprovider = \"shopify\"\ntenant = \"t\"\nsecrets = [\"s\"]\noptions = { shop_domian = \"x\" }\n",
    )
    .unwrap();
    let out = einmal(&[
        "config",
        "check",
        "--json",
        "--config",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["valid"], false, "{report}");
    assert!(
        report["problems"].to_string().contains("shop_domain"),
        "{report}"
    );

    let data_dir = dir.path().to_str().unwrap();
    let out = einmal(&[
        "--json",
        "inventory",
        "set",
        "--tenant",
        "demo",
        "SKU-RED-M",
        "--on-hand",
        "7",
        "--data-dir",
        data_dir,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let set: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(set, json!({"sku": "SKU-RED-M", "on_hand": 7}));
}
