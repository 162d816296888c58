//! `einmal events show|list`: read the inbox.

use std::process::ExitCode;

use clap::Subcommand;
use einmal::envelope::InboxKey;
use einmal::pipeline::relay::BACKLOG_SCAN_MAX;
use einmal::ports::{
    DeliveryState, DeliveryStatus, Inbox, InboxFilter, InboxItem, InboxQuery, InboxRelay,
    InboxState,
};
use einmal::text::{json_terminal_safe, terminal_safe as safe};

use crate::store::{ListArgs, ScopeArgs, StoreArgs};
use einmal_cli::error::CliError;

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// One inbox item.
    Show {
        #[arg(long)]
        provider: String,
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        event_id: String,
        /// Include the decompressed body (may hold personal data).
        #[arg(long)]
        body: bool,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Inbox items (newest first on the embedded store): `--limit` of them (read
    /// from the store a page of at most 1,000 at a time), or every match with
    /// `--all`; printed as they are read (`--json`: one JSON array). When more match
    /// than `--limit`, the cursor of the rest is printed on stderr.
    List {
        /// received, queued, processing, completed, ignored, retryable, waiting, dead_letter
        #[arg(long, value_parser = parse_state)]
        state: Option<InboxState>,
        /// Event type (Stripe `type`, Shopify topic, …).
        #[arg(long = "type")]
        event_type: Option<String>,
        /// The object the event is about (payment, order id).
        #[arg(long = "object")]
        object_id: Option<String>,
        /// Received at or after (RFC 3339).
        #[arg(long, value_parser = parse_time)]
        since: Option<i64>,
        /// Received before (RFC 3339).
        #[arg(long, value_parser = parse_time)]
        until: Option<i64>,
        /// Continue where the previous page stopped (the cursor it printed).
        #[arg(long, conflicts_with = "delivery_state")]
        cursor: Option<String>,
        /// Every matching event, page by page (no cursor to follow); instead of --limit.
        #[arg(long, conflicts_with_all = ["limit", "delivery_state"])]
        all: bool,
        /// Events with a delivery in this state: dead_letter (the relay gave up: the
        /// event itself is `completed`) or pending (being retried). Read from the
        /// store's index of such deliveries, newest dead letter / earliest retry
        /// first, one page (no cursor); each event's matching deliveries follow it.
        #[arg(long, value_parser = parse_delivery_state)]
        delivery_state: Option<DeliveryState>,
        /// With --delivery-state: only deliveries to this destination.
        #[arg(long, requires = "delivery_state")]
        destination: Option<String>,
        #[command(flatten)]
        scope: ScopeArgs,
        #[command(flatten)]
        list: ListArgs,
    },
}

pub(crate) fn parse_time(s: &str) -> Result<i64, String> {
    einmal::time::parse_rfc3339(s)
        .map(|secs| secs.saturating_mul(1000))
        .ok_or_else(|| format!("not an RFC 3339 time: {s:?}"))
}

fn parse_delivery_state(s: &str) -> Result<DeliveryState, String> {
    match s {
        "dead_letter" => Ok(DeliveryState::DeadLetter),
        "pending" => Ok(DeliveryState::Pending),
        _ => Err(format!(
            "unknown delivery state {s:?}; one of dead_letter, pending"
        )),
    }
}

fn parse_state(s: &str) -> Result<InboxState, String> {
    InboxState::parse(s).ok_or_else(|| {
        let all: Vec<_> = InboxState::ALL.iter().map(|s| s.as_str()).collect();
        format!("unknown state {s:?}; one of {}", all.join(", "))
    })
}

pub async fn run(command: EventsCommand) -> Result<ExitCode, CliError> {
    match command {
        EventsCommand::Show {
            provider,
            tenant,
            event_id,
            body,
            json,
            store,
        } => {
            let inbox = store.open().await?;
            let key = InboxKey::new(&provider, &tenant, &event_id);
            let item = inbox.get(&key).await.map_err(|e| e.to_string())?;
            let Some(item) = item else {
                return Err(CliError::NotFound(format!("no event {key}")));
            };
            let mut value = item_json(&item);
            if body {
                let raw = einmal::body::decompress(&item.body, item.body_len as usize)
                    .map_err(|e| e.to_string())?;
                value["body"] =
                    serde_json::Value::String(String::from_utf8_lossy(&raw).into_owned());
            }
            if json {
                let text = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
                println!("{}", json_terminal_safe(&text));
            } else {
                println!("{}{}", line(&item), delivery_lines(&item));
            }
            Ok(ExitCode::SUCCESS)
        }
        EventsCommand::List {
            state,
            event_type,
            object_id,
            since,
            until,
            cursor,
            all,
            delivery_state,
            destination,
            scope: ScopeArgs { provider, tenant },
            list: ListArgs { limit, json, store },
        } => {
            let inbox = store.open().await?;
            if let Some(wanted) = delivery_state {
                let query = InboxQuery {
                    filter: InboxFilter {
                        state,
                        provider,
                        tenant,
                        limit,
                    },
                    event_type,
                    object_id,
                    since_ms: since,
                    until_ms: until,
                    cursor: None,
                };
                let found =
                    with_deliveries(inbox.as_ref(), &query, wanted, destination.as_deref()).await?;
                if json {
                    let values: Vec<_> = found.iter().map(item_json).collect();
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&values).map_err(|e| e.to_string())?
                    );
                } else {
                    for item in &found {
                        let shown = |d: &DeliveryStatus| {
                            d.state == wanted
                                && destination.as_deref().is_none_or(|n| n == d.destination)
                        };
                        println!("{}{}", line(item), delivery_lines_of(item, shown));
                    }
                }
                return Ok(ExitCode::SUCCESS);
            }
            let wanted = if all {
                None
            } else if limit == 0 {
                Some(DEFAULT_LIMIT)
            } else {
                Some(limit)
            };
            let query = InboxQuery {
                filter: InboxFilter {
                    state,
                    provider,
                    tenant,
                    limit: 0,
                },
                event_type,
                object_id,
                since_ms: since,
                until_ms: until,
                cursor,
            };
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let rest = stream_pages(inbox.as_ref(), query, wanted, json, &mut out)
                .await
                .map_err(|e| CliError::from(e.to_string()))?;
            // On stderr, so stdout (text or JSON) stays the items alone.
            if let Some(next) = rest {
                eprintln!("einmal: more events: --cursor {}", safe(&next));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `--limit`'s default (and what 0 means).
const DEFAULT_LIMIT: usize = 100;

#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error(transparent)]
    Search(#[from] einmal::ports::SearchError),
    #[error("writing the list: {0}")]
    Write(#[from] std::io::Error),
}

/// Print the items `query` matches, at most `wanted` (all with `None`), reading the
/// store one page at a time and writing each page before the next is read (memory:
/// one page). Returns the cursor of the rest when `wanted` stopped the listing first.
async fn stream_pages<S: Inbox + ?Sized>(
    store: &S,
    mut query: InboxQuery,
    wanted: Option<usize>,
    json: bool,
    out: &mut impl std::io::Write,
) -> Result<Option<String>, StreamError> {
    let mut printed = 0usize;
    let mut opened = false;
    let rest = loop {
        let left = wanted.map_or(PAGE_MAX, |w| w.saturating_sub(printed));
        if left == 0 {
            break query.cursor;
        }
        query.filter.limit = left.min(PAGE_MAX);
        let page = store.search(&query).await?;
        // Nothing on stdout before the first page is in (a bad cursor prints nothing).
        if json && !opened {
            out.write_all(b"[")?;
            opened = true;
        }
        for item in &page.items {
            if json {
                let text = serde_json::to_string_pretty(&item_json(item))
                    .map_err(std::io::Error::other)?;
                let sep = if printed == 0 { "\n" } else { ",\n" };
                write!(out, "{sep}{}", json_terminal_safe(&text))?;
            } else {
                writeln!(out, "{}", line(item))?;
            }
            printed += 1;
        }
        out.flush()?;
        match page.next_cursor {
            Some(next) => query.cursor = Some(next),
            None => break None,
        }
    };
    if json {
        if !opened {
            out.write_all(b"[")?;
        }
        out.write_all(if printed == 0 { b"]\n" } else { b"\n]\n" })?;
    }
    out.flush()?;
    Ok(rest)
}

/// Items per store page: what both stores serve at most per search.
const PAGE_MAX: usize = 1_000;

/// The events `query` matches with a delivery in state `wanted` (to `destination`),
/// up to the query's limit, through the store's index of such deliveries.
async fn with_deliveries<S: InboxRelay + ?Sized>(
    store: &S,
    query: &InboxQuery,
    wanted: DeliveryState,
    destination: Option<&str>,
) -> Result<Vec<InboxItem>, CliError> {
    let items = match wanted {
        DeliveryState::DeadLetter => store.relay_dead(BACKLOG_SCAN_MAX).await,
        _ => store.relay_pending(BACKLOG_SCAN_MAX).await,
    }
    .map_err(|e| e.to_string())?;
    let f = &query.filter;
    let limit = if f.limit == 0 { 100 } else { f.limit };
    Ok(items
        .into_iter()
        .filter(|i| {
            let e = &i.envelope;
            f.state.is_none_or(|s| s == i.state)
                && f.provider.as_ref().is_none_or(|p| *p == e.provider)
                && f.tenant.as_ref().is_none_or(|t| *t == e.tenant)
                && query.event_type.as_ref().is_none_or(|t| *t == e.event_type)
                && query
                    .object_id
                    .as_ref()
                    .is_none_or(|o| Some(o) == e.object_id.as_ref())
                && query.since_ms.is_none_or(|s| i.received_at_ms >= s)
                && query.until_ms.is_none_or(|u| i.received_at_ms < u)
                && i.deliveries
                    .iter()
                    .any(|d| d.state == wanted && destination.is_none_or(|n| n == d.destination))
        })
        .take(limit)
        .collect())
}

fn item_json(item: &InboxItem) -> serde_json::Value {
    serde_json::to_value(item).unwrap_or_default()
}

/// One line per item; what came from a webhook or a destination is escaped
/// (`einmal::text::terminal_safe`).
fn line(item: &InboxItem) -> String {
    let mut line = format!(
        "{}  {:<11} {:<28} attempts={} received_at_ms={}",
        safe(item.key.as_str()),
        item.state.as_str(),
        safe(&item.envelope.event_type),
        item.attempts,
        item.received_at_ms
    );
    // A parked event says what it waits for and since when.
    if let (InboxState::Waiting, Some(w)) = (item.state, &item.waiting) {
        line.push_str(&format!(
            " waiting_on={} waiting_since_ms={} reason={:?}",
            safe(&w.on),
            w.since_ms,
            // Debug escapes control and format characters itself.
            item.last_error.as_deref().unwrap_or("")
        ));
    }
    line
}

/// One line per delivery: where it went, how it stands, its last attempt.
fn delivery_lines(item: &InboxItem) -> String {
    delivery_lines_of(item, |_| true)
}

/// [`delivery_lines`] of the deliveries `shown` picks.
fn delivery_lines_of(item: &InboxItem, shown: impl Fn(&DeliveryStatus) -> bool) -> String {
    let mut line = String::new();
    for d in item.deliveries.iter().filter(|d| shown(d)) {
        line.push_str(&format!(
            "\n  delivery {} {}",
            safe(&d.destination),
            d.state
        ));
        if let Some(output) = &d.output {
            line.push_str(&format!(" output={}", safe(&output.kind)));
        }
        line.push_str(&format!(" attempts={}", d.attempts));
        if let Some(status) = d.last_status {
            line.push_str(&format!(" status={status}"));
        }
        if let Some(ms) = d.last_latency_ms {
            line.push_str(&format!(" latency_ms={ms}"));
        }
        if let Some(at) = d.last_attempt_ms {
            line.push_str(&format!(" last_attempt={}", rfc3339_ms(at)));
        }
        if let Some(at) = d.next_attempt_ms {
            line.push_str(&format!(" next_attempt={}", rfc3339_ms(at)));
        }
        line.push_str(&format!(" key={}", safe(&d.key)));
        if let Some(detail) = &d.detail {
            line.push_str(&format!(" detail={detail:?}"));
        }
    }
    line
}

fn rfc3339_ms(ms: i64) -> String {
    einmal::time::format_rfc3339(ms.div_euclid(1000))
}
