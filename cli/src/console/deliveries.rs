//! The console's Deliveries page: what the relay could not deliver. An event can be
//! `completed` while a destination refused it (a revoked privilege, an endpoint that
//! answers 410), so the dead-lettered deliveries are listed here, per destination,
//! from the store's index of them (and the pending ones from the relay's index), with
//! a replay of one or many events through the same audited [`Replayer`] as
//! `einmal replay` (it schedules the event's dead-lettered deliveries again, same keys;
//! the relay sends them on its next pass).
//!
//! Also the Overview's delivery figures ([`overview_rows`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{html, Markup};

use einmal::envelope::InboxKey;
use einmal::pipeline::relay::{backlog_of, excerpt, EXCERPT_CHARS};
use einmal::ports::{DeliveryState, DeliveryStatus, InboxItem};
use einmal::time::now_millis;

use super::page::{event_link, operator_of, render, report_markup, Page};
use super::view::{age, at, ConsoleError, Params};
use super::{Console, BASE};

/// Items read from each index at most (the Overview's and the sweeper's bound).
const READ: usize = 1_000;

const PARAMS: [&str; 5] = ["state", "destination", "provider", "tenant", "limit"];

/// Per destination: dead-lettered deliveries, pending ones, the oldest pending
/// delivery's event age (ms).
#[derive(Default)]
struct Figures {
    dead: u64,
    pending: u64,
    oldest_pending_ms: Option<i64>,
}

/// The Overview's rows: dead-lettered deliveries (linked here) and the oldest pending
/// delivery's age, over every destination.
pub(super) async fn overview_rows(console: &Console, now: i64) -> Result<Markup, ConsoleError> {
    let store = &console.stores.inbox;
    let dead = store.relay_dead(READ).await?;
    let pending = store.relay_pending(READ).await?;
    let dead_count = dead_of(&dead).count();
    let backlog = backlog_of(&pending, now, |_, _| false);
    let pending_count: u64 = backlog.per_destination.values().map(|(n, _)| n).sum();
    let oldest = backlog.per_destination.values().map(|(_, age)| *age).max();
    let more = |n: usize| if n >= READ { "+" } else { "" };
    Ok(html! {
        tr { th { "Dead-lettered deliveries" } td {
            a id="dead-deliveries" href={ (BASE) "/deliveries" } { (dead_count) (more(dead.len())) }
        } }
        tr { th { "Pending deliveries" } td {
            a href={ (BASE) "/deliveries?state=pending" } { (pending_count) (more(pending.len())) }
            " (oldest " span id="oldest-pending-delivery" { (oldest.map(age).unwrap_or_else(|| "-".into())) } ")"
        } }
    })
}

fn dead_of(items: &[InboxItem]) -> impl Iterator<Item = (&InboxItem, &DeliveryStatus)> {
    of_state(items, DeliveryState::DeadLetter)
}

fn of_state(
    items: &[InboxItem],
    state: DeliveryState,
) -> impl Iterator<Item = (&InboxItem, &DeliveryStatus)> {
    items.iter().flat_map(move |item| {
        item.deliveries
            .iter()
            .filter(move |d| d.state == state)
            .map(move |d| (item, d))
    })
}

pub(super) async fn deliveries(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let page = deliveries_page(&console, query.as_deref().unwrap_or("")).await;
    render(&console, &headers, page)
}

async fn deliveries_page(console: &Console, raw: &str) -> Page {
    let p = Params::parse(raw, &PARAMS)?;
    let state = match p.get("state").as_deref() {
        None | Some("dead_letter") => DeliveryState::DeadLetter,
        Some("pending") => DeliveryState::Pending,
        Some(other) => {
            return Err(ConsoleError::BadRequest(format!(
                "unknown delivery state {other:?}; one of dead_letter, pending"
            )))
        }
    };
    let limit = p.count("limit", 100, 1_000)?;
    let (destination, provider, tenant) =
        (p.get("destination"), p.get("provider"), p.get("tenant"));
    let now = now_millis();
    let store = &console.stores.inbox;
    let dead = store.relay_dead(READ).await?;
    let pending = store.relay_pending(READ).await?;
    // The per-destination summary, over everything read.
    let mut per: BTreeMap<String, Figures> = BTreeMap::new();
    for (_, d) in dead_of(&dead) {
        per.entry(d.destination.clone()).or_default().dead += 1;
    }
    for (name, (n, oldest)) in backlog_of(&pending, now, |_, _| false).per_destination {
        let f = per.entry(name).or_default();
        f.pending = n;
        f.oldest_pending_ms = Some(oldest);
    }
    let listed = if state == DeliveryState::DeadLetter {
        &dead
    } else {
        &pending
    };
    let rows: Vec<(&InboxItem, &DeliveryStatus)> = of_state(listed, state)
        .filter(|(item, d)| {
            destination.as_ref().is_none_or(|n| *n == d.destination)
                && provider
                    .as_ref()
                    .is_none_or(|v| *v == item.envelope.provider)
                && tenant.as_ref().is_none_or(|v| *v == item.envelope.tenant)
        })
        .take(limit)
        .collect();
    let field = |name: &str| p.get(name).unwrap_or_default();
    let dead_state = state == DeliveryState::DeadLetter;
    let body = html! {
        p.muted { "Deliveries the relay gave up on (dead_letter) or is retrying (pending). The event itself may be "
            code { "completed" } ": processing succeeded, a destination refused it. As of " (at(now)) "." }
        table id="per-destination" {
            tr { th { "Destination" } th { "Dead-lettered" } th { "Pending" } th { "Oldest pending" } }
            @for (name, f) in &per {
                tr {
                    td.destination { (name) }
                    td { a href=(link("dead_letter", name)) { (f.dead) } }
                    td { a href=(link("pending", name)) { (f.pending) } }
                    td { (f.oldest_pending_ms.map(age).unwrap_or_else(|| "-".into())) }
                }
            }
        }
        @if per.is_empty() { p.muted { "No dead-lettered or pending delivery." } }
        form method="get" action={ (BASE) "/deliveries" } id="filter" {
            fieldset {
                label { "State "
                    select name="state" {
                        option value="dead_letter" selected[dead_state] { "dead_letter" }
                        option value="pending" selected[!dead_state] { "pending" }
                    }
                } " "
                label { "Destination " input type="text" name="destination" value=(field("destination")); } " "
                label { "Provider " input type="text" name="provider" value=(field("provider")); } " "
                label { "Tenant " input type="text" name="tenant" value=(field("tenant")); } " "
                button type="submit" { "Show" }
            }
        }
        @if rows.is_empty() {
            p.muted id="no-deliveries" { "No " (state.as_str()) " delivery." }
        } @else {
            form method="post" action={ (BASE) "/deliveries/replay" } id="replay-deliveries" {
                input type="hidden" name="csrf" value=(console.csrf);
                (rows_table(&rows, now, dead_state))
                @if dead_state {
                    p.muted { "A replay schedules every dead-lettered delivery of the selected events again (same keys, so a destination that dedups applies each once); the relay sends them on its next pass. Audited like " code { "einmal replay" } "." }
                    fieldset {
                        label { "Reason " input type="text" name="reason" required; } " "
                        label { "Operator " input type="text" name="operator" required; } " "
                        button type="submit" id="replay-selected" { "Replay selected" }
                    }
                }
            }
        }
    };
    Ok(("Deliveries".into(), body))
}

fn link(state: &str, destination: &str) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("state", state);
    q.append_pair("destination", destination);
    format!("{BASE}/deliveries?{}", q.finish())
}

fn rows_table(rows: &[(&InboxItem, &DeliveryStatus)], now: i64, select: bool) -> Markup {
    html! {
        table.deliveries {
            tr {
                @if select { th { "Select" } }
                th { "Event" } th { "Destination" } th { "State" } th { "Attempts" }
                th { "Last status" } th { "Last attempt" } th { "Next attempt" } th { "Last error" }
            }
            @for (item, d) in rows {
                tr.delivery {
                    @if select { td { input type="checkbox" name="id" value=(item.key.as_str()); } }
                    td { a.event href=(event_link(item)) { (item.key.as_str()) } br;
                         span.muted { (item.envelope.event_type) ", event " (item.state.as_str()) } }
                    td.destination { (d.destination)
                        @if let Some(output) = &d.output { " " span.muted { "(" (output.kind) ")" } } }
                    td.state { (d.state.as_str()) }
                    td.attempts { (d.attempts) }
                    td.status { (d.last_status.map_or("-".to_string(), |s| s.to_string())) }
                    td { @if let Some(t) = d.last_attempt_ms { (at(t)) " " span.muted { "(" (age(now - t)) " ago)" } } @else { "-" } }
                    td { @if let Some(t) = d.next_attempt_ms { (at(t)) } @else { "-" } }
                    td.detail { (d.detail.as_deref().map_or("-".to_string(), |t| excerpt(t, EXCERPT_CHARS))) }
                }
            }
        }
    }
}

pub(super) async fn replay(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let page = replay_page(&console, &body).await;
    render(&console, &headers, page)
}

/// Most events one form replays.
const MAX_SELECTED: usize = 1_000;

async fn replay_page(console: &Console, body: &str) -> Page {
    // `id` repeats (one per checked row); every other field is strict as elsewhere.
    let mut ids = Vec::new();
    // (The serializer is not `Send`: it must not live across the awaits below.)
    let rest = {
        let mut rest = form_urlencoded::Serializer::new(String::new());
        for (name, value) in form_urlencoded::parse(body.as_bytes()) {
            match name.as_ref() {
                "id" if !value.trim().is_empty() => ids.push(InboxKey::from_stored(value.trim())),
                "id" => {}
                _ => {
                    rest.append_pair(&name, &value);
                }
            }
        }
        rest.finish()
    };
    let p = Params::parse(&rest, &["csrf", "reason", "operator"])?;
    let operator = operator_of(console, &p)?;
    if ids.is_empty() {
        return Err(ConsoleError::BadRequest(
            "select at least one delivery".into(),
        ));
    }
    if ids.len() > MAX_SELECTED {
        return Err(ConsoleError::BadRequest(format!(
            "at most {MAX_SELECTED} events per replay"
        )));
    }
    let report = console
        .stores
        .replayer
        .replay_keys(&ids, &operator)
        .await
        .map_err(|e| ConsoleError::Unavailable(e.to_string()))?;
    let markup = html! {
        (report_markup(&report))
        p { a href={ (BASE) "/deliveries" } { "Back to the deliveries" } }
    };
    Ok(("Replay".into(), markup))
}
