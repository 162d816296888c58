//! What every console page shares: the page result, its rendering in the layout, the
//! link to an event, the replay form's operator and the replay report's markup.

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};

use einmal::pipeline::replay::{Operator, ReplayReport};
use einmal::ports::InboxItem;

use super::view::{self, ConsoleError, Params};
use super::{auth, Console, BASE};

pub(super) type Page = Result<(String, Markup), ConsoleError>;

/// The response of a page: its markup in the layout, or the error.
pub(super) fn render(console: &Console, headers: &HeaderMap, page: Page) -> Response {
    match page {
        Ok((title, body)) => view::page(console, &title, body).into_response(),
        Err(e) => e.respond(console, headers),
    }
}

pub(super) fn event_link(item: &InboxItem) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("id", item.key.as_str());
    format!("{BASE}/event?{}", q.finish())
}

/// The form's CSRF token, reason and operator, all required.
pub(super) fn operator_of(console: &Console, p: &Params) -> Result<Operator, ConsoleError> {
    let csrf = p.get("csrf").unwrap_or_default();
    if !auth::same(&csrf, &console.csrf) {
        return Err(ConsoleError::Csrf);
    }
    Ok(Operator {
        reason: p.required("reason", "a reason (recorded in the audit log)")?,
        actor: p.required(
            "operator",
            "the operator's name (recorded in the audit log)",
        )?,
    })
}

pub(super) fn report_markup(report: &ReplayReport) -> Markup {
    let s = &report.summary;
    html! {
        p id="replay-summary" {
            @if s.dry_run { "Would replay " (s.matched) " event(s): nothing changed, nothing audited." }
            @else {
                span.ok { "Replayed " (s.replayed) " of " (s.matched) "." }
                " already done " (s.already_done) ", busy " (s.busy) ", missing " (s.missing)
                ", failed " (s.failed) ", redelivered " (s.redelivered) "."
            }
        }
        @if let Some(id) = &report.audit_id {
            p { "Audit record " a href={ (BASE) "/audit" } { code id="audit-id" { (id) } } }
        }
        table {
            tr { th { "Event" } th { "Outcome" } }
            @for (key, outcome) in &report.outcomes {
                tr { td { (key.as_str()) } td.outcome { (outcome.as_str()) } }
            }
        }
    }
}
