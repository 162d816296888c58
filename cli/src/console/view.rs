//! The console's layout and the small pieces the pages share: errors (HTML for a
//! browser, JSON otherwise), query parameters, times, bars, the redacted body.

use std::collections::HashMap;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::{Console, BASE};
use einmal::telemetry::redact;

/// The console's whole style sheet, inline: no request leaves for a CDN (the CSP
/// allows it by its hash).
pub(super) const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#222}\
header{background:#1f2937;color:#fff;padding:.6em 1em}header a{color:#fff;margin-right:1em}\
main{padding:1em}table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;\
padding:.3em .5em;text-align:left;font-size:.9em;vertical-align:top}pre{background:#f6f8fa;\
padding:.8em;overflow:auto}.error{color:#b91c1c;font-weight:bold}.ok{color:#15803d}\
form.inline{display:inline}fieldset{margin:.5em 0}input[type=text]{width:14em}\
.muted{color:#666}.state{font-family:monospace}form.logout{display:inline;float:right}";

/// A whole page for a request that passed the access rule: the header with the
/// store's detail and the navigation, then `body`.
pub(super) fn page(console: &Console, title: &str, body: Markup) -> Markup {
    layout(Some(console), title, body)
}

/// A page before the access rule (the login form, refusals): nothing about the store.
pub(super) fn public_page(title: &str, body: Markup) -> Markup {
    layout(None, title, body)
}

fn layout(console: Option<&Console>, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · einmal console" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    strong { "einmal console" } " "
                    @if let Some(console) = console {
                        span.muted { "(" (console.stores.backend) ") " }
                    }
                    a href=(BASE) { "Overview" }
                    a href={ (BASE) "/events" } { "Events" }
                    a href={ (BASE) "/dead-letters" } { "Dead letters" }
                    a href={ (BASE) "/deliveries" } { "Deliveries" }
                    a href={ (BASE) "/audit" } { "Audit log" }
                    a href={ (BASE) "/reconcile" } { "Reconciliation" }
                    @if console.is_some_and(|c| c.token.is_some()) {
                        form.logout method="post" action={ (BASE) "/logout" } {
                            button type="submit" id="logout" { "Log out" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// Whether the client reads HTML (a browser) rather than JSON.
pub(super) fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"))
}

pub(super) fn json_error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "error": code, "message": message }).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A page's failure: the client's input (4xx) or the store (503).
#[derive(Debug, thiserror::Error)]
pub(super) enum ConsoleError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("the form is stale or forged: reload the page and submit again")]
    Csrf,
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

impl ConsoleError {
    fn status(&self) -> (StatusCode, &'static str) {
        match self {
            ConsoleError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ConsoleError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ConsoleError::Csrf => (StatusCode::FORBIDDEN, "csrf"),
            ConsoleError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        }
    }

    /// The response: an HTML page for a browser, JSON otherwise.
    pub(super) fn respond(&self, console: &Console, headers: &HeaderMap) -> Response {
        let (status, code) = self.status();
        if matches!(self, ConsoleError::Unavailable(_)) {
            tracing::warn!(error = %self, "console: store call failed");
        }
        let message = self.to_string();
        if wants_html(headers) {
            let body = html! { p.error { (message) } };
            (
                status,
                page(console, status.canonical_reason().unwrap_or("Error"), body),
            )
                .into_response()
        } else {
            json_error(status, code, &message)
        }
    }
}

impl From<einmal::ports::StoreError> for ConsoleError {
    fn from(e: einmal::ports::StoreError) -> Self {
        ConsoleError::Unavailable(e.to_string())
    }
}

/// Query or form parameters, strictly: an unknown name or a repeated one is refused
/// (a typo must not silently widen a search); empty values count as absent.
pub(super) struct Params(HashMap<String, String>);

impl Params {
    pub(super) fn parse(raw: &str, allowed: &[&str]) -> Result<Params, ConsoleError> {
        let mut map = HashMap::new();
        for (name, value) in form_urlencoded::parse(raw.as_bytes()) {
            if !allowed.contains(&name.as_ref()) {
                return Err(ConsoleError::BadRequest(format!(
                    "unknown parameter {name:?}; expected one of {}",
                    allowed.join(", ")
                )));
            }
            if map
                .insert(name.clone().into_owned(), value.trim().to_owned())
                .is_some()
            {
                return Err(ConsoleError::BadRequest(format!(
                    "parameter {name:?} given twice"
                )));
            }
        }
        map.retain(|_, v: &mut String| !v.is_empty());
        Ok(Params(map))
    }

    pub(super) fn get(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }

    pub(super) fn required(&self, name: &str, what: &str) -> Result<String, ConsoleError> {
        self.get(name)
            .ok_or_else(|| ConsoleError::BadRequest(format!("{what} is required")))
    }

    /// An RFC 3339 time (a `YYYY-MM-DDTHH:MM[:SS]` without offset is UTC), in ms.
    pub(super) fn time_ms(&self, name: &str) -> Result<Option<i64>, ConsoleError> {
        let Some(raw) = self.get(name) else {
            return Ok(None);
        };
        let parsed = einmal::time::parse_rfc3339(&raw)
            .or_else(|| einmal::time::parse_rfc3339(&format!("{raw}Z")))
            .or_else(|| einmal::time::parse_rfc3339(&format!("{raw}:00Z")));
        parsed
            .map(|secs| Some(secs.saturating_mul(1000)))
            .ok_or_else(|| {
                ConsoleError::BadRequest(format!(
                    "{name}: not an RFC 3339 time: {raw:?} (e.g. 2026-12-01T09:30:00Z)"
                ))
            })
    }

    /// A count between 1 and `max`.
    pub(super) fn count(
        &self,
        name: &str,
        default: usize,
        max: usize,
    ) -> Result<usize, ConsoleError> {
        match self.get(name) {
            None => Ok(default),
            Some(raw) => raw
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| {
                    ConsoleError::BadRequest(format!("{name}: a number from 1 to {max}"))
                }),
        }
    }
}

/// Unix ms as RFC 3339 with milliseconds.
pub(super) fn at(ms: i64) -> String {
    let secs = einmal::time::format_rfc3339(ms.div_euclid(1000));
    // `…Z` → `….mmmZ`
    match secs.strip_suffix('Z') {
        Some(head) => format!("{head}.{:03}Z", ms.rem_euclid(1000)),
        None => secs,
    }
}

/// A duration in ms, short (`42s`, `7m`, `3h`, `2d`).
pub(super) fn age(ms: i64) -> String {
    let secs = (ms / 1000).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// A horizontal bar chart as inline SVG: one labelled bar per value.
pub(super) fn bars(title: &str, rows: &[(String, u64)]) -> Markup {
    const WIDTH: u64 = 320;
    const ROW: usize = 22;
    let max = rows.iter().map(|(_, v)| *v).max().unwrap_or(0).max(1);
    let height = rows.len() * ROW + 4;
    html! {
        figure {
            figcaption { strong { (title) } }
            svg xmlns="http://www.w3.org/2000/svg" width="560" height=(height)
                role="img" aria-label=(title) {
                @for (i, (label, value)) in rows.iter().enumerate() {
                    @let y = i * ROW;
                    text x="0" y=(y + 15) font-size="13" { (label) }
                    rect x="160" y=(y + 3) height="16" width=(value * WIDTH / max) fill="#2563eb" {}
                    text x=(165 + value * WIDTH / max) y=(y + 15) font-size="13" { (value) }
                }
            }
        }
    }
}

/// The body for display: JSON pretty-printed with credential-like fields masked,
/// then every registered secret value masked (the same masking as the logs).
pub(super) fn redacted_body(raw: &[u8]) -> String {
    let mut text = match serde_json::from_slice::<serde_json::Value>(raw) {
        Ok(mut value) => {
            mask_fields(&mut value);
            serde_json::to_string_pretty(&value).unwrap_or_default()
        }
        Err(_) => String::from_utf8_lossy(raw).into_owned(),
    };
    redact::mask_secrets(&mut text);
    text
}

fn mask_fields(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (name, v) in map.iter_mut() {
                if redact::is_credential_option(name) || name.to_lowercase().contains("signature") {
                    *v = serde_json::Value::String("[redacted]".into());
                } else {
                    mask_fields(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(mask_fields),
        _ => {}
    }
}

/// The heading of a delivery's row on the event page: to which destination, and of
/// what: the event itself, or one of its decision's outputs (kind and key), which may
/// go to the same destination as the event.
pub(super) fn delivery_label(d: &einmal::ports::DeliveryStatus) -> String {
    match &d.output {
        None => format!("Delivery to {}: the event", d.destination),
        Some(o) => format!(
            "Delivery to {}: output {} ({})",
            d.destination, o.kind, o.key
        ),
    }
}

#[cfg(test)]
mod delivery_label_tests {
    use einmal::destinations::Output;
    use einmal::ports::{DeliveryState, DeliveryStatus};

    #[test]
    fn the_event_and_its_output_to_one_destination_read_differently() {
        let event = DeliveryStatus {
            destination: "shop".into(),
            key: "msg_1".into(),
            state: DeliveryState::Delivered,
            attempts: 1,
            last_status: Some(200),
            last_latency_ms: None,
            last_attempt_ms: None,
            next_attempt_ms: None,
            detail: None,
            output: None,
            release_owed: false,
        };
        let output = DeliveryStatus {
            key: "msg_2".into(),
            output: Some(Output {
                kind: "notification.payment_received".into(),
                key: "t1#order-1001#paid".into(),
                object_id: Some("1001".into()),
                data: serde_json::json!({}),
            }),
            ..event.clone()
        };
        assert_eq!(super::delivery_label(&event), "Delivery to shop: the event");
        assert_eq!(
            super::delivery_label(&output),
            "Delivery to shop: output notification.payment_received (t1#order-1001#paid)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_fields_are_masked_and_the_rest_kept() {
        let shown = redacted_body(
            br#"{"id":"evt_1","data":{"client_secret":"pi_1_secret_x","api_key":"sk_live_1","amount":2000,"nested":[{"access_token":"t"}]}}"#,
        );
        for secret in ["pi_1_secret_x", "sk_live_1", "\"t\""] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("\"amount\": 2000"), "{shown}");
        assert!(shown.contains("evt_1"), "{shown}");
    }

    #[test]
    fn params_are_strict() {
        assert!(Params::parse("state=completed&typo=1", &["state"]).is_err());
        assert!(Params::parse("state=a&state=b", &["state"]).is_err());
        let p = Params::parse("state=&since=2026-12-01T09%3A30", &["state", "since"]).unwrap();
        assert_eq!(p.get("state"), None);
        assert_eq!(p.time_ms("since").unwrap(), Some(1_796_117_400_000));
        assert!(Params::parse("since=yesterday", &["since"])
            .unwrap()
            .time_ms("since")
            .is_err());
        assert!(Params::parse("limit=0", &["limit"])
            .unwrap()
            .count("limit", 50, 500)
            .is_err());
    }
}
