//! Fetching the authoritative state of a resource named by a thin webhook (a *hint*:
//! Mollie classic, GoPay, Klarna KCO push; see `providers::thin`).
//!
//! The processor calls [`ResourceLookup::fetch`] before the domain sees a hint, and the
//! domain decides on the fetched JSON only, so a forged or stale hint cannot cause an
//! effect. [`HttpLookup`] is the production adapter; tests point it at a fake provider
//! API on loopback through the tenant option `api_base`.
//!
//! # Requests per provider
//!
//! Each thin provider states its request in its [`thin::HintSpec`] (`providers/mollie.rs`,
//! `gopay.rs`, `klarna_push.rs`): `GET {api_base}{path}{id}` with a Bearer token or
//! Basic credentials from tenant options. `api_base` defaults to the provider's public
//! API (Mollie, GoPay, Klarna EU; set it for the Klarna NA/OC regions and for
//! playgrounds). Both `https://` (rustls, the system's root certificates) and `http://`
//! are accepted.
//!
//! # Credentials
//!
//! API credentials are tenant *options* (`api_key`, `access_token`, `api_username`,
//! `api_password`), not `secrets`: `secrets` stays the list of signature keys that the
//! providers rotate through. A credential option should not be written inline in a
//! committed file: its value may be `env:VAR`, which is resolved from the process
//! environment at each lookup (so a rotated key only needs the variable to change).
//! Credentials never appear in logs or error messages.
//!
//! GoPay's API wants an OAuth2 access token (`POST /api/oauth2/token` with client id
//! and secret, valid 30 minutes). Obtaining and refreshing it is not done here: the
//! `access_token` option (or the variable it names) must hold a current token.
//!
//! # Errors
//!
//! [`LookupError::Transient`] (5xx, 429, timeouts, connection failures) makes the
//! processor retry with backoff; [`LookupError::Permanent`] (404, 401/403, other 4xx,
//! missing or invalid configuration) dead-letters the item at once. Every request has a
//! 5 s timeout and a 1 MiB response limit. Bodies are never logged.

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use thiserror::Error;

use crate::config::TenantConfig;
use crate::https::HttpsClient;
use crate::providers;
use crate::providers::thin::{self, ApiAuth};

/// Timeout of one lookup (connect, request and body).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest accepted response body.
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// Tenant option overriding the provider's API base URL.
pub const API_BASE_OPTION: &str = "api_base";

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LookupError {
    /// Worth retrying: 5xx, 429, timeout, connection failure.
    #[error("resource lookup failed (transient): {0}")]
    Transient(String),
    /// Will not succeed as is: 404, 401/403, other 4xx, bad configuration.
    #[error("resource lookup failed (permanent): {0}")]
    Permanent(String),
}

/// Fetch the current state of `resource_id` (kind `event_type`, e.g. `payment`) from
/// `provider`'s API with `tenant`'s credentials; the result is the provider's JSON.
#[async_trait]
pub trait ResourceLookup: Send + Sync {
    async fn fetch(
        &self,
        tenant: &TenantConfig,
        provider: &str,
        event_type: &str,
        resource_id: &str,
    ) -> Result<Vec<u8>, LookupError>;
}

/// One API request to make: URL and `Authorization` value (a credential: not `Debug`).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiRequest {
    pub url: String,
    pub authorization: String,
}

impl std::fmt::Debug for ApiRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiRequest")
            .field("url", &self.url)
            .field("authorization", &"***")
            .finish()
    }
}

fn permanent(msg: impl Into<String>) -> LookupError {
    LookupError::Permanent(msg.into())
}

/// A credential option: its value, or with `env:VAR` the variable's value.
fn credential(
    tenant: &TenantConfig,
    name: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<String, LookupError> {
    let raw = tenant
        .option(name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| permanent(format!("tenant option `{name}` is not set")))?;
    let value = match raw.strip_prefix("env:") {
        Some(var) => env(var.trim()).ok_or_else(|| {
            permanent(format!(
                "tenant option `{name}` refers to environment variable {}, which is not set",
                var.trim()
            ))
        })?,
        None => raw.to_string(),
    };
    if value.is_empty() {
        return Err(permanent(format!("tenant option `{name}` is empty")));
    }
    Ok(value)
}

fn api_base<'a>(tenant: &'a TenantConfig, default: &'a str) -> Result<&'a str, LookupError> {
    let base = tenant
        .option(API_BASE_OPTION)
        .filter(|b| !b.is_empty())
        .unwrap_or(default)
        .trim_end_matches('/');
    if !(base.starts_with("https://") || base.starts_with("http://")) {
        return Err(permanent("tenant option `api_base` must be an http(s) URL"));
    }
    Ok(base)
}

/// The request for one lookup, with credentials resolved through `env`.
pub fn api_request(
    tenant: &TenantConfig,
    provider: &str,
    event_type: &str,
    resource_id: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<ApiRequest, LookupError> {
    // The id goes into a URL path: the ingest rules again, as a second line of defence.
    thin::check_resource_id(resource_id)
        .map_err(|e| permanent(format!("invalid resource id: {e}")))?;
    let spec = providers::lookup(provider)
        .and_then(|p| p.hint())
        .filter(|hint| hint.resource.kind == event_type)
        .ok_or_else(|| permanent(format!("no resource lookup for {provider} {event_type}")))?
        .lookup;
    let base = api_base(tenant, spec.default_base)?;
    let authorization = match spec.auth {
        ApiAuth::Bearer { token } => format!("Bearer {}", credential(tenant, token, &env)?),
        ApiAuth::Basic { username, password } => {
            let user = credential(tenant, username, &env)?;
            let password = credential(tenant, password, &env)?;
            let basic =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            format!("Basic {basic}")
        }
    };
    Ok(ApiRequest {
        url: format!("{base}{}{resource_id}", spec.path),
        authorization,
    })
}

/// The class of a non-2xx answer.
pub fn classify_status(status: http::StatusCode) -> LookupError {
    let msg = format!("provider API answered {}", status.as_u16());
    if status.is_server_error()
        || status == http::StatusCode::TOO_MANY_REQUESTS
        || status == http::StatusCode::REQUEST_TIMEOUT
    {
        LookupError::Transient(msg)
    } else {
        LookupError::Permanent(msg)
    }
}

/// The HTTP adapter over the process's shared [`HttpsClient`]. Without root
/// certificates every HTTPS lookup fails (transient, so it retries and then
/// dead-letters) until the certificates are installed.
#[derive(Clone)]
pub struct HttpLookup {
    client: HttpsClient,
    timeout: Duration,
}

impl HttpLookup {
    /// A client of its own (tests, one-off tools); wiring shares one via [`Self::with_client`].
    pub fn new() -> Self {
        Self::with_client(HttpsClient::new())
    }

    /// Lookups over `client` (a clone of the process's one client).
    pub fn with_client(client: HttpsClient) -> Self {
        HttpLookup {
            client,
            timeout: LOOKUP_TIMEOUT,
        }
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn get(&self, request: &ApiRequest) -> Result<Vec<u8>, LookupError> {
        let http_request = http::Request::get(&request.url)
            .header(http::header::AUTHORIZATION, &request.authorization)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, "einmal")
            .body(Empty::<Bytes>::new())
            .map_err(|_| permanent("cannot build the API request (invalid URL or credential)"))?;
        let response = self
            .client
            .request(http_request)
            .await
            .map_err(|e| LookupError::Transient(format!("provider API unreachable: {e}")))?;
        let status = response.status();
        if !status.is_success() {
            return Err(classify_status(status));
        }
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    permanent("provider API response exceeds 1 MiB")
                } else {
                    LookupError::Transient(format!("reading the provider API response: {e}"))
                }
            })?;
        Ok(body.to_bytes().to_vec())
    }
}

impl Default for HttpLookup {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl ResourceLookup for HttpLookup {
    async fn fetch(
        &self,
        tenant: &TenantConfig,
        provider: &str,
        event_type: &str,
        resource_id: &str,
    ) -> Result<Vec<u8>, LookupError> {
        let request = api_request(tenant, provider, event_type, resource_id, |var| {
            std::env::var(var).ok()
        })?;
        let started = std::time::Instant::now();
        let result = match tokio::time::timeout(self.timeout, self.get(&request)).await {
            Ok(result) => result,
            Err(_) => Err(LookupError::Transient(format!(
                "provider API did not answer within {} ms",
                self.timeout.as_millis()
            ))),
        };
        tracing::debug!(
            provider, tenant = %tenant.tenant, resource_id, ok = result.is_ok(),
            elapsed_ms = started.elapsed().as_millis() as u64, "resource lookup"
        );
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(provider: &str, options: &[(&str, &str)]) -> TenantConfig {
        TenantConfig {
            provider: provider.into(),
            tenant: "acme".into(),
            secrets: vec![],
            tolerance_secs: 300,
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn requests_per_provider() {
        let t = tenant(
            "mollie",
            &[("api_key", "test_abc"), ("api_base", "http://127.0.0.1:9/")],
        );
        let r = api_request(&t, "mollie", "payment", "tr_1", no_env).unwrap();
        assert_eq!(r.url, "http://127.0.0.1:9/v2/payments/tr_1");
        assert_eq!(r.authorization, "Bearer test_abc");
        assert!(!format!("{r:?}").contains("test_abc"));

        let t = tenant("gopay", &[("access_token", "env:GOPAY_TOKEN")]);
        let env = |v: &str| (v == "GOPAY_TOKEN").then(|| "tok".to_string());
        let r = api_request(&t, "gopay", "payment", "3000006529", env).unwrap();
        assert_eq!(
            r.url,
            "https://gate.gopay.cz/api/payments/payment/3000006529"
        );
        assert_eq!(r.authorization, "Bearer tok");

        let t = tenant(
            "klarna-push",
            &[
                ("api_username", "PK1_x"),
                ("api_password", "pw"),
                ("api_base", "https://api.playground.klarna.com"),
            ],
        );
        let r = api_request(&t, "klarna-push", "order", "abc-1", no_env).unwrap();
        assert_eq!(
            r.url,
            "https://api.playground.klarna.com/ordermanagement/v1/orders/abc-1"
        );
        assert_eq!(r.authorization, "Basic UEsxX3g6cHc=");
    }

    #[test]
    fn bad_configuration_is_permanent() {
        let perm = |r: Result<ApiRequest, LookupError>| matches!(r, Err(LookupError::Permanent(_)));
        let t = tenant("mollie", &[]);
        assert!(perm(api_request(&t, "mollie", "payment", "tr_1", no_env)));
        let t = tenant("mollie", &[("api_key", "env:NOPE")]);
        let err = api_request(&t, "mollie", "payment", "tr_1", no_env).unwrap_err();
        assert!(err.to_string().contains("NOPE"), "{err}");
        let t = tenant("mollie", &[("api_key", "k"), ("api_base", "ftp://x")]);
        assert!(perm(api_request(&t, "mollie", "payment", "tr_1", no_env)));
        let t = tenant("mollie", &[("api_key", "k")]);
        assert!(perm(api_request(&t, "mollie", "payment", "../x", no_env)));
        assert!(perm(api_request(&t, "mollie", "order", "tr_1", no_env)));
        assert!(perm(api_request(&t, "stripe", "payment", "tr_1", no_env)));
        let t = tenant("klarna-push", &[("api_username", "u")]);
        assert!(perm(api_request(&t, "klarna-push", "order", "o", no_env)));
    }

    #[test]
    fn status_classes() {
        use http::StatusCode as S;
        for s in [
            S::INTERNAL_SERVER_ERROR,
            S::BAD_GATEWAY,
            S::SERVICE_UNAVAILABLE,
            S::TOO_MANY_REQUESTS,
        ] {
            assert!(
                matches!(classify_status(s), LookupError::Transient(_)),
                "{s}"
            );
        }
        for s in [
            S::NOT_FOUND,
            S::UNAUTHORIZED,
            S::FORBIDDEN,
            S::BAD_REQUEST,
            S::GONE,
            S::FOUND,
        ] {
            assert!(
                matches!(classify_status(s), LookupError::Permanent(_)),
                "{s}"
            );
        }
    }

    #[tokio::test]
    async fn connection_refused_is_transient() {
        // Bind then drop a listener: the port is (almost certainly) closed now.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let base = format!("http://127.0.0.1:{port}");
        let t = tenant("mollie", &[("api_key", "k"), ("api_base", &base)]);
        let lookup = HttpLookup::new();
        let err = lookup
            .fetch(&t, "mollie", "payment", "tr_1")
            .await
            .unwrap_err();
        assert!(matches!(err, LookupError::Transient(_)), "{err}");
    }
}
