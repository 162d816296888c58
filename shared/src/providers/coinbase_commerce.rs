//! Coinbase Commerce: `X-CC-Webhook-Signature: <hex>` = HMAC-SHA256(shared secret as
//! UTF-8, raw body) [SDK-src] (coinbase-commerce-python `coinbase_commerce/webhook.py`
//! `WebhookSignature`, 1.0.1). Nothing time-related is signed.
//!
//! The body wraps the event: `{"id": <delivery number>, "scheduled_for": …, "event":
//! {"id": <uuid>, "type": "charge:confirmed", "created_at": …, "data": {…}}}`; the
//! event id is `event.id` (stable across attempts), the outer `id` names the delivery
//! [SDK-src] (the SDK builds its `Event` from `event` alone).

use http::HeaderName;

use super::body_hmac::{BodyHmac, Digest, Encoding};
use super::plain_json::PlainJson;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::request::WebhookRequest;

pub struct CoinbaseCommerce;

static SIGNATURE: HeaderName = HeaderName::from_static("x-cc-webhook-signature");

static SCHEME: BodyHmac = BodyHmac {
    header: &SIGNATURE,
    encoding: Encoding::Hex,
    digest: Digest::Sha256,
};

static ENVELOPE: PlainJson = PlainJson {
    provider: "coinbase-commerce",
    event_id: (
        &["event", "id"],
        "missing `event.id`",
        "`event.id` is not a string",
    ),
    event_type: (&[&["event", "type"]], "missing `event.type`"),
    object_id: &[&["event", "data", "id"], &["event", "data", "code"]],
    occurred_at: Some(&["event", "created_at"]),
    delivery_id: Some(&["id"]),
    tenant: None,
};

impl Provider for CoinbaseCommerce {
    fn name(&self) -> &'static str {
        "coinbase-commerce"
    }

    fn options(&self) -> &'static [&'static str] {
        &[]
    }

    /// Failed deliveries are retried for up to 3 days (UNCONFIRMED: from memory of the
    /// Commerce docs; the longest reported value is taken).
    fn retry_window_days(&self) -> u32 {
        3
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        _now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        SCHEME.verify(request, tenant)?;
        let envelope = ENVELOPE.extract(&request.body, tenant)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }

    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        _event_id: &str,
        _now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        SCHEME.sign(tenant, body, &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::test_support::{tenant, verify_one};

    const BODY: &str = r#"{"id":7,"scheduled_for":"2024-01-01T00:00:00Z","event":{"id":"24934862-d980-46cb-9402-43c81b0cdba6","resource":"event","type":"charge:confirmed","api_version":"2018-03-22","created_at":"2024-01-01T00:00:00Z","data":{"id":"f765421f-d10c-4f1b-9c0a-2d4a5a1f6d3e","code":"66BEOV2A"}}}"#;

    #[test]
    fn verifies_and_extracts_the_inner_event() {
        let t = tenant("coinbase-commerce", &["s"]);
        let h = CoinbaseCommerce.sign(BODY.as_bytes(), &t, "", 0).unwrap();
        let env = verify_one(
            &CoinbaseCommerce,
            &WebhookRequest::post(h.clone(), BODY),
            &t,
            0,
        )
        .unwrap();
        assert_eq!(env.event_id, "24934862-d980-46cb-9402-43c81b0cdba6");
        assert_eq!(env.event_type, "charge:confirmed");
        assert_eq!(env.delivery_id.as_deref(), Some("7"));
        assert_eq!(
            env.object_id.as_deref(),
            Some("f765421f-d10c-4f1b-9c0a-2d4a5a1f6d3e")
        );
        let tampered = WebhookRequest::post(h.clone(), BODY.replace("66BEOV2A", "66BEOV2B"));
        assert_eq!(
            verify_one(&CoinbaseCommerce, &tampered, &t, 0),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify_one(
                &CoinbaseCommerce,
                &WebhookRequest::post(h, BODY),
                &tenant("coinbase-commerce", &["x"]),
                0
            ),
            Err(ProviderError::SignatureMismatch)
        );
    }
}
