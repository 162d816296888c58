//! Each Lambda function starts under `cargo lambda watch` (host target, debug, the
//! workspace's own `target/`) and answers its sample event from `events/`, against moto:
//!
//! - receiver: every `events/apigw/*.json`, re-signed at the current time
//!   (`regenerate-events --now`), answers 200 `accepted`, and each provider's inbox item
//!   is in moto's table;
//! - processor: `events/sqs/batch.json` (as checked in) answers a partial batch response
//!   (`batchItemFailures`, naming only records of the batch), and the Stripe item it
//!   points at was claimed (no longer `received`);
//! - sweeper, reconciler: `events/schedule/*.json` answer their JSON reports.
//!
//! cargo-lambda comes from `$EINMAL_CARGO_LAMBDA` (path of the `cargo-lambda` binary),
//! else `cargo-lambda` on PATH. Without it the test is skipped with a message, unless
//! `CI` or `EINMAL_REQUIRE_CARGO_LAMBDA` is set: then it fails, saying so.
//! Every process started here (moto, `cargo lambda watch` with its cargo and function
//! children, each `cargo lambda invoke`) runs in its own process group and is killed
//! by group when the test ends, passes or fails.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use einmal::adapters::aws::create_state_table;
use einmal::adapters::aws::AwsStore;
use einmal::ports::{Inbox, InboxState};
use einmal_tests::fixtures::all_items;
use einmal_tests::moto::{aws_store, unique_name, Moto};
use serde_json::Value;

/// Path of the `cargo-lambda` binary (else `cargo-lambda` on PATH).
const CARGO_LAMBDA_ENV: &str = "EINMAL_CARGO_LAMBDA";
/// Set (like `CI`) to fail instead of skipping when cargo-lambda is missing.
const REQUIRE_ENV: &str = "EINMAL_REQUIRE_CARGO_LAMBDA";
/// The first invocation of each function compiles it (and may wait for the cargo lock
/// while other builds run).
pub(crate) const FIRST_INVOKE_TIMEOUT: Duration = Duration::from_secs(20 * 60);
const INVOKE_TIMEOUT: Duration = Duration::from_secs(90);

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests crate lives in the workspace")
        .to_path_buf()
}

fn cargo_lambda() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(CARGO_LAMBDA_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{CARGO_LAMBDA_ENV}={} is not a file",
            path.display()
        );
        return Some(path);
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join("cargo-lambda"))
        .find(|p| p.is_file())
}

/// A process group we started; killed (TERM, then KILL) on drop.
pub(crate) struct Group {
    what: &'static str,
    child: Child,
}

impl Group {
    pub(crate) fn spawn(what: &'static str, command: &mut Command) -> Group {
        use std::os::unix::process::CommandExt;
        let child = command
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Group { what, child }
    }

    fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
    }
}

/// PIDs of every live descendant of `pid` (from /proc). cargo-lambda starts each
/// function instance (`cargo run --bin …` and the function) in a process group of its
/// own, which a signal to our group does not reach.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may contain spaces and parentheses.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        parent_of.push((child, ppid));
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        i += 1;
    }
    found.remove(0);
    found
}

impl Drop for Group {
    fn drop(&mut self) {
        let stragglers = descendants(self.child.id());
        let kill_stragglers = |signal: &str| {
            for pid in &stragglers {
                let _ = Command::new("kill")
                    .args([signal, &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
        };
        if let Ok(Some(_)) = self.child.try_wait() {
            // The leader is gone; its group may still have members.
            self.signal("-KILL");
            kill_stragglers("-KILL");
            return;
        }
        self.signal("-TERM");
        kill_stragglers("-TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.signal("-KILL");
        // Orphans are reparented, so look each one up by PID (seconds later: no reuse).
        let alive = |pid: &&u32| Path::new(&format!("/proc/{pid}")).exists();
        for pid in stragglers.iter().filter(alive) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.wait();
        eprintln!("stopped {} (process group {})", self.what, self.child.id());
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

struct Watch {
    bin: PathBuf,
    port: u16,
    log: PathBuf,
    dir: PathBuf,
    _group: Group,
}

impl Watch {
    /// `cargo lambda invoke FUNCTION --data-file FILE`; the function's JSON answer.
    fn invoke(&self, function: &str, data: &Path, timeout: Duration) -> Value {
        let (ok, stdout, stderr) = self.invoke_raw(function, data, timeout);
        assert!(
            ok,
            "`cargo lambda invoke {function} --data-file {}` failed:\n{stdout}\n{stderr}\nwatch log:\n{}",
            data.display(),
            tail(&self.log, 40)
        );
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "{function}: the answer is not JSON ({e}):\n{stdout}\nwatch log:\n{}",
                tail(&self.log, 40)
            )
        })
    }

    /// Whether the invocation succeeded, its stdout and the tail of its stderr.
    fn invoke_raw(&self, function: &str, data: &Path, timeout: Duration) -> (bool, String, String) {
        let out = self
            .dir
            .join(format!("invoke-{}.out", unique_name(function)));
        let err = out.with_extension("err");
        let started = Instant::now();
        let mut group = Group::spawn(
            "cargo lambda invoke",
            Command::new(&self.bin)
                .args([
                    "lambda",
                    "invoke",
                    function,
                    "--invoke-address",
                    "127.0.0.1",
                ])
                .args(["--invoke-port", &self.port.to_string()])
                .args(["--output-format", "json", "--data-file"])
                .arg(data)
                .current_dir(root())
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&out).expect("invoke stdout file"))
                .stderr(std::fs::File::create(&err).expect("invoke stderr file")),
        );
        let status = loop {
            if let Some(status) = group.child.try_wait().expect("wait for invoke") {
                break status;
            }
            if started.elapsed() > timeout {
                panic!(
                    "`cargo lambda invoke {function} --data-file {}` gave no answer within {}s\n\
                     invoke stderr:\n{}\nwatch log:\n{}",
                    data.display(),
                    timeout.as_secs(),
                    tail(&err, 20),
                    tail(&self.log, 40)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        drop(group);
        eprintln!(
            "invoke {function} {}: {:.1}s",
            data.file_name().unwrap_or_default().to_string_lossy(),
            started.elapsed().as_secs_f64()
        );
        (
            status.success(),
            std::fs::read_to_string(&out).unwrap_or_default(),
            tail(&err, 20),
        )
    }
}

/// The cargo-lambda binary, or `None` (the caller skips) when it is missing and
/// neither `CI` nor [`REQUIRE_ENV`] is set; missing but required fails here.
pub(crate) fn cargo_lambda_or_skip() -> Option<PathBuf> {
    let bin = cargo_lambda();
    if bin.is_none() {
        let required = [REQUIRE_ENV, "CI"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
        assert!(
            !required,
            "cargo-lambda is required here (CI or {REQUIRE_ENV} is set) but was not found: \
             set {CARGO_LAMBDA_ENV} to the cargo-lambda binary or put it on PATH \
             (tests/run.sh installs it into .venv: pip install cargo-lambda)"
        );
        eprintln!("SKIPPED: cargo-lambda not found (set {CARGO_LAMBDA_ENV} or put it on PATH)");
    }
    bin
}

#[test]
fn each_function_answers_its_sample_event_under_cargo_lambda_watch() {
    let Some(bin) = cargo_lambda_or_skip() else {
        return;
    };
    let test_started = Instant::now();
    let root = root();
    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");

    // moto with the inbox table, queue + DLQ and the state table (the existing helpers).
    let moto = Moto::start();
    let (store, names, state_table) = runtime.block_on(async {
        let (store, names) = aws_store(&moto, None).await;
        let sdk = moto.sdk_config().await;
        let state_table = unique_name("einmal-state");
        create_state_table(&aws_sdk_dynamodb::Client::new(&sdk), &state_table)
            .await
            .expect("create state table on moto");
        (store, names, state_table)
    });

    let config = std::fs::read_to_string(root.join("einmal.toml")).expect("einmal.toml");
    let port = free_port();
    let log = dir.path().join("watch.log");
    let mut command = Command::new(&bin);
    command
        .args([
            "lambda",
            "watch",
            "--ignore-changes",
            "--invoke-address",
            "127.0.0.1",
        ])
        .args(["--invoke-port", &port.to_string()])
        .current_dir(&root)
        // The functions inherit this environment (EINMAL_CONFIG is multi-line TOML,
        // which `--env-var` cannot carry).
        .env("AWS_ENDPOINT_URL", &moto.endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .env("EINMAL_INBOX_TABLE", &names.table)
        .env("EINMAL_QUEUE_URL", &names.queue_url)
        .env(
            "EINMAL_DLQ_URL",
            names.dlq_url.as_deref().unwrap_or_default(),
        )
        .env("EINMAL_STATE_TABLE", &state_table)
        .env("EINMAL_CONFIG", &config)
        .env_remove("EINMAL_CONFIG_PARAMETER")
        // The demo tenants' API credentials (`env:VAR` options) stay unset: nothing
        // here calls a provider's API.
        .env_remove("MOLLIE_API_KEY")
        .env_remove("GOPAY_ACCESS_TOKEN")
        .env_remove("KLARNA_API_USERNAME")
        .env_remove("KLARNA_API_PASSWORD")
        .env("RUST_LOG", "info")
        // Same target dir and profile as the rest of the suite: nothing rebuilt twice.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .stdin(Stdio::null());
    let log_file = std::fs::File::create(&log).expect("watch log");
    command
        .stdout(log_file.try_clone().expect("watch log"))
        .stderr(log_file);
    let group = Group::spawn("cargo lambda watch", &mut command);
    let watch = Watch {
        bin,
        port,
        log: log.clone(),
        dir: dir.path().to_path_buf(),
        _group: group,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "cargo lambda watch did not listen on {port}:\n{}",
            tail(&log, 40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "cargo lambda watch listening after {:.1}s",
        test_started.elapsed().as_secs_f64()
    );

    // The first invocation compiles the receiver, minutes on a loaded machine: warm it
    // with a checked-in sample (its signature long expired: any answer will do) before
    // the events are signed, so their timestamps are fresh when they arrive.
    let warm_up = watch.invoke(
        "receiver",
        &root.join("events/apigw/generic.json"),
        FIRST_INVOKE_TIMEOUT,
    );
    assert!(
        warm_up["statusCode"].is_number(),
        "receiver warm-up: not an HTTP answer: {warm_up}"
    );
    // The receiver events, signed now (timestamped signatures expire after 300 s),
    // after the warm-up.
    let events_now = dir.path().join("events");
    let status = Command::new(env!("CARGO_BIN_EXE_regenerate-events"))
        .arg("--root")
        .arg(&root)
        .arg("--now")
        .arg("--out")
        .arg(&events_now)
        .stdout(Stdio::null())
        .status()
        .expect("run regenerate-events --now");
    assert!(status.success(), "regenerate-events --now failed");

    // Receiver: every provider's event, re-signed now.
    let mut apigw: Vec<PathBuf> = std::fs::read_dir(events_now.join("apigw"))
        .expect("apigw events")
        .map(|e| e.expect("entry").path())
        .collect();
    apigw.sort();
    assert!(
        apigw.len() >= 17,
        "expected an event per provider: {apigw:?}"
    );
    let mut providers = Vec::new();
    for file in &apigw {
        let answer = watch.invoke("receiver", file, INVOKE_TIMEOUT);
        assert_eq!(answer["statusCode"], 200, "{}: {answer}", file.display());
        let body = answer["body"].as_str().unwrap_or_default();
        let event: Value =
            serde_json::from_slice(&std::fs::read(file).expect("event")).expect("JSON");
        let provider = event["pathParameters"]["provider"]
            .as_str()
            .expect("provider")
            .to_string();
        // Adyen answers its plain `[accepted]`; everyone else our JSON.
        assert!(
            body.contains("accepted"),
            "{}: not accepted: {body}",
            file.display()
        );
        providers.push(provider);
    }
    let items = runtime.block_on(all_items(&store as &dyn Inbox));
    for provider in &providers {
        assert!(
            items
                .iter()
                .any(|item| item.key.as_str().starts_with(&format!("{provider}#demo#"))),
            "no inbox item for {provider} in moto's table {}",
            names.table
        );
    }
    eprintln!(
        "receiver: {} events accepted, {} inbox items",
        apigw.len(),
        items.len()
    );

    // Processor: the checked-in SQS batch (pointers to the Stripe, Shopify, GitHub items).
    let batch_file = root.join("events/sqs/batch.json");
    let batch: Value =
        serde_json::from_slice(&std::fs::read(&batch_file).expect("batch")).expect("JSON");
    let answer = watch.invoke("processor", &batch_file, FIRST_INVOKE_TIMEOUT);
    let failures = answer["batchItemFailures"]
        .as_array()
        .unwrap_or_else(|| panic!("processor: not a batch response: {answer}"));
    let ids: Vec<&str> = batch["Records"]
        .as_array()
        .expect("records")
        .iter()
        .filter_map(|r| r["messageId"].as_str())
        .collect();
    for failure in failures {
        let id = failure["itemIdentifier"].as_str().unwrap_or_default();
        assert!(
            ids.contains(&id),
            "processor reported an unknown record: {answer}"
        );
    }
    let stripe_key = batch["Records"][0]["body"]
        .as_str()
        .and_then(|b| serde_json::from_str::<Value>(b).ok())
        .and_then(|b| b["pk"].as_str().map(str::to_string))
        .expect("first record points at an item");
    let stripe = runtime
        .block_on(store_get(&store, &stripe_key))
        .unwrap_or_else(|| panic!("{stripe_key} is not in the inbox"));
    assert_ne!(
        stripe.state,
        InboxState::Received,
        "the processor did not claim {stripe_key}: {stripe:?}"
    );
    eprintln!(
        "processor: {answer} ({stripe_key}: {:?}, {} attempt(s))",
        stripe.state, stripe.attempts
    );

    // Sweeper and reconciler: their schedule events.
    let answer = watch.invoke(
        "sweeper",
        &root.join("events/schedule/sweeper.json"),
        FIRST_INVOKE_TIMEOUT,
    );
    assert!(answer.is_object(), "sweeper: {answer}");
    eprintln!("sweeper: {answer}");
    // Narrowed to GoPay: reconciled from the hint the receiver stored above, offline.
    let answer = watch.invoke(
        "reconciler",
        &root.join("events/schedule/reconciler-gopay.json"),
        FIRST_INVOKE_TIMEOUT,
    );
    assert!(
        answer.is_object() || answer.is_array(),
        "reconciler: {answer}"
    );
    eprintln!("reconciler (gopay): {answer}");
    // The plain schedule reconciles every tenant with API credentials. The demo Mollie
    // tenant names its key by environment variable (MOLLIE_API_KEY), unset here, so
    // the run answers with that tenant's failure (an error in any tenant fails the
    // invocation, so the schedule's alarms see it).
    let (ok, stdout, stderr) = watch.invoke_raw(
        "reconciler",
        &root.join("events/schedule/reconciler.json"),
        INVOKE_TIMEOUT,
    );
    assert!(
        !ok && format!("{stdout}{stderr}").contains("MOLLIE_API_KEY"),
        "reconciler: expected the missing MOLLIE_API_KEY to fail the run:\n{stdout}\n{stderr}"
    );
    eprintln!("reconciler (all tenants): ok={ok} {}", stdout.trim());

    drop(watch);
    drop(moto);
    eprintln!(
        "cargo lambda watch check: {:.1}s wall",
        test_started.elapsed().as_secs_f64()
    );
}

async fn store_get(store: &AwsStore, key: &str) -> Option<einmal::ports::InboxItem> {
    store
        .get(&einmal::envelope::InboxKey::from_stored(key))
        .await
        .expect("get works")
}
