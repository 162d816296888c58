//! `einmal reconcile`: pull recent events from the providers' APIs since the stored
//! checkpoint and ingest what the inbox lacks (`source = reconcile`), through the same
//! idempotent path as webhooks. See `einmal::reconcile`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use einmal::config::Config;
use einmal::pipeline::ingest::Ingestor;
use einmal::providers::sig::parse_rfc3339;
use einmal::reconcile::{ReconcileOptions, Reconciler};

use crate::store::StoreArgs;

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Tenant configuration (TOML); `api_key` (Stripe) / `access_token` (Shopify)
    /// options, possibly `env:VAR`, and optionally `api_base`.
    #[arg(long, default_value_os_t = crate::default_config_path())]
    pub config: PathBuf,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Only this provider (stripe, shopify).
    #[arg(long)]
    pub provider: Option<String>,
    /// Only this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Start here (RFC 3339) instead of the stored checkpoint.
    #[arg(long)]
    pub since: Option<String>,
    /// Print the reports as JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: ReconcileArgs) -> Result<ExitCode, String> {
    let since = match args.since.as_deref() {
        Some(s) => Some(parse_rfc3339(s).ok_or_else(|| format!("--since: not RFC 3339: {s}"))?),
        None => None,
    };
    let config = Arc::new(Config::load(&args.config).map_err(|e| e.to_string())?);
    let stores = args.store.open().await?;
    let state = args.store.open_state().await?;
    let ingestor = Arc::new(Ingestor::new(config, stores.inbox, stores.queue));
    let reconciler = Reconciler::new(ingestor, state);
    let options = ReconcileOptions {
        provider: args.provider,
        tenant: args.tenant,
        since,
    };
    let reports = reconciler.run(&options).await.map_err(|e| e.to_string())?;
    if args.json {
        let text = serde_json::to_string_pretty(&reports).map_err(|e| e.to_string())?;
        println!("{text}");
    } else if reports.is_empty() {
        println!("no tenant to reconcile (set `api_key` / `access_token` options)");
    } else {
        println!(
            "{:<10} {:<16} {:>8} {:>8} {:>9}  since → checkpoint",
            "PROVIDER", "TENANT", "FETCHED", "PRESENT", "INGESTED"
        );
        for r in &reports {
            let end = match (&r.checkpoint, &r.error) {
                (Some(c), _) => c.clone(),
                (None, Some(e)) => format!("error: {e}"),
                (None, None) => String::new(),
            };
            println!(
                "{:<10} {:<16} {:>8} {:>8} {:>9}  {} → {end}",
                r.provider, r.tenant, r.fetched, r.already_present, r.ingested, r.since
            );
        }
    }
    Ok(if reports.iter().any(|r| r.error.is_some()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
