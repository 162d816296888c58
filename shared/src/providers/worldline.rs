//! Worldline Online Payments (formerly Ingenico): `X-GCS-Signature: <base64>` =
//! HMAC-SHA256(webhook secret key as UTF-8, raw body), the key chosen by
//! `X-GCS-KeyId` [SDK-src] (onlinepayments-sdk-python3 10.3.0
//! `onlinepayments/sdk/webhooks/signature_validator.py`; the SDK refuses a repeated
//! header). Nothing time-related is signed.
//!
//! Secrets are written `keyid:secret` (as for Klarna): only secrets whose key id equals
//! the header are tried. The body is the SDK's `WebhooksEvent`: `id`, `type`,
//! `created`, `merchantId`, and the `payment`/`refund`/`payout`/`token` it is about.
//! Option `merchant_id`: the body's `merchantId` must equal it.

use http::HeaderName;

use super::body_hmac::{BodyHmac, Digest, Encoding};
use super::plain_json::{PlainJson, TenantField};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::{Secret, TenantConfig};
use crate::request::WebhookRequest;

pub struct Worldline;

static SIGNATURE: HeaderName = HeaderName::from_static("x-gcs-signature");
static KEY_ID: HeaderName = HeaderName::from_static("x-gcs-keyid");

static SCHEME: BodyHmac = BodyHmac {
    header: &SIGNATURE,
    encoding: Encoding::Base64,
    digest: Digest::Sha256,
};

static ENVELOPE: PlainJson = PlainJson {
    provider: "worldline",
    event_id: (&["id"], "missing event `id`", "event `id` is not a string"),
    event_type: (&[&["type"]], "missing event `type`"),
    object_id: &[
        &["refund", "id"],
        &["payment", "id"],
        &["payout", "id"],
        &["token", "id"],
    ],
    occurred_at: Some(&["created"]),
    delivery_id: None,
    tenant: Some(TenantField {
        option: "merchant_id",
        path: &["merchantId"],
        absent_passes: false,
    }),
};

/// `keyid:secret`, split at the first colon.
fn split(secret: &Secret) -> Option<(&str, &str)> {
    secret.expose().split_once(':')
}

impl Provider for Worldline {
    fn name(&self) -> &'static str {
        "worldline"
    }

    fn options(&self) -> &'static [&'static str] {
        &["merchant_id"]
    }

    fn validate_tenant(&self, tenant: &TenantConfig) -> Result<(), String> {
        if tenant.secrets.iter().all(|s| split(s).is_some()) {
            Ok(())
        } else {
            Err("worldline secrets are written `keyid:secret`".into())
        }
    }

    /// Retry schedule UNCONFIRMED (no primary source read); 1 day assumed, with the
    /// dedup store's replay margin on top.
    fn retry_window_days(&self) -> u32 {
        1
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        _now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let key_id = sig::single_header(request, &KEY_ID)?
            .ok_or(ProviderError::MissingHeader("x-gcs-keyid"))?;
        SCHEME.verify_with(request, tenant, |s| {
            split(s).filter(|(kid, _)| *kid == key_id).map(|(_, k)| k)
        })?;
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
        let (kid, key) = split(&sig::secrets(tenant)?[0]).ok_or(ProviderError::NoSecret)?;
        let signature = SCHEME.signature(key, body);
        sig::json_headers(&[(&SIGNATURE, &signature), (&KEY_ID, kid)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::test_support::{tenant, verify_one};

    const BODY: &str = r#"{"apiVersion":"v1","created":"2024-01-01T10:00:00.000+0000","id":"34b8a607-1fce-4003-b3ae-a4d29e92b232","merchantId":"DemoMerchant","type":"payment.captured","payment":{"id":"3066019730_0","status":"CAPTURED"}}"#;

    #[test]
    fn key_id_selects_the_secret_and_the_body_is_signed() {
        let t = tenant("worldline", &["k1:secret-one", "k2:secret-two"]);
        let h = Worldline
            .sign(
                BODY.as_bytes(),
                &tenant("worldline", &["k2:secret-two"]),
                "",
                0,
            )
            .unwrap();
        let env = verify_one(&Worldline, &WebhookRequest::post(h.clone(), BODY), &t, 0).unwrap();
        assert_eq!(env.event_id, "34b8a607-1fce-4003-b3ae-a4d29e92b232");
        assert_eq!(env.event_type, "payment.captured");
        assert_eq!(env.object_id.as_deref(), Some("3066019730_0"));
        // The right secret under another key id is not tried.
        let wrong_kid = tenant("worldline", &["k1:secret-two"]);
        assert_eq!(
            verify_one(
                &Worldline,
                &WebhookRequest::post(h.clone(), BODY),
                &wrong_kid,
                0
            ),
            Err(ProviderError::NoSecret)
        );
        let tampered = WebhookRequest::post(h, BODY.replace("CAPTURED", "CAPTUREE"));
        assert_eq!(
            verify_one(&Worldline, &tampered, &t, 0),
            Err(ProviderError::SignatureMismatch)
        );
        assert!(Worldline
            .validate_tenant(&tenant("worldline", &["nokeyid"]))
            .is_err());
    }
}
