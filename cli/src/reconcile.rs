//! `einmal reconcile`: pull recent events from the providers' APIs since the stored
//! checkpoint and ingest what the inbox lacks (`source = reconcile`), through the same
//! idempotent path as webhooks. See `einmal::reconcile`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use einmal::config_source::ConfigSource;
use einmal::domain::payment_view::PaymentView;
use einmal::https::HttpsClient;
use einmal::pipeline::ingest::Ingestor;
use einmal::reconcile::{audit_record, ReconcileOptions, Reconciler};
use einmal::text::terminal_safe as safe;
use einmal::time::parse_rfc3339;

use crate::store::StoreArgs;
use einmal_cli::error::CliError;

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Tenant configuration (TOML); `api_key` (Stripe, Mollie) / `access_token`
    /// (Shopify, GoPay) / `api_username` + `api_password` (Klarna push) options,
    /// possibly `env:VAR`, and optionally `api_base`.
    #[arg(long, default_value_os_t = crate::default_config_path())]
    pub config: PathBuf,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Only this provider (stripe, shopify, mollie, gopay, klarna-push).
    #[arg(long)]
    pub provider: Option<String>,
    /// Only this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Start here (RFC 3339) instead of the stored checkpoint.
    #[arg(long)]
    pub since: Option<String>,
    /// Why (recorded in the audit log).
    #[arg(long, default_value = "scheduled")]
    pub reason: String,
    /// Who (recorded in the audit log); defaults to $USER.
    #[arg(long)]
    pub actor: Option<String>,
    /// Print the reports as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Reconcile with `view` reading what the business believes about its orders.
pub async fn run(args: ReconcileArgs, view: Arc<dyn PaymentView>) -> Result<ExitCode, CliError> {
    let since = match args.since.as_deref() {
        Some(s) => Some(parse_rfc3339(s).ok_or_else(|| format!("--since: not RFC 3339: {s}"))?),
        None => None,
    };
    // Before any work: a run whose audit record could not name who ran it.
    let actor = crate::ops::audit_actor(args.actor.clone())?;
    let config = Arc::new(einmal_cli::config_file::load(&args.config).await?);
    let store = args.store.open().await?;
    let state = args.store.open_state().await?;
    let ingestor = Arc::new(Ingestor::from_store(
        ConfigSource::fixed(config),
        store.clone(),
    ));
    let audit = args.store.open_audit().await?;
    let reconciler =
        Reconciler::new(ingestor, state.clone(), view, HttpsClient::new()).with_hints(store);
    let options = ReconcileOptions {
        provider: args.provider,
        tenant: args.tenant,
        since,
    };
    let reports = reconciler
        .run_with(&options, Some(state.as_ref()))
        .await
        .map_err(|e| e.to_string())?;
    if let Some(audit) = &audit {
        let record = audit_record(
            &actor,
            &args.reason,
            &options,
            &reports,
            einmal::time::now_millis(),
        );
        audit
            .append(&record)
            .await
            .map_err(|e| format!("reconciled, but the audit record failed: {e}"))?;
    }
    // A failed run always says why on stderr (also with --json, whose reports carry
    // the same text in `error`).
    for r in reports.iter().filter(|r| r.error.is_some()) {
        eprintln!(
            "einmal reconcile: {} tenant {} failed, checkpoint kept: {}",
            r.provider,
            r.tenant,
            safe(r.error.as_deref().unwrap_or_default())
        );
    }
    if args.json {
        let text = serde_json::to_string_pretty(&reports).map_err(|e| e.to_string())?;
        println!("{}", einmal::text::json_terminal_safe(&text));
    } else if reports.is_empty() {
        println!(
            "no tenant to reconcile (set `api_key` / `access_token` / `api_username` options)"
        );
    } else {
        println!(
            "{:<10} {:<16} {:>8} {:>8} {:>9}  since → checkpoint",
            "PROVIDER", "TENANT", "FETCHED", "PRESENT", "INGESTED"
        );
        for r in &reports {
            let end = match (&r.checkpoint, &r.error) {
                (Some(c), _) => safe(c).into_owned(),
                (None, Some(e)) => format!("error: {}", safe(e)),
                (None, None) => String::new(),
            };
            println!(
                "{:<10} {:<16} {:>8} {:>8} {:>9}  {} → {end}",
                r.provider,
                r.tenant,
                r.fetched,
                r.already_present,
                r.ingested,
                safe(&r.since)
            );
        }
        let differences: Vec<_> = reports.iter().flat_map(|r| &r.differences).collect();
        if !differences.is_empty() {
            println!();
            println!(
                "{:<10} {:<16} {:<28} {:<16} {:<10} OURS",
                "PROVIDER", "TENANT", "OBJECT", "ORDER", "PROVIDER"
            );
            for d in differences {
                println!(
                    "{:<10} {:<16} {:<28} {:<16} {:<10} {}",
                    d.provider,
                    d.tenant,
                    safe(&d.object_id),
                    safe(&d.order_id),
                    safe(&d.provider_status),
                    safe(&d.our_status)
                );
            }
        }
    }
    Ok(if reports.iter().any(|r| r.error.is_some()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
