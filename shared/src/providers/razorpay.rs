//! Razorpay: `X-Razorpay-Signature: <hex>` = HMAC-SHA256(webhook secret as UTF-8, raw
//! body) [SDK-src] (razorpay-python `razorpay/utility/utility.py`
//! `verify_webhook_signature`, 2.0.1). Nothing time-related is signed.
//!
//! The event id is the `x-razorpay-event-id` header, which Razorpay documents as the
//! same on every retry of an event and meant for deduplication [doc]; it is unsigned,
//! like GitHub's delivery id, so a replayed body under a new id gets a fresh key: the
//! domain's effect keys (payment id, refund id) stop a second effect. The type, the
//! account and the object come from the signed body. Option `account_id`: the body's
//! `account_id` must equal it.

use http::HeaderName;

use super::body_hmac::{BodyHmac, Digest, Encoding};
use super::json::{self, Raw};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Razorpay;

static SIGNATURE: HeaderName = HeaderName::from_static("x-razorpay-signature");
static EVENT_ID: HeaderName = HeaderName::from_static("x-razorpay-event-id");

static SCHEME: BodyHmac = BodyHmac {
    header: &SIGNATURE,
    encoding: Encoding::Hex,
    digest: Digest::Sha256,
};

fn extract(request: &WebhookRequest, tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    let id = sig::single_header(request, &EVENT_ID)?
        .ok_or(ProviderError::MissingHeader("x-razorpay-event-id"))?;
    sig::check_event_id(id)?;
    let [kind, account, created, refund, payment, order, subscription] = json::json_fields(
        &request.body,
        [
            &["event"],
            &["account_id"],
            &["created_at"],
            &["payload", "refund", "entity", "id"],
            &["payload", "payment", "entity", "id"],
            &["payload", "order", "entity", "id"],
            &["payload", "subscription", "entity", "id"],
        ],
    )?;
    let kind = json::required_str(kind, "missing `event`")?;
    if let Some(want) = tenant.option("account_id") {
        if account.and_then(Raw::str).as_deref() != Some(want) {
            return Err(ProviderError::TenantMismatch("account_id"));
        }
    }
    // A refund event carries its payment too; the refund is the object it is about.
    let object = refund.or(payment).or(order).or(subscription);
    Ok(Envelope {
        provider: "razorpay".into(),
        tenant: tenant.tenant.clone(),
        event_id: id.to_owned(),
        event_type: kind.into_owned(),
        object_id: object.and_then(Raw::text).map(|o| o.into_owned()),
        object_version: None,
        occurred_at: created.and_then(Raw::time),
        delivery_id: None,
    })
}

impl Provider for Razorpay {
    fn name(&self) -> &'static str {
        "razorpay"
    }

    fn options(&self) -> &'static [&'static str] {
        &["account_id"]
    }

    /// Retries with exponential backoff for 24 hours [doc] (razorpay.com/docs/webhooks,
    /// "Retries"; not confirmed in an SDK).
    fn retry_window_days(&self) -> u32 {
        1
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        _now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        SCHEME.verify(request, tenant)?;
        let envelope = extract(request, tenant)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }

    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        _now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        SCHEME.sign(tenant, body, &[(&EVENT_ID, event_id)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::test_support::{tenant, verify_one};

    const BODY: &str = r#"{"entity":"event","account_id":"acc_DEMO","event":"payment.captured","contains":["payment"],"payload":{"payment":{"entity":{"id":"pay_1","amount":5000,"currency":"INR"}}},"created_at":1700000000}"#;

    fn signed(secret: &str, body: &str, id: &str) -> WebhookRequest {
        let h = Razorpay
            .sign(body.as_bytes(), &tenant("razorpay", &[secret]), id, 0)
            .unwrap();
        WebhookRequest::post(h, body.to_owned())
    }

    #[test]
    fn scheme_is_plain_hex_hmac_of_the_body() {
        // GitHub's published vector (V1) fixes the HMAC; Razorpay's is the same shape.
        assert_eq!(
            SCHEME.signature("It's a Secret to Everybody", b"Hello, World!"),
            "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }

    #[test]
    fn verifies_and_extracts() {
        let t = tenant("razorpay", &["s"]);
        let env = verify_one(&Razorpay, &signed("s", BODY, "evt_1"), &t, 0).unwrap();
        assert_eq!(env.event_id, "evt_1");
        assert_eq!(env.event_type, "payment.captured");
        assert_eq!(env.object_id.as_deref(), Some("pay_1"));
        assert_eq!(env.occurred_at, Some(1_700_000_000));
        assert_eq!(
            verify_one(
                &Razorpay,
                &signed("s", BODY, "evt_1"),
                &tenant("razorpay", &["x"]),
                0
            ),
            Err(ProviderError::SignatureMismatch)
        );
        let mut r = signed("s", BODY, "evt_1");
        r.body = BODY.replace("5000", "5001").into();
        assert_eq!(
            verify_one(&Razorpay, &r, &t, 0),
            Err(ProviderError::SignatureMismatch)
        );
        let mut r = signed("s", BODY, "evt_1");
        r.headers.remove("x-razorpay-event-id");
        assert_eq!(
            verify_one(&Razorpay, &r, &t, 0),
            Err(ProviderError::MissingHeader("x-razorpay-event-id"))
        );
        let mut t = t;
        t.options.insert("account_id".into(), "acc_OTHER".into());
        assert_eq!(
            verify_one(&Razorpay, &signed("s", BODY, "evt_1"), &t, 0),
            Err(ProviderError::TenantMismatch("account_id"))
        );
    }
}
