//! The arguments of `einmal serve`, for both backends: beside the two pipelines
//! rather than in either, so each of them reads them without reaching into the other.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::serve_http::ClientLimits;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Directory of the embedded store (created if missing).
    #[arg(long, default_value = ".einmal")]
    pub data_dir: PathBuf,
    /// Tenant configuration (TOML).
    #[arg(long, default_value_os_t = crate::default_config_path())]
    pub config: PathBuf,
    /// The token of the console at /console; required to serve it on an address that
    /// is not loopback (without one the console is off there).
    #[arg(long, env = "EINMAL_CONSOLE_TOKEN", hide_env_values = true)]
    pub console_token: Option<String>,
    /// A host name the console at /console answers to besides the bound address
    /// (127.0.0.1, localhost, [::1] on its port): the name a reverse proxy forwards
    /// as `Host`, optionally with :port. Repeatable; any other Host is refused (421).
    #[arg(long = "console-host", value_name = "NAME")]
    pub console_hosts: Vec<String>,
    /// Mark the console's session cookie `Secure` (the console is behind a TLS proxy;
    /// a login from an https origin sets it anyway).
    #[arg(long)]
    pub console_secure_cookie: bool,
    /// Serve `/metrics` on this address of its own (with small connection limits)
    /// instead of on `--addr`; e.g. 127.0.0.1:9464.
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// The bearer token every `/metrics` scrape must present (`Authorization: Bearer
    /// …`); without it and without --metrics-addr, `/metrics` is served on a loopback
    /// --addr only.
    #[arg(long, env = "EINMAL_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    #[command(flatten)]
    pub limits: ClientLimits,
    #[command(flatten)]
    pub purge: crate::store_cmd::PurgeArgs,
    #[command(flatten)]
    pub aws: AwsServeArgs,
}

/// Which pipeline `einmal serve` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServeBackend {
    /// The embedded pipeline on the SQLite store in --data-dir.
    Embedded,
    /// The Lambdas' handlers on DynamoDB, SQS and SSM (EINMAL_* variables).
    Aws,
}

/// The template's event source defaults (`infra/template.yaml`, `Events.Work`).
pub const DEFAULT_BATCH_SIZE: u32 = 10;
pub const DEFAULT_BATCHING_WINDOW_SECS: u64 = 1;
/// Lambda's long poll; moto serves one request at a time, so tests use 0.
pub const DEFAULT_POLL_WAIT_SECS: u32 = 20;
/// The template's `SweepSchedule` and `ReconcileSchedule` defaults.
pub const DEFAULT_SWEEP_EVERY_SECS: u64 = 60;
pub const DEFAULT_RECONCILE_EVERY_SECS: u64 = 3600;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "AWS backend (--backend aws)")]
pub struct AwsServeArgs {
    /// `embedded`: the SQLite store in --data-dir. `aws`: the Lambdas' handlers on the
    /// tables and queues named by EINMAL_INBOX_TABLE, EINMAL_QUEUE_URL, EINMAL_DLQ_URL,
    /// EINMAL_STATE_TABLE (and EINMAL_AUDIT_TABLE), the configuration from
    /// EINMAL_CONFIG_PARAMETER (SSM), else EINMAL_CONFIG, else --config.
    #[arg(long, value_enum, default_value_t = ServeBackend::Embedded)]
    pub backend: ServeBackend,
    /// Messages per processor invocation (the event source's BatchSize).
    #[arg(long, default_value_t = DEFAULT_BATCH_SIZE, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: u32,
    /// How long a batch may gather before the processor is invoked
    /// (MaximumBatchingWindowInSeconds).
    #[arg(long, default_value_t = DEFAULT_BATCHING_WINDOW_SECS, value_parser = clap::value_parser!(u64).range(0..=300))]
    pub batching_window_secs: u64,
    /// Concurrent pollers, each invoking the processor with its own batches.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub pollers: u64,
    /// SQS long-poll wait per receive (0–20 s). 20 as Lambda's pollers; use 0 against
    /// a single-threaded moto, which a waiting receive blocks.
    #[arg(long, default_value_t = DEFAULT_POLL_WAIT_SECS, value_parser = clap::value_parser!(u32).range(0..=20))]
    pub poll_wait_secs: u32,
    /// Pause after an empty receive when --poll-wait-secs is 0, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub poll_idle_ms: u64,
    /// Run the sweeper (and its relay pass) every this many seconds.
    #[arg(long, default_value_t = DEFAULT_SWEEP_EVERY_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub sweep_every_secs: u64,
    /// Run the reconciler every this many seconds; 0: never (`einmal reconcile
    /// --backend aws` runs it by hand).
    #[arg(long, default_value_t = DEFAULT_RECONCILE_EVERY_SECS)]
    pub reconcile_every_secs: u64,
    /// Print the functions' EMF metric lines on stdout, as the Lambdas do.
    #[arg(long)]
    pub emf: bool,
}

impl AwsServeArgs {
    pub fn is_aws(&self) -> bool {
        self.backend == ServeBackend::Aws
    }
}
