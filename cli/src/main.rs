//! `einmal`: run einmal locally, send signed sample webhooks, inspect the inbox.

mod business;
mod config_check;
mod events;
mod ops;
mod reconcile;
mod relay;
mod send;
mod serve;
mod serve_http;
mod store;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "einmal",
    version,
    about = "Exactly-once business effects from at-least-once webhooks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the receiver over HTTP on the embedded store.
    Serve(serve::ServeArgs),
    /// Check the tenant configuration.
    Config {
        #[command(subcommand)]
        command: config_check::ConfigCommand,
    },
    /// Pull recent provider events since the checkpoint and ingest what is missing.
    Reconcile(reconcile::ReconcileArgs),
    /// Sign a sample event with the tenant's configured secret and post it.
    Send(send::SendArgs),
    /// Inspect inbox items.
    Events {
        #[command(subcommand)]
        command: events::EventsCommand,
    },
    /// Inspect orders of the reference domain.
    Orders {
        #[command(subcommand)]
        command: business::OrdersCommand,
    },
    /// Inspect and seed stock per SKU.
    Inventory {
        #[command(subcommand)]
        command: business::InventoryCommand,
    },
    /// Dead-lettered events: list and show.
    Dlq {
        #[command(subcommand)]
        command: ops::DlqCommand,
    },
    /// Replay one event or, with --bulk, many (audited).
    Replay(ops::ReplayArgs),
    /// The audit log of manual actions.
    Audit {
        #[command(subcommand)]
        command: ops::AuditCommand,
    },
}

/// Where the demo configuration lives when `--config` is not given.
pub fn default_config_path() -> PathBuf {
    PathBuf::from("einmal.toml")
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Config { command } => config_check::run(command),
        Command::Reconcile(args) => reconcile::run(args).await,
        Command::Send(args) => send::run(args).await,
        Command::Events { command } => events::run(command).await,
        Command::Orders { command } => business::run_orders(command).await,
        Command::Inventory { command } => business::run_inventory(command).await,
        Command::Dlq { command } => ops::run_dlq(command).await,
        Command::Replay(args) => ops::run_replay(args).await,
        Command::Audit { command } => ops::run_audit(command).await,
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("einmal: {err}");
            ExitCode::from(2)
        }
    }
}
