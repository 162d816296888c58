//! Shared rules of the thin-event providers (Mollie classic, GoPay, Klarna KCO push).
//!
//! These providers sign nothing and send only a resource id. The request is a *hint*:
//! it is authenticated by an opaque per-tenant token in the URL
//! (`/webhooks/{provider}/{tenant}/{token}`, tenant option `path_token`), stored in the
//! inbox, and the processor fetches the authoritative state from the provider's API
//! with the tenant's credentials before any effect (`crate::lookup`,
//! `pipeline::process`). A forged hint therefore costs one API call and changes
//! nothing: the business decision is made on the fetched state only.
//!
//! # Dedup key
//!
//! The same resource id is re-sent for every status change, so it can never be the
//! event id alone (a later `paid` notification would be dropped as a duplicate of the
//! earlier `open` one). The request carries nothing else that is stable across retries
//! (no event id, no status, no timestamp), so the event id is
//! `{resource_id}:hint:{now_secs / 60}`: one inbox item per resource per minute.
//! Retries within the same minute deduplicate; a later status change (or a retry in
//! a later minute) creates a new hint item, which is cheap and harmless. A per-receipt
//! key (`{id}@{received_ms}`) would pile up one item per retry instead.
//!
//! Effects stay exactly-once regardless of how many hint items a resource gets: the
//! processor decides on the *fetched* business state, and the domain's effect keys
//! come from that state (order + action), never from the hint's event id. Two hints
//! that both see `paid` produce one effect; the second finds its key applied.
//!
//! The envelope's event type is `hint.{kind}` (`hint.payment`, `hint.order`): the
//! processor recognises hints by this prefix, fetches the resource, and shows the
//! domain the fetched JSON under `{kind}` (see [`HINT_PREFIX`]).

use super::sig;
use super::ProviderError;
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

/// Tenant option holding the URL token that authenticates a thin endpoint.
pub const PATH_TOKEN_OPTION: &str = "path_token";
/// Event types of hint envelopes start with this; the rest is what the domain sees.
pub const HINT_PREFIX: &str = "hint.";
/// Width of the dedup window of hints, in seconds.
pub const HINT_WINDOW_SECS: i64 = 60;
/// Longest accepted resource id.
pub const MAX_RESOURCE_ID_LEN: usize = 64;

/// What a thin-event provider's hints name and how the processor fetches it: the
/// provider states it ([`super::Provider::hint`]); `crate::lookup` does the HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HintSpec {
    /// The resource a hint names (its `kind`: event type `hint.{kind}`, fetched JSON shown
    /// to the domain under `{kind}`), the one table reconciliation reads too.
    pub resource: &'static ThinResource,
    /// Whether the hints are indexed for reconciliation ([`crate::ports::InboxHints`]):
    /// true for providers without a list API, whose reconciliation can only look up the
    /// resources their hints named.
    pub indexed: bool,
    /// The API request that fetches the resource.
    pub lookup: LookupSpec,
}

/// One API lookup: `GET {api_base}{path}{resource_id}` with the tenant's credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupSpec {
    /// Used when the tenant sets no `api_base` option.
    pub default_base: &'static str,
    /// The path up to the resource id, starting with `/`.
    pub path: &'static str,
    pub auth: ApiAuth,
}

/// How a lookup authenticates; each field names the tenant option holding the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiAuth {
    /// `Authorization: Bearer {option}`.
    Bearer { token: &'static str },
    /// `Authorization: Basic base64({username}:{password})`.
    Basic {
        username: &'static str,
        password: &'static str,
    },
}

/// Check the request's path token against the tenant's `path_token` option, in
/// constant time. No configured token refuses the endpoint (`NoSecret`): an unsigned
/// endpoint is never open.
pub fn check_path_token(
    request: &WebhookRequest,
    tenant: &TenantConfig,
) -> Result<(), ProviderError> {
    let expected = configured_token(tenant)?;
    let given = request
        .path_token
        .as_deref()
        .filter(|t| !t.is_empty())
        .ok_or(ProviderError::MissingHeader("path token"))?;
    if sig::ct_eq(given.as_bytes(), expected.as_bytes()) {
        Ok(())
    } else {
        Err(ProviderError::SignatureMismatch)
    }
}

/// The tenant's configured path token, or `NoSecret`.
pub fn configured_token(tenant: &TenantConfig) -> Result<&str, ProviderError> {
    tenant
        .option(PATH_TOKEN_OPTION)
        .filter(|t| !t.is_empty())
        .ok_or(ProviderError::NoSecret)
}

/// Resource ids end up in inbox keys and API URLs: ASCII letters, digits, `-`, `_`,
/// at most [`MAX_RESOURCE_ID_LEN`] bytes.
pub fn check_resource_id(id: &str) -> Result<(), ProviderError> {
    if id.is_empty() {
        return Err(sig::payload_error("resource id is empty"));
    }
    if id.len() > MAX_RESOURCE_ID_LEN {
        return Err(sig::payload_error("resource id is longer than 64 bytes"));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
    {
        return Err(sig::payload_error(
            "resource id may only use ASCII letters, digits, '-' and '_'",
        ));
    }
    Ok(())
}

/// The single value of form/query parameter `name` in `pairs`, if present. Repeats
/// with different values are refused (no guessing which one is meant).
pub fn single_param(pairs: &[u8], name: &str) -> Result<Option<String>, ProviderError> {
    let mut found: Option<String> = None;
    for (k, v) in form_urlencoded::parse(pairs) {
        if k != name {
            continue;
        }
        match &found {
            Some(prev) if *prev != v => {
                return Err(sig::payload_error(format!(
                    "parameter `{name}` repeated with different values"
                )))
            }
            _ => found = Some(v.into_owned()),
        }
    }
    Ok(found)
}

/// The envelope of a hint for `resource_id` received at `now_secs` (see the module
/// docs for the event id).
pub fn hint_envelope(
    provider: &str,
    tenant: &TenantConfig,
    kind: &str,
    resource_id: &str,
    now_secs: i64,
) -> Envelope {
    Envelope {
        provider: provider.to_string(),
        tenant: tenant.tenant.clone(),
        event_id: hint_event_id(resource_id, now_secs),
        event_type: format!("{HINT_PREFIX}{kind}"),
        object_id: Some(resource_id.to_string()),
        object_version: None,
        occurred_at: None,
        delivery_id: None,
    }
}

/// The one event of a hint whose body carries nothing worth storing (GoPay, Klarna
/// push): the id is validated, and the processor fetches the real state later.
pub fn bodiless_hint(
    provider: &str,
    tenant: &TenantConfig,
    kind: &str,
    resource_id: &str,
    now_secs: i64,
) -> Result<Vec<super::VerifiedEvent>, ProviderError> {
    check_resource_id(resource_id)?;
    Ok(vec![super::VerifiedEvent {
        envelope: hint_envelope(provider, tenant, kind, resource_id, now_secs),
        body: bytes::Bytes::new(),
    }])
}

/// The `Provider` methods of the bodiless query hints (GoPay, Klarna push), which differ
/// only in how the resource id is read from the query: `$id_of(query)`. A hint is
/// guarded by the path token, so no secret is needed; what the provider sends is no
/// headers and an empty body (token and id live in the URL), and signing still refuses
/// a tenant without a configured path token. A macro because these are trait methods.
macro_rules! query_hint_methods {
    ($name:expr, $hint:expr, $id_of:expr) => {
        fn hint(&self) -> Option<&'static $crate::providers::thin::HintSpec> {
            Some(&$hint)
        }

        fn needs_secret(&self, _tenant: &$crate::config::TenantConfig) -> bool {
            false
        }

        fn verify_and_extract(
            &self,
            request: &$crate::request::WebhookRequest,
            tenant: &$crate::config::TenantConfig,
            now_secs: i64,
        ) -> Result<Vec<$crate::providers::VerifiedEvent>, $crate::providers::ProviderError> {
            $crate::providers::thin::check_path_token(request, tenant)?;
            let id = $id_of(request.query.as_deref().unwrap_or_default())?;
            $crate::providers::thin::bodiless_hint(
                $name,
                tenant,
                $hint.resource.kind,
                &id,
                now_secs,
            )
        }

        fn sign(
            &self,
            _body: &[u8],
            tenant: &$crate::config::TenantConfig,
            _event_id: &str,
            _now_secs: i64,
        ) -> Result<http::HeaderMap, $crate::providers::ProviderError> {
            $crate::providers::thin::configured_token(tenant)?;
            Ok(http::HeaderMap::new())
        }

        fn signed_request(
            &self,
            body: &[u8],
            tenant: &$crate::config::TenantConfig,
            event_id: &str,
            now_secs: i64,
        ) -> Result<(http::HeaderMap, bytes::Bytes), $crate::providers::ProviderError> {
            Ok((
                self.sign(body, tenant, event_id, now_secs)?,
                bytes::Bytes::new(),
            ))
        }
    };
}
pub(crate) use query_hint_methods;

/// `{resource_id}:hint:{now_secs / 60}`.
pub fn hint_event_id(resource_id: &str, now_secs: i64) -> String {
    format!(
        "{resource_id}:hint:{}",
        now_secs.div_euclid(HINT_WINDOW_SECS)
    )
}

/// What a fetched thin resource's status means: only final states are facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentState {
    Paid,
    /// Finally failed (failed, canceled, expired, …).
    Failed,
    /// Not final (open, authorized, refunded, …): nothing to apply yet.
    Open,
}

/// The provider's own facts about the resource a hint names and the processor fetches:
/// where its id, status and order reference are, and which statuses are final. The
/// reference domain and reconciliation both read them from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinResource {
    /// The hint kind (`hint.{kind}`) and lookup kind: `payment`, `order`.
    pub kind: &'static str,
    /// Path of the resource id in the fetched JSON.
    pub id: &'static [&'static str],
    /// Path of the status.
    pub status: &'static [&'static str],
    /// Path of our order id (the merchant's reference).
    pub order_id: &'static [&'static str],
    /// Statuses that mean paid.
    pub paid: &'static [&'static str],
    /// Statuses that mean finally failed.
    pub failed: &'static [&'static str],
}

impl ThinResource {
    /// What `status` means.
    pub fn state(&self, status: &str) -> PaymentState {
        if self.paid.contains(&status) {
            PaymentState::Paid
        } else if self.failed.contains(&status) {
            PaymentState::Failed
        } else {
            PaymentState::Open
        }
    }

    /// The value at `path` in `body` (`None` when absent or null).
    pub fn field<'v>(body: &'v serde_json::Value, path: &[&str]) -> Option<&'v serde_json::Value> {
        path.iter()
            .try_fold(body, |v, k| v.get(k))
            .filter(|v| !v.is_null())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn tenant(token: Option<&str>) -> TenantConfig {
        TenantConfig {
            provider: "gopay".into(),
            tenant: "acme".into(),
            secrets: vec![],
            tolerance_secs: 300,
            options: token
                .map(|t| [(PATH_TOKEN_OPTION.to_string(), t.to_string())].into())
                .unwrap_or_default(),
        }
    }

    fn req(token: Option<&str>) -> WebhookRequest {
        let mut r = WebhookRequest::post(HeaderMap::new(), "");
        r.path_token = token.map(str::to_string);
        r
    }

    #[test]
    fn path_token_rules() {
        let t = tenant(Some("tok-123"));
        assert_eq!(check_path_token(&req(Some("tok-123")), &t), Ok(()));
        assert_eq!(
            check_path_token(&req(Some("tok-124")), &t),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            check_path_token(&req(Some("tok-1234")), &t),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            check_path_token(&req(None), &t),
            Err(ProviderError::MissingHeader("path token"))
        );
        assert_eq!(
            check_path_token(&req(Some("")), &t),
            Err(ProviderError::MissingHeader("path token"))
        );
        for t in [tenant(None), tenant(Some(""))] {
            assert_eq!(
                check_path_token(&req(Some("anything")), &t),
                Err(ProviderError::NoSecret)
            );
        }
        assert!(ProviderError::NoSecret.is_authentication_failure());
        assert!(ProviderError::MissingHeader("path token").is_authentication_failure());
    }

    #[test]
    fn resource_ids() {
        for ok in [
            "tr_5B8cwPMGnU6qLbRvo7qEZo",
            "3000006529",
            "a-b_c",
            &"x".repeat(64),
        ] {
            assert_eq!(check_resource_id(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a b", "a/b", "a#b", "é", "../x", &"x".repeat(65)] {
            let err = check_resource_id(bad).unwrap_err();
            assert!(!err.is_authentication_failure(), "{bad}");
        }
    }

    #[test]
    fn dedup_window_is_one_minute() {
        assert_eq!(hint_event_id("tr_1", 120), "tr_1:hint:2");
        assert_eq!(hint_event_id("tr_1", 179), "tr_1:hint:2");
        assert_eq!(hint_event_id("tr_1", 180), "tr_1:hint:3");
        let env = hint_envelope("mollie", &tenant(None), "payment", "tr_1", 600);
        assert_eq!(env.event_type, "hint.payment");
        assert_eq!(env.object_id.as_deref(), Some("tr_1"));
        assert_eq!(env.key().as_str(), "mollie#acme#tr_1:hint:10");
    }

    #[test]
    fn thin_resources_name_their_final_states() {
        for provider in super::super::all() {
            let Some(facts) = provider.reconcile().and_then(|s| s.thin()) else {
                continue;
            };
            let name = provider.name();
            assert!(!facts.paid.is_empty(), "{name}");
            for status in facts.paid {
                assert_eq!(facts.state(status), PaymentState::Paid, "{name} {status}");
            }
            for status in facts.failed {
                assert_eq!(facts.state(status), PaymentState::Failed, "{name} {status}");
            }
            assert_eq!(facts.state("no such status"), PaymentState::Open, "{name}");
            assert!(["payment", "order"].contains(&facts.kind), "{name}");
        }
        let body = serde_json::json!({"a": {"b": 1}, "n": null});
        assert_eq!(
            ThinResource::field(&body, &["a", "b"]),
            Some(&serde_json::json!(1))
        );
        assert_eq!(ThinResource::field(&body, &["n"]), None);
        assert_eq!(ThinResource::field(&body, &["a", "c"]), None);
    }

    #[test]
    fn params() {
        assert_eq!(
            single_param(b"id=tr_1&x=2", "id"),
            Ok(Some("tr_1".to_string()))
        );
        assert_eq!(single_param(b"id=a&id=a", "id"), Ok(Some("a".into())));
        assert!(single_param(b"id=a&id=b", "id").is_err());
        assert_eq!(single_param(b"", "id"), Ok(None));
        assert_eq!(single_param(b"ID=a", "id"), Ok(None));
    }
}
