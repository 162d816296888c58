//! The transport-neutral view of one incoming webhook request.
//!
//! Both the Lambda handler (API Gateway events) and `einmal serve` (hyper)
//! build a [`WebhookRequest`] and hand it to the same ingest function.

use bytes::Bytes;
use http::{HeaderMap, Method};

#[derive(Debug, Clone)]
pub struct WebhookRequest {
    pub method: Method,
    /// Header names are case-insensitive (`http::HeaderMap`); repeated headers are kept.
    pub headers: HeaderMap,
    /// Raw query string without the leading `?`, if any.
    pub query: Option<String>,
    /// The exact raw body bytes as received (after API Gateway base64 decoding).
    pub body: Bytes,
    /// The optional third path segment, `/webhooks/{provider}/{tenant}/{token}`: an opaque
    /// per-tenant token that guards endpoints of providers that sign nothing.
    pub path_token: Option<String>,
}

impl WebhookRequest {
    pub fn post(headers: HeaderMap, body: impl Into<Bytes>) -> Self {
        Self {
            method: Method::POST,
            headers,
            query: None,
            body: body.into(),
            path_token: None,
        }
    }

    /// The first value of a header as UTF-8, if present and valid.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// All values of a header (providers such as Mollie repeat a header during rotation).
    pub fn header_all<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
    }
}
