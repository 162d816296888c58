//! The options of an HTTP destination and their check (`kind = "http"`).

use std::time::Duration;

use toml::Value;

use super::signing::decode_secret;
use crate::destinations::fields::Fields;
use crate::https::address::{is_loopback_host, AddressPolicy};
use crate::problems::{did_you_mean, nearest};
use crate::secret::{Secret, SecretLookup};

pub const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_TIMEOUT_MS: u64 = 120_000;
/// The options of kind `http`.
pub(crate) const FIELDS: &[&str] = &["url", "secrets", "body", "timeout_ms", "allow_private"];

/// What an HTTP destination receives as its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BodyFormat {
    /// The verified original body, byte for byte.
    #[default]
    Original,
    /// einmal's normalised envelope: `{type, timestamp, data: {provider, tenant,
    /// event_id, object_id, object_version, occurred_at, body}}`.
    Envelope,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HttpDestination {
    pub url: String,
    /// Standard Webhooks secrets (`whsec_` + base64); every one signs, so a rotation
    /// lists the new and the old.
    pub secrets: Vec<Secret>,
    pub body: BodyFormat,
    pub timeout: Duration,
    /// Allow private, link-local and loopback-looking addresses other than loopback
    /// itself (an internal service); off by default against SSRF.
    pub allow_private: bool,
}

/// The options of an HTTP destination, checked (URL, secrets, body, timeout).
pub(crate) fn parse(f: &mut Fields, lookup: SecretLookup<'_>) -> Option<HttpDestination> {
    let url = f.required_string("url");
    let allow_private = f.bool("allow_private", false);
    let mut ok = true;
    if let Some((line, url)) = &url {
        if let Err(reason) = check_url(url, allow_private) {
            f.problem(*line, reason);
            ok = false;
        }
    }
    let mut secrets = Vec::new();
    match f.take("secrets") {
        None => {
            let line = f.line;
            f.problem(line, "missing `secrets`: an HTTP destination signs every delivery (`whsec_` + base64, e.g. from `einmal listen`)");
            ok = false;
        }
        Some((line, Value::Array(items))) if !items.is_empty() => {
            for item in items {
                match f.secret("secrets", line, item, lookup) {
                    Some(secret) => match decode_secret(secret.expose()) {
                        Ok(_) => secrets.push(secret),
                        Err(reason) => {
                            f.problem(line, reason);
                            ok = false;
                        }
                    },
                    None => ok = false,
                }
            }
        }
        Some((line, _)) => {
            f.problem(
                line,
                "`secrets` must be a non-empty list of secrets (strings, { env = \"VARIABLE\" } or { ssm = \"/parameter\" })",
            );
            ok = false;
        }
    }
    let body = match f.string("body") {
        None => BodyFormat::Original,
        Some((_, b)) if b == "original" => BodyFormat::Original,
        Some((_, b)) if b == "envelope" => BodyFormat::Envelope,
        Some((line, b)) => {
            f.problem(
                line,
                format!(
                    "`body` must be \"original\" or \"envelope\", not `{b}`{}",
                    did_you_mean(nearest(&b, ["original", "envelope"]))
                ),
            );
            ok = false;
            BodyFormat::Original
        }
    };
    let timeout = Duration::from_millis(f.number(
        "timeout_ms",
        DEFAULT_HTTP_TIMEOUT.as_millis() as u64,
        1,
        MAX_TIMEOUT_MS,
    ));
    let (_, url) = url?;
    ok.then_some(HttpDestination {
        url,
        secrets,
        body,
        timeout,
        allow_private,
    })
}

/// HTTPS, or plain HTTP to loopback; a host; no credentials; an IP literal the
/// address policy allows.
pub fn check_url(url: &str, allow_private: bool) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("`url` is not a valid URL: {e}"))?;
    let authority = uri
        .authority()
        .ok_or_else(|| format!("`url` {} has no host", shown_url(url)))?;
    if authority.as_str().contains('@') {
        return Err("`url` must not contain credentials (user:password@)".into());
    }
    let host = authority.host();
    let loopback = is_loopback_host(host);
    match uri.scheme_str() {
        Some("https") => {}
        Some("http") if loopback => {}
        Some("http") => {
            return Err(format!(
                "`url` must use https:// (plain http:// only to loopback: localhost, 127.0.0.1, [::1]), not {}",
                shown_url(url)
            ))
        }
        _ => {
            return Err(format!(
                "`url` must be an https:// URL, not {}",
                shown_url(url)
            ))
        }
    }
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<std::net::IpAddr>() {
        let policy = AddressPolicy {
            loopback,
            private: allow_private,
        };
        if let Some(reason) = policy.refusal(ip) {
            return Err(format!("`url`: {reason}"));
        }
    }
    Ok(())
}

/// A URL as an error may show it: without credentials, query or fragment, which may
/// carry tokens (`?key=…`, `user:pass@`).
pub(crate) fn shown_url(url: &str) -> String {
    let cut = url.find(['?', '#']).unwrap_or(url.len());
    let had_tail = cut < url.len();
    let url = &url[..cut];
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find('/').unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let hidden = if had_tail || host.len() < authority.len() {
                "…"
            } else {
                ""
            };
            format!("{scheme}://{host}{path}{hidden}")
        }
        None if had_tail => format!("{url}…"),
        None => url.to_string(),
    }
}
