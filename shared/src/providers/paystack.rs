//! Paystack: `x-paystack-signature: <hex>` = HMAC-**SHA512**(secret key as UTF-8, raw
//! body) [doc] (paystack.com/docs/payments/webhooks, "Verify event origin"; no
//! official server SDK verifies it, so the unit test checks the HMAC against RFC 4231's
//! published vector). Nothing time-related is signed.
//!
//! The event carries no event id: the dedup id is `{event}:{data.id}` (the transaction,
//! refund or transfer id; retries repeat it byte for byte). Option `domain`
//! (`live`/`test`): the body's `data.domain` must equal it, so test events never land in
//! a live tenant.

use std::borrow::Cow;

use http::HeaderName;

use super::body_hmac::{BodyHmac, Digest, Encoding};
use super::json::{self, Raw};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Paystack;

static SIGNATURE: HeaderName = HeaderName::from_static("x-paystack-signature");

static SCHEME: BodyHmac = BodyHmac {
    header: &SIGNATURE,
    encoding: Encoding::Hex,
    digest: Digest::Sha512,
};

fn extract(body: &[u8], tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    let [kind, id, domain, paid_at, created_at, reference] = json::json_fields(
        body,
        [
            &["event"],
            &["data", "id"],
            &["data", "domain"],
            &["data", "paid_at"],
            &["data", "created_at"],
            &["data", "reference"],
        ],
    )?;
    let kind = json::required_str(kind, "missing `event`")?;
    let id = id
        .and_then(Raw::text)
        .ok_or_else(|| sig::payload_error("missing `data.id`"))?;
    if let Some(want) = tenant.option("domain") {
        if domain.and_then(Raw::str).as_deref() != Some(want) {
            return Err(ProviderError::TenantMismatch("domain"));
        }
    }
    let event_id = format!("{kind}:{id}");
    sig::check_event_id(&event_id)?;
    Ok(Envelope {
        provider: "paystack".into(),
        tenant: tenant.tenant.clone(),
        event_id,
        event_type: kind.into_owned(),
        object_id: reference
            .and_then(Raw::text)
            .map(Cow::into_owned)
            .or(Some(id.into_owned())),
        object_version: None,
        occurred_at: paid_at.or(created_at).and_then(Raw::time),
        delivery_id: None,
    })
}

impl Provider for Paystack {
    fn name(&self) -> &'static str {
        "paystack"
    }

    fn options(&self) -> &'static [&'static str] {
        &["domain"]
    }

    /// Live: every 3 minutes for the first 4 tries, then hourly for 72 hours [doc]
    /// (same page, "Retries"; read from memory of the page: UNCONFIRMED).
    fn retry_window_days(&self) -> u32 {
        4
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        _now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        SCHEME.verify(request, tenant)?;
        let envelope = extract(&request.body, tenant)?;
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

    const BODY: &str = r#"{"event":"charge.success","data":{"id":302961,"domain":"live","status":"success","reference":"qTPrJoy9Bx","amount":10000,"currency":"NGN","paid_at":"2016-09-30T21:10:19.000Z","created_at":"2016-09-30T21:09:56.000Z"}}"#;

    #[test]
    fn rfc4231_vector_fixes_the_hmac_sha512() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            SCHEME.signature("Jefe", b"what do ya want for nothing?"),
            "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"
        );
    }

    #[test]
    fn composite_id_tenant_domain_and_refusals() {
        let mut t = tenant("paystack", &["sk_test_x"]);
        t.options.insert("domain".into(), "live".into());
        let h = Paystack.sign(BODY.as_bytes(), &t, "", 0).unwrap();
        let env = verify_one(&Paystack, &WebhookRequest::post(h.clone(), BODY), &t, 0).unwrap();
        assert_eq!(env.event_id, "charge.success:302961");
        assert_eq!(env.object_id.as_deref(), Some("qTPrJoy9Bx"));
        assert_eq!(env.occurred_at, Some(1_475_269_819));
        let tampered = WebhookRequest::post(h.clone(), BODY.replace("10000", "10001"));
        assert_eq!(
            verify_one(&Paystack, &tampered, &t, 0),
            Err(ProviderError::SignatureMismatch)
        );
        t.options.insert("domain".into(), "test".into());
        assert_eq!(
            verify_one(&Paystack, &WebhookRequest::post(h, BODY), &t, 0),
            Err(ProviderError::TenantMismatch("domain"))
        );
    }
}
