//! A real PostgreSQL server on loopback, for the PostgreSQL destination tests.
//!
//! The server binaries come from `$EINMAL_POSTGRES_BIN` (a directory with `initdb`,
//! `postgres`, `pg_isready`), else the newest `/usr/lib/postgresql/<version>/bin`
//! (Debian's `postgresql` package; `tests/run.sh` installs it when missing). Without
//! them a test is skipped with a message ([`PgServer::shared_or_skip`]), unless `CI` or
//! `EINMAL_REQUIRE_POSTGRES` is set: then it fails, saying so.
//!
//! [`PgServer::start`] makes a temporary directory, `initdb`s a cluster in it (user
//! `einmal`, trust authentication) and runs `postgres` in the foreground on a free
//! port (TCP on 127.0.0.1 only, its socket in the directory, `fsync=off`). `initdb`
//! and `postgres` refuse to run as root, so as root both run as the `postgres` user
//! (the directory is chowned to it). Like moto, the server runs under a small `sh`
//! wrapper that stops it by PID (`SIGINT`, PostgreSQL's fast shutdown) when its stdin
//! closes: on [`PgServer::stop`], on drop, or when the test process exits however it
//! exits; the shared server's wrapper then removes the directory too.

use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A directory holding `initdb`, `postgres` and `pg_isready`.
pub const POSTGRES_BIN_ENV: &str = "EINMAL_POSTGRES_BIN";
/// Set (like `CI`) to fail instead of skipping when PostgreSQL is missing.
pub const REQUIRE_ENV: &str = "EINMAL_REQUIRE_POSTGRES";
/// The superuser `initdb` creates (trust authentication, no password).
pub const USER: &str = "einmal";

const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs "$@" and sends it SIGINT (fast shutdown) when stdin reaches EOF, which happens
/// when our end of the pipe closes. With `EINMAL_PG_REMOVE` set, the watcher then
/// waits for the server to exit and removes that directory. The wrapper itself exits
/// with the server's status, so a server that dies at startup is noticed at once.
const WRAPPER: &str = r#"exec 3<&0
"$@" 3<&- & pid=$!
( cat <&3 >/dev/null; kill -INT "$pid" 2>/dev/null
  if [ -n "$EINMAL_PG_REMOVE" ]; then
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done; rm -rf "$EINMAL_PG_REMOVE"
  fi ) &
exec 3<&-
wait "$pid""#;

pub struct PgServer {
    pub port: u16,
    bin: PathBuf,
    dir: PathBuf,
    /// `(uid, gid)` of `postgres` when we are root.
    run_as: Option<(u32, u32)>,
    /// The wrapper while the server runs.
    child: Option<Child>,
    /// Shared server: the wrapper removes the directory at exit (statics never drop).
    remove_on_exit: bool,
}

impl PgServer {
    /// One server for the whole test binary, or `None` (with a SKIPPED message) when
    /// the binaries are missing and not required. Panics with the reason otherwise.
    pub fn shared_or_skip() -> Option<&'static PgServer> {
        static SHARED: OnceLock<Result<PgServer, String>> = OnceLock::new();
        let bin = match bin_dir() {
            Ok(bin) => bin,
            Err(missing) => {
                skip_or_fail(&missing);
                return None;
            }
        };
        let shared = SHARED.get_or_init(|| PgServer::start_in(bin, true));
        match shared {
            Ok(server) => Some(server),
            Err(e) => panic!("PostgreSQL did not start: {e}"),
        }
    }

    /// A private server (e.g. to stop and restart it), or `None` like
    /// [`shared_or_skip`](Self::shared_or_skip).
    pub fn private_or_skip() -> Option<PgServer> {
        match bin_dir() {
            Ok(bin) => Some(
                PgServer::start_in(bin, false)
                    .unwrap_or_else(|e| panic!("PostgreSQL did not start: {e}")),
            ),
            Err(missing) => {
                skip_or_fail(&missing);
                None
            }
        }
    }

    fn start_in(bin: PathBuf, remove_on_exit: bool) -> Result<PgServer, String> {
        let run_as = run_as()?;
        let dir = make_dir(run_as)?;
        let mut server = PgServer {
            port: 0,
            bin,
            dir,
            run_as,
            child: None,
            remove_on_exit,
        };
        server.initdb()?;
        let mut last_error = String::new();
        // A free port can be taken between our probe and the server's bind: retry.
        for _ in 0..3 {
            server.port = free_port().map_err(|e| format!("no free port: {e}"))?;
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
    }

    /// `host=127.0.0.1 port=… user=einmal dbname=<dbname>`.
    pub fn dsn(&self, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={USER} dbname={dbname}",
            self.port
        )
    }

    /// The same over the server's unix socket: `host=<socket dir> port=… …`.
    pub fn socket_dsn(&self, dbname: &str) -> String {
        format!(
            "host={} port={} user={USER} dbname={dbname}",
            self.dir.display(),
            self.port
        )
    }

    /// A new, empty database with a name no other test uses; returns the name.
    pub async fn create_database(&self, prefix: &str) -> String {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "{prefix}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let admin = self.client("postgres").await;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        name
    }

    /// A plain client on `dbname` (its connection runs on a spawned task).
    pub async fn client(&self, dbname: &str) -> tokio_postgres::Client {
        let (client, connection) =
            tokio_postgres::connect(&self.dsn(dbname), tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| panic!("connect to the test server ({dbname}): {e}"));
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }

    /// Stops the server (fast shutdown) and waits until it has exited; the data stay.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.stdin.take());
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the stopped server again on the same port with the same data.
    pub fn restart(&mut self) {
        self.launch()
            .unwrap_or_else(|e| panic!("PostgreSQL did not restart: {e}"));
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        // The server's user may not be allowed into our working directory.
        command.current_dir(&self.dir);
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command
    }

    fn initdb(&self) -> Result<(), String> {
        let output = self
            .command("initdb")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .map_err(|e| format!("cannot run initdb: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "initdb failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(())
    }

    fn launch(&mut self) -> Result<(), String> {
        let log = self.dir.join("log");
        let log_file =
            std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let log_err = log_file.try_clone().map_err(|e| e.to_string())?;
        let mut command = Command::new("sh");
        command.current_dir(&self.dir);
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command
            .arg("-c")
            .arg(WRAPPER)
            .arg("einmal-postgres")
            .arg(self.bin.join("postgres"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&self.dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ]);
        if self.remove_on_exit {
            command.env("EINMAL_PG_REMOVE", &self.dir);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(log_file)
            .stderr(log_err)
            .spawn()
            .map_err(|e| format!("cannot spawn sh: {e}"))?;
        let started = Instant::now();
        loop {
            if self.is_ready() {
                self.child = Some(child);
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("postgres exited: {status}; log:\n{}", tail(&log)));
            }
            if started.elapsed() > STARTUP_TIMEOUT {
                drop(child.stdin.take());
                let _ = child.wait();
                return Err(format!(
                    "not ready on port {} after {}s; log:\n{}",
                    self.port,
                    STARTUP_TIMEOUT.as_secs(),
                    tail(&log)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn is_ready(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", USER, "-d", "postgres", "-t", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn skip_or_fail(missing: &str) {
    let required = [REQUIRE_ENV, "CI"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
    assert!(
        !required,
        "PostgreSQL is required here (CI or {REQUIRE_ENV} is set) but {missing}: install \
         Debian's `postgresql` (tests/run.sh does) or set {POSTGRES_BIN_ENV} to its bin directory"
    );
    eprintln!("SKIPPED: {missing} (install `postgresql` or set {POSTGRES_BIN_ENV})");
}

/// `$EINMAL_POSTGRES_BIN`, else the newest `/usr/lib/postgresql/<N>/bin` with `initdb`.
fn bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(POSTGRES_BIN_ENV).filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        if !dir.join("initdb").is_file() {
            return Err(format!(
                "{POSTGRES_BIN_ENV}={} has no initdb",
                dir.display()
            ));
        }
        return Ok(dir);
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| "no /usr/lib/postgresql/*/bin/initdb was found".to_string())
}

/// As root: the `postgres` user's ids (initdb and postgres refuse root).
fn run_as() -> Result<Option<(u32, u32)>, String> {
    let me = std::fs::metadata("/proc/self").map_err(|e| format!("/proc/self: {e}"))?;
    if me.uid() != 0 {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| format!("/etc/passwd: {e}"))?;
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&"postgres") && fields.len() > 3)
                .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
                .flatten()
        })
        .map(Some)
        .ok_or_else(|| {
            "running as root, but there is no `postgres` user to run the server as \
             (the Debian package creates it)"
                .to_string()
        })
}

/// A fresh directory under the temp dir, owned by the user the server runs as.
fn make_dir(run_as: Option<(u32, u32)>) -> Result<PathBuf, String> {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "einmal-pg-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .map_err(|e| format!("chown {}: {e}", dir.display()))?;
    }
    Ok(dir)
}

fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
