//! `einmal`: run einmal locally, send signed sample webhooks, inspect the inbox.

mod business;
mod config_check;
mod events;
mod listen;
mod ops;
mod reconcile;
mod send;
mod store;

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use einmal::domain::reference::ReferenceDomain;
// The embedded pipeline lives in the library (`einmal_cli`), usable with any domain.
pub use einmal_cli::default_config_path;
use einmal_cli::serve;

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
    /// Run `serve` and forward every event, signed the Standard Webhooks way, to a
    /// local app (like `stripe listen --forward-to`).
    Listen(listen::ListenArgs),
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
    /// The web console (events, dead letters and replays, audit log, reconciliation)
    /// on the chosen store; `einmal serve` also serves it at /console.
    Console(ConsoleArgs),
}

#[derive(clap::Args)]
struct ConsoleArgs {
    /// Where to listen; an address that is not loopback needs --token.
    #[arg(long, default_value = "127.0.0.1:8790")]
    addr: std::net::SocketAddr,
    /// The console's token (at least 16 characters): asked for by every page.
    #[arg(long, env = "EINMAL_CONSOLE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    store: store::StoreArgs,
}

/// `einmal console`: the token rule first, then the stores, then serve.
async fn run_console(args: ConsoleArgs) -> Result<ExitCode, String> {
    use einmal_cli::console;
    console::check_access(&args.addr, args.token.as_deref()).map_err(|e| e.to_string())?;
    let ops = args.store.open_ops().await?;
    let backend = match args.store.backend {
        store::Backend::Embedded => format!("embedded, {}", args.store.data_dir.display()),
        store::Backend::Aws => "aws".to_owned(),
    };
    let stores = console::ConsoleStores {
        inbox: args.store.open().await?,
        replayer: ops.replayer,
        audit: ops.audit,
        intake: None,
        backend,
    };
    console::serve(stores, args.addr, args.token).await?;
    Ok(ExitCode::SUCCESS)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(args, Arc::new(ReferenceDomain::new())).await,
        Command::Listen(args) => listen::run(args, Arc::new(ReferenceDomain::new())).await,
        Command::Config { command } => config_check::run(command),
        // The business's view of its orders: the reference domain's.
        Command::Reconcile(args) => reconcile::run(args, Arc::new(ReferenceDomain)).await,
        Command::Send(args) => send::run(args).await,
        Command::Events { command } => events::run(command).await,
        Command::Orders { command } => business::run_orders(command).await,
        Command::Inventory { command } => business::run_inventory(command).await,
        Command::Dlq { command } => ops::run_dlq(command).await,
        Command::Replay(args) => ops::run_replay(args).await,
        Command::Audit { command } => ops::run_audit(command).await,
        Command::Console(args) => run_console(args).await,
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("einmal: {err}");
            ExitCode::from(2)
        }
    }
}
