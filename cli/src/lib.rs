//! The embedded pipeline behind `einmal serve`, as a library: a user's binary runs it
//! with its own domain ([`serve_main`], or [`serve::run`] with arguments of its own).
//! The other commands (`send`, `events`, `replay`, …) need no domain: the stock
//! `einmal` binary works on the same data directory.

pub mod aws_credentials;
pub mod config_file;
pub mod console;
pub mod error;
pub mod metrics;
pub mod relay;
pub mod serve;
pub mod serve_args;
pub mod serve_aws;
pub mod serve_http;
pub mod store_cmd;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use einmal::domain::Domain;

/// Where the demo configuration lives when `--config` is not given.
pub fn default_config_path() -> PathBuf {
    PathBuf::from("einmal.toml")
}

/// `einmal serve`'s flags as a binary's whole command line.
#[derive(Parser)]
#[command(about = "einmal serve: the receiver over HTTP on the embedded store, with this domain")]
struct ServeCli {
    #[command(flatten)]
    serve: serve::ServeArgs,
}

/// A user's `main`: parse `einmal serve`'s flags and serve with `domain` until Ctrl-C
/// or SIGTERM. Exit code 4 ([`error::EXIT_FAILURE`]) with the reason on stderr when it
/// cannot start, 2 on a bad command line.
pub async fn serve_main(domain: Arc<dyn Domain>) -> ExitCode {
    let cli = ServeCli::parse();
    match serve::run(cli.serve, domain).await {
        Ok(code) => code,
        Err(err) => error::CliError::Failure(err).report(false),
    }
}
