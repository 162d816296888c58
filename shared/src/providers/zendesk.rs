//! Zendesk webhooks: `X-Zendesk-Webhook-Signature: <base64>` = HMAC-SHA256(signing
//! secret as UTF-8, `timestamp + raw body`), the timestamp being the
//! `X-Zendesk-Webhook-Signature-Timestamp` header as sent, an RFC 3339 time such as
//! `2021-07-25T10:00:00Z` [doc] (developer.zendesk.com/documentation/webhooks/verifying:
//! "base64(HMACSHA256(TIMESTAMP + BODY))"). Zendesk ships no SDK that verifies. The
//! window is the tenant's tolerance, both directions (Zendesk documents none).
//!
//! The body einmal reads is an event-subscription webhook's (`id`, `type`
//! `zen:event-type:…`, `subject`, `time`, `detail`) [doc] (developer.zendesk.com
//! api-reference/webhooks/event-types); a trigger or automation webhook whose custom
//! body carries no `id` is authentic but refused as malformed (400). Rotation: every
//! secret is tried (Zendesk resets a secret at once, so the old one is listed only for
//! deliveries in flight).

use http::HeaderName;

use super::plain_json::PlainJson;
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::request::WebhookRequest;

pub struct Zendesk;

const SIGNATURE_NAME: &str = "x-zendesk-webhook-signature";
const TIMESTAMP_NAME: &str = "x-zendesk-webhook-signature-timestamp";
static SIGNATURE: HeaderName = HeaderName::from_static(SIGNATURE_NAME);
static TIMESTAMP: HeaderName = HeaderName::from_static(TIMESTAMP_NAME);

static ENVELOPE: PlainJson = PlainJson {
    provider: "zendesk",
    event_id: (&["id"], "missing event `id`", "event `id` is not a string"),
    event_type: (&[&["type"]], "missing event `type`"),
    object_id: &[&["detail", "id"], &["subject"]],
    occurred_at: Some(&["time"]),
    delivery_id: None,
    tenant: None,
};

fn mac(secret: &str, ts: &str, body: &[u8]) -> [u8; 32] {
    sig::hmac_sha256(secret.as_bytes(), &[ts.as_bytes(), body])
}

impl Provider for Zendesk {
    fn name(&self) -> &'static str {
        "zendesk"
    }

    fn options(&self) -> &'static [&'static str] {
        &[]
    }

    /// Zendesk retries only a few times within minutes, for some status codes (409,
    /// 429/503 with a short `Retry-After`, timeouts) behind a circuit breaker [doc]
    /// (developer.zendesk.com/api-reference/webhooks/introduction, "Webhook retries";
    /// the exact counts UNCONFIRMED: the page was read only in part). 1 day.
    fn retry_window_days(&self) -> u32 {
        1
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let secrets = sig::secrets(tenant)?;
        let ts = sig::single_header(request, &TIMESTAMP)?
            .ok_or(ProviderError::MissingHeader(TIMESTAMP_NAME))?;
        let at = crate::time::parse_rfc3339(ts).ok_or(ProviderError::MalformedHeader(
            TIMESTAMP_NAME,
            "timestamp is not an RFC 3339 time",
        ))?;
        let candidates = sig::base64_signatures(request, &SIGNATURE)?;
        sig::check_timestamp(at, now_secs, tenant.tolerance_secs, false)?;
        let body = &request.body;
        sig::verify_any(secrets, &candidates, |s| Some(mac(s.expose(), ts, body)))?;
        let envelope = ENVELOPE.extract(body, tenant)?;
        sig::check_event_id(&envelope.event_id)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }

    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        _event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let secret = sig::secrets(tenant)?[0].expose();
        let ts = crate::time::format_rfc3339(now_secs);
        let signature = base64::Engine::encode(&sig::B64, mac(secret, &ts, body));
        sig::json_headers(&[(&SIGNATURE, &signature), (&TIMESTAMP, &ts)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::test_support::{tenant, verify_one};
    use http::HeaderValue;

    const BODY: &str = r#"{"account_id":22129848,"detail":{"id":"5158","status":"OPEN","subject":"Where is my order?"},"event":{},"id":"cbe4028c-7239-495d-b020-f22348516046","subject":"zen:ticket:5158","time":"2024-03-01T10:00:00Z","type":"zen:event-type:ticket.created","zendesk_event_version":"2022-11-06"}"#;
    const NOW: i64 = 1_709_287_200; // 2024-03-01T10:00:00Z

    fn signed(secret: &str, at: i64) -> http::HeaderMap {
        Zendesk
            .sign(BODY.as_bytes(), &tenant("zendesk", &[secret]), "", at)
            .unwrap()
    }

    fn check(
        h: http::HeaderMap,
        body: &str,
        secrets: &[&str],
        now: i64,
    ) -> Result<(), ProviderError> {
        verify_one(
            &Zendesk,
            &WebhookRequest::post(h, body.to_owned()),
            &tenant("zendesk", secrets),
            now,
        )
        .map(|_| ())
    }

    #[test]
    fn signed_content_is_timestamp_then_body_in_base64() {
        // The documented formula, spelled out: base64(HMAC-SHA256(TIMESTAMP + BODY)).
        let h = signed("dGhpc19zZWNyZXRfaXNfZm9yX3Rlc3Rpbmdfb25seQ==", NOW);
        assert_eq!(h[&TIMESTAMP], "2024-03-01T10:00:00Z");
        let want = sig::hmac_sha256(
            b"dGhpc19zZWNyZXRfaXNfZm9yX3Rlc3Rpbmdfb25seQ==",
            &[format!("2024-03-01T10:00:00Z{BODY}").as_bytes()],
        );
        assert_eq!(
            h[&SIGNATURE].to_str().unwrap(),
            base64::Engine::encode(&sig::B64, want)
        );
    }

    #[test]
    fn verifies_extracts_and_refuses() {
        let h = signed("s", NOW);
        let env = verify_one(
            &Zendesk,
            &WebhookRequest::post(h.clone(), BODY),
            &tenant("zendesk", &["s"]),
            NOW,
        )
        .unwrap();
        assert_eq!(env.event_id, "cbe4028c-7239-495d-b020-f22348516046");
        assert_eq!(env.event_type, "zen:event-type:ticket.created");
        assert_eq!(env.object_id.as_deref(), Some("5158"));
        assert_eq!(env.occurred_at, Some(NOW));
        assert_eq!(
            check(h.clone(), &BODY.replace("OPEN", "SOLVED"), &["s"], NOW),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            check(h.clone(), BODY, &["x"], NOW),
            Err(ProviderError::SignatureMismatch)
        );
        // Rotation: the old secret next to the new one.
        assert!(check(h.clone(), BODY, &["new", "s"], NOW).is_ok());
        assert!(check(signed("new", NOW), BODY, &["new", "s"], NOW).is_ok());
        // The signed timestamp, both directions.
        assert!(check(h.clone(), BODY, &["s"], NOW + 300).is_ok());
        assert_eq!(
            check(h.clone(), BODY, &["s"], NOW + 301),
            Err(ProviderError::TimestampOutOfTolerance)
        );
        assert_eq!(
            check(h.clone(), BODY, &["s"], NOW - 301),
            Err(ProviderError::TimestampOutOfTolerance)
        );
        // Another timestamp (even the same instant spelled otherwise) breaks the MAC.
        let mut moved = h.clone();
        moved.insert(
            &TIMESTAMP,
            HeaderValue::from_static("2024-03-01T10:00:00+00:00"),
        );
        assert_eq!(
            check(moved, BODY, &["s"], NOW),
            Err(ProviderError::SignatureMismatch)
        );
        let mut garbled = h.clone();
        garbled.insert(&TIMESTAMP, HeaderValue::from_static("1709287200"));
        assert!(matches!(
            check(garbled, BODY, &["s"], NOW),
            Err(ProviderError::MalformedHeader(TIMESTAMP_NAME, _))
        ));
        let mut missing = h.clone();
        missing.remove(&SIGNATURE);
        assert_eq!(
            check(missing, BODY, &["s"], NOW),
            Err(ProviderError::MissingHeader(SIGNATURE_NAME))
        );
        // A trigger webhook's custom body without `id`: authentic, malformed.
        let custom = r#"{"ticket":"5158","say":"hello"}"#;
        let h = Zendesk
            .sign(custom.as_bytes(), &tenant("zendesk", &["s"]), "", NOW)
            .unwrap();
        let err = check(h, custom, &["s"], NOW).unwrap_err();
        assert!(!err.is_authentication_failure(), "{err:?}");
    }
}
