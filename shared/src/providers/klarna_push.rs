//! Klarna Checkout (KCO) push: an unsigned POST with an empty body to the merchant's
//! push URL, in which Klarna replaced the `{checkout.order.id}` placeholder. The
//! conventional query names are `klarna_order_id` and `checkout_order_id`; both are
//! accepted (equal values if both are present). Pushes repeat until the order is
//! acknowledged in the Order Management API.
//!
//! Nothing is signed, so the request is only a hint (see [`super::thin`]): the URL
//! must carry the tenant's `path_token` (`/webhooks/klarna-push/{tenant}/{token}?
//! klarna_order_id={checkout.order.id}`), the envelope is `hint.order` for the order
//! id, and the processor fetches `GET {api_base}/ordermanagement/v1/orders/{id}` before
//! any effect. The body is ignored and not stored.
//!
//! Not done here: `POST …/orders/{id}/acknowledge`. Until something acknowledges the
//! order, Klarna keeps pushing; each push is a cheap hint (one item per minute at most)
//! and effects stay exactly-once.
//!
//! `sign` / `signed_request` produce what Klarna sends (no signature headers, empty
//! body); the token and the order id live in the URL, which `einmal send` does not
//! build for this provider.

use super::reconcile_source::{ReconcileMethod, ReconcileSource};
use super::thin::{self, ThinResource};
use super::{Provider, ProviderError};

pub struct KlarnaPush;

pub const NAME: &str = "klarna-push";

/// An order as the Order Management API's `GET /ordermanagement/v1/orders/{id}`
/// returns it.
pub static RESOURCE: ThinResource = ThinResource {
    kind: "order",
    id: &["order_id"],
    status: &["status"],
    order_id: &["merchant_reference1"],
    paid: &["AUTHORIZED", "PART_CAPTURED", "CAPTURED"],
    failed: &["CANCELLED"],
};

const PARAMS: [&str; 2] = ["klarna_order_id", "checkout_order_id"];

fn order_id(query: &str) -> Result<String, ProviderError> {
    let mut found: Option<String> = None;
    for name in PARAMS {
        if let Some(v) = thin::single_param(query.as_bytes(), name)? {
            match &found {
                Some(prev) if *prev != v => {
                    return Err(ProviderError::MalformedPayload(
                        "klarna_order_id and checkout_order_id differ".into(),
                    ))
                }
                _ => found = Some(v),
            }
        }
    }
    found.ok_or_else(|| {
        ProviderError::MalformedPayload(
            "missing query parameter `klarna_order_id` (or `checkout_order_id`)".into(),
        )
    })
}

/// Pushes name orders (Order Management API, Klarna EU by default); no list API, so
/// reconciliation finds them through the index.
static HINT: thin::HintSpec = thin::HintSpec {
    resource: &RESOURCE,
    indexed: true,
    lookup: thin::LookupSpec {
        default_base: "https://api.klarna.com",
        path: "/ordermanagement/v1/orders/",
        auth: thin::ApiAuth::Basic {
            username: "api_username",
            password: "api_password",
        },
    },
};

impl Provider for KlarnaPush {
    fn name(&self) -> &'static str {
        NAME
    }

    fn options(&self) -> &'static [&'static str] {
        &[
            "path_token",
            "api_username",
            "api_password",
            "api_base",
            "max_hints_per_minute",
        ]
    }

    /// Pushes repeat until acknowledged; schedule unconfirmed, counted as two days.
    fn retry_window_days(&self) -> u32 {
        2
    }

    thin::query_hint_methods!(NAME, HINT, order_id);

    fn reconcile(&self) -> Option<ReconcileSource> {
        Some(ReconcileSource {
            credential_option: "api_username",
            method: ReconcileMethod::WatchedHints(&RESOURCE),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TenantConfig;
    use crate::request::WebhookRequest;
    use http::{HeaderMap, Method};

    const ORDER: &str = "f3392f8b-6116-4073-ab96-e330819e2c07";

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

    fn push(query: Option<&str>, token: Option<&str>) -> WebhookRequest {
        let mut r = WebhookRequest::post(HeaderMap::new(), "");
        r.query = query.map(str::to_string);
        r.path_token = token.map(str::to_string);
        r
    }

    #[test]
    fn extracts_an_order_hint_from_either_parameter() {
        let t = tenant(Some("tok"));
        for q in [
            format!("klarna_order_id={ORDER}"),
            format!("checkout_order_id={ORDER}"),
            format!("checkout_order_id={ORDER}&klarna_order_id={ORDER}"),
            format!("sid=1&klarna_order_id={ORDER}"),
        ] {
            let v = KlarnaPush
                .verify_and_extract(&push(Some(&q), Some("tok")), &t, 120)
                .unwrap();
            assert_eq!(v.len(), 1);
            let env = &v[0].envelope;
            assert_eq!(env.provider, "klarna-push");
            assert_eq!(env.event_type, "hint.order");
            assert_eq!(env.object_id.as_deref(), Some(ORDER));
            assert_eq!(env.event_id, format!("{ORDER}:hint:2"));
            assert!(v[0].body.is_empty());
        }
        assert!(KlarnaPush.accepts_method(&Method::POST));
        assert!(!KlarnaPush.accepts_method(&Method::GET));
    }

    #[test]
    fn authentication_comes_first() {
        let t = tenant(Some("tok"));
        let q = format!("klarna_order_id={ORDER}");
        let check = |q: Option<&str>, tok| KlarnaPush.verify_and_extract(&push(q, tok), &t, 0);
        assert_eq!(
            check(Some(&q), None),
            Err(ProviderError::MissingHeader("path token"))
        );
        assert_eq!(
            check(Some(&q), Some("tok2")),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            check(None, Some("x")),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            KlarnaPush.verify_and_extract(&push(Some(&q), Some("tok")), &tenant(None), 0),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn malformed_queries() {
        let t = tenant(Some("tok"));
        for q in [
            None,
            Some("order_id=1".to_string()),
            Some("klarna_order_id=".to_string()),
            Some("klarna_order_id=a&checkout_order_id=b".to_string()),
            Some("klarna_order_id={checkout.order.id}".to_string()),
        ] {
            let err = KlarnaPush
                .verify_and_extract(&push(q.as_deref(), Some("tok")), &t, 0)
                .unwrap_err();
            assert!(
                matches!(err, ProviderError::MalformedPayload(_)),
                "{q:?}: {err:?}"
            );
        }
    }

    #[test]
    fn sign_round_trip() {
        let t = tenant(Some("tok"));
        let (h, body) = KlarnaPush.signed_request(b"ignored", &t, ORDER, 0).unwrap();
        assert!(h.is_empty() && body.is_empty());
        let mut r = WebhookRequest::post(h, body);
        r.query = Some(format!("klarna_order_id={ORDER}"));
        r.path_token = Some("tok".into());
        assert!(KlarnaPush.verify_and_extract(&r, &t, 0).is_ok());
        assert_eq!(
            KlarnaPush.sign(b"", &tenant(None), ORDER, 0).unwrap_err(),
            ProviderError::NoSecret
        );
    }
}
