//! GoPay notifications: an unsigned HTTP **GET** to the tenant's `notification_url`
//! with the payment id in the query (`?id=3000006529`; recurring payments may add
//! `parent_id`, ignored). GoPay sends one whenever the payment state changes and
//! retries until it gets a 200.
//!
//! Nothing is signed, so the request is only a hint (see [`super::thin`]): the URL
//! must carry the tenant's `path_token` (`/webhooks/gopay/{tenant}/{token}`), the
//! envelope is `hint.payment` for the payment id, and the processor fetches
//! `GET {api_base}/api/payments/payment/{id}` before any effect.
//!
//! `sign` / `signed_request` produce what GoPay sends: no headers, an empty body. The
//! id and the token live in the URL, which `einmal send` does not build for this
//! provider: call the endpoint directly, e.g.
//! `curl "http://127.0.0.1:8080/webhooks/gopay/T/TOKEN?id=3000006529"`.

use super::reconcile_source::{ReconcileMethod, ReconcileSource};
use super::thin::{self, ThinResource};
use super::{Provider, ProviderError};

pub struct GoPay;

pub const NAME: &str = "gopay";

/// Hints name payments; no list API, so reconciliation finds them through the index.
static HINT: thin::HintSpec = thin::HintSpec {
    resource: &RESOURCE,
    indexed: true,
    lookup: thin::LookupSpec {
        default_base: "https://gate.gopay.cz",
        path: "/api/payments/payment/",
        auth: thin::ApiAuth::Bearer {
            token: "access_token",
        },
    },
};

/// A payment as `GET /api/payments/payment/{id}` returns it.
pub static RESOURCE: ThinResource = ThinResource {
    kind: "payment",
    id: &["id"],
    status: &["state"],
    order_id: &["order_number"],
    paid: &["PAID"],
    failed: &["CANCELED", "TIMEOUTED"],
};

/// The payment id of `?id=…`.
fn payment_id(query: &str) -> Result<String, ProviderError> {
    thin::single_param(query.as_bytes(), "id")?
        .ok_or_else(|| ProviderError::MalformedPayload("missing query parameter `id`".into()))
}

impl Provider for GoPay {
    fn name(&self) -> &'static str {
        NAME
    }

    fn options(&self) -> &'static [&'static str] {
        &[
            "path_token",
            "access_token",
            "api_base",
            "max_hints_per_minute",
        ]
    }

    /// Up to 20 attempts; schedule unconfirmed, counted as two days.
    fn retry_window_days(&self) -> u32 {
        2
    }

    fn accepts_method(&self, method: &http::Method) -> bool {
        method == http::Method::GET
    }

    thin::query_hint_methods!(NAME, HINT, payment_id);

    fn reconcile(&self) -> Option<ReconcileSource> {
        Some(ReconcileSource {
            credential_option: "access_token",
            method: ReconcileMethod::WatchedHints(&RESOURCE),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TenantConfig;
    use crate::envelope::Envelope;
    use crate::request::WebhookRequest;
    use bytes::Bytes;
    use http::{HeaderMap, Method};

    fn tenant(token: Option<&str>) -> TenantConfig {
        TenantConfig {
            provider: NAME.into(),
            tenant: "acme".into(),
            secrets: vec![],
            tolerance_secs: 300,
            options: token
                .map(|t| [("path_token".to_string(), t.to_string())].into())
                .unwrap_or_default(),
        }
    }

    fn get(query: Option<&str>, token: Option<&str>) -> WebhookRequest {
        WebhookRequest {
            method: Method::GET,
            headers: HeaderMap::new(),
            query: query.map(str::to_string),
            body: Bytes::new(),
            path_token: token.map(str::to_string),
        }
    }

    #[test]
    fn extracts_a_payment_hint() {
        let r = get(Some("id=3000006529"), Some("tok"));
        let v = GoPay
            .verify_and_extract(&r, &tenant(Some("tok")), 1_700_000_000)
            .unwrap();
        assert_eq!(v.len(), 1);
        assert!(v[0].body.is_empty());
        assert_eq!(
            v[0].envelope,
            Envelope {
                provider: "gopay".into(),
                tenant: "acme".into(),
                event_id: format!("3000006529:hint:{}", 1_700_000_000 / 60),
                event_type: "hint.payment".into(),
                object_id: Some("3000006529".into()),
                object_version: None,
                occurred_at: None,
                delivery_id: None,
            }
        );
        // Recurring payments add parent_id: ignored.
        let r = get(Some("parent_id=1&id=3000006529"), Some("tok"));
        assert!(GoPay
            .verify_and_extract(&r, &tenant(Some("tok")), 0)
            .is_ok());
    }

    #[test]
    fn only_get_is_accepted() {
        assert!(GoPay.accepts_method(&Method::GET));
        assert!(!GoPay.accepts_method(&Method::POST));
        assert!(!GoPay.accepts_method(&Method::PUT));
    }

    #[test]
    fn token_is_checked_before_the_query() {
        let t = tenant(Some("tok"));
        let check =
            |q: Option<&str>, tok: Option<&str>| GoPay.verify_and_extract(&get(q, tok), &t, 0);
        assert_eq!(
            check(Some("id=1"), None),
            Err(ProviderError::MissingHeader("path token"))
        );
        assert_eq!(
            check(Some("id=1"), Some("nope")),
            Err(ProviderError::SignatureMismatch)
        );
        // A bad query with a bad token is still an authentication failure.
        assert_eq!(
            check(None, Some("nope")),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            GoPay.verify_and_extract(&get(Some("id=1"), Some("tok")), &tenant(None), 0),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn malformed_queries() {
        let t = tenant(Some("tok"));
        for q in [
            None,
            Some(""),
            Some("x=1"),
            Some("id="),
            Some("id=1&id=2"),
            Some("id=a%2Fb"),
            Some("id=a%23b"),
        ] {
            let err = GoPay
                .verify_and_extract(&get(q, Some("tok")), &t, 0)
                .unwrap_err();
            assert!(
                matches!(err, ProviderError::MalformedPayload(_)),
                "{q:?}: {err:?}"
            );
        }
    }

    #[test]
    fn retries_within_a_minute_share_the_key() {
        let t = tenant(Some("tok"));
        let r = get(Some("id=42"), Some("tok"));
        let key = |now| {
            GoPay.verify_and_extract(&r, &t, now).unwrap()[0]
                .envelope
                .key()
        };
        assert_eq!(key(600), key(659));
        assert_ne!(key(659), key(660));
    }

    #[test]
    fn sign_needs_a_token_and_sends_nothing() {
        let (h, b) = GoPay
            .signed_request(b"{}", &tenant(Some("tok")), "42", 0)
            .unwrap();
        assert!(h.is_empty() && b.is_empty());
        assert_eq!(
            GoPay
                .signed_request(b"", &tenant(None), "42", 0)
                .unwrap_err(),
            ProviderError::NoSecret
        );
    }
}
