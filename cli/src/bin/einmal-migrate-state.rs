//! `einmal-migrate-state --from OLD --to NEW`: copy every business record of a state
//! table of the previous layout (hash key `pk` with the `by_tenant_kind` index) into a
//! table of the current one (hash `tenant_kind`, range `id`, no index), creating it if
//! missing. Safe to re-run: a record is never written over a newer version. Run it
//! while the processor and the reconciler are paused (README "Deploy on AWS").
//!
//! Exit codes: 0 copied (the counts on stdout), 2 failed (the reason on stderr).

use std::process::ExitCode;

use clap::Parser;
use einmal::adapters::aws::migrate_state_table;

#[derive(Parser)]
#[command(about = "Copy a state table of the previous layout into the current layout")]
struct Args {
    /// The state table to read (the previous layout).
    #[arg(long)]
    from: String,
    /// The state table to write (created if missing; `EINMAL_STATE_TABLE` afterwards).
    #[arg(long)]
    to: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    match migrate_state_table(&sdk, &args.from, &args.to).await {
        Ok(done) => {
            println!(
                "copied {} records from {} to {}; {} were there already",
                done.copied, args.from, args.to, done.already_there
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("einmal-migrate-state: {e}");
            ExitCode::from(2)
        }
    }
}
