//! `einmal`: run einmal locally, send signed sample webhooks, inspect the inbox.

mod business;
mod completions;
mod config_check;
mod events;
mod listen;
mod ops;
mod reconcile;
mod send;
mod setup;
mod store;

use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, Parser, Subcommand};
use einmal::domain::reference::ReferenceDomain;
// The embedded pipeline lives in the library (`einmal_cli`), usable with any domain.
pub use einmal_cli::default_config_path;
use einmal_cli::error::{self, CliError};
use einmal_cli::serve;

#[derive(Parser)]
#[command(
    name = "einmal",
    version,
    about = "Exactly-once business effects from at-least-once webhooks",
    after_help = error::EXIT_CODES_HELP
)]
struct Cli {
    /// Print data as JSON on stdout and an error as a JSON object on stderr.
    #[arg(long, global = true)]
    json: bool,
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
    /// Create the stores the code expects: on AWS the tables, indexes and queues named
    /// by the Lambdas' environment variables; embedded, the --data-dir store. Idempotent.
    Setup(setup::SetupArgs),
    /// Print a shell completion script (e.g. `einmal completions bash > ~/.local/share/bash-completion/completions/einmal`).
    Completions(completions::CompletionsArgs),
    /// Print the man page (roff), e.g. `einmal man | man -l -`.
    Man(completions::ManArgs),
    /// The web console (events, dead letters and replays, audit log, reconciliation)
    /// on the chosen store; `einmal serve` also serves it at /console.
    Console(ConsoleArgs),
    /// The embedded store's figures.
    Store {
        #[command(subcommand)]
        command: einmal_cli::store_cmd::StoreCommand,
    },
    /// Copy the embedded store consistently while `einmal serve` runs.
    Backup(einmal_cli::store_cmd::BackupArgs),
    /// Restore a copy made by `einmal backup` into a store no `einmal serve` runs on.
    Restore(einmal_cli::store_cmd::RestoreArgs),
}

#[derive(clap::Args)]
struct ConsoleArgs {
    /// Where to listen; an address that is not loopback needs --token.
    #[arg(long, default_value = "127.0.0.1:8790")]
    addr: std::net::SocketAddr,
    /// The console's token (at least 16 characters): asked for by every page.
    #[arg(long, env = "EINMAL_CONSOLE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A host name the console answers to besides the bound address (127.0.0.1,
    /// localhost, [::1] on its port): the name a reverse proxy forwards as `Host`,
    /// optionally with :port. Repeatable; any other Host is refused (421).
    #[arg(long = "host", visible_alias = "console-host", value_name = "NAME")]
    hosts: Vec<String>,
    /// Mark the session cookie `Secure` (the console is behind a TLS proxy; a login
    /// from an https origin sets it anyway).
    #[arg(long, visible_alias = "console-secure-cookie")]
    secure_cookie: bool,
    /// Tenant configuration (TOML): its secrets are masked in the bodies shown. The
    /// default file may be missing (said on stderr); a given one must load.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    #[command(flatten)]
    limits: ConsoleLimits,
    #[command(flatten)]
    store: store::StoreArgs,
}

/// `einmal console`'s HTTP bounds (as `einmal serve`'s, sized for a few operators).
#[derive(clap::Args)]
struct ConsoleLimits {
    /// Milliseconds a client has to send a complete request head; also how long an
    /// idle keep-alive connection stays open.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    header_read_timeout_ms: u64,
    /// Milliseconds a client has to send a whole form.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout_ms: u64,
    /// Connections open at once; one more is answered 503 and closed.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_connections: u64,
    /// Connections one peer IP address may hold at once; one more is answered 503
    /// and closed.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_connections_per_peer: u64,
}

impl ConsoleLimits {
    fn client_limits(&self) -> einmal_cli::serve_http::ClientLimits {
        einmal_cli::serve_http::ClientLimits {
            header_read_timeout_ms: self.header_read_timeout_ms,
            body_timeout_ms: self.body_timeout_ms,
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            // No webhook bodies here: the console bounds its forms itself.
            max_body_bytes_in_flight: 1 << 20,
        }
    }
}

/// The tenant configuration's secrets, registered for masking (the bodies and
/// headers the console shows); a missing default file is said, a bad one refused.
async fn mask_configured_secrets(config: Option<&std::path::Path>) -> Result<(), CliError> {
    let (path, given) = match config {
        Some(path) => (path.to_owned(), true),
        None => (default_config_path(), false),
    };
    if !given && !path.exists() {
        eprintln!(
            "einmal: no {} here: only credential-like fields are masked in bodies (give --config)",
            path.display()
        );
        return Ok(());
    }
    let config = einmal_cli::config_file::load(&path).await?;
    einmal::telemetry::redact::register_config(&config);
    Ok(())
}

/// `einmal console`: the token rule first, then the configuration and the stores,
/// then serve.
async fn run_console(args: ConsoleArgs) -> Result<ExitCode, CliError> {
    use einmal_cli::console;
    // A missing or short token, a bad host name: usage errors (exit 2), before
    // anything is opened.
    console::check_access(&args.addr, args.token.as_deref())
        .map_err(|e| CliError::Usage(e.to_string()))?;
    console::check_host_names(&args.hosts).map_err(|e| CliError::Usage(e.to_string()))?;
    mask_configured_secrets(args.config.as_deref()).await?;
    let ops = args.store.open_ops().await?;
    let backend = match args.store.backend {
        store::Backend::Embedded => format!("embedded, {}", args.store.data_dir.display()),
        store::Backend::Aws => "aws".to_owned(),
    };
    let stores = console::ConsoleStores {
        inbox: args.store.open().await?,
        replayer: ops.replayer,
        audit: ops.audit,
        figures: None,
        backend,
    };
    let limits = args.limits.client_limits();
    let options = console::ConsoleOptions {
        token: args.token,
        hosts: args.hosts,
        secure_cookie: args.secure_cookie,
        body_timeout: limits.body_timeout(),
    };
    console::serve(stores, args.addr, options, &limits).await?;
    Ok(ExitCode::SUCCESS)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage_error(err),
    };
    let json = cli.json;
    let result = match cli.command {
        // The AWS pipeline's reconciler reads the reference domain's orders too.
        Command::Serve(args) if args.aws.is_aws() => {
            einmal_cli::serve_aws::run(
                args,
                Arc::new(ReferenceDomain::new()),
                Some(Arc::new(ReferenceDomain)),
            )
            .await
        }
        Command::Serve(args) => serve::run(args, Arc::new(ReferenceDomain::new()))
            .await
            .map_err(CliError::from),
        Command::Listen(args) if args.serve.aws.is_aws() => {
            listen::run_aws(args, Arc::new(ReferenceDomain::new())).await
        }
        Command::Listen(args) => listen::run(args, Arc::new(ReferenceDomain::new()))
            .await
            .map_err(CliError::from),
        Command::Config { command } => config_check::run(command).await.map_err(CliError::from),
        // The business's view of its orders: the reference domain's.
        Command::Reconcile(args) => reconcile::run(args, Arc::new(ReferenceDomain)).await,
        Command::Send(args) => send::run(args).await.map_err(CliError::from),
        Command::Events { command } => events::run(command).await,
        Command::Orders { command } => business::run_orders(command).await,
        Command::Inventory { command } => business::run_inventory(command).await,
        Command::Dlq { command } => ops::run_dlq(command).await,
        Command::Replay(args) => ops::run_replay(args).await,
        Command::Audit { command } => ops::run_audit(command).await,
        Command::Setup(args) => setup::run(args, json).await,
        Command::Completions(args) => completions::completions(args, Cli::command()),
        Command::Man(args) => completions::man(args, Cli::command()),
        Command::Console(args) => run_console(args).await,
        Command::Store { command } => einmal_cli::store_cmd::run_store(command, json).await,
        Command::Backup(args) => einmal_cli::store_cmd::run_backup(args, json).await,
        Command::Restore(args) => einmal_cli::store_cmd::run_restore(args, json).await,
    };
    match result {
        Ok(code) => code,
        Err(err) => err.report(json),
    }
}

/// A command line clap refuses: its message and exit code 2 (with `--json`, as a JSON
/// error object); `--help` and `--version` print and exit 0 as usual.
fn usage_error(err: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let wants_json = std::env::args_os()
        .take_while(|a| a != "--")
        .any(|a| a == "--json");
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = err.print();
            ExitCode::SUCCESS
        }
        _ if wants_json => {
            // clap's message without its styling, trimmed to the error line and hint.
            let message = err.render().to_string();
            let message = message
                .trim()
                .trim_start_matches("error: ")
                .split("\n\nUsage:")
                .next()
                .unwrap_or_default()
                .trim();
            eprintln!("{}", error::error_json("usage", message));
            ExitCode::from(error::EXIT_USAGE)
        }
        _ => {
            let _ = err.print();
            ExitCode::from(error::EXIT_USAGE)
        }
    }
}
