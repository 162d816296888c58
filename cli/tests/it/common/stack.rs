//! One running einmal, either backend, driven from outside as a user drives it: the real
//! `einmal` binary (`serve`, or `serve --backend aws` on moto through the Lambdas' own
//! handlers), `einmal send` as the provider, and the CLI's own reads (`events list`,
//! `orders show`, `inventory show`, `dlq list`) for the outcome. Every black-box
//! scenario is written once against it and run on both backends.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::repo;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Aws,
}

/// The scaled-down timings every scenario runs with (production: minutes): backoffs of
/// at most 1 s, a redrive after 3 receives, the sweeper every second, stuck items
/// re-enqueued after 3 s, and on AWS a queue visibility of 5 s (a killed batch comes
/// back after it, as after a Lambda timeout).
const TUNING: [(&str, &str); 9] = [
    ("RUST_LOG", "warn"),
    ("EINMAL_MAX_RECEIVE_COUNT", "3"),
    ("EINMAL_BACKOFF_BASE_MS", "100"),
    ("EINMAL_BACKOFF_MAX_MS", "1000"),
    ("EINMAL_LEASE_MS", "4000"),
    ("EINMAL_SWEEP_STUCK_AFTER_MS", "3000"),
    ("EINMAL_RELAY_BACKOFF_BASE_MS", "100"),
    ("EINMAL_RELAY_BACKOFF_CAP_MS", "400"),
    ("EINMAL_RELAY_LEASE_MS", "3000"),
];
pub const VISIBILITY_SECS: &str = "5";

/// The provider's side of a stack: posts webhooks to it. Cloned into client threads
/// while the stack itself is killed and restarted (its address never changes).
#[derive(Clone)]
pub struct Sender {
    events_dir: PathBuf,
    config: PathBuf,
    url: String,
}

pub struct Stack {
    pub backend: Backend,
    dir: tempfile::TempDir,
    config: PathBuf,
    /// The variables the Lambdas read (AWS) and the tunings; the CLI reads get them too.
    env: Vec<(String, String)>,
    /// AWS: where `serve` sends its SDK calls (moto, or a fault proxy before it).
    serve_endpoint: Option<String>,
    addr: String,
    child: Option<Child>,
    pub url: String,
}

impl Stack {
    /// A fresh store (embedded: a data dir; AWS: tables and queues under a unique name,
    /// made by `einmal setup --backend aws`) with the demo configuration plus
    /// `destinations` (TOML). Not started.
    pub fn new(backend: Backend, destinations: &str) -> Stack {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut toml = std::fs::read_to_string(repo().join("einmal.toml")).expect("einmal.toml");
        toml.push_str(destinations);
        let config = dir.path().join("einmal.toml");
        std::fs::write(&config, toml).expect("config written");
        let mut env: Vec<(String, String)> = TUNING
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if backend == Backend::Aws {
            let moto = einmal_tests::moto::shared();
            env.extend(aws_env(
                &moto.endpoint,
                &einmal_tests::moto::unique_name("bb"),
            ));
        }
        std::fs::create_dir_all(dir.path().join("data")).expect("data dir");
        std::fs::create_dir_all(dir.path().join("events")).expect("events dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let stack = Stack {
            backend,
            config,
            env,
            serve_endpoint: None,
            url: format!("http://{addr}"),
            addr,
            dir,
            child: None,
        };
        let setup = stack.cli(&["setup"]);
        assert!(setup.status.success(), "setup: {}", text(&setup.stderr));
        if backend == Backend::Aws {
            stack.shorten_visibility();
        }
        stack
    }

    /// The AWS SDK's variables (moto's endpoint, region, test credentials) without the
    /// store's names: for an embedded `serve` delivering to an AWS destination kind.
    pub fn with_aws_sdk(&mut self) {
        let moto = einmal_tests::moto::shared();
        let sdk = aws_env(&moto.endpoint, "unused")
            .into_iter()
            .filter(|(k, _)| k.starts_with("AWS_"));
        self.env.extend(sdk);
    }

    /// `serve` sends its AWS calls to `endpoint` (a fault proxy in front of moto); the
    /// CLI's reads still go to moto directly.
    pub fn serve_through(&mut self, endpoint: &str) {
        self.serve_endpoint = Some(endpoint.to_owned());
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The flags that pick this stack's store, for the CLI commands that read one.
    fn store_args(&self) -> Vec<String> {
        match self.backend {
            Backend::Embedded => vec!["--data-dir".into(), self.data_dir().display().to_string()],
            Backend::Aws => vec!["--backend".into(), "aws".into()],
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_einmal"));
        command
            .args(args)
            .current_dir(repo())
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("EINMAL_CONFIG")
            .env_remove("EINMAL_CONFIG_PARAMETER");
        for (k, v) in &self.env {
            command.env(k, v);
        }
        command
    }

    /// `einmal ARGS` with this stack's store flags appended.
    pub fn cli(&self, args: &[&str]) -> Output {
        let store = self.store_args();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(store.iter().map(String::as_str));
        self.command(&all).output().expect("einmal runs")
    }

    /// `einmal ARGS --json`, parsed; the command must succeed.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.cli(&all);
        assert!(
            out.status.success(),
            "einmal {args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("einmal {args:?}: not JSON ({e}): {}", text(&out.stdout)))
    }

    /// Start `einmal serve` (again, on the same address and store after a kill).
    pub fn start(&mut self) {
        self.start_within(Duration::from_secs(60));
    }

    /// Start `einmal serve`, allowing `deadline` before it listens: a start during an
    /// outage waits in its checks until the outage is over.
    pub fn start_within(&mut self, deadline: Duration) {
        assert!(self.child.is_none(), "already running");
        let mut args: Vec<String> = vec!["serve".into(), "--addr".into(), self.addr.clone()];
        args.extend(["--config".into(), self.config.display().to_string()]);
        match self.backend {
            Backend::Embedded => {
                args.extend(["--data-dir".into(), self.data_dir().display().to_string()])
            }
            Backend::Aws => args.extend(
                [
                    "--backend",
                    "aws",
                    "--pollers",
                    "2",
                    "--poll-wait-secs",
                    "0",
                    "--poll-idle-ms",
                    "100",
                    "--batching-window-secs",
                    "0",
                    "--sweep-every-secs",
                    "1",
                    "--reconcile-every-secs",
                    "0",
                ]
                .map(String::from),
            ),
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut command = self.command(&args);
        if let Some(endpoint) = &self.serve_endpoint {
            command.env("AWS_ENDPOINT_URL", endpoint);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("serve.log"))
            .expect("serve log");
        let mut child = command
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("einmal serve starts");
        let started = Instant::now();
        while std::net::TcpStream::connect(&self.addr).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("einmal serve exited ({status}):\n{}", self.log());
            }
            assert!(
                started.elapsed() < deadline,
                "einmal serve did not listen within {deadline:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(child);
    }

    /// SIGKILL (`kill -9`): no shutdown, no flush, batches in hand abandoned.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL");
            child.wait().expect("reaped");
        }
    }

    /// What every `serve` of this stack wrote on stderr.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// The provider's side, for client threads.
    pub fn sender(&self) -> Sender {
        Sender {
            events_dir: self.dir.path().join("events"),
            config: self.config.clone(),
            url: self.url.clone(),
        }
    }

    /// [`Sender::send_until_acked`] from this thread.
    pub fn send_until_acked(
        &self,
        provider: &str,
        topic: Option<&str>,
        event_id: &str,
        body: &Value,
    ) {
        self.sender()
            .send_until_acked(provider, topic, event_id, body)
    }

    pub fn set_stock(&self, sku: &str, on_hand: i64) {
        let out = self.cli(&[
            "inventory",
            "set",
            "--tenant",
            "demo",
            sku,
            "--on-hand",
            &on_hand.to_string(),
        ]);
        assert!(out.status.success(), "inventory set: {}", text(&out.stderr));
    }

    pub fn on_hand(&self, sku: &str) -> i64 {
        self.json(&["inventory", "show", "--tenant", "demo", sku])["on_hand"]
            .as_i64()
            .expect("on_hand")
    }

    pub fn order(&self, id: &str) -> Value {
        self.json(&["orders", "show", "--tenant", "demo", id])
    }

    pub fn events(&self) -> Vec<Value> {
        let list = self.json(&["events", "list", "--limit", "100000"]);
        list.as_array().expect("a list").clone()
    }

    pub fn dead_letters(&self) -> Value {
        self.json(&["dlq", "list"])
    }

    /// Wait until `expected` events are stored and every one is done (`completed`, or
    /// `ignored` by the domain: still delivered to destinations); fails at once on a
    /// dead letter (nothing here is permanent), and after `within`.
    pub fn until_all_completed(&self, expected: usize, within: Duration) -> Vec<Value> {
        let started = Instant::now();
        loop {
            let items = self.events();
            let dead: Vec<_> = items
                .iter()
                .filter(|i| i["state"] == "dead_letter")
                .map(|i| (&i["key"], &i["last_error"]))
                .collect();
            assert!(dead.is_empty(), "dead-lettered: {dead:#?}\n{}", self.log());
            let done = |i: &Value| i["state"] == "completed" || i["state"] == "ignored";
            if items.len() == expected && items.iter().all(done) {
                eprintln!(
                    "{:?}: {expected} events completed {:.1} s after the wait began",
                    self.backend,
                    started.elapsed().as_secs_f64()
                );
                return items;
            }
            let open: Vec<_> = items
                .iter()
                .filter(|i| !done(i))
                .map(|i| (&i["key"], &i["state"], &i["last_error"]))
                .collect();
            assert!(
                started.elapsed() < within,
                "{} of {expected} events stored, not completed: {open:#?}\n{}",
                items.len(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A variable of this stack's environment (the AWS names).
    pub fn var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The queue's visibility timeout, as the template sets it (scaled down).
    fn shorten_visibility(&self) {
        let queue = self.var("EINMAL_QUEUE_URL").expect("queue url").to_owned();
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async {
            let sdk = einmal_tests::moto::shared().sdk_config().await;
            aws_sdk_sqs::Client::new(&sdk)
                .set_queue_attributes()
                .queue_url(queue)
                .attributes(
                    aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
                    VISIBILITY_SECS,
                )
                .send()
                .await
                .expect("visibility set");
        });
    }
}

impl Sender {
    /// `einmal send` of `body` as `provider`'s event `event_id` (Shopify: with `topic`),
    /// retried as a provider retries until it is acknowledged with a 2xx (the server
    /// may be down or restarting). Blocking; callable from many threads.
    pub fn send_until_acked(
        &self,
        provider: &str,
        topic: Option<&str>,
        event_id: &str,
        body: &Value,
    ) {
        let file = self.events_dir.join(format!("{provider}-{event_id}.json"));
        if !file.exists() {
            std::fs::write(&file, body.to_string()).expect("event written");
        }
        let file = file.display().to_string();
        let config = self.config.display().to_string();
        let mut args = vec![
            "send",
            "--provider",
            provider,
            "--tenant",
            "demo",
            "--event",
            &file,
            "--url",
            &self.url,
            "--config",
            &config,
        ];
        if let Some(topic) = topic {
            args.extend(["--topic", topic, "--event-id", event_id]);
        }
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let out = Command::new(env!("CARGO_BIN_EXE_einmal"))
                .args(&args)
                .current_dir(repo())
                .output()
                .expect("einmal send runs");
            if text(&out.stdout).starts_with('2') {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{provider} {event_id} never acknowledged: {}{}",
                text(&out.stdout),
                text(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The variables the Lambdas read, for tables and queues under base name `name`, as an
/// operator sets them before `einmal setup --backend aws`.
pub fn aws_env(endpoint: &str, name: &str) -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT_URL", endpoint.to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ("EINMAL_INBOX_TABLE", name.to_owned()),
        (
            "EINMAL_QUEUE_URL",
            format!("{endpoint}/123456789012/{name}"),
        ),
        (
            "EINMAL_DLQ_URL",
            format!("{endpoint}/123456789012/{name}-dlq"),
        ),
        ("EINMAL_STATE_TABLE", format!("{name}-state")),
        ("EINMAL_AUDIT_TABLE", format!("{name}-audit")),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .to_vec()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
