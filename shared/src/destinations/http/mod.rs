//! The HTTP destination: POST each message to the user's endpoint, signed the
//! Standard Webhooks way, so the user verifies with the `standardwebhooks` library of
//! any language and dedups on `webhook-id` (our stable key).
//!
//! Classification of the answer (the relay's retry policy follows from it):
//! 2xx is delivered; 408, 409 (an idempotent endpoint still busy with the same key),
//! 425, 429 and 5xx, network errors and timeouts are retried (honouring `Retry-After`);
//! 410 is permanent ("gone"); every other 4xx is permanent: the same request will fail
//! the same way. A 3xx is permanent too: redirects are never followed (Standard
//! Webhooks counts them as failures, and a redirect is an SSRF path), and a moved
//! endpoint is a configuration change, so it should dead-letter visibly at once
//! rather than retry for days; once the URL is fixed, `einmal replay` re-delivers.

use std::net::IpAddr;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use thiserror::Error;

pub mod config;
pub mod signing;

pub use config::{check_url, BodyFormat, HttpDestination, DEFAULT_HTTP_TIMEOUT};
use signing::{SecretError, SigningKeys};

use super::{Delivered, Message, Sink, SinkError};
use crate::https::address::{is_loopback_host, AddressPolicy};
use crate::https::{refused_address, HttpsClient};

/// How much of an answer body is read (the rest is dropped with the connection).
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// Length of the answer excerpt kept in the delivery record.
pub const EXCERPT_CHARS: usize = 200;

const USER_AGENT_VALUE: &str = concat!("einmal/", env!("CARGO_PKG_VERSION"));

/// A destination that cannot be built from its configuration.
#[derive(Debug, Error)]
pub enum HttpSinkError {
    #[error("invalid url: {0}")]
    Url(String),
    #[error(transparent)]
    Secret(#[from] SecretError),
}

/// One HTTP destination: its URL, keys and timeout, and a guarded client of its own.
pub struct HttpSink {
    uri: Uri,
    keys: SigningKeys,
    /// The secrets' text, so an answer echoing one never reaches the record.
    redact: Vec<String>,
    timeout: Duration,
    client: HttpsClient,
    /// An IP-literal host the policy refuses: refused on every attempt without any
    /// connection (host names are checked by the guarded resolver instead).
    refused_literal: Option<String>,
}

impl std::fmt::Debug for HttpSink {
    // The path and query may carry a token: only the host.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSink")
            .field("host", &self.uri.host())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpSink {
    /// Build the sink; `client` is the process's outbound client, whose roots it
    /// shares (the sink keeps a guarded client with its own pool).
    pub fn new(config: &HttpDestination, client: &HttpsClient) -> Result<Self, HttpSinkError> {
        let uri: Uri = config
            .url
            .parse()
            .map_err(|e: http::uri::InvalidUri| HttpSinkError::Url(e.to_string()))?;
        let host = uri
            .host()
            .ok_or_else(|| HttpSinkError::Url("no host".into()))?
            .to_string();
        let loopback = is_loopback_host(&host);
        match uri.scheme_str() {
            Some("https") => {}
            Some("http") if loopback => {}
            Some("http") => {
                return Err(HttpSinkError::Url(
                    "plain http:// is allowed only for loopback (localhost, 127.0.0.1, [::1])"
                        .into(),
                ))
            }
            _ => return Err(HttpSinkError::Url("the scheme must be https".into())),
        }
        let policy = AddressPolicy {
            loopback,
            private: config.allow_private,
        };
        let refused_literal = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .ok()
            .and_then(|ip| policy.refusal(ip));
        Ok(HttpSink {
            uri,
            keys: SigningKeys::new(&config.secrets)?,
            redact: config
                .secrets
                .iter()
                .map(|s| s.expose().to_string())
                .collect(),
            timeout: config.timeout,
            client: client.guarded(config.allow_private),
            refused_literal,
        })
    }

    fn request(&self, message: &Message) -> Result<Request<Full<Bytes>>, SinkError> {
        let timestamp = crate::time::now_secs();
        let signature = self.keys.sign(&message.key, timestamp, &message.body);
        let content_type = HeaderValue::from_str(&message.content_type)
            .unwrap_or(HeaderValue::from_static("application/json"));
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(self.uri.clone())
            .header(CONTENT_TYPE, content_type)
            .header(USER_AGENT, USER_AGENT_VALUE)
            .header("webhook-id", header_text(&message.key))
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            // An RFC 8941 sf-string, as the Idempotency-Key draft asks: quoted.
            .header(
                "idempotency-key",
                format!("\"{}\"", header_string(&message.key)),
            )
            .header("einmal-provider", header_text(&message.provider))
            .header("einmal-tenant", header_text(&message.tenant))
            .header("einmal-event-type", header_text(&message.event_type))
            .header("einmal-event-id", header_text(&message.event_id));
        if let Some(id) = &message.object_id {
            builder = builder.header("einmal-object-id", header_text(id));
        }
        if let Some(version) = &message.object_version {
            builder = builder.header("einmal-object-version", header_text(version));
        }
        builder
            .body(Full::new(Bytes::copy_from_slice(&message.body)))
            .map_err(|e| SinkError::Permanent {
                status: None,
                detail: format!("cannot build the request: {e}"),
            })
    }

    async fn exchange(&self, request: Request<Full<Bytes>>) -> Result<Delivered, SinkError> {
        let response = match self.client.send(request).await {
            Ok(response) => response,
            Err(err) => {
                if let Some(refused) = refused_address(&err) {
                    return Err(SinkError::Permanent {
                        status: None,
                        detail: refused.to_string(),
                    });
                }
                return Err(SinkError::Retry {
                    status: None,
                    retry_after: None,
                    detail: describe_error(&err),
                });
            }
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, crate::time::now_secs()));
        // Read a bounded prefix: enough for the excerpt, and a small 2xx body is read
        // whole so the connection goes back to the pool.
        let mut body = response.into_body();
        let mut answer = Vec::new();
        while answer.len() < MAX_ANSWER_BYTES {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        answer.extend_from_slice(data);
                    }
                }
                // A broken body after a 2xx status is still a delivery; after an
                // error status the excerpt is just shorter.
                Some(Err(_)) | None => break,
            }
        }
        classify(status, retry_after, &excerpt(&answer, &self.redact))
    }
}

#[async_trait]
impl Sink for HttpSink {
    async fn deliver(&self, message: &Message) -> Result<Delivered, SinkError> {
        if let Some(reason) = &self.refused_literal {
            return Err(SinkError::Permanent {
                status: None,
                detail: reason.clone(),
            });
        }
        let request = self.request(message)?;
        match tokio::time::timeout(self.timeout, self.exchange(request)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(SinkError::Retry {
                status: None,
                retry_after: None,
                detail: format!("timed out after {} ms", self.timeout.as_millis()),
            }),
        }
    }
}

/// The outcome of an answer with `status`, per the module's rules.
pub fn classify(
    status: StatusCode,
    retry_after: Option<Duration>,
    excerpt: &str,
) -> Result<Delivered, SinkError> {
    let code = status.as_u16();
    let reason = status.canonical_reason().unwrap_or("unknown status");
    let detail = |what: &str| {
        if excerpt.is_empty() {
            what.to_string()
        } else {
            format!("{what}: {excerpt}")
        }
    };
    if status.is_success() {
        return Ok(Delivered {
            status: Some(code),
            note: None,
        });
    }
    if status.is_server_error() || matches!(code, 408 | 409 | 425 | 429) {
        return Err(SinkError::Retry {
            status: Some(code),
            retry_after,
            detail: detail(reason),
        });
    }
    let what = match code {
        410 => "gone: the endpoint says it no longer exists".to_string(),
        300..=399 => {
            "redirect not followed: configure the destination with the final URL".to_string()
        }
        _ => reason.to_string(),
    };
    Err(SinkError::Permanent {
        status: Some(code),
        detail: detail(&what),
    })
}

/// `Retry-After` as delay-seconds or an HTTP-date (RFC 9110), relative to `now`.
/// A date in the past is "now"; anything else unparsable is ignored.
pub fn parse_retry_after(value: &str, now: i64) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = crate::time::parse_http_date(value)?;
    Some(Duration::from_secs(at.saturating_sub(now).max(0) as u64))
}

/// Why a request failed, from the innermost cause (e.g. "connection refused"),
/// without the URL (its query may carry a token).
fn describe_error(err: &(dyn std::error::Error + 'static)) -> String {
    let mut root = err;
    while let Some(next) = root.source() {
        root = next;
    }
    let what = if let Some(e) = err.downcast_ref::<hyper_util::client::legacy::Error>() {
        if e.is_connect() {
            "cannot connect"
        } else {
            "request failed"
        }
    } else {
        "request failed"
    };
    let cause = root.to_string();
    let cause: String = cause.chars().take(EXCERPT_CHARS).collect();
    format!("{what}: {cause}")
}

/// At most [`EXCERPT_CHARS`] characters of an answer: control characters and runs of
/// whitespace become one space, anything that looks like a signing secret is masked.
pub fn excerpt(answer: &[u8], secrets: &[String]) -> String {
    let head = &answer[..answer.len().min(4 * EXCERPT_CHARS)];
    let mut text = String::from_utf8_lossy(head).into_owned();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret.as_str(), "***");
    }
    let mut out = String::new();
    let mut words = text.split(|c: char| c.is_whitespace() || c.is_control());
    let mut first = true;
    for word in words.by_ref().filter(|w| !w.is_empty()) {
        let word = if word.contains("whsec_") {
            "whsec_***"
        } else {
            word
        };
        if !first {
            out.push(' ');
        }
        first = false;
        out.push_str(word);
    }
    if out.chars().count() > EXCERPT_CHARS {
        out = out.chars().take(EXCERPT_CHARS - 1).collect();
        out.push('…');
    }
    out
}

/// A header value from text we do not control (provider ids and types): visible
/// ASCII stays, every other byte (and `%`) is percent-encoded, so no value can break
/// the request or fail to build.
fn header_text(text: &str) -> HeaderValue {
    HeaderValue::from_str(&header_string(text)).expect("visible ASCII is a valid header value")
}

/// [`header_text`] as a string; `"` and `\\` are encoded too, so it can be quoted.
fn header_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_graphic() && !matches!(b, b'%' | b'"' | b'\\') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// einmal's normalised envelope of `message` (whose body is the provider's original):
/// `{"type", "timestamp" (RFC 3339, the event's time), "data": {provider, tenant,
/// event_id, object_id, object_version, occurred_at, body}}`. `body` is the original
/// JSON value, or the text when the provider's body is not JSON (form posts).
pub fn envelope_body(message: &Message) -> Vec<u8> {
    let occurred = message.occurred_at.map(crate::time::format_rfc3339);
    let body = serde_json::from_slice::<serde_json::Value>(&message.body).unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(&message.body).into_owned())
    });
    let envelope = serde_json::json!({
        "type": message.event_type,
        "timestamp": occurred
            .clone()
            .unwrap_or_else(|| crate::time::format_rfc3339(crate::time::now_secs())),
        "data": {
            "provider": message.provider,
            "tenant": message.tenant,
            "event_id": message.event_id,
            "object_id": message.object_id,
            "object_version": message.object_version,
            "occurred_at": occurred,
            "body": body,
        },
    });
    serde_json::to_vec(&envelope).expect("a JSON value serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).unwrap()
    }

    #[test]
    fn answers_are_classified() {
        assert_eq!(classify(status(204), None, "").unwrap().status, Some(204));
        for code in [408, 409, 425, 429, 500, 502, 503, 504] {
            assert!(
                matches!(classify(status(code), None, ""), Err(SinkError::Retry { status: Some(c), .. }) if c == code),
                "{code}"
            );
        }
        for code in [301, 302, 307, 400, 401, 403, 404, 410, 413, 422] {
            assert!(
                matches!(classify(status(code), None, ""), Err(SinkError::Permanent { status: Some(c), .. }) if c == code),
                "{code}"
            );
        }
        let Err(SinkError::Permanent { detail, .. }) = classify(status(410), None, "bye") else {
            panic!()
        };
        assert_eq!(detail, "gone: the endpoint says it no longer exists: bye");
        let Err(SinkError::Retry { retry_after, .. }) =
            classify(status(429), Some(Duration::from_secs(7)), "")
        else {
            panic!()
        };
        assert_eq!(retry_after, Some(Duration::from_secs(7)));
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        assert_eq!(parse_retry_after("7", 0), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after(" 120 ", 0),
            Some(Duration::from_secs(120))
        );
        // Sun, 06 Nov 1994 08:49:37 GMT = 784111777.
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_770),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_999),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", 0), None);
        assert_eq!(parse_retry_after("-5", 0), None);
        assert_eq!(parse_retry_after("", 0), None);
    }

    #[test]
    fn excerpts_are_short_clean_and_redacted() {
        assert_eq!(
            excerpt(b"  bad\r\n\tinput \x07 here ", &[]),
            "bad input here"
        );
        let long = "x".repeat(1000);
        let e = excerpt(long.as_bytes(), &[]);
        assert_eq!(e.chars().count(), EXCERPT_CHARS);
        assert!(e.ends_with('…'));
        let secret = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD".to_string();
        let e = excerpt(
            format!("key {secret} and whsec_other, token=abc").as_bytes(),
            &["token=abc".into(), secret.clone()],
        );
        assert_eq!(e, "key *** and whsec_*** ***");
        assert_eq!(excerpt(&[0xff, b'o', b'k'], &[]), "\u{fffd}ok");
    }

    #[test]
    fn header_text_keeps_visible_ascii_and_encodes_the_rest() {
        assert_eq!(header_text("evt_1A-b.c/d"), "evt_1A-b.c/d");
        assert_eq!(header_text("a b\r\n%é"), "a%20b%0D%0A%25%C3%A9");
    }

    #[test]
    fn the_envelope_wraps_the_original_json() {
        let message = Message {
            key: "msg_1".into(),
            destination: "d".into(),
            provider: "stripe".into(),
            tenant: "demo".into(),
            event_id: "evt_1".into(),
            event_type: "payment_intent.succeeded".into(),
            object_id: Some("pi_1".into()),
            object_version: None,
            occurred_at: Some(0),
            body: br#"{"id":"evt_1","n":1}"#.to_vec(),
            content_type: "application/json".into(),
        };
        let v: serde_json::Value = serde_json::from_slice(&envelope_body(&message)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "type": "payment_intent.succeeded",
                "timestamp": "1970-01-01T00:00:00Z",
                "data": {
                    "provider": "stripe", "tenant": "demo", "event_id": "evt_1",
                    "object_id": "pi_1", "object_version": null,
                    "occurred_at": "1970-01-01T00:00:00Z",
                    "body": {"id": "evt_1", "n": 1},
                },
            })
        );
        let form = Message {
            body: b"a=1&b=2".to_vec(),
            ..message
        };
        let v: serde_json::Value = serde_json::from_slice(&envelope_body(&form)).unwrap();
        assert_eq!(v["data"]["body"], "a=1&b=2");
    }

    #[test]
    fn urls_must_be_https_or_loopback() {
        let client = HttpsClient::new();
        let config = |url: &str| HttpDestination {
            url: url.into(),
            secrets: vec![signing::generate_secret()],
            body: Default::default(),
            timeout: Duration::from_secs(1),
            allow_private: false,
        };
        assert!(HttpSink::new(&config("https://example.com/h"), &client).is_ok());
        assert!(HttpSink::new(&config("http://localhost:3000/h"), &client).is_ok());
        assert!(HttpSink::new(&config("http://[::1]:3000/h"), &client).is_ok());
        let err = HttpSink::new(&config("http://example.com/h"), &client).unwrap_err();
        assert!(err.to_string().contains("loopback"), "{err}");
        assert!(HttpSink::new(&config("ftp://example.com/h"), &client).is_err());
        let mut bad = config("https://example.com/h");
        bad.secrets = vec![crate::config::Secret::new("nope")];
        assert!(matches!(
            HttpSink::new(&bad, &client),
            Err(HttpSinkError::Secret(SecretError::Prefix))
        ));
    }
}
