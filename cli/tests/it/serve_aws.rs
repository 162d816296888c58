//! `einmal serve --backend aws` through the real binary against moto (one server for
//! this test binary, as the suite starts it): `einmal setup --backend aws`, the
//! server, `einmal send`, then `einmal events show|orders show --backend aws` read
//! the outcome. Bad input: a missing table or queue, a missing variable, an endpoint
//! that does not answer — each a clear message and the README's exit code, nothing
//! created.
//!
//! moto serves one request at a time, so the server polls with `--poll-wait-secs 0`.

use crate::common;

use std::io::Read;
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::repo;
use einmal::adapters::aws::{create_state_table, create_tables};
use einmal_tests::moto;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(30);

/// The variables the Lambdas read, for tables and queues under base name `name`, as an
/// operator sets them before `einmal setup --backend aws`.
fn env_for(endpoint: &str, name: &str) -> Vec<(&'static str, String)> {
    vec![
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
        ("RUST_LOG", "warn".to_owned()),
    ]
}

fn command(env: &[(&'static str, String)], args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_einmal"));
    command
        .args(args)
        .current_dir(repo())
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("EINMAL_CONFIG")
        .env_remove("EINMAL_CONFIG_PARAMETER");
    for (k, v) in env {
        command.env(k, v);
    }
    command
}

fn run(env: &[(&'static str, String)], args: &[&str]) -> Output {
    command(env, args).output().expect("einmal runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o.stdout)))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running `einmal serve --backend aws`; killed on drop.
struct Serve {
    child: Child,
    url: String,
}

impl Serve {
    fn start(env: &[(&'static str, String)]) -> Serve {
        let addr = format!("127.0.0.1:{}", free_port());
        let child = command(
            env,
            &[
                "serve",
                "--backend",
                "aws",
                "--addr",
                &addr,
                "--pollers",
                "2",
                "--poll-wait-secs",
                "0",
                "--poll-idle-ms",
                "100",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("einmal serve starts");
        let mut serve = Serve {
            child,
            url: format!("http://{addr}"),
        };
        let started = Instant::now();
        while TcpStream::connect(&addr).is_err() {
            if let Ok(Some(status)) = serve.child.try_wait() {
                panic!("einmal serve exited ({status}): {}", serve.stderr());
            }
            assert!(started.elapsed() < DEADLINE, "einmal serve did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        serve
    }

    fn stderr(&mut self) -> String {
        let mut err = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = pipe.read_to_string(&mut err);
        }
        err
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn setup_serve_send_and_the_event_is_completed_with_its_effect() {
    let moto = moto::shared();
    let name = moto::unique_name("einmal-serve");
    let env = env_for(&moto.endpoint, &name);
    let setup = run(&env, &["setup", "--backend", "aws"]);
    assert!(setup.status.success(), "{}", text(&setup.stderr));
    let mut serve = Serve::start(&env);

    let sent = run(
        &env,
        &[
            "send",
            "--provider",
            "stripe",
            "--tenant",
            "demo",
            "--url",
            &serve.url,
        ],
    );
    assert!(
        text(&sent.stdout).starts_with("200 "),
        "{}{}",
        text(&sent.stdout),
        text(&sent.stderr)
    );

    let show = [
        "events",
        "show",
        "--backend",
        "aws",
        "--provider",
        "stripe",
        "--tenant",
        "demo",
        "--event-id",
        "evt_demo_1",
        "--json",
    ];
    let started = Instant::now();
    let item = loop {
        let item = json(&run(&env, &show));
        if item["state"] == "completed" {
            break item;
        }
        assert!(started.elapsed() < DEADLINE, "not completed: {item}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        item["envelope"]["event_type"], "payment_intent.succeeded",
        "{item}"
    );
    let order = json(&run(
        &env,
        &[
            "orders",
            "show",
            "--backend",
            "aws",
            "--tenant",
            "demo",
            "order-1001",
            "--json",
        ],
    ));
    assert_eq!(order["payment_status"], "paid", "{order}");

    // SIGTERM: the server stops polling, finishes what it holds and exits 0.
    let pid = serve.child.id().to_string();
    let term = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(term.success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = serve.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "einmal serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = serve.stderr();
    assert!(status.success(), "{status}: {err}");
    assert!(err.contains("einmal: stopped"), "{err}");
}

/// The start fails with `code`, its message naming every `needle`.
fn refused(env: &[(&'static str, String)], code: i32, needles: &[&str]) {
    let out = run(
        env,
        &[
            "serve",
            "--backend",
            "aws",
            "--addr",
            "127.0.0.1:0",
            "--poll-wait-secs",
            "0",
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
}

#[test]
fn a_missing_table_or_queue_is_named_with_its_variable_and_nothing_is_created() {
    let moto = moto::shared();
    let name = moto::unique_name("einmal-serve-bad");
    let env = env_for(&moto.endpoint, &name);
    // Nothing exists: the inbox table is the first thing named.
    refused(
        &env,
        3,
        &[
            &name,
            "EINMAL_INBOX_TABLE",
            "does not exist",
            "einmal setup --backend aws",
        ],
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let sdk = rt.block_on(moto.sdk_config());
    let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
    let exists = |table: String| {
        rt.block_on(dynamodb.describe_table().table_name(table).send())
            .is_ok()
    };
    assert!(!exists(name.clone()), "a failed start creates nothing");

    // The tables, not the queue.
    rt.block_on(create_tables(&dynamodb, &name)).expect("inbox");
    rt.block_on(create_state_table(&dynamodb, &format!("{name}-state")))
        .expect("state");
    rt.block_on(einmal::adapters::aws::create_audit_table(
        &dynamodb,
        &format!("{name}-audit"),
    ))
    .expect("audit");
    refused(
        &env,
        3,
        &[
            &name,
            "EINMAL_QUEUE_URL",
            "queue",
            "einmal setup --backend aws",
        ],
    );
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue = rt.block_on(sqs.get_queue_url().queue_name(&name).send());
    assert!(queue.is_err(), "a failed start creates no queue");

    // A variable that is not set: a usage error naming it.
    let without: Vec<_> = env
        .iter()
        .filter(|(k, _)| *k != "EINMAL_STATE_TABLE")
        .cloned()
        .collect();
    refused(&without, 2, &["EINMAL_STATE_TABLE"]);
}

#[test]
fn an_endpoint_that_does_not_answer_is_a_failure_naming_it() {
    // A port nobody listens on.
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let env = env_for(&endpoint, "einmal-nowhere");
    refused(&env, 4, &["does not answer", &endpoint, "AWS_ENDPOINT_URL"]);
}

/// `einmal listen --backend aws`: the AWS pipeline with a `listen` destination for every
/// tenant; a sent event reaches the local app, signed with `--secret` (verified there
/// with the `standardwebhooks` crate), and the attempt is recorded on the event.
#[test]
fn listen_on_aws_forwards_each_event_signed_to_the_local_app() {
    use einmal_tests::destination_server::{Answer, DestinationServer, SECRET};
    let moto = moto::shared();
    let name = moto::unique_name("einmal-listen");
    let env = env_for(&moto.endpoint, &name);
    let setup = run(&env, &["setup", "--backend", "aws"]);
    assert!(setup.status.success(), "{}", text(&setup.stderr));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let app = rt.block_on(DestinationServer::start(|_, _| Answer::Ok));
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = command(
        &env,
        &[
            "listen",
            "--backend",
            "aws",
            "--forward-to",
            &app.url,
            "--secret",
            SECRET,
            "--addr",
            &addr,
            "--poll-wait-secs",
            "0",
            "--poll-idle-ms",
            "100",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("einmal listen starts");
    let started = Instant::now();
    while TcpStream::connect(&addr).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("einmal listen exited ({status}): {err}");
        }
        assert!(started.elapsed() < DEADLINE, "einmal listen did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("http://{addr}");
    let sent = run(
        &env,
        &[
            "send",
            "--provider",
            "stripe",
            "--tenant",
            "demo",
            "--url",
            &url,
        ],
    );
    assert!(
        text(&sent.stdout).starts_with("200 "),
        "{}",
        text(&sent.stderr)
    );
    let started = Instant::now();
    while app.effects().is_empty() {
        assert!(started.elapsed() < DEADLINE, "nothing forwarded");
        std::thread::sleep(Duration::from_millis(100));
    }
    let calls = app.calls();
    assert!(calls.iter().all(|c| c.verified), "signed with --secret");
    assert_eq!(calls[0].event_type, "payment_intent.succeeded");
    let item = json(&run(
        &env,
        &[
            "events",
            "show",
            "--backend",
            "aws",
            "--provider",
            "stripe",
            "--tenant",
            "demo",
            "--event-id",
            "evt_demo_1",
            "--json",
        ],
    ));
    assert!(
        item.to_string().contains("listen"),
        "the delivery is recorded: {item}"
    );
    let _ = child.kill();
    let _ = child.wait();
    let mut out = String::new();
    let _ = child.stdout.take().unwrap().read_to_string(&mut out);
    assert!(
        out.starts_with("Ready! Your webhook signing secret is whsec_"),
        "{out}"
    );
}
