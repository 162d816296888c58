//! The console's pages. Each handler parses its input strictly (4xx with the reason),
//! reads through the storage ports and renders with `maud`.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};

use einmal::audit::AuditRecord;
use einmal::envelope::InboxKey;
use einmal::pipeline::replay::BulkSelector;
use einmal::ports::{InboxFilter, InboxItem, InboxQuery, InboxState, SearchError};
use einmal::time::now_millis;

use super::page::{event_link, operator_of, render, report_markup, Page};
use super::view::{self, age, at, bars, ConsoleError, Params};
use super::{Console, BASE, MAX_SAMPLES, SAMPLE_EVERY_MS};

/// Outside the access rule: the answer says nothing about the store.
pub(super) async fn not_found(headers: HeaderMap) -> Response {
    let message = "no such console page";
    if view::wants_html(&headers) {
        let body = html! { p.error { (message) } };
        (
            axum::http::StatusCode::NOT_FOUND,
            view::public_page("Not Found", body),
        )
            .into_response()
    } else {
        view::json_error(axum::http::StatusCode::NOT_FOUND, "not_found", message)
    }
}

/// Most pending items read for the backlog figures (the sweeper's own bound).
const BACKLOG_READ: usize = 1_000;
const TERMINAL: [InboxState; 3] = [
    InboxState::Completed,
    InboxState::Ignored,
    InboxState::DeadLetter,
];

pub(super) async fn overview(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let page = overview_page(&console, query.as_deref().unwrap_or("")).await;
    render(&console, &headers, page)
}

async fn overview_page(console: &Console, query: &str) -> Page {
    Params::parse(query, &[])?;
    let now = now_millis();
    let inbox = &console.stores.inbox;
    let counts = inbox.count_states(&InboxFilter::default()).await?;
    // Pending items, oldest first: the sweeper's backlog and oldest-pending figures.
    let pending = inbox.stuck(now, BACKLOG_READ).await?;
    let oldest = pending
        .iter()
        .map(|i| now.saturating_sub(i.updated_at_ms))
        .max();
    let of = |s: InboxState| {
        counts
            .counts
            .iter()
            .find(|(c, _)| *c == s)
            .map_or(0, |c| c.1)
    };
    let terminal: u64 = TERMINAL.iter().map(|s| of(*s)).sum();
    let drain = drain_rate(console, now, terminal);
    let state_rows: Vec<(String, u64)> = counts
        .counts
        .iter()
        .map(|(s, n)| (s.as_str().to_owned(), *n))
        .collect();
    let figures = console.stores.figures.as_ref().map(|m| m.since_start());
    let deliveries = super::deliveries::overview_rows(console, now).await?;
    let body = html! {
        p.muted { "As of " (at(now)) @if counts.truncated { " (counts are lower bounds: the store's read bound was reached)" } }
        table {
            tr { th { "Backlog (pending events)" } td { (pending.len()) @if pending.len() == BACKLOG_READ { "+" } } }
            tr { th { "Oldest pending age" } td { (oldest.map(age).unwrap_or_else(|| "-".into())) } }
            tr { th { "Dead letters" } td { a href={ (BASE) "/dead-letters" } { (of(InboxState::DeadLetter)) } } }
            (deliveries)
            tr { th { "Drain rate" } td { (drain) } }
        }
        (bars("Events by state", &state_rows))
        @match figures {
            Some((c, processed)) => {
                table {
                    tr {
                        th { "PaymentWithinSlo since start" }
                        td {
                            @if processed.payments == 0 { "- (no payment event processed yet)" }
                            @else { (slo_share(processed.within_slo, processed.payments)) " (" (processed.within_slo) " of " (processed.payments) " payment events within the SLI threshold)" }
                        }
                    }
                    tr { th { "Completed since start" } td { (processed.completed) } }
                    tr { th { "Dead-lettered since start" } td { (processed.dead_letters) } }
                }
                (bars("Intake since start", &[
                    ("accepted".into(), c.accepted),
                    ("duplicates".into(), c.duplicates),
                    ("signature failures".into(), c.signature_failures),
                    ("malformed".into(), c.malformed),
                    ("rate limited".into(), c.rate_limited),
                    ("unavailable".into(), c.unavailable),
                ]))
            }
            None => {
                p.muted { "Intake counters (accepted, duplicates, signature failures) and PaymentWithinSlo are the receiver's and processor's metrics: in CloudWatch for a Lambda deployment, in the log of " code { "einmal serve" } "." }
            }
        }
    };
    Ok(("Overview".into(), body))
}

/// `within` of `total` as a percentage with one decimal.
fn slo_share(within: u64, total: u64) -> String {
    format!("{:.1}%", within as f64 * 100.0 / total as f64)
}

/// Events that reached a terminal state per second, between the oldest kept sample
/// and now (one sample per view, [`SAMPLE_EVERY_MS`] apart, [`MAX_SAMPLES`] kept).
fn drain_rate(console: &Console, now: i64, terminal: u64) -> String {
    let Ok(mut samples) = console.samples.lock() else {
        return "-".into();
    };
    if samples
        .back()
        .is_none_or(|(t, _)| now - t >= SAMPLE_EVERY_MS)
    {
        if samples.len() == MAX_SAMPLES {
            samples.pop_front();
        }
        samples.push_back((now, terminal));
    }
    match samples.front() {
        Some((t0, n0)) if now - t0 >= SAMPLE_EVERY_MS => {
            let rate = terminal.saturating_sub(*n0) as f64 * 1000.0 / (now - t0) as f64;
            format!("{rate:.1} events/s over the last {}", age(now - t0))
        }
        _ => "- (reload in a few seconds: measured between two views)".into(),
    }
}

const SEARCH_PARAMS: [&str; 9] = [
    "provider", "tenant", "state", "type", "object", "since", "until", "cursor", "limit",
];

fn parse_state(raw: Option<String>) -> Result<Option<InboxState>, ConsoleError> {
    raw.map(|s| {
        InboxState::parse(&s).ok_or_else(|| {
            let all: Vec<_> = InboxState::ALL.iter().map(|s| s.as_str()).collect();
            ConsoleError::BadRequest(format!("unknown state {s:?}; one of {}", all.join(", ")))
        })
    })
    .transpose()
}

fn search_query(p: &Params, state: Option<InboxState>) -> Result<InboxQuery, ConsoleError> {
    Ok(InboxQuery {
        filter: InboxFilter {
            state,
            provider: p.get("provider"),
            tenant: p.get("tenant"),
            limit: p.count("limit", 50, 500)?,
        },
        event_type: p.get("type"),
        object_id: p.get("object"),
        since_ms: p.time_ms("since")?,
        until_ms: p.time_ms("until")?,
        cursor: p.get("cursor"),
    })
}

fn search_error(e: SearchError) -> ConsoleError {
    match e {
        SearchError::InvalidCursor(m) => ConsoleError::BadRequest(format!("invalid cursor: {m}")),
        SearchError::Store(e) => e.into(),
    }
}

/// The link to the next page: the same search with `cursor`.
fn next_link(page: &str, raw_query: &str, cursor: &str) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(raw_query.as_bytes()) {
        if k != "cursor" && !v.is_empty() {
            out.append_pair(&k, &v);
        }
    }
    out.append_pair("cursor", cursor);
    format!("{BASE}/{page}?{}", out.finish())
}

pub(super) async fn events(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let page = events_page(&console, query.as_deref().unwrap_or("")).await;
    render(&console, &headers, page)
}

async fn events_page(console: &Console, raw: &str) -> Page {
    let p = Params::parse(raw, &SEARCH_PARAMS)?;
    let state = parse_state(p.get("state"))?;
    let query = search_query(&p, state)?;
    let inbox = &console.stores.inbox;
    let page = inbox.search(&query).await.map_err(search_error)?;
    let counts = inbox
        .count_states(&InboxFilter {
            provider: query.filter.provider.clone(),
            tenant: query.filter.tenant.clone(),
            ..InboxFilter::default()
        })
        .await?;
    let field = |name: &str| p.get(name).unwrap_or_default();
    let body = html! {
        form method="get" action={ (BASE) "/events" } id="search" {
            fieldset {
                label { "Provider " input type="text" name="provider" value=(field("provider")); } " "
                label { "Tenant " input type="text" name="tenant" value=(field("tenant")); } " "
                label { "State "
                    select name="state" {
                        option value="" { "any" }
                        @for s in InboxState::ALL {
                            option value=(s.as_str()) selected[state == Some(s)] { (s.as_str()) }
                        }
                    }
                }
            }
            fieldset {
                label { "Type " input type="text" name="type" value=(field("type")); } " "
                label { "Object id " input type="text" name="object" value=(field("object")); } " "
                label { "Since " input type="text" name="since" placeholder="2026-12-01T00:00:00Z" value=(field("since")); } " "
                label { "Until " input type="text" name="until" placeholder="RFC 3339" value=(field("until")); } " "
                button type="submit" id="search-button" { "Search" }
            }
        }
        p {
            "Counts by state" @if counts.truncated { " (lower bounds)" } ": "
            @for (s, n) in &counts.counts {
                a.state href={ (BASE) "/events?state=" (s.as_str()) } { (s.as_str()) "=" (n) } " "
            }
        }
        (items_table(&page.items, false, console))
        @if page.items.is_empty() { p.muted id="no-results" { "No event on this page." } }
        @if let Some(cursor) = &page.next_cursor {
            p { a id="next-page" href=(next_link("events", raw, cursor)) { "Next page →" } }
        }
    };
    Ok(("Events".into(), body))
}

fn items_table(items: &[InboxItem], replay: bool, console: &Console) -> Markup {
    let now = now_millis();
    html! {
        table.events {
            tr {
                th { "Event" } th { "Type" } th { "Object" } th { "State" } th { "Attempts" }
                th { "Received" } th { "Last error" }
                @if replay { th { "Replay" } }
            }
            @for item in items {
                tr {
                    td { a.event href=(event_link(item)) { (item.key.as_str()) } }
                    td { (item.envelope.event_type) }
                    td { (item.envelope.object_id.as_deref().unwrap_or("-")) }
                    td.state { (item.state.as_str()) }
                    td { (item.attempts) }
                    td { (at(item.received_at_ms)) " " span.muted { "(" (age(now - item.received_at_ms)) " ago)" } }
                    td { (item.last_error_class.as_deref().unwrap_or("")) " " (item.last_error.as_deref().unwrap_or("")) }
                    @if replay { td { (replay_form(console, item)) } }
                }
            }
        }
    }
}

fn replay_form(console: &Console, item: &InboxItem) -> Markup {
    html! {
        form.inline.replay method="post" action={ (BASE) "/replay" } {
            input type="hidden" name="csrf" value=(console.csrf);
            input type="hidden" name="id" value=(item.key.as_str());
            input type="text" name="reason" placeholder="reason (required)" required;
            " "
            input type="text" name="operator" placeholder="operator (required)" required;
            " "
            button type="submit" { "Replay" }
        }
    }
}

pub(super) async fn event(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let page = event_page(&console, query.as_deref().unwrap_or("")).await;
    render(&console, &headers, page)
}

async fn event_page(console: &Console, raw: &str) -> Page {
    let p = Params::parse(raw, &["id"])?;
    let id = p.required("id", "the event's id (provider#tenant#event_id)")?;
    let key = InboxKey::from_stored(id);
    let item = console
        .stores
        .inbox
        .get(&key)
        .await?
        .ok_or_else(|| ConsoleError::NotFound(format!("no event {key}")))?;
    let body = einmal::body::decompress(&item.body, item.body_len as usize)
        .map(|raw| view::redacted_body(&raw))
        .unwrap_or_else(|e| format!("(the stored body cannot be read: {e})"));
    let e = &item.envelope;
    let finished = matches!(
        item.state,
        InboxState::Completed | InboxState::Ignored | InboxState::DeadLetter
    );
    let markup = html! {
        table {
            tr { th { "Provider / tenant" } td { (e.provider) " / " (e.tenant) } }
            tr { th { "Event id" } td { (e.event_id) } }
            tr { th { "Type" } td { (e.event_type) } }
            tr { th { "Object" } td { (e.object_id.as_deref().unwrap_or("-")) " " (e.object_version.as_deref().unwrap_or("")) } }
            tr { th { "State" } td.state id="event-state" { (item.state.as_str()) } }
        }
        h2 { "Timeline" }
        table.timeline {
            tr { th { "Received" } td { (at(item.received_at_ms)) " via " (item.source.as_str()) } }
            @if item.attempts > 0 {
                tr { th { "Claimed" } td { (item.attempts) " attempt(s)"
                    @if let (Some(owner), Some(until)) = (&item.lease_owner, item.lease_until_ms) {
                        ", leased by " (owner) " until " (at(until))
                    } } }
            }
            @if item.last_error.is_some() || item.last_error_class.is_some() {
                tr { th { "Last failure" } td {
                    (item.last_error_class.as_deref().unwrap_or("-")) ": " (item.last_error.as_deref().unwrap_or("-")) } }
            }
            @if let Some(w) = &item.waiting {
                tr { th { "Waiting" } td { "on " (w.on) " since " (at(w.since_ms)) } }
            }
            @if finished {
                tr { th { (item.state.as_str()) } td { (at(item.updated_at_ms)) } }
            } @else {
                tr { th { "Last change" } td { (at(item.updated_at_ms)) } }
            }
            @if let Some(result) = &item.result {
                tr { th { "Effects applied" } td { code { (result) } } }
            }
            @for d in &item.deliveries {
                tr { th { (view::delivery_label(d)) } td {
                    (d.state.to_string()) ", " (d.attempts) " attempt(s)"
                    @if let Some(s) = d.last_status { ", status " (s) }
                    @if let Some(t) = d.last_attempt_ms { ", last " (at(t)) }
                    @if let Some(t) = d.next_attempt_ms { ", next " (at(t)) }
                    @if let Some(detail) = &d.detail { " — " (detail) }
                } }
            }
        }
        @if item.state == InboxState::DeadLetter
            || item.deliveries.iter().any(|d| d.state == einmal::ports::DeliveryState::DeadLetter) {
            h2 { "Replay" }
            (replay_form(console, &item))
        }
        h2 { "Body" }
        p.muted { "Credential-like fields and configured secrets are masked." }
        pre id="body" { (body) }
    };
    Ok((format!("Event {}", item.key), markup))
}

const DLQ_PARAMS: [&str; 7] = [
    "provider", "tenant", "type", "since", "until", "cursor", "limit",
];

pub(super) async fn dead_letters(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let page = dead_letters_page(&console, query.as_deref().unwrap_or("")).await;
    render(&console, &headers, page)
}

async fn dead_letters_page(console: &Console, raw: &str) -> Page {
    let p = Params::parse(raw, &DLQ_PARAMS)?;
    let query = search_query(&p, Some(InboxState::DeadLetter))?;
    let page = console
        .stores
        .inbox
        .search(&query)
        .await
        .map_err(search_error)?;
    let field = |name: &str| p.get(name).unwrap_or_default();
    let body = html! {
        (items_table(&page.items, true, console))
        @if page.items.is_empty() { p.muted id="no-results" { "No dead letter on this page." } }
        @if let Some(cursor) = &page.next_cursor {
            p { a id="next-page" href=(next_link("dead-letters", raw, cursor)) { "Next page →" } }
        }
        h2 { "Bulk replay" }
        p.muted { "Every dead letter the filter matches. Preview first: nothing changes and nothing is audited until you confirm." }
        form method="post" action={ (BASE) "/replay-bulk" } id="bulk" {
            input type="hidden" name="csrf" value=(console.csrf);
            fieldset {
                label { "Provider " input type="text" name="provider" value=(field("provider")); } " "
                label { "Tenant " input type="text" name="tenant" value=(field("tenant")); } " "
                label { "Type " input type="text" name="type" value=(field("type")); } " "
                label { "Since " input type="text" name="since" value=(field("since")); } " "
                label { "Until " input type="text" name="until" value=(field("until")); }
            }
            fieldset {
                label { "Reason " input type="text" name="reason" required; } " "
                label { "Operator " input type="text" name="operator" required; } " "
                button type="submit" name="action" value="preview" { "Preview (dry run)" }
            }
        }
    };
    Ok(("Dead letters".into(), body))
}

pub(super) async fn replay_one(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let page = replay_one_page(&console, &body).await;
    render(&console, &headers, page)
}

async fn replay_one_page(console: &Console, body: &str) -> Page {
    let p = Params::parse(body, &["csrf", "id", "reason", "operator"])?;
    let operator = operator_of(console, &p)?;
    let key = InboxKey::from_stored(p.required("id", "the event's id")?);
    let report = console
        .stores
        .replayer
        .replay_one(&key, false, &operator)
        .await
        .map_err(|e| ConsoleError::Unavailable(e.to_string()))?;
    Ok(("Replay".into(), report_markup(&report)))
}

pub(super) async fn replay_bulk(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let page = replay_bulk_page(&console, &body).await;
    render(&console, &headers, page)
}

async fn replay_bulk_page(console: &Console, body: &str) -> Page {
    let p = Params::parse(
        body,
        &[
            "csrf", "provider", "tenant", "type", "since", "until", "reason", "operator", "action",
        ],
    )?;
    let operator = operator_of(console, &p)?;
    let dry_run = match p.get("action").as_deref() {
        Some("preview") => true,
        Some("replay") => false,
        _ => return Err(ConsoleError::BadRequest("action: preview or replay".into())),
    };
    let selector = BulkSelector {
        provider: p.get("provider"),
        tenant: p.get("tenant"),
        event_type: p.get("type"),
        since_ms: p.time_ms("since")?,
        until_ms: p.time_ms("until")?,
        state: Some(InboxState::DeadLetter),
        force: false,
        limit: 0,
    };
    let report = console
        .stores
        .replayer
        .replay_bulk(&selector, dry_run, &operator, &mut |_| {})
        .await
        .map_err(|e| ConsoleError::Unavailable(e.to_string()))?;
    let hidden = |name: &str| p.get(name).unwrap_or_default();
    let markup = html! {
        (report_markup(&report))
        @if dry_run && report.summary.matched > 0 {
            form method="post" action={ (BASE) "/replay-bulk" } id="confirm" {
                input type="hidden" name="csrf" value=(console.csrf);
                @for name in ["provider", "tenant", "type", "since", "until", "reason", "operator"] {
                    input type="hidden" name=(name) value=(hidden(name));
                }
                p { "Reason: " (operator.reason) ", operator: " (operator.actor) }
                button type="submit" name="action" value="replay" { "Replay these " (report.summary.matched) }
            }
        }
    };
    Ok((
        if dry_run {
            "Bulk replay preview"
        } else {
            "Bulk replay"
        }
        .into(),
        markup,
    ))
}

pub(super) async fn audit(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let page = audit_page(&console, query.as_deref().unwrap_or("")).await;
    render(&console, &headers, page)
}

/// Events named per audit row at most (the record keeps them all).
const EVENTS_SHOWN: usize = 10;

async fn audit_page(console: &Console, raw: &str) -> Page {
    let p = Params::parse(raw, &["limit"])?;
    let records = console
        .stores
        .audit
        .list(p.count("limit", 100, 1_000)?)
        .await?;
    let body = html! {
        table.audit {
            tr { th { "At" } th { "Operator" } th { "Action" } th { "Reason" } th { "Events" } th { "Result" } }
            @for r in &records {
                tr {
                    td { (at(r.at_ms)) } td.actor { (r.actor) } td { (r.action) } td.reason { (r.reason) }
                    td { @for e in r.events.iter().take(EVENTS_SHOWN) { code { (e) } br; }
                         @if r.events.len() > EVENTS_SHOWN { "… " (r.events.len()) " in all" } }
                    td { code { (compact_result(r)) } }
                }
            }
        }
        @if records.is_empty() { p.muted { "No manual action yet." } }
    };
    Ok(("Audit log".into(), body))
}

fn compact_result(r: &AuditRecord) -> String {
    let keep = [
        "replayed",
        "redelivered",
        "already_done",
        "busy",
        "missing",
        "failed",
        "fetched",
        "ingested",
        "differences",
    ];
    let mut out = serde_json::Map::new();
    for k in keep {
        if let Some(v) = r.result.get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    serde_json::Value::Object(out).to_string()
}

pub(super) async fn reconcile(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let page = reconcile_page(&console, query.as_deref().unwrap_or("")).await;
    render(&console, &headers, page)
}

/// Audit records read to find the reconciliation runs (they are audited as
/// `reconcile`): the runs among the newest this many records are shown.
const RECONCILE_READ: usize = 1_000;

async fn reconcile_page(console: &Console, raw: &str) -> Page {
    Params::parse(raw, &[])?;
    let records = console.stores.audit.list(RECONCILE_READ).await?;
    let runs: Vec<&AuditRecord> = records.iter().filter(|r| r.action == "reconcile").collect();
    let body = html! {
        p.muted { "Runs of " code { "einmal reconcile" } " and of the reconciler function, from the audit log (the newest " (RECONCILE_READ) " records)." }
        @for r in &runs {
            h2 { (at(r.at_ms)) " by " (r.actor) " — " (r.reason) }
            table {
                tr { th { "Provider" } th { "Tenant" } th { "Since" } th { "Fetched" } th { "Already present" }
                     th { "Ingested" } th { "Differences" } th { "Checkpoint" } th { "Error" } }
                @for t in r.result["tenants"].as_array().into_iter().flatten() {
                    tr {
                        @for k in ["provider", "tenant", "since", "fetched", "already_present", "ingested", "differences", "checkpoint", "error"] {
                            td { (cell(&t[k])) }
                        }
                    }
                }
            }
            (differences_table(r))
            @if !r.events.is_empty() {
                p { "Ingested: " @for e in r.events.iter().take(EVENTS_SHOWN) { code { (e) } " " } }
            }
        }
        @if runs.is_empty() { p.muted { "No reconciliation run recorded." } }
    };
    Ok(("Reconciliation".into(), body))
}

/// The differences the run's audit record lists (at most
/// [`einmal::reconcile::MAX_AUDITED_DIFFERENCES`]; records of older runs have none).
fn differences_table(r: &AuditRecord) -> Markup {
    let total = r.result["differences"].as_u64().unwrap_or(0);
    let listed = r.result["difference_list"].as_array();
    html! {
        @if let Some(list) = listed.filter(|l| !l.is_empty()) {
            h3 { "Differences" @if (list.len() as u64) < total { " (the first " (list.len()) " of " (total) ")" } }
            table {
                tr { th { "Kind" } th { "Provider" } th { "Tenant" } th { "Object" } th { "Order" } th { "Provider says" } th { "Our order" } }
                @for d in list {
                    tr {
                        @for k in ["kind", "provider", "tenant", "object_id", "order_id", "provider_status", "our_status"] {
                            td { (cell(&d[k])) }
                        }
                    }
                }
            }
        } @else if total > 0 {
            p.muted { (total) " differences (this run's record keeps the count only)" }
        }
    }
}

fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "-".into(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
