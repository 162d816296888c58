//! Lemon Squeezy: `X-Signature: <hex>` = HMAC-SHA256(signing secret as UTF-8, raw
//! body). Nothing time-related is signed.
//!
//! There is no event id, so the dedup id is the composite
//! `{event name}:{data.type}:{data.id}:{data.attributes.updated_at}`, which retries
//! repeat byte for byte. The event name is the signed body `meta.event_name`; the
//! unsigned `X-Event-Name` header is only a fallback when the body lacks it, and a
//! header that contradicts the body is refused (otherwise a replayed body with an
//! edited header would get a fresh dedup key). If the tenant option `store_id` is set,
//! `data.attributes.store_id` must equal it.

use std::borrow::Cow;

use http::HeaderName;

use super::json::{self, Raw};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct LemonSqueezy;

const HEADER: &str = "x-signature";
static SIGNATURE: HeaderName = HeaderName::from_static(HEADER);
static EVENT_NAME: HeaderName = HeaderName::from_static("x-event-name");

fn required<'a>(raw: Option<Raw<'a>>, what: &str) -> Result<Cow<'a, str>, ProviderError> {
    raw.and_then(Raw::text)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| sig::payload_error(format!("missing `{what}`")))
}

fn extract(request: &WebhookRequest, tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    let header_name = sig::single_header(request, &EVENT_NAME)?;
    let [meta_name, data_type, data_id, updated_at, store] = json::json_fields(
        &request.body,
        [
            &["meta", "event_name"],
            &["data", "type"],
            &["data", "id"],
            &["data", "attributes", "updated_at"],
            &["data", "attributes", "store_id"],
        ],
    )?;
    let body_name = meta_name.and_then(Raw::str).filter(|n| !n.is_empty());
    let name = match (body_name, header_name) {
        (Some(body), Some(header)) if body != header => {
            return Err(sig::payload_error(
                "X-Event-Name header contradicts meta.event_name",
            ))
        }
        (Some(body), _) => body,
        (None, Some(header)) => Cow::Borrowed(header),
        (None, None) => return Err(sig::payload_error("missing event name")),
    };
    let data_type = required(data_type, "data.type")?;
    let data_id = required(data_id, "data.id")?;
    let updated_at = required(updated_at, "data.attributes.updated_at")?;
    if let Some(want) = tenant.option("store_id") {
        if store.and_then(Raw::text).as_deref() != Some(want) {
            return Err(ProviderError::TenantMismatch("store_id"));
        }
    }
    let event_id = format!("{name}:{data_type}:{data_id}:{updated_at}");
    sig::check_event_id(&event_id)?;
    Ok(Envelope {
        provider: "lemonsqueezy".into(),
        tenant: tenant.tenant.clone(),
        event_id,
        event_type: name.into_owned(),
        object_id: Some(data_id.into_owned()),
        occurred_at: crate::time::parse_rfc3339(&updated_at),
        object_version: Some(updated_at.into_owned()),
        delivery_id: None,
    })
}

impl Provider for LemonSqueezy {
    fn name(&self) -> &'static str {
        "lemonsqueezy"
    }

    fn options(&self) -> &'static [&'static str] {
        &["store_id"]
    }

    /// 3 retries within about 3 minutes.
    fn retry_window_days(&self) -> u32 {
        1
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        _now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let secrets = sig::secrets(tenant)?;
        let candidates = sig::hex_signatures(request, &SIGNATURE, "", false)?;
        sig::verify_body_hmac_sha256(secrets, &candidates, &request.body)?;
        let envelope = extract(request, tenant)?;
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
        sig::put(&mut h, &SIGNATURE, &mac)?;
        // Lemon Squeezy sends the event name in a header too; mirror the body's.
        let name = json::json_fields(body, [&["meta", "event_name"]])
            .ok()
            .and_then(|[n]| n.and_then(Raw::str));
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            sig::put(&mut h, &EVENT_NAME, &name)?;
        }
        sig::put(&mut h, &http::header::CONTENT_TYPE, "application/json")?;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    const BODY: &str = r#"{"meta":{"event_name":"order_created","custom_data":{"tenant":"x"}},"data":{"type":"orders","id":"1","attributes":{"store_id":42,"status":"paid","created_at":"2021-08-17T09:45:53.000000Z","updated_at":"2021-08-17T09:45:53.000000Z"}}}"#;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        crate::providers::test_support::tenant("lemonsqueezy", secrets)
    }

    fn sig_for(secret: &str, body: &str) -> String {
        hex::encode(sig::hmac_sha256(secret.as_bytes(), &[body.as_bytes()]))
    }

    fn req(sigs: &[&str], event: Option<&str>, body: &str) -> WebhookRequest {
        let mut h = HeaderMap::new();
        for v in sigs {
            h.append(HEADER, HeaderValue::from_str(v).unwrap());
        }
        if let Some(e) = event {
            h.append("x-event-name", HeaderValue::from_str(e).unwrap());
        }
        WebhookRequest::post(h, body.to_owned())
    }

    fn signed(secret: &str, body: &str) -> WebhookRequest {
        req(&[&sig_for(secret, body)], Some("order_created"), body)
    }

    fn verify(r: &WebhookRequest, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        crate::providers::test_support::verify_one(&LemonSqueezy, r, t, 0)
    }

    #[test]
    fn independent_hmac_vector() {
        // No published vector; cross-check the scheme with the V1 HMAC (GitHub docs):
        // plain lowercase hex of HMAC-SHA256(secret, body), no prefix.
        let v1 = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(sig_for("It's a Secret to Everybody", "Hello, World!"), v1);
        let r = req(&[v1], None, "Hello, World!");
        assert_eq!(
            verify(&r, &tenant(&["It's a Secret to Everybody"])),
            Err(sig::payload_error("body is not a JSON object"))
        );
        // Either hex case is accepted.
        let r = req(&[&v1.to_uppercase()], None, "Hello, World!");
        assert!(matches!(
            verify(&r, &tenant(&["It's a Secret to Everybody"])),
            Err(ProviderError::MalformedPayload(_))
        ));
    }

    #[test]
    fn extracts_composite_envelope() {
        let env = verify(&signed("s", BODY), &tenant(&["s"])).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "lemonsqueezy".into(),
                tenant: "acme".into(),
                event_id: "order_created:orders:1:2021-08-17T09:45:53.000000Z".into(),
                event_type: "order_created".into(),
                object_id: Some("1".into()),
                object_version: Some("2021-08-17T09:45:53.000000Z".into()),
                occurred_at: Some(1_629_193_553),
                delivery_id: None,
            }
        );
    }

    #[test]
    fn event_name_header_is_fallback_only() {
        let t = tenant(&["s"]);
        let s = sig_for("s", BODY);
        // No header: the body's name is used.
        assert!(verify(&req(&[&s], None, BODY), &t).is_ok());
        // A header contradicting the signed body is refused.
        assert_eq!(
            verify(&req(&[&s], Some("order_refunded"), BODY), &t),
            Err(sig::payload_error(
                "X-Event-Name header contradicts meta.event_name"
            ))
        );
        // Body without meta.event_name: the header supplies it.
        let body = r#"{"data":{"type":"subscriptions","id":"7","attributes":{"updated_at":"2024-01-01T00:00:00Z"}}}"#;
        let s = sig_for("s", body);
        let env = verify(&req(&[&s], Some("subscription_updated"), body), &t).unwrap();
        assert_eq!(
            env.event_id,
            "subscription_updated:subscriptions:7:2024-01-01T00:00:00Z"
        );
        assert_eq!(
            verify(&req(&[&s], None, body), &t),
            Err(sig::payload_error("missing event name"))
        );
    }

    #[test]
    fn event_id_stable_across_retries_and_changes_with_updates() {
        let t = tenant(&["s"]);
        let a = verify(&signed("s", BODY), &t).unwrap();
        let b = verify(&signed("s", BODY), &t).unwrap();
        assert_eq!(a.key(), b.key());
        let updated = BODY.replace(
            r#""updated_at":"2021-08-17T09:45:53.000000Z""#,
            r#""updated_at":"2021-08-18T00:00:00.000000Z""#,
        );
        let c = verify(&signed("s", &updated), &t).unwrap();
        assert_ne!(a.key(), c.key());
    }

    #[test]
    fn tampered_body_and_wrong_secret() {
        let s = sig_for("s", BODY);
        let tampered = BODY.replace("paid", "void");
        assert_eq!(
            verify(&req(&[&s], None, &tampered), &tenant(&["s"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(&signed("s", BODY), &tenant(&["other"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn rotation_old_and_new_and_two_values() {
        let both = tenant(&["new", "old"]);
        assert!(verify(&signed("old", BODY), &both).is_ok());
        assert!(verify(&signed("new", BODY), &both).is_ok());
        let (old, new) = (sig_for("old", BODY), sig_for("new", BODY));
        assert!(verify(&req(&[&old, &new], None, BODY), &tenant(&["new"])).is_ok());
        let joined = format!("{new},{old}");
        assert!(verify(&req(&[&joined], None, BODY), &tenant(&["old"])).is_ok());
        assert_eq!(
            verify(&req(&[&old, &new], None, BODY), &tenant(&["x"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn missing_garbled_and_duplicated_headers() {
        let t = tenant(&["s"]);
        let good = sig_for("s", BODY);
        assert_eq!(
            verify(&req(&[], Some("order_created"), BODY), &t),
            Err(ProviderError::MissingHeader(HEADER))
        );
        for (h, why) in [
            ("", "empty value"),
            (" , ", "empty value"),
            ("zz", "signature is not valid hex"),
            ("sha256=00", "signature is not valid hex"),
        ] {
            assert_eq!(
                verify(&req(&[h], None, BODY), &t),
                Err(ProviderError::MalformedHeader(HEADER, why)),
                "{h}"
            );
        }
        assert_eq!(
            verify(&req(&["00"], None, BODY), &t),
            Err(ProviderError::SignatureMismatch)
        );
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_bytes(b"\xff").unwrap());
        assert_eq!(
            verify(&WebhookRequest::post(h, BODY), &t),
            Err(ProviderError::MalformedHeader(
                HEADER,
                "value is not visible ASCII"
            ))
        );
        assert!(verify(&req(&[&good, &good], None, BODY), &t).is_ok());
        // Two different event-name headers are ambiguous.
        let mut r = req(&[&good], Some("order_created"), BODY);
        r.headers
            .append("x-event-name", HeaderValue::from_static("order_refunded"));
        assert_eq!(
            verify(&r, &t),
            Err(ProviderError::MalformedHeader(
                "x-event-name",
                "repeated with different values"
            ))
        );
        assert_eq!(
            verify(&signed("s", BODY), &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn authentic_but_malformed_payloads() {
        let t = tenant(&["s"]);
        let check = |body: &str, want: ProviderError| {
            let got = verify(&req(&[&sig_for("s", body)], None, body), &t);
            assert!(!want.is_authentication_failure());
            assert_eq!(got, Err(want), "{body}");
        };
        check("null", sig::payload_error("body is not a JSON object"));
        check(
            r#"{"meta":{"event_name":"x"},"data":{"id":"1","attributes":{"updated_at":"u"}}}"#,
            sig::payload_error("missing `data.type`"),
        );
        check(
            r#"{"meta":{"event_name":"x"},"data":{"type":"t","attributes":{"updated_at":"u"}}}"#,
            sig::payload_error("missing `data.id`"),
        );
        check(
            r#"{"meta":{"event_name":"x"},"data":{"type":"t","id":"1","attributes":{}}}"#,
            sig::payload_error("missing `data.attributes.updated_at`"),
        );
        let long = format!(
            r#"{{"meta":{{"event_name":"x"}},"data":{{"type":"t","id":"{}","attributes":{{"updated_at":"u"}}}}}}"#,
            "9".repeat(300)
        );
        check(
            &long,
            sig::payload_error("event id is longer than 256 bytes"),
        );
    }

    #[test]
    fn store_id_must_match_tenant_option() {
        let mut t = tenant(&["s"]);
        t.options.insert("store_id".into(), "42".into());
        assert!(verify(&signed("s", BODY), &t).is_ok());
        t.options.insert("store_id".into(), "43".into());
        assert_eq!(
            verify(&signed("s", BODY), &t),
            Err(ProviderError::TenantMismatch("store_id"))
        );
    }

    #[test]
    fn sign_round_trip_uses_first_secret() {
        let t = tenant(&["new", "old"]);
        let h = LemonSqueezy.sign(BODY.as_bytes(), &t, "", 0).unwrap();
        assert_eq!(h["x-event-name"], "order_created");
        let r = WebhookRequest::post(h, BODY);
        assert_eq!(verify(&r, &t).unwrap().event_type, "order_created");
        assert_eq!(
            verify(&r, &tenant(&["old"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            LemonSqueezy.sign(b"{}", &tenant(&[]), "", 0).unwrap_err(),
            ProviderError::NoSecret
        );
    }
}
