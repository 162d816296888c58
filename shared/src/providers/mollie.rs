//! Mollie next-gen webhooks: `X-Mollie-Signature: sha256=<hex>` = HMAC-SHA256(shared
//! secret as UTF-8, raw body). The `sha256=` prefix is optional (mollie-api-php
//! strips it when present). During secret rotation Mollie repeats the header, one
//! value per secret: every value is checked against every tenant secret. Nothing
//! time-related is signed.
//!
//! A request without the header is a classic thin webhook (`id=tr_…`, unsigned,
//! state must be fetched): not supported in this pass, so it is `MissingHeader`.
//!
//! The event id field is UNCONFIRMED in Mollie's docs: we dedup on the body's
//! top-level `id` (the event's own id in next-gen payloads), type `type`, occurred at
//! `createdAt`, and take the optional `entityId` as object id. The tenant is the
//! webhook URL (no payload check).

use std::borrow::Cow;

use http::HeaderName;

use super::sig::{self, Raw};
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Mollie;

const HEADER: &str = "x-mollie-signature";
static SIGNATURE: HeaderName = HeaderName::from_static(HEADER);

fn extract(body: &[u8], tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    let [id, kind, created, entity] =
        sig::json_fields(body, [&["id"], &["type"], &["createdAt"], &["entityId"]])?;
    let id = id.ok_or_else(|| sig::payload_error("missing event `id`"))?;
    let id = id
        .str()
        .ok_or_else(|| sig::payload_error("event `id` is not a string"))?;
    sig::check_event_id(&id)?;
    let kind = kind.and_then(Raw::str).filter(|k| !k.is_empty());
    let kind = kind.ok_or_else(|| sig::payload_error("missing event `type`"))?;
    Ok(Envelope {
        provider: "mollie".into(),
        tenant: tenant.tenant.clone(),
        event_id: id.into_owned(),
        event_type: kind.into_owned(),
        object_id: entity.and_then(Raw::text).map(Cow::into_owned),
        object_version: None,
        occurred_at: created.and_then(Raw::time),
        delivery_id: None,
    })
}

impl Provider for Mollie {
    fn name(&self) -> &'static str {
        "mollie"
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        _now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let secrets = sig::secrets(tenant)?;
        let candidates = sig::hex_signatures(request, &SIGNATURE, "sha256=", false)?;
        sig::verify_body_hmac_sha256(secrets, &candidates, &request.body)?;
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
        let key = sig::secrets(tenant)?[0].expose();
        let mut h = http::HeaderMap::new();
        let mac = hex::encode(sig::hmac_sha256(key.as_bytes(), &[body]));
        sig::put(&mut h, &SIGNATURE, &format!("sha256={mac}"))?;
        sig::put(&mut h, &http::header::CONTENT_TYPE, "application/json")?;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use http::{HeaderMap, HeaderValue};

    const BODY: &str = r#"{"resource":"event","id":"event_GvJ8WHrp5isUdRub9CJyH","type":"payment-link.paid","entityId":"pl_qng5gbbv8NAZ5gpM5ZYgx","createdAt":"2024-12-16T15:57:04.0Z","_embedded":{"entity":{"id":"pl_qng5gbbv8NAZ5gpM5ZYgx","resource":"payment-link"}},"_links":{"self":{"href":"x"}}}"#;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        TenantConfig {
            provider: "mollie".into(),
            tenant: "acme".into(),
            secrets: secrets.iter().map(|s| Secret::new(*s)).collect(),
            tolerance_secs: 300,
            options: Default::default(),
        }
    }

    fn sig_for(secret: &str, body: &str) -> String {
        let mac = sig::hmac_sha256(secret.as_bytes(), &[body.as_bytes()]);
        format!("sha256={}", hex::encode(mac))
    }

    fn req(sigs: &[&str], body: &str) -> WebhookRequest {
        let mut h = HeaderMap::new();
        for v in sigs {
            h.append(HEADER, HeaderValue::from_str(v).unwrap());
        }
        WebhookRequest::post(h, body.to_owned())
    }

    fn verify(r: &WebhookRequest, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        let mut v = Mollie.verify_and_extract(r, t, 0)?;
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].body, r.body);
        Ok(v.remove(0).envelope)
    }

    #[test]
    fn independent_hmac_vector() {
        // No published Mollie vector; the scheme equals GitHub's, so V2 (Octokit) applies.
        let v2 = "sha256=4864d2759938a15468b5df9ade20bf161da9b4f737ea61794142f3484236bda3";
        assert_eq!(sig_for("mysecret", r#"{"foo":"bar"}"#), v2);
        let r = req(&[v2], r#"{"foo":"bar"}"#);
        assert_eq!(
            verify(&r, &tenant(&["mysecret"])),
            Err(sig::payload_error("missing event `id`"))
        );
        // The prefix is optional, as in mollie-api-php.
        let r = req(&[&v2["sha256=".len()..]], r#"{"foo":"bar"}"#);
        assert!(matches!(
            verify(&r, &tenant(&["mysecret"])),
            Err(ProviderError::MalformedPayload(_))
        ));
    }

    #[test]
    fn extracts_envelope() {
        let env = verify(&req(&[&sig_for("s", BODY)], BODY), &tenant(&["s"])).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "mollie".into(),
                tenant: "acme".into(),
                event_id: "event_GvJ8WHrp5isUdRub9CJyH".into(),
                event_type: "payment-link.paid".into(),
                object_id: Some("pl_qng5gbbv8NAZ5gpM5ZYgx".into()),
                object_version: None,
                occurred_at: Some(1_734_364_624),
                delivery_id: None,
            }
        );
    }

    #[test]
    fn rotation_repeated_header_and_secrets() {
        let (old, new) = (sig_for("old", BODY), sig_for("new", BODY));
        // Mollie sends one header per secret during rotation; either may come first.
        for order in [[&old, &new], [&new, &old]] {
            let r = req(&[order[0], order[1]], BODY);
            assert!(verify(&r, &tenant(&["old"])).is_ok());
            assert!(verify(&r, &tenant(&["new"])).is_ok());
            assert_eq!(
                verify(&r, &tenant(&["x"])),
                Err(ProviderError::SignatureMismatch)
            );
        }
        // API Gateway v2 comma-joins the repeats.
        let joined = req(&[&format!("{old},{new}")], BODY);
        assert!(verify(&joined, &tenant(&["new"])).is_ok());
        let both = tenant(&["new", "old"]);
        assert!(verify(&req(&[&old], BODY), &both).is_ok());
        assert!(verify(&req(&[&new], BODY), &both).is_ok());
    }

    #[test]
    fn tampered_body_and_wrong_secret() {
        let s = sig_for("s", BODY);
        let tampered = BODY.replace("paid", "open");
        assert_eq!(
            verify(&req(&[&s], &tampered), &tenant(&["s"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(&req(&[&s], BODY), &tenant(&["other"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn classic_thin_webhook_is_missing_header() {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        let r = WebhookRequest::post(h, "id=tr_5B8cwPMGnU6qLbRvo7qEZo");
        assert_eq!(
            verify(&r, &tenant(&["s"])),
            Err(ProviderError::MissingHeader(HEADER))
        );
    }

    #[test]
    fn garbled_and_duplicated_headers() {
        let t = tenant(&["s"]);
        let good = sig_for("s", BODY);
        for (h, why) in [
            ("", "empty value"),
            ("sha256=", "empty value"),
            ("sha256=xyz", "signature is not valid hex"),
            ("sha1=00", "signature is not valid hex"),
        ] {
            assert_eq!(
                verify(&req(&[h], BODY), &t),
                Err(ProviderError::MalformedHeader(HEADER, why)),
                "{h}"
            );
        }
        // One garbled value among good ones is still refused: no guessing.
        assert_eq!(
            verify(&req(&[&good, "sha256=zz"], BODY), &t),
            Err(ProviderError::MalformedHeader(
                HEADER,
                "signature is not valid hex"
            ))
        );
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_bytes(b"sha256=\xff").unwrap());
        assert_eq!(
            verify(&WebhookRequest::post(h, BODY), &t),
            Err(ProviderError::MalformedHeader(
                HEADER,
                "value is not visible ASCII"
            ))
        );
        assert!(verify(&req(&[&good, &good], BODY), &t).is_ok());
        assert!(verify(&req(&[&good.to_uppercase()], BODY), &t).is_ok());
        assert_eq!(
            verify(&req(&[&good], BODY), &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn authentic_but_malformed_payloads() {
        let t = tenant(&["s"]);
        let check = |body: &str, want: ProviderError| {
            let got = verify(&req(&[&sig_for("s", body)], body), &t);
            assert!(!want.is_authentication_failure());
            assert_eq!(got, Err(want), "{body}");
        };
        check(
            "id=tr_5B8cwPMGnU6qLbRvo7qEZo",
            sig::payload_error("body is not a JSON object"),
        );
        check(r#"{"type":"x"}"#, sig::payload_error("missing event `id`"));
        check(
            r#"{"id":{},"type":"x"}"#,
            sig::payload_error("event `id` is not a string"),
        );
        check(r#"{"id":"e"}"#, sig::payload_error("missing event `type`"));
        check(
            r#"{"id":"e","id":"f","type":"x"}"#,
            sig::payload_error("duplicate field `id`"),
        );
    }

    #[test]
    fn event_id_stable_across_retries_and_sign_round_trip() {
        let t = tenant(&["new", "old"]);
        let h = Mollie.sign(BODY.as_bytes(), &t, "", 0).unwrap();
        let r = WebhookRequest::post(h, BODY);
        let a = verify(&r, &t).unwrap();
        let b = Mollie.verify_and_extract(&r, &t, 86_400).unwrap();
        assert_eq!(a.key(), b[0].envelope.key());
        assert_eq!(
            verify(&r, &tenant(&["old"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            Mollie.sign(b"{}", &tenant(&[]), "", 0).unwrap_err(),
            ProviderError::NoSecret
        );
    }
}
