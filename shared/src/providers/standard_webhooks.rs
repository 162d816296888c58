//! Standard Webhooks (and Svix): `webhook-signature: v1,<b64> [v1,<b64> …]` =
//! HMAC-SHA256(base64-decoded key after `whsec_`, `"{id}.{timestamp}.{raw body}"`),
//! with `webhook-id` / `webhook-timestamp` (or the `svix-*` names). Window ±tolerance.

use std::borrow::Cow;

use base64::Engine as _;
use http::HeaderName;

use super::json::{self, Raw};
use super::sig::{self, header_names};
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::{Secret, TenantConfig};
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct StandardWebhooks;

// Each header under its Standard Webhooks name and its Svix name.
static ID: [HeaderName; 2] = header_names!("webhook-id", "svix-id");
static TIMESTAMP: [HeaderName; 2] = header_names!("webhook-timestamp", "svix-timestamp");
static SIGNATURE: [HeaderName; 2] = header_names!("webhook-signature", "svix-signature");

/// The key bytes: base64 after an optional `whsec_` prefix. A secret that does not
/// decode cannot produce a valid signature, so it is skipped (`None`).
fn key(secret: &Secret) -> Option<Vec<u8>> {
    let s = secret.expose().trim();
    sig::B64
        .decode(s.strip_prefix("whsec_").unwrap_or(s))
        .ok()
        .filter(|k| !k.is_empty())
}

/// Every `v1` signature of the first signature header present (Standard or Svix name).
fn candidates(request: &WebhookRequest) -> Result<Vec<Vec<u8>>, ProviderError> {
    let header = match SIGNATURE.iter().find(|n| request.headers.contains_key(*n)) {
        Some(n) => n,
        None => return Err(ProviderError::MissingHeader(SIGNATURE[0].as_str())),
    };
    sig::standard_v1_signatures(request, header)
}

fn required<'a>(
    request: &'a WebhookRequest,
    names: &'static [HeaderName; 2],
) -> Result<&'a str, ProviderError> {
    sig::single_header_of(request, names)?.ok_or(ProviderError::MissingHeader(names[0].as_str()))
}

impl Provider for StandardWebhooks {
    fn name(&self) -> &'static str {
        "standard-webhooks"
    }

    fn options(&self) -> &'static [&'static str] {
        &[]
    }

    /// The Svix schedule spans about 28 h.
    fn retry_window_days(&self) -> u32 {
        2
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let secrets = sig::secrets(tenant)?;
        let id = required(request, &ID)?;
        let ts = sig::parse_unix(TIMESTAMP[0].as_str(), required(request, &TIMESTAMP)?)?;
        let candidates = candidates(request)?;
        let body = &request.body[..];
        sig::verify_standard(
            secrets,
            &candidates,
            (id, ts),
            (now_secs, tenant.tolerance_secs),
            body,
            |s| key(s).map(Cow::Owned),
        )?;

        sig::check_event_id(id)?;
        let [kind, timestamp, object_id] =
            json::json_fields(body, [&["type"], &["timestamp"], &["data", "id"]])?;
        let envelope = Envelope {
            provider: "standard-webhooks".into(),
            tenant: tenant.tenant.clone(),
            event_id: id.to_owned(),
            event_type: kind
                .and_then(Raw::str)
                .filter(|k| !k.is_empty())
                .map_or_else(|| "unknown".to_owned(), Cow::into_owned),
            object_id: object_id.and_then(Raw::text).map(Cow::into_owned),
            object_version: None,
            occurred_at: timestamp.and_then(Raw::time).or(Some(ts)),
            delivery_id: None,
        };
        Ok(VerifiedEvent::whole(envelope, request))
    }

    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let key = key(&sig::secrets(tenant)?[0]).ok_or(ProviderError::NoSecret)?;
        let (ts, signature) = sig::sign_standard(&key, event_id, body, now_secs);
        sig::json_headers(&[
            (&ID[0], event_id),
            (&TIMESTAMP[0], &ts),
            (&SIGNATURE[0], &signature),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    const V3_KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const V3_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const V3_TS: i64 = 1_614_265_330;
    const V3_BODY: &str = r#"{"test": 2432232314}"#;
    const V3_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
    const OTHER_KEY: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const BODY: &str = r#"{"type":"invoice.paid","timestamp":"2022-11-03T20:26:10.344522Z","data":{"id":"inv_1","type":"nested"}}"#;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        crate::providers::test_support::tenant("standard-webhooks", secrets)
    }

    fn sign_with(secret: &str, id: &str, ts: i64, body: &str) -> String {
        let h = StandardWebhooks
            .sign(body.as_bytes(), &tenant(&[secret]), id, ts)
            .unwrap();
        h["webhook-signature"].to_str().unwrap().to_owned()
    }

    fn headers(id: &str, ts: &str, sigs: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("webhook-id", HeaderValue::from_str(id).unwrap());
        h.insert("webhook-timestamp", HeaderValue::from_str(ts).unwrap());
        for s in sigs {
            h.append("webhook-signature", HeaderValue::from_str(s).unwrap());
        }
        h
    }

    fn verify_at(
        h: HeaderMap,
        body: &str,
        t: &TenantConfig,
        now: i64,
    ) -> Result<Envelope, ProviderError> {
        let r = WebhookRequest::post(h, body.to_owned());
        crate::providers::test_support::verify_one(&StandardWebhooks, &r, t, now)
    }

    fn verify(h: HeaderMap, body: &str, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        verify_at(h, body, t, V3_TS)
    }

    fn good(secret: &str, body: &str) -> HeaderMap {
        headers(
            V3_ID,
            &V3_TS.to_string(),
            &[&sign_with(secret, V3_ID, V3_TS, body)],
        )
    }

    #[test]
    fn v3_vector() {
        assert_eq!(sign_with(V3_KEY, V3_ID, V3_TS, V3_BODY), V3_SIG);
        let env = verify(
            headers(V3_ID, "1614265330", &[V3_SIG]),
            V3_BODY,
            &tenant(&[V3_KEY]),
        )
        .unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "standard-webhooks".into(),
                tenant: "acme".into(),
                event_id: V3_ID.into(),
                event_type: "unknown".into(),
                object_id: None,
                object_version: None,
                occurred_at: Some(V3_TS),
                delivery_id: None,
            }
        );
        // The space after the colon is part of the signed bytes.
        let squashed = V3_BODY.replace(": ", ":");
        assert_eq!(
            verify(
                headers(V3_ID, "1614265330", &[V3_SIG]),
                &squashed,
                &tenant(&[V3_KEY])
            ),
            Err(ProviderError::SignatureMismatch)
        );
        // Key without the prefix works; the prefixed string as raw bytes (Stripe style) does not.
        assert!(verify(
            headers(V3_ID, "1614265330", &[V3_SIG]),
            V3_BODY,
            &tenant(&["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])
        )
        .is_ok());
    }

    #[test]
    fn svix_header_names() {
        let mut h = HeaderMap::new();
        h.insert("svix-id", HeaderValue::from_static(V3_ID));
        h.insert("svix-timestamp", HeaderValue::from_static("1614265330"));
        h.insert("svix-signature", HeaderValue::from_static(V3_SIG));
        assert_eq!(
            verify(h, V3_BODY, &tenant(&[V3_KEY])).unwrap().event_id,
            V3_ID
        );
    }

    #[test]
    fn extracts_envelope() {
        let env = verify(good(V3_KEY, BODY), BODY, &tenant(&[V3_KEY])).unwrap();
        assert_eq!(env.event_type, "invoice.paid");
        assert_eq!(env.object_id.as_deref(), Some("inv_1"));
        assert_eq!(env.occurred_at, Some(1_667_507_170));
    }

    #[test]
    fn spec_example_multi_signature_skips_v1a() {
        let mut h = headers("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", "1674087231", &["v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4= v1a,hnO3f9T8Ytu9HwrXslvumlUpqtNVqkhqw/enGzPCXe5BdqzCInXqYXFymVJaA7AZdpXwVLPo3mNl8EM+m7TBAg=="]);
        let r = WebhookRequest::post(h.clone(), "{}");
        let c = candidates(&r).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].len(), 32);
        // Only v1a: nothing we can check.
        h.insert(
            "webhook-signature",
            HeaderValue::from_static("v1a,hnO3f9T8 v2,abc"),
        );
        let r = WebhookRequest::post(h, "{}");
        assert_eq!(
            candidates(&r),
            Err(ProviderError::MalformedHeader(
                "webhook-signature",
                "no v1 signature"
            ))
        );
    }

    #[test]
    fn tampered_body_wrong_secret_and_signed_id() {
        let h = good(V3_KEY, BODY);
        assert_eq!(
            verify(
                h.clone(),
                &BODY.replace("inv_1", "inv_2"),
                &tenant(&[V3_KEY])
            ),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(h.clone(), BODY, &tenant(&[OTHER_KEY])),
            Err(ProviderError::SignatureMismatch)
        );
        let mut other_id = h;
        other_id.insert("webhook-id", HeaderValue::from_static("msg_other"));
        assert_eq!(
            verify(other_id, BODY, &tenant(&[V3_KEY])),
            Err(ProviderError::SignatureMismatch)
        );
        // A secret that is not base64 is unusable, not a panic.
        assert_eq!(
            verify(good(V3_KEY, BODY), BODY, &tenant(&["whsec_!!!"])),
            Err(ProviderError::NoSecret)
        );
        assert_eq!(
            verify(good(V3_KEY, BODY), BODY, &tenant(&["whsec_!!!", V3_KEY])).map(|e| e.event_id),
            Ok(V3_ID.into())
        );
    }

    #[test]
    fn rotation() {
        let both = tenant(&[OTHER_KEY, V3_KEY]);
        let old = sign_with(V3_KEY, V3_ID, V3_TS, BODY);
        let new = sign_with(OTHER_KEY, V3_ID, V3_TS, BODY);
        let ts = V3_TS.to_string();
        assert!(verify(headers(V3_ID, &ts, &[&old]), BODY, &both).is_ok());
        assert!(verify(headers(V3_ID, &ts, &[&new]), BODY, &both).is_ok());
        let two = format!("{new} {old}");
        assert!(verify(headers(V3_ID, &ts, &[&two]), BODY, &tenant(&[V3_KEY])).is_ok());
        assert!(verify(headers(V3_ID, &ts, &[&two]), BODY, &tenant(&[OTHER_KEY])).is_ok());
        // Repeated header values, separate and comma-joined by API Gateway.
        assert!(verify(headers(V3_ID, &ts, &[&new, &old]), BODY, &tenant(&[V3_KEY])).is_ok());
        assert!(verify(
            headers(V3_ID, &ts, &[&format!("{new},{old}")]),
            BODY,
            &tenant(&[V3_KEY])
        )
        .is_ok());
        let forged = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        assert_eq!(
            verify(headers(V3_ID, &ts, &[forged]), BODY, &both),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn timestamp_tolerance_both_directions() {
        let t = tenant(&[V3_KEY]);
        for (now, ok) in [
            (V3_TS + 300, true),
            (V3_TS - 300, true),
            (V3_TS + 301, false),
            (V3_TS - 301, false),
        ] {
            let got = verify_at(good(V3_KEY, BODY), BODY, &t, now);
            if ok {
                assert!(got.is_ok(), "{now}");
            } else {
                assert_eq!(got, Err(ProviderError::TimestampOutOfTolerance), "{now}");
            }
        }
    }

    #[test]
    fn missing_and_garbled_headers() {
        let t = tenant(&[V3_KEY]);
        let ts = V3_TS.to_string();
        let mut h = good(V3_KEY, BODY);
        h.remove("webhook-signature");
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::MissingHeader("webhook-signature"))
        );
        let mut h = good(V3_KEY, BODY);
        h.insert(
            "webhook-signature",
            HeaderValue::from_bytes(b"v1,\xff").unwrap(),
        );
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::MalformedHeader(
                "webhook-signature",
                "value is not visible ASCII"
            ))
        );
        let mut h = good(V3_KEY, BODY);
        h.remove("webhook-id");
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::MissingHeader("webhook-id"))
        );
        let mut h = good(V3_KEY, BODY);
        h.remove("webhook-timestamp");
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::MissingHeader("webhook-timestamp"))
        );
        let name = "webhook-signature";
        for (v, why) in [
            ("", "empty value"),
            ("v1", "expected v1,<base64> entries"),
            ("v1,AAAA,v1", "expected v1,<base64> entries"),
            ("v1,%%%", "signature is not valid base64"),
            ("v2,abc", "no v1 signature"),
        ] {
            assert_eq!(
                verify(headers(V3_ID, &ts, &[v]), BODY, &t),
                Err(ProviderError::MalformedHeader(name, why)),
                "{v}"
            );
        }
        let sig = sign_with(V3_KEY, V3_ID, V3_TS, BODY);
        let bad_ts = || {
            ProviderError::MalformedHeader(
                "webhook-timestamp",
                "timestamp is not a Unix time in seconds",
            )
        };
        assert_eq!(
            verify(headers(V3_ID, "abc", &[&sig]), BODY, &t),
            Err(bad_ts())
        );
        assert_eq!(
            verify(headers(V3_ID, "1614265330.5", &[&sig]), BODY, &t),
            Err(bad_ts())
        );
        // Duplicated timestamp header: identical copies are fine, different ones are not.
        assert!(verify(headers(V3_ID, &format!("{ts},{ts}"), &[&sig]), BODY, &t).is_ok());
        let mut h = headers(V3_ID, &ts, &[&sig]);
        h.append("webhook-timestamp", HeaderValue::from_static("1614265331"));
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::MalformedHeader(
                "webhook-timestamp",
                "repeated with different values"
            ))
        );
        assert_eq!(
            verify(good(V3_KEY, BODY), BODY, &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn authentic_but_malformed() {
        let t = tenant(&[V3_KEY]);
        let got = verify(good(V3_KEY, "hello"), "hello", &t);
        assert_eq!(got, Err(sig::payload_error("body is not a JSON object")));
        let long = "m".repeat(300);
        let h = headers(
            &long,
            &V3_TS.to_string(),
            &[&sign_with(V3_KEY, &long, V3_TS, BODY)],
        );
        let got = verify(h, BODY, &t).unwrap_err();
        assert_eq!(got, sig::payload_error("event id is longer than 256 bytes"));
        assert!(!got.is_authentication_failure());
    }

    #[test]
    fn sign_round_trip() {
        let t = tenant(&[OTHER_KEY, V3_KEY]);
        let h = StandardWebhooks
            .sign(BODY.as_bytes(), &t, "msg_1", 1_700_000_000)
            .unwrap();
        let env = verify_at(h.clone(), BODY, &t, 1_700_000_100).unwrap();
        assert_eq!(
            (env.event_id.as_str(), env.event_type.as_str()),
            ("msg_1", "invoice.paid")
        );
        assert_eq!(
            verify_at(h, BODY, &tenant(&[V3_KEY]), 1_700_000_000),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            StandardWebhooks.sign(b"{}", &tenant(&["whsec_***"]), "m", 0),
            Err(ProviderError::NoSecret)
        );
    }
}
