//! A real DynamoDB/SQS-compatible server on loopback (moto), for the AWS adapter tests.
//!
//! `Moto::shared()` starts one server per test binary (`it`: one for the whole suite);
//! tests isolate themselves with [`unique_name`] tables and queues, so they run in
//! parallel. The server answers one request at a time (see [`moto_command`]), so every
//! conditional write is atomic as on DynamoDB and the tests need no client-side lock to
//! prove atomicity. The server is spawned through a small `sh` wrapper that kills it
//! when its stdin closes, which happens when the test process exits however it exits
//! (statics never run `Drop`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_dynamodb::config::{
    interceptors::BeforeTransmitInterceptorContextRef, ConfigBag, Credentials, Intercept,
    RuntimeComponents,
};
use einmal::adapters::aws::{create_queues, create_tables, AwsNames, AwsStore};
use einmal::adapters::aws::{create_state_table, DynamoStateStore};

/// The `moto_server` whose Python serves the tests (a path, or a name on PATH).
pub const MOTO_BIN_ENV: &str = "EINMAL_MOTO_BIN";
/// `aws_store` creates its main queue with this redrive threshold.
pub const MAX_RECEIVE_COUNT: u32 = 3;

const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs "$@" and kills it by PID when stdin reaches EOF, which happens when our end
/// of the pipe closes: on `Drop`, or when the test process exits in any way (a
/// static's `Drop` never runs). The watcher then removes the log. The wrapper itself
/// exits with moto's status, so a moto that dies at startup is noticed at once.
const WRAPPER: &str = r#"exec 3<&0
"$@" 3<&- & pid=$!
# Background jobs get /dev/null as stdin, so the watcher reads our pipe through fd 3.
( cat <&3 >/dev/null; kill "$pid" 2>/dev/null; rm -f "$EINMAL_MOTO_LOG" ) &
exec 3<&-
wait "$pid""#;

pub struct Moto {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    child: Child,
    log: PathBuf,
}

impl Moto {
    /// Start a private server (blocking, up to ~20 s). Panics if moto cannot start.
    pub fn start() -> Moto {
        let mut last_error = String::new();
        // A free port can be taken between our probe and moto's bind: retry a few times.
        for _ in 0..3 {
            match Self::try_start() {
                Ok(moto) => return moto,
                Err(e) => last_error = e,
            }
        }
        panic!("moto did not start: {last_error}");
    }

    /// One server for the whole test binary.
    pub fn shared() -> &'static Moto {
        static SHARED: OnceLock<Moto> = OnceLock::new();
        SHARED.get_or_init(Moto::start)
    }

    fn try_start() -> Result<Moto, String> {
        let port = free_port().map_err(|e| format!("no free port: {e}"))?;
        let log =
            std::env::temp_dir().join(format!("einmal-moto-{}-{port}.log", std::process::id()));
        let log_file =
            std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let log_err = log_file.try_clone().map_err(|e| e.to_string())?;
        let mut command = Command::new("sh");
        command.arg("-c").arg(WRAPPER).arg("einmal-moto");
        command.args(moto_command());
        command.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        let mut child = command
            .env("EINMAL_MOTO_LOG", &log)
            .stdin(Stdio::piped())
            .stdout(log_file)
            .stderr(log_err)
            .spawn()
            .map_err(|e| format!("cannot spawn sh: {e}"))?;
        let endpoint = format!("http://127.0.0.1:{port}");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let started = Instant::now();
        loop {
            if answers_http(&addr) {
                return Ok(Moto {
                    endpoint,
                    child,
                    log,
                });
            }
            if let Ok(Some(status)) = child.try_wait() {
                let log_tail = tail(&log);
                let _ = std::fs::remove_file(&log);
                return Err(format!("{status}; log:\n{log_tail}"));
            }
            if started.elapsed() > STARTUP_TIMEOUT {
                let log_tail = tail(&log);
                stop(&mut child);
                return Err(format!(
                    "no HTTP answer on {endpoint} after {}s; log:\n{log_tail}",
                    STARTUP_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SDK config for this server: endpoint, us-east-1, static test credentials.
    pub async fn sdk_config(&self) -> SdkConfig {
        aws_config::defaults(BehaviorVersion::latest())
            .endpoint_url(&self.endpoint)
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new(
                "testing",
                "testing",
                None,
                None,
                "einmal-moto",
            ))
            .load()
            .await
    }

    /// The server's log file (stdout + stderr).
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        stop(&mut self.child);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Close the wrapper's stdin (it then kills moto by PID and exits); force if it hangs.
fn stop(child: &mut Child) {
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The checked-in wrapper that serves moto single-threaded (see the script).
const SINGLE_THREADED_SCRIPT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/moto_single_threaded.py");

/// moto's own server is threaded, and moto applies a conditional write as a check and
/// then a store with no lock between them: two concurrent conditional writes of one
/// item could both pass, which DynamoDB never allows. So the harness serves moto's app
/// single-threaded ([`SINGLE_THREADED_SCRIPT`]) with the Python that has moto
/// installed: the one of `$EINMAL_MOTO_BIN` (a `moto_server` script: its venv's
/// `python3` beside it, else its `#!` line), else of `moto_server` on PATH, else
/// `python3`.
fn moto_command() -> Vec<String> {
    vec![
        moto_python().unwrap_or_else(|e| panic!("cannot find moto's Python: {e}")),
        SINGLE_THREADED_SCRIPT.to_string(),
    ]
}

/// The Python of the project's venv (the one moto is installed in): the tests that run a
/// Python library (moto, the `standardwebhooks` verifier) use it.
pub fn moto_python() -> Result<String, String> {
    let configured = std::env::var(MOTO_BIN_ENV)
        .ok()
        .filter(|bin| !bin.trim().is_empty());
    let bin = match configured {
        Some(bin) if bin.contains('/') => Some(PathBuf::from(bin)),
        Some(name) => Some(on_path(&name).ok_or_else(|| format!("{name} is not on PATH"))?),
        None => on_path("moto_server"),
    };
    let Some(bin) = bin else {
        return Ok("python3".to_string());
    };
    python_of(&bin)
}

fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The interpreter that runs the `moto_server` script `bin`.
fn python_of(bin: &Path) -> Result<String, String> {
    if let Some(dir) = bin.parent() {
        for sibling in ["python3", "python"] {
            let candidate = dir.join(sibling);
            if candidate.is_file() {
                return Ok(candidate.display().to_string());
            }
        }
    }
    let text = std::fs::read(bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    let first_line = text.split(|b| *b == b'\n').next().unwrap_or_default();
    let shebang = String::from_utf8_lossy(first_line);
    let interpreter = shebang
        .strip_prefix("#!")
        .and_then(|rest| rest.split_whitespace().next())
        .filter(|python| python.contains("python"))
        .ok_or_else(|| {
            format!(
                "{} is not a Python script (no python beside it, no #!...python line); \
                 point {MOTO_BIN_ENV} at the moto_server of a Python with moto[server]",
                bin.display()
            )
        })?;
    Ok(interpreter.to_string())
}

/// One server for the whole test binary (same as [`Moto::shared`]).
pub fn shared() -> &'static Moto {
    Moto::shared()
}

fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// Any HTTP response means the server is up.
fn answers_http(addr: &SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = b"GET /moto-api/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if stream.write_all(request).is_err() {
        return false;
    }
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).is_ok() && &head == b"HTTP/"
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A name no other test (or test process) uses: `prefix-pid-counter-nanos`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{n}-{nanos}", std::process::id())
}

/// Counts HTTP attempts (retries included) made by every client it is attached to.
#[derive(Debug, Clone, Default)]
pub struct CallCounter(Arc<AtomicUsize>);

impl CallCounter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    pub fn reset(&self) {
        self.0.store(0, Ordering::SeqCst);
    }
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "einmal-call-counter"
    }

    // Runs once per attempt, right before the request goes on the wire.
    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A fresh table, queue and DLQ (unique names) on `moto`, and a store on them.
/// Setup calls are not counted; every call the store makes is, on both clients.
pub async fn aws_store(moto: &Moto, counter: Option<CallCounter>) -> (AwsStore, AwsNames) {
    let sdk = moto.sdk_config().await;
    let name = unique_name("einmal");
    create_tables(&aws_sdk_dynamodb::Client::new(&sdk), &name)
        .await
        .expect("create table on moto");
    let names = create_queues(&aws_sdk_sqs::Client::new(&sdk), &name, MAX_RECEIVE_COUNT)
        .await
        .expect("create queues on moto");
    let mut dynamodb = aws_sdk_dynamodb::config::Builder::from(&sdk);
    let mut sqs = aws_sdk_sqs::config::Builder::from(&sdk);
    if let Some(counter) = counter {
        dynamodb = dynamodb.interceptor(counter.clone());
        sqs = sqs.interceptor(counter);
    }
    let store = AwsStore::new(
        aws_sdk_dynamodb::Client::from_conf(dynamodb.build()),
        aws_sdk_sqs::Client::from_conf(sqs.build()),
        names.clone(),
    );
    (store, names)
}

/// The DynamoDB operation an intercepted request calls, from its `x-amz-target`
/// header (`DynamoDB_20120810.PutItem` -> `PutItem`; `?` without one).
pub fn operation_of<'a>(context: &'a BeforeTransmitInterceptorContextRef<'_>) -> &'a str {
    let target = context
        .request()
        .headers()
        .get("x-amz-target")
        .unwrap_or("?");
    target.rsplit('.').next().unwrap_or(target)
}

/// Records the DynamoDB operation of every HTTP attempt (from `X-Amz-Target`,
/// e.g. `PutItem`), so tests can check which call a port method made.
#[derive(Debug, Clone, Default)]
pub struct OperationLog(Arc<std::sync::Mutex<Vec<String>>>);

impl OperationLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// The operations so far, oldest first.
    pub fn operations(&self) -> Vec<String> {
        self.0.lock().map(|ops| ops.clone()).unwrap_or_default()
    }

    /// Forget what was recorded; returns it.
    pub fn take(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|mut ops| std::mem::take(&mut *ops))
            .unwrap_or_default()
    }
}

impl Intercept for OperationLog {
    fn name(&self) -> &'static str {
        "einmal-operation-log"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        if let Ok(mut ops) = self.0.lock() {
            ops.push(operation_of(context).to_string());
        }
        Ok(())
    }
}

/// A fresh state table (unique name, with its GSI) on `moto`, and a store on it.
/// Setup calls are not counted; every call the store makes is.
pub async fn state_store(moto: &Moto, counter: Option<CallCounter>) -> DynamoStateStore {
    state_store_logged(moto, counter, None).await
}

/// [`state_store`] that also records each call's operation name in `operations`.
pub async fn state_store_logged(
    moto: &Moto,
    counter: Option<CallCounter>,
    operations: Option<OperationLog>,
) -> DynamoStateStore {
    let sdk = moto.sdk_config().await;
    let table = unique_name("einmal-state");
    create_state_table(&aws_sdk_dynamodb::Client::new(&sdk), &table)
        .await
        .expect("create state table on moto");
    let mut dynamodb = aws_sdk_dynamodb::config::Builder::from(&sdk);
    if let Some(counter) = counter {
        dynamodb = dynamodb.interceptor(counter);
    }
    if let Some(operations) = operations {
        dynamodb = dynamodb.interceptor(operations);
    }
    DynamoStateStore::new(aws_sdk_dynamodb::Client::from_conf(dynamodb.build()), table)
}
