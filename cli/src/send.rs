//! `einmal send`: sign a sample event like the provider would and post it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use einmal::config::TenantConfig;
use einmal::providers::{self, Provider};
use einmal::request::WebhookRequest;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[derive(Debug, Args)]
pub struct SendArgs {
    /// Provider path name (stripe, shopify, github, standard-webhooks).
    #[arg(long)]
    pub provider: String,
    /// Tenant as configured.
    #[arg(long)]
    pub tenant: String,
    /// The event body to send; defaults to events/samples/{provider}.json.
    #[arg(long)]
    pub event: Option<PathBuf>,
    /// Event id to use (Stripe: replaces the body's `id`; others: the id header).
    /// Sending the same id twice shows deduplication.
    #[arg(long)]
    pub event_id: Option<String>,
    /// The topic header for providers that carry the event type in a header
    /// (Shopify `X-Shopify-Topic`, GitHub `X-GitHub-Event`), e.g. `orders/paid`.
    #[arg(long)]
    pub topic: Option<String>,
    /// Tenant configuration holding the secret (TOML).
    #[arg(long, default_value_os_t = crate::default_config_path())]
    pub config: PathBuf,
    /// Base URL of a running `einmal serve`.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Print `{"status": ..., "response": ...}` instead of the status and the body.
    #[arg(long)]
    pub json: bool,
    /// Send the body's own event time. By default the time the provider's body carries
    /// (Stripe `created`, Paddle `occurred_at`, …) is moved to now, so a demo event's
    /// lag, and the payment SLO, read as for a live event.
    #[arg(long)]
    pub keep_time: bool,
}

pub async fn run(args: SendArgs) -> Result<ExitCode, String> {
    let config = einmal_cli::config_file::load_tenants(&args.config).await?;
    let provider = providers::lookup(&args.provider).ok_or_else(|| {
        let known: Vec<_> = providers::all().iter().map(|p| p.name()).collect();
        format!(
            "unknown provider {:?}; known: {}",
            args.provider,
            known.join(", ")
        )
    })?;
    let mut tenant = config
        .tenant(&args.provider, &args.tenant)
        .cloned()
        .ok_or_else(|| {
            format!(
                "tenant {:?} is not configured for {} in {}",
                args.tenant,
                args.provider,
                args.config.display()
            )
        })?;
    if let Some(topic) = &args.topic {
        tenant.options.insert("topic".into(), topic.clone());
        tenant.options.insert("event".into(), topic.clone());
    }
    let path = args
        .event
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("events/samples/{}.json", args.provider)));
    let mut body =
        std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let event_id = match &args.event_id {
        Some(id) => id.clone(),
        None => format!("demo-{}-1", args.provider),
    };
    if args.provider == "stripe" {
        if let Some(id) = &args.event_id {
            body = with_top_level_id(&body, id).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let now = einmal::time::now_secs();
    if !args.keep_time {
        body = stamped_now(provider, &tenant, &body, &event_id, now);
    }
    let (headers, body) = provider
        .signed_request(&body, &tenant, &event_id, now)
        .map_err(|e| format!("cannot sign for {}: {e}", args.provider))?;

    let url = format!(
        "{}/webhooks/{}/{}",
        args.url.trim_end_matches('/'),
        args.provider,
        args.tenant
    );
    let mut request = http::Request::post(&url).header("content-type", "application/json");
    for (name, value) in &headers {
        request = request.header(name, value);
    }
    let request = request
        .body(Full::new(body))
        .map_err(|e| format!("invalid request: {e}"))?;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("cannot reach {url}: {e} (is `einmal serve` running?)"))?;
    let status = response.status();
    let text = response
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .map_err(|e| format!("reading the response failed: {e}"))?;
    if args.json {
        let response = serde_json::from_str::<serde_json::Value>(&text)
            .unwrap_or(serde_json::Value::String(text));
        let out = serde_json::json!({"status": status.as_u16(), "response": response});
        println!("{}", einmal::text::json_terminal_safe(&out.to_string()));
    } else {
        println!("{} {}", status.as_u16(), einmal::text::terminal_safe(&text));
    }
    Ok(if status.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(einmal_cli::error::EXIT_NEGATIVE)
    })
}

fn with_top_level_id(body: &[u8], id: &str) -> Result<Vec<u8>, String> {
    let mut value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let object = value
        .as_object_mut()
        .ok_or("the event is not a JSON object")?;
    object.insert("id".into(), serde_json::Value::String(id.to_string()));
    serde_json::to_vec(&value).map_err(|e| e.to_string())
}

/// The event time einmal reads from `body` as `provider` would send it (`None`: the
/// body carries none, or it does not verify as sent).
fn occurred_at(
    provider: &dyn Provider,
    tenant: &TenantConfig,
    body: &[u8],
    event_id: &str,
    now: i64,
) -> Option<i64> {
    let (headers, body) = provider.signed_request(body, tenant, event_id, now).ok()?;
    let events = provider
        .verify_and_extract(&WebhookRequest::post(headers, body), tenant, now)
        .ok()?;
    events.first()?.envelope.occurred_at
}

/// How far from now an event time may be and still count as now.
const NOW_SLACK_SECS: i64 = 60;

/// `body` with the event time it carries moved to `now`: every token in it that spells
/// that time (an RFC 3339 time, with or without an offset; Unix seconds, with or
/// without a fraction) is rewritten to now, in the same form; nothing else changes.
/// A body whose time is already recent, carries none, or that would not read as now
/// afterwards is sent as it is.
fn stamped_now(
    provider: &dyn Provider,
    tenant: &TenantConfig,
    body: &[u8],
    event_id: &str,
    now: i64,
) -> Vec<u8> {
    let Some(old) = occurred_at(provider, tenant, body, event_id, now) else {
        return body.to_vec();
    };
    if (now - old).abs() <= NOW_SLACK_SECS {
        return body.to_vec();
    }
    let Ok(text) = std::str::from_utf8(body) else {
        return body.to_vec();
    };
    let stamped = restamp(text, old, now);
    match occurred_at(provider, tenant, stamped.as_bytes(), event_id, now) {
        Some(t) if (now - t).abs() <= NOW_SLACK_SECS => stamped.into_bytes(),
        _ => body.to_vec(),
    }
}

/// Rewrite every token of `text` that spells the time `old` (Unix seconds) to `now`.
fn restamp(text: &str, old: i64, now: i64) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() || (i > 0 && bytes[i - 1].is_ascii_alphanumeric()) {
            let c = text[i..].chars().next().unwrap_or_default();
            out.push(c);
            i += c.len_utf8().max(1);
            continue;
        }
        // A token: digits and what times are written with.
        let end = bytes[i..]
            .iter()
            .position(|b| !(b.is_ascii_alphanumeric() || b"-:.+".contains(b)))
            .map_or(bytes.len(), |n| i + n);
        let token = &text[i..end];
        match retimed(token, old, now) {
            Some((replacement, used)) => {
                out.push_str(&replacement);
                out.push_str(&token[used..]);
            }
            None => out.push_str(token),
        }
        i = end;
    }
    out
}

/// `token` as `now` when it spells `old`: the replacement and how much of the token it
/// replaces (a Unix time keeps its fraction).
fn retimed(token: &str, old: i64, now: i64) -> Option<(String, usize)> {
    if token.as_bytes().get(4) == Some(&b'-') {
        if einmal::time::parse_rfc3339(token) == Some(old) {
            return Some((einmal::time::format_rfc3339(now), token.len()));
        }
        // Without an offset (WooCommerce's `*_gmt`): read as UTC.
        if einmal::time::parse_rfc3339(&format!("{token}Z")) == Some(old) {
            let now = einmal::time::format_rfc3339(now);
            return Some((now.trim_end_matches('Z').to_string(), token.len()));
        }
        return None;
    }
    let digits = token
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(token.len());
    let whole = &token[..digits];
    let rest = &token[digits..];
    let fraction = rest.is_empty()
        || (rest.starts_with('.')
            && rest.len() > 1
            && rest[1..].bytes().all(|b| b.is_ascii_digit()));
    match whole.parse::<i64>().ok() {
        Some(t) if fraction && t == old => Some((now.to_string(), digits)),
        // Unix milliseconds (HubSpot's `occurredAt`): the same second, kept in ms.
        Some(t) if rest.is_empty() && t.div_euclid(1000) == old => {
            Some(((now * 1000 + t.rem_euclid(1000)).to_string(), digits))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use einmal::config::Config;

    const OLD: i64 = 1_764_410_400; // 2025-11-29T10:00:00Z
    const NOW: i64 = 1_796_300_000;

    #[test]
    fn every_spelling_of_the_time_moves_and_nothing_else() {
        let now = einmal::time::format_rfc3339(NOW);
        let cases = [
            (
                r#"{"created": 1764410400, "id": 1764410401}"#.to_string(),
                format!(r#"{{"created": {NOW}, "id": 1764410401}}"#),
            ),
            (
                r#"{"timestamp": 1764410400.123456}"#.into(),
                format!(r#"{{"timestamp": {NOW}.123456}}"#),
            ),
            (
                r#"{"ts": "1764410400.000100"}"#.into(),
                format!(r#"{{"ts": "{NOW}.000100"}}"#),
            ),
            (
                r#"{"at": "2025-11-29T11:00:00+01:00"}"#.into(),
                format!(r#"{{"at": "{now}"}}"#),
            ),
            (
                r#"{"at": "2025-11-29T10:00:00.000000Z"}"#.into(),
                format!(r#"{{"at": "{now}"}}"#),
            ),
            (
                r#"{"gmt": "2025-11-29T10:00:00"}"#.into(),
                format!(r#"{{"gmt": "{}"}}"#, now.trim_end_matches('Z')),
            ),
            (
                "<timestamp type=\"datetime\">2025-11-29T10:00:00Z</timestamp>".into(),
                format!("<timestamp type=\"datetime\">{now}</timestamp>"),
            ),
            (
                r#"{"other": "2025-11-29T10:00:05Z", "id": "x1764410400", "n": 17644104000}"#
                    .into(),
                r#"{"other": "2025-11-29T10:00:05Z", "id": "x1764410400", "n": 17644104000}"#
                    .into(),
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(restamp(&body, OLD, NOW), expected, "{body}");
        }
    }

    /// Every sample `einmal send` sends by default reads as sent now, wherever its
    /// provider reads an event time from the body.
    #[test]
    fn a_sent_sample_reads_as_now() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let config = Config::load(&root.join("einmal.toml")).expect("einmal.toml loads");
        let now = einmal::time::now_secs();
        let mut stamped = Vec::new();
        for provider in providers::all() {
            let sample = root.join(format!("events/samples/{}.json", provider.name()));
            let Ok(body) = std::fs::read(&sample) else {
                continue;
            };
            let Some(tenant) = config.tenant(provider.name(), "demo") else {
                continue;
            };
            let event_id = format!("demo-{}-1", provider.name());
            let Some(before) = occurred_at(*provider, tenant, &body, &event_id, now) else {
                continue;
            };
            let sent = stamped_now(*provider, tenant, &body, &event_id, now);
            let after = occurred_at(*provider, tenant, &sent, &event_id, now);
            assert!(
                after.is_some_and(|t| (now - t).abs() <= NOW_SLACK_SECS),
                "{}: event time {before} sent as {after:?}, now {now}",
                provider.name()
            );
            stamped.push(provider.name());
        }
        // Integer seconds, RFC 3339 with and without an offset, a float, XML.
        for name in ["stripe", "adyen", "woocommerce", "mailgun", "braintree"] {
            assert!(stamped.contains(&name), "{name}: {stamped:?}");
        }
    }
}
