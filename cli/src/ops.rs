//! Operator commands: `einmal dlq list|show`, `einmal replay` (one event or bulk, with
//! a dry run and progress), `einmal audit list`. Every replay is audited.
//!
//! `dlq list` shows both kinds of dead letter: events whose processing was given up
//! (state `dead_letter`, their lines and JSON as before, JSON with `"kind": "event"`),
//! then the deliveries the relay gave up on (`"kind": "delivery"`: an event that was
//! processed, `completed`, but a destination refused it), read from the store's index
//! of dead-lettered deliveries. `--events` / `--deliveries` show one kind only.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use einmal::audit::AuditRecord;
use einmal::envelope::InboxKey;
use einmal::pipeline::relay::{excerpt, BACKLOG_SCAN_MAX, EXCERPT_CHARS};
use einmal::pipeline::replay::{BulkSelector, ItemOutcome, Operator, ReplayReport};
use einmal::ports::{
    DeliveryState, DeliveryStatus, InboxFilter, InboxItem, InboxRelay, InboxState,
};
use einmal::text::{json_terminal_safe as safe_json, terminal_safe as safe};
use einmal::time::now_millis;
use einmal::time::parse_rfc3339;
use serde_json::json;

use crate::store::{ListArgs, ScopeArgs, StoreArgs};
use einmal_cli::error::CliError;

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Dead-lettered events (reason, attempts, age), then dead-lettered deliveries
    /// (`delivery <destination>`: attempts, last status, an excerpt of the last error).
    List {
        /// Only dead-lettered events (the output before deliveries were listed).
        #[arg(long, conflicts_with = "deliveries")]
        events: bool,
        /// Only dead-lettered deliveries.
        #[arg(long)]
        deliveries: bool,
        /// Only deliveries to this destination (implies --deliveries).
        #[arg(long)]
        destination: Option<String>,
        #[command(flatten)]
        scope: ScopeArgs,
        #[command(flatten)]
        list: ListArgs,
    },
    /// One dead-lettered event by its inbox key (`provider#tenant#event_id`).
    Show {
        id: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Audit records, newest first.
    List {
        #[command(flatten)]
        list: ListArgs,
    },
}

/// Replay one event (`--provider --tenant --event-id`) or, with `--bulk`, every event
/// a filter matches. Completed events stay completed unless `--force`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Replay every event the filter matches instead of one event.
    #[arg(long)]
    bulk: bool,
    #[arg(long, required_unless_present = "bulk")]
    provider: Option<String>,
    #[arg(long, required_unless_present = "bulk")]
    tenant: Option<String>,
    #[arg(long, required_unless_present = "bulk", conflicts_with = "bulk")]
    event_id: Option<String>,
    /// Bulk: event type (Stripe `type`, Shopify topic, …).
    #[arg(long = "type", requires = "bulk")]
    event_type: Option<String>,
    /// Bulk: received at or after (RFC 3339).
    #[arg(long, requires = "bulk", value_parser = parse_time)]
    since: Option<i64>,
    /// Bulk: received before (RFC 3339).
    #[arg(long, requires = "bulk", value_parser = parse_time)]
    until: Option<i64>,
    /// Bulk: only events in this state (e.g. dead_letter).
    #[arg(long, requires = "bulk", value_parser = parse_state)]
    state: Option<InboxState>,
    /// Bulk: most events read.
    #[arg(long, requires = "bulk", default_value_t = 0)]
    limit: usize,
    /// Why (recorded in the audit log; required unless --dry-run).
    #[arg(long, required_unless_present = "dry_run")]
    reason: Option<String>,
    /// Who (recorded in the audit log); defaults to $USER, required when it is unset.
    #[arg(long)]
    actor: Option<String>,
    /// Re-run completed / ignored events too (effects still apply at most once).
    #[arg(long)]
    force: bool,
    /// Bulk: show what would be replayed; change nothing, audit nothing.
    #[arg(long, requires = "bulk")]
    dry_run: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

fn parse_time(s: &str) -> Result<i64, String> {
    parse_rfc3339(s)
        .map(|secs| secs.saturating_mul(1000))
        .ok_or_else(|| format!("not an RFC 3339 time: {s:?}"))
}

fn parse_state(s: &str) -> Result<InboxState, String> {
    InboxState::parse(s).ok_or_else(|| {
        let all: Vec<_> = InboxState::ALL.iter().map(|s| s.as_str()).collect();
        format!("unknown state {s:?}; one of {}", all.join(", "))
    })
}

/// JSON on stdout, with what JSON leaves raw (format characters, C1 controls) of
/// stored strings escaped.
fn print_json(value: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    println!("{}", safe_json(&text));
    Ok(())
}

fn age(ms: i64) -> String {
    let secs = (ms / 1000).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn dlq_json(item: &InboxItem, now: i64) -> serde_json::Value {
    json!({
        "kind": "event",
        "id": item.key.as_str(),
        "provider": item.envelope.provider,
        "tenant": item.envelope.tenant,
        "event_id": item.envelope.event_id,
        "event_type": item.envelope.event_type,
        "state": item.state,
        "reason": item.last_error,
        "error_class": item.last_error_class,
        "attempts": item.attempts,
        "received_at_ms": item.received_at_ms,
        "updated_at_ms": item.updated_at_ms,
        "age_ms": now - item.received_at_ms,
    })
}

/// A dead-lettered delivery as `dlq list --json` shows it.
fn delivery_json(item: &InboxItem, d: &DeliveryStatus, now: i64) -> serde_json::Value {
    json!({
        "kind": "delivery",
        "id": item.key.as_str(),
        "provider": item.envelope.provider,
        "tenant": item.envelope.tenant,
        "event_id": item.envelope.event_id,
        "event_type": item.envelope.event_type,
        "event_state": item.state,
        "destination": d.destination,
        "delivery_key": d.key,
        "output": d.output.as_ref().map(|o| o.kind.clone()),
        "state": d.state,
        "attempts": d.attempts,
        "last_status": d.last_status,
        "last_attempt_ms": d.last_attempt_ms,
        "reason": d.detail.as_deref().map(|t| excerpt(t, EXCERPT_CHARS)),
        "received_at_ms": item.received_at_ms,
        "age_ms": now - item.received_at_ms,
    })
}

/// One line per dead-lettered delivery: the event's key where the event lines have it,
/// `delivery <destination>` where they have the event type.
fn delivery_line(item: &InboxItem, d: &DeliveryStatus, now: i64) -> String {
    let what = match &d.output {
        Some(output) => format!("delivery {} ({})", safe(&d.destination), safe(&output.kind)),
        None => format!("delivery {}", safe(&d.destination)),
    };
    format!(
        "{}  {:<28} attempts={} status={} age={}  {}",
        safe(item.key.as_str()),
        what,
        d.attempts,
        d.last_status.map_or("-".to_string(), |s| s.to_string()),
        age(now - item.received_at_ms),
        d.detail
            .as_deref()
            .map_or("-".to_string(), |t| excerpt(t, EXCERPT_CHARS))
    )
}

/// The dead-lettered deliveries within `scope` (and to `destination`), newest first:
/// up to `limit` deliveries, through the store's index (a read bounded by
/// [`BACKLOG_SCAN_MAX`] items).
pub(crate) async fn dead_deliveries<S: InboxRelay + ?Sized>(
    store: &S,
    provider: Option<&str>,
    tenant: Option<&str>,
    destination: Option<&str>,
    limit: usize,
) -> Result<Vec<(InboxItem, DeliveryStatus)>, String> {
    let items = store
        .relay_dead(BACKLOG_SCAN_MAX)
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for item in items {
        if provider.is_some_and(|p| p != item.envelope.provider)
            || tenant.is_some_and(|t| t != item.envelope.tenant)
        {
            continue;
        }
        for d in &item.deliveries {
            if d.state == DeliveryState::DeadLetter
                && destination.is_none_or(|name| name == d.destination)
                && out.len() < limit
            {
                out.push((item.clone(), d.clone()));
            }
        }
    }
    Ok(out)
}

/// `dlq list`'s line: stored text (type, reason) escaped (`einmal::text`).
fn dlq_line(item: &InboxItem, now: i64) -> String {
    format!(
        "{}  {:<28} attempts={} age={}  {}",
        safe(item.key.as_str()),
        safe(&item.envelope.event_type),
        item.attempts,
        age(now - item.received_at_ms),
        safe(item.last_error.as_deref().unwrap_or("-"))
    )
}

/// `dlq show`'s lines, stored text escaped.
fn dlq_details(item: &InboxItem, now: i64) -> String {
    [
        format!("id:          {}", safe(item.key.as_str())),
        format!("type:        {}", safe(&item.envelope.event_type)),
        format!("state:       {}", item.state),
        format!(
            "reason:      {} ({})",
            safe(item.last_error.as_deref().unwrap_or("-")),
            safe(item.last_error_class.as_deref().unwrap_or("-"))
        ),
        format!("attempts:    {}", item.attempts),
        format!("age:         {}", age(now - item.received_at_ms)),
        format!(
            "result:      {}",
            safe(item.result.as_deref().unwrap_or("-"))
        ),
    ]
    .join("\n")
}

pub async fn run_dlq(command: DlqCommand) -> Result<ExitCode, CliError> {
    let now = now_millis();
    match command {
        DlqCommand::List {
            events,
            deliveries,
            destination,
            scope: ScopeArgs { provider, tenant },
            list: ListArgs { limit, json, store },
        } => {
            let inbox = store.open().await?;
            let deliveries = deliveries || destination.is_some();
            let items = match deliveries {
                true => Vec::new(),
                false => inbox
                    .list(&InboxFilter {
                        state: Some(InboxState::DeadLetter),
                        provider: provider.clone(),
                        tenant: tenant.clone(),
                        limit,
                    })
                    .await
                    .map_err(|e| e.to_string())?,
            };
            let dead = match events {
                true => Vec::new(),
                false => {
                    dead_deliveries(
                        inbox.as_ref(),
                        provider.as_deref(),
                        tenant.as_deref(),
                        destination.as_deref(),
                        limit,
                    )
                    .await?
                }
            };
            if json {
                let values = items
                    .iter()
                    .map(|i| dlq_json(i, now))
                    .chain(dead.iter().map(|(i, d)| delivery_json(i, d, now)))
                    .collect();
                print_json(&values)?;
            } else {
                for item in &items {
                    println!("{}", dlq_line(item, now));
                }
                for (item, d) in &dead {
                    println!("{}", delivery_line(item, d, now));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        DlqCommand::Show { id, json, store } => {
            let inbox = store.open().await?;
            let key = InboxKey::from_stored(id);
            let Some(item) = inbox.get(&key).await.map_err(|e| e.to_string())? else {
                return Err(CliError::NotFound(format!("no event {key}")));
            };
            if json {
                print_json(&dlq_json(&item, now))?;
            } else {
                println!("{}", dlq_details(&item, now));
            }
            if item.state != InboxState::DeadLetter {
                eprintln!(
                    "einmal: {} is {}, not dead_letter",
                    safe(key.as_str()),
                    item.state
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn report_json(report: &ReplayReport) -> serde_json::Value {
    json!({
        "summary": report.summary,
        "audit_id": report.audit_id,
        "outcomes": report.outcomes.iter()
            .map(|(k, o)| json!({"id": k.as_str(), "outcome": o.as_str()}))
            .collect::<Vec<_>>(),
    })
}

/// Who an audit record names: `--actor`, else $USER; an audit record never names
/// "unknown", so with neither it is a usage error.
pub(crate) fn audit_actor(actor: Option<String>) -> Result<String, CliError> {
    actor
        .or_else(|| std::env::var("USER").ok())
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .ok_or_else(|| {
            CliError::Usage(
                "--actor is required when $USER is unset (the audit log names who)".into(),
            )
        })
}

pub async fn run_replay(args: ReplayArgs) -> Result<ExitCode, CliError> {
    // A dry run changes and audits nothing: it needs neither a reason nor an actor.
    let operator = if args.dry_run {
        Operator {
            actor: audit_actor(args.actor.clone()).unwrap_or_else(|_| "dry-run".into()),
            reason: args.reason.clone().unwrap_or_else(|| "dry run".into()),
        }
    } else {
        let reason = args.reason.clone().unwrap_or_default();
        if reason.trim().is_empty() {
            return Err(CliError::Usage("--reason must not be empty".into()));
        }
        Operator {
            actor: audit_actor(args.actor.clone())?,
            reason,
        }
    };
    let stores = args.store.open_ops().await?;
    let report = if args.bulk {
        let selector = BulkSelector {
            provider: args.provider.clone(),
            tenant: args.tenant.clone(),
            event_type: args.event_type.clone(),
            since_ms: args.since,
            until_ms: args.until,
            state: args.state,
            force: args.force,
            limit: args.limit,
        };
        // A bar only on a terminal: piped, redraws would fill the log with `\r` lines.
        let bar = (!args.json && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_message(if args.dry_run { "checked" } else { "replayed" });
            bar
        });
        let mut progress = |p: einmal::pipeline::replay::Progress<'_>| {
            if let Some(bar) = &bar {
                bar.set_length(p.total as u64);
                bar.set_position(p.done as u64);
            }
        };
        let report = stores
            .replayer
            .replay_bulk(&selector, args.dry_run, &operator, &mut progress)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        report
    } else {
        let (Some(provider), Some(tenant), Some(event_id)) =
            (&args.provider, &args.tenant, &args.event_id)
        else {
            return Err(CliError::Usage(
                "--provider, --tenant and --event-id are required".into(),
            ));
        };
        let key = InboxKey::new(provider, tenant, event_id);
        stores
            .replayer
            .replay_one(&key, args.force, &operator)
            .await
            .map_err(|e| e.to_string())?
    };
    if args.json {
        print_json(&report_json(&report))?;
    } else {
        if !args.bulk || report.outcomes.len() <= 20 {
            for (key, outcome) in &report.outcomes {
                match (report.summary.dry_run, outcome) {
                    (true, ItemOutcome::Replayed) => {
                        println!("{}  would replay", safe(key.as_str()))
                    }
                    (true, ItemOutcome::Redelivered) => {
                        println!("{}  would redeliver", safe(key.as_str()))
                    }
                    _ => println!("{}  {}", safe(key.as_str()), outcome.as_str()),
                }
            }
        }
        let s = &report.summary;
        let audit = report
            .audit_id
            .as_deref()
            .map(|id| format!(" audit={id}"))
            .unwrap_or_default();
        if s.dry_run {
            // Nothing was replayed: say what would be.
            println!(
                "dry run (nothing changed): would replay {} and redeliver {} of matched={} already_done={} busy={}",
                s.replayed, s.redelivered, s.matched, s.already_done, s.busy
            );
        } else {
            if args.force && s.replayed > 0 {
                // What a forced re-run of a completed event does (the processor logs
                // it per event: "effects already applied, nothing changed; ...").
                println!(
                    "forced: a completed event runs its decision again; effects already applied stay as they are and it keeps its result; its deliveries are sent again under the same keys"
                );
            }
            println!(
                "matched={} replayed={} redelivered={} already_done={} busy={} missing={} failed={} dead_letters_removed={}{audit}",
                s.matched,
                s.replayed,
                s.redelivered,
                s.already_done,
                s.busy,
                s.missing,
                s.failed,
                s.dead_letters_removed,
            );
        }
    }
    let bad = report.outcomes.iter().any(|(_, o)| {
        matches!(
            o,
            ItemOutcome::Failed | ItemOutcome::Missing | ItemOutcome::Busy
        )
    });
    Ok(if bad {
        ExitCode::from(einmal_cli::error::EXIT_NEGATIVE)
    } else {
        ExitCode::SUCCESS
    })
}

fn audit_line(r: &AuditRecord) -> String {
    format!(
        "{}  {}  {:<12} by {}  events={}  result={}  reason={:?}",
        safe(&r.id),
        einmal::time::format_rfc3339(r.at_ms / 1000),
        safe(&r.action),
        safe(&r.actor),
        r.events.len(),
        json!({
            "replayed": r.result["replayed"],
            "redelivered": r.result["redelivered"],
            "already_done": r.result["already_done"],
            "busy": r.result["busy"],
            "missing": r.result["missing"],
            "failed": r.result["failed"],
        }),
        r.reason
    )
}

pub async fn run_audit(command: AuditCommand) -> Result<ExitCode, CliError> {
    match command {
        AuditCommand::List {
            list: ListArgs { limit, json, store },
        } => {
            let stores = store.open_ops().await?;
            let records = stores.audit.list(limit).await.map_err(|e| e.to_string())?;
            if json {
                print_json(&serde_json::to_value(&records).map_err(|e| e.to_string())?)?;
            } else {
                for r in &records {
                    println!("{}", audit_line(r));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_line_counts_redeliveries() {
        let record = AuditRecord {
            id: "a1".into(),
            at_ms: 1_764_600_000_000,
            actor: "ops-alice".into(),
            action: "replay".into(),
            reason: "crm fixed".into(),
            selector: json!({}),
            events: vec!["stripe#demo#evt_1".into()],
            result: json!({"matched": 1, "replayed": 0, "redelivered": 1, "already_done": 0,
                "busy": 0, "missing": 0, "failed": 0}),
        };
        let line = audit_line(&record);
        assert!(line.contains(r#""redelivered":1"#), "{line}");
        assert!(line.contains(r#""replayed":0"#), "{line}");
    }
}
