//! `einmal serve` with the subscription domain: the same flags as `einmal serve`.

use std::process::ExitCode;
use std::sync::Arc;

#[tokio::main]
async fn main() -> ExitCode {
    einmal_cli::serve_main(Arc::new(custom_domain::Subscriptions)).await
}
