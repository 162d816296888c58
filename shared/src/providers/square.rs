//! Square: `x-square-hmacsha256-signature: <base64>` = HMAC-SHA256(signature key as
//! UTF-8, `notification_url + raw body`).
//!
//! The notification URL must be byte-identical to the one configured in the Square
//! subscription (not what API Gateway sees), so it comes from the tenant option
//! `notification_url`. Without it the tenant is not verifiable: that configuration
//! error is reported as [`ProviderError::NoSecret`] (the URL is part of the key
//! material here). The legacy SHA-1 `x-square-signature` is never accepted
//! (downgrade protection). Nothing time-related is signed. Dedup on body `event_id`;
//! if the tenant option `merchant_id` is set, the body `merchant_id` must equal it.

use http::HeaderName;

use super::plain_json::{PlainJson, TenantField};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Square;

const HEADER: &str = "x-square-hmacsha256-signature";
static SIGNATURE: HeaderName = HeaderName::from_static(HEADER);

/// The tenant option holding the subscription's exact notification URL.
pub const URL_OPTION: &str = "notification_url";

fn notification_url(tenant: &TenantConfig) -> Result<&str, ProviderError> {
    tenant
        .option(URL_OPTION)
        .filter(|u| !u.is_empty())
        .ok_or(ProviderError::NoSecret)
}

fn candidates(request: &WebhookRequest) -> Result<Vec<Vec<u8>>, ProviderError> {
    let mut out = Vec::with_capacity(1);
    let mut present = false;
    for value in sig::header_values(request, &SIGNATURE) {
        present = true;
        // API Gateway comma-joins repeats; base64 never contains a comma.
        for part in value?.split(',').map(str::trim) {
            if part.is_empty() {
                return Err(ProviderError::MalformedHeader(HEADER, "empty value"));
            }
            out.push(sig::decode_base64(HEADER, part)?);
        }
    }
    if !present {
        return Err(ProviderError::MissingHeader(HEADER));
    }
    Ok(out)
}

static ENVELOPE: PlainJson = PlainJson {
    provider: "square",
    event_id: (
        &["event_id"],
        "missing `event_id`",
        "`event_id` is not a string",
    ),
    event_type: (&[&["type"]], "missing event `type`"),
    object_id: &[&["data", "id"]],
    occurred_at: Some(&["created_at"]),
    delivery_id: None,
    tenant: Some(TenantField {
        option: "merchant_id",
        path: &["merchant_id"],
        absent_passes: false,
    }),
};

fn extract(body: &[u8], tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    ENVELOPE.extract(body, tenant)
}

impl Provider for Square {
    fn name(&self) -> &'static str {
        "square"
    }

    fn options(&self) -> &'static [&'static str] {
        &["notification_url", "merchant_id"]
    }

    /// Up to 72 h (one page of the docs says 24 h).
    fn retry_window_days(&self) -> u32 {
        3
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        _now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let secrets = sig::secrets(tenant)?;
        let url = notification_url(tenant)?;
        let candidates = candidates(request)?;
        let body = &request.body[..];
        sig::verify_any(secrets, &candidates, |s| {
            Some(sig::hmac_sha256(
                s.expose().as_bytes(),
                &[url.as_bytes(), body],
            ))
        })?;
        let envelope = extract(body, tenant)?;
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
        let url = notification_url(tenant)?;
        let mac = sig::hmac_sha256(key.as_bytes(), &[url.as_bytes(), body]);
        sig::json_headers(&[(&SIGNATURE, &base64::Engine::encode(&sig::B64, mac))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use http::{HeaderMap, HeaderValue};

    const V9_KEY: &str = "Ibxx_5AKakO-3qeNVR61Dw";
    const V9_URL: &str = "https://webhook.site/679a4f3a-dcfa-49ee-bac5-9d0edad886b9";
    const V9_BODY: &str = r#"{"merchant_id":"MLEFBHHSJGVHD","type":"webhooks.test_notification","event_id":"ac3ac95b-f97d-458c-a6e6-18981597e05f","created_at":"2022-07-13T20:30:59.037339943Z","data":{"type":"webhooks","id":"bc368e64-01aa-407e-b46e-3231809b1129"}}"#;
    const V9_SIG: &str = "GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4=";
    const V9B_BODY: &str = r#"{"data":{"type":"webhooks","id":">id<"}}"#;
    const V9B_SIG: &str = "Cxt7+aTi4rKgcA0bC4g9EHdVtLSDWdqccmL5MvihU4U=";
    const URL: &str = "https://hooks.example.com/webhooks/square/acme";

    fn tenant_at(url: &str, secrets: &[&str]) -> TenantConfig {
        TenantConfig {
            provider: "square".into(),
            tenant: "acme".into(),
            secrets: secrets.iter().map(|s| Secret::new(*s)).collect(),
            tolerance_secs: 300,
            options: [(URL_OPTION.to_owned(), url.to_owned())].into(),
        }
    }

    fn tenant(secrets: &[&str]) -> TenantConfig {
        tenant_at(URL, secrets)
    }

    fn req(headers: &[&str], body: &str) -> WebhookRequest {
        let mut h = HeaderMap::new();
        for v in headers {
            h.append(HEADER, HeaderValue::from_str(v).unwrap());
        }
        WebhookRequest::post(h, body.to_owned())
    }

    fn sig_for(key: &str, url: &str, body: &str) -> String {
        let mac = sig::hmac_sha256(key.as_bytes(), &[url.as_bytes(), body.as_bytes()]);
        base64::Engine::encode(&sig::B64, mac)
    }

    fn event(id: &str) -> String {
        format!(
            r#"{{"merchant_id":"M1","type":"payment.updated","event_id":"{id}","created_at":"2024-01-01T00:00:00Z","data":{{"type":"payment","id":"pay_1","object":{{"payment":{{"id":"pay_1"}}}}}}}}"#
        )
    }

    fn verify(r: &WebhookRequest, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        crate::providers::test_support::verify_one(&Square, r, t, 0)
    }

    #[test]
    fn v9_first_vector_verifies_and_extracts() {
        assert_eq!(sig_for(V9_KEY, V9_URL, V9_BODY), V9_SIG);
        let t = tenant_at(V9_URL, &[V9_KEY]);
        let env = verify(&req(&[V9_SIG], V9_BODY), &t).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "square".into(),
                tenant: "acme".into(),
                event_id: "ac3ac95b-f97d-458c-a6e6-18981597e05f".into(),
                event_type: "webhooks.test_notification".into(),
                object_id: Some("bc368e64-01aa-407e-b46e-3231809b1129".into()),
                object_version: None,
                occurred_at: Some(1_657_744_259),
                delivery_id: None,
            }
        );
        let h = Square.sign(V9_BODY.as_bytes(), &t, "", 0).unwrap();
        assert_eq!(h[HEADER], V9_SIG);
    }

    #[test]
    fn v9_second_vector_verifies_but_has_no_event_id() {
        assert_eq!(
            sig_for("signature-key", "https://webhook.site/webhooks", V9B_BODY),
            V9B_SIG
        );
        let t = tenant_at("https://webhook.site/webhooks", &["signature-key"]);
        assert_eq!(
            verify(&req(&[V9B_SIG], V9B_BODY), &t),
            Err(sig::payload_error("missing `event_id`"))
        );
    }

    #[test]
    fn v9_negative_url_and_key() {
        let wrong_url = tenant_at(
            "https://webhook.site/79a4f3a-dcfa-49ee-bac5-9d0edad886b9",
            &[V9_KEY],
        );
        let wrong_key = tenant_at(V9_URL, &["MCmhFRxGX82xMwg5FsaoQA"]);
        let r = req(&[V9_SIG], V9_BODY);
        assert_eq!(
            verify(&r, &wrong_url),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(&r, &wrong_key),
            Err(ProviderError::SignatureMismatch)
        );
        // A trailing slash is a different URL.
        let slash = tenant_at(&format!("{V9_URL}/"), &[V9_KEY]);
        assert_eq!(verify(&r, &slash), Err(ProviderError::SignatureMismatch));
    }

    #[test]
    fn missing_notification_url_is_a_configuration_error() {
        let mut t = tenant(&["k"]);
        t.options.clear();
        let body = event("e1");
        let r = req(&[&sig_for("k", "", &body)], &body);
        assert_eq!(verify(&r, &t), Err(ProviderError::NoSecret));
        assert_eq!(
            Square.sign(body.as_bytes(), &t, "", 0).unwrap_err(),
            ProviderError::NoSecret
        );
        t.options.insert(URL_OPTION.into(), String::new());
        assert_eq!(verify(&r, &t), Err(ProviderError::NoSecret));
    }

    #[test]
    fn tampered_body_and_wrong_secret() {
        let body = event("e1");
        let s = sig_for("k", URL, &body);
        assert_eq!(
            verify(
                &req(&[&s], &body.replace("pay_1", "pay_2")),
                &tenant(&["k"])
            ),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(&req(&[&s], &body), &tenant(&["other"])),
            Err(ProviderError::SignatureMismatch)
        );
        // The legacy SHA-1 header alone is never enough.
        let mut h = HeaderMap::new();
        let sha1 = sig::hmac_sha1(b"k", &[URL.as_bytes(), body.as_bytes()]);
        let sha1 = base64::Engine::encode(&sig::B64, sha1);
        h.insert("x-square-signature", HeaderValue::from_str(&sha1).unwrap());
        assert_eq!(
            verify(&WebhookRequest::post(h, body), &tenant(&["k"])),
            Err(ProviderError::MissingHeader(HEADER))
        );
    }

    #[test]
    fn rotation_old_and_new_and_two_header_values() {
        let body = event("e1");
        let both = tenant(&["new", "old"]);
        let old = sig_for("old", URL, &body);
        let new = sig_for("new", URL, &body);
        assert!(verify(&req(&[&old], &body), &both).is_ok());
        assert!(verify(&req(&[&new], &body), &both).is_ok());
        assert!(verify(&req(&[&old, &new], &body), &tenant(&["new"])).is_ok());
        let joined = format!("{new}, {old}");
        assert!(verify(&req(&[&joined], &body), &tenant(&["old"])).is_ok());
        assert_eq!(
            verify(&req(&[&old, &new], &body), &tenant(&["x"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn missing_and_garbled_headers() {
        let t = tenant(&["k"]);
        let body = event("e1");
        let good = sig_for("k", URL, &body);
        assert_eq!(
            verify(&req(&[], &body), &t),
            Err(ProviderError::MissingHeader(HEADER))
        );
        for (h, why) in [
            ("", "empty value"),
            (",", "empty value"),
            ("not base64!", "signature is not valid base64"),
            ("AQJ=", "signature is not valid base64"),
        ] {
            assert_eq!(
                verify(&req(&[h], &body), &t),
                Err(ProviderError::MalformedHeader(HEADER, why)),
                "{h}"
            );
        }
        assert_eq!(
            verify(&req(&[&good, "%%%"], &body), &t),
            Err(ProviderError::MalformedHeader(
                HEADER,
                "signature is not valid base64"
            ))
        );
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_bytes(b"\xffab").unwrap());
        assert_eq!(
            verify(&WebhookRequest::post(h, body.clone()), &t),
            Err(ProviderError::MalformedHeader(
                HEADER,
                "value is not visible ASCII"
            ))
        );
        // Short or long decoded values simply do not match.
        assert_eq!(
            verify(&req(&["AAAA"], &body), &t),
            Err(ProviderError::SignatureMismatch)
        );
        assert!(verify(&req(&[&good, &good], &body), &t).is_ok());
        assert_eq!(
            verify(&req(&[&good], &body), &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn authentic_but_malformed_payloads() {
        let t = tenant(&["k"]);
        let check = |body: &str, want: ProviderError| {
            let got = verify(&req(&[&sig_for("k", URL, body)], body), &t);
            assert!(!want.is_authentication_failure());
            assert_eq!(got, Err(want), "{body}");
        };
        check("", sig::payload_error("body is not a JSON object"));
        check(r#"{"type":"x"}"#, sig::payload_error("missing `event_id`"));
        check(
            r#"{"event_id":["a"],"type":"x"}"#,
            sig::payload_error("`event_id` is not a string"),
        );
        check(
            r#"{"event_id":"a\u0000","type":"x"}"#,
            sig::payload_error("event id contains control or format characters"),
        );
        check(
            r#"{"event_id":"a"}"#,
            sig::payload_error("missing event `type`"),
        );
    }

    #[test]
    fn merchant_id_must_match_tenant_option() {
        let mut t = tenant(&["k"]);
        let body = event("e1");
        let r = req(&[&sig_for("k", URL, &body)], &body);
        assert!(verify(&r, &t).is_ok());
        t.options.insert("merchant_id".into(), "M1".into());
        assert!(verify(&r, &t).is_ok());
        t.options.insert("merchant_id".into(), "M2".into());
        assert_eq!(
            verify(&r, &t),
            Err(ProviderError::TenantMismatch("merchant_id"))
        );
        // An event without merchant_id cannot prove it belongs to M2.
        let body = r#"{"type":"x","event_id":"e"}"#;
        let r = req(&[&sig_for("k", URL, body)], body);
        assert_eq!(
            verify(&r, &t),
            Err(ProviderError::TenantMismatch("merchant_id"))
        );
    }

    #[test]
    fn event_id_stable_across_retries_and_sign_round_trip() {
        let t = tenant(&["new", "old"]);
        let body = event("evt-42");
        let h = Square.sign(body.as_bytes(), &t, "", 0).unwrap();
        let first = verify(&WebhookRequest::post(h.clone(), body.clone()), &t).unwrap();
        // A retry carries the same bytes; verification does not depend on the clock.
        let retry =
            Square.verify_and_extract(&WebhookRequest::post(h.clone(), body.clone()), &t, 999_999);
        assert_eq!(retry.unwrap()[0].envelope.event_id, first.event_id);
        assert_eq!(first.event_id, "evt-42");
        assert_eq!(first.occurred_at, Some(1_704_067_200));
        assert_eq!(
            verify(&WebhookRequest::post(h, body), &tenant(&["old"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            Square.sign(b"{}", &tenant(&[]), "", 0).unwrap_err(),
            ProviderError::NoSecret
        );
    }
}
