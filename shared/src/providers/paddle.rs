//! Paddle Billing: `Paddle-Signature: ts=<unix>;h1=<hex>[;h1=…]`, HMAC-SHA256 over
//! `"{ts}:{raw body}"`, keyed with the `pdl_ntfset_…` secret string as UTF-8.
//!
//! The timestamp must lie within `tenant.tolerance_secs` of now in both directions (the
//! SDK's 5 s old-side default is too tight for Lambda; dedup covers replays inside the
//! window). Unknown header keys are ignored (the SDK's strictness is not forward
//! compatible) and so are `h1` values that are not hex (the SDK's own test sends
//! `h1=dummy` next to the real signature). Dedup on body `event_id`, never on
//! `notification_id` (one per destination; kept as the delivery id). Paddle puts no
//! seller id in the payload: the tenant is the destination URL and its secret.

use http::HeaderName;

use super::plain_json::PlainJson;
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Paddle;

const HEADER: &str = "paddle-signature";
static SIGNATURE: HeaderName = HeaderName::from_static(HEADER);

/// One `ts` with its `h1` signatures. Normally one; API Gateway comma-joins a
/// repeated header, and each joined value is its own group.
type Group = sig::StampedSigs;

fn parse_group(text: &str) -> Result<Group, ProviderError> {
    let mut ts = None;
    let mut sigs = Vec::with_capacity(2);
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((key, value)) = entry.split_once('=') else {
            return Err(ProviderError::MalformedHeader(HEADER, "entry without '='"));
        };
        match key.trim() {
            "ts" => {
                let t = sig::parse_unix(HEADER, value.trim())?;
                if ts.is_some_and(|prev| prev != t) {
                    return Err(ProviderError::MalformedHeader(HEADER, "several timestamps"));
                }
                ts = Some(t);
            }
            // Not hex (e.g. `h1=dummy`): it can never match; skip it like the SDK does.
            "h1" => sigs.extend(sig::decode_hex(HEADER, value.trim()).ok()),
            _ => {}
        }
    }
    let ts = ts.ok_or(ProviderError::MalformedHeader(HEADER, "no timestamp"))?;
    Ok(Group { ts, sigs })
}

fn parse_header(request: &WebhookRequest) -> Result<Vec<Group>, ProviderError> {
    let mut groups = Vec::with_capacity(1);
    let mut present = false;
    for value in sig::header_values(request, &SIGNATURE) {
        present = true;
        for part in value?.split(',').map(str::trim) {
            groups.push(parse_group(part)?);
        }
    }
    if !present {
        return Err(ProviderError::MissingHeader(HEADER));
    }
    if groups.iter().all(|g| g.sigs.is_empty()) {
        return Err(ProviderError::MalformedHeader(
            HEADER,
            "no hex h1 signature",
        ));
    }
    Ok(groups)
}

static ENVELOPE: PlainJson = PlainJson {
    provider: "paddle",
    event_id: (
        &["event_id"],
        "missing `event_id`",
        "`event_id` is not a string",
    ),
    event_type: (&[&["event_type"]], "missing `event_type`"),
    object_id: &[&["data", "id"]],
    occurred_at: Some(&["occurred_at"]),
    delivery_id: Some(&["notification_id"]),
    tenant: None,
};

fn extract(body: &[u8], tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    ENVELOPE.extract(body, tenant)
}

impl Provider for Paddle {
    fn name(&self) -> &'static str {
        "paddle"
    }

    fn options(&self) -> &'static [&'static str] {
        &[]
    }

    /// Up to 60 retries over 3 days (live accounts).
    fn retry_window_days(&self) -> u32 {
        3
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let body = sig::verify_stamped_request(request, tenant, now_secs, b":", parse_header)?;
        let envelope = extract(body, tenant)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }

    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        _event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let (ts, mac) = sig::sign_stamped_hex(tenant, body, b":", now_secs)?;
        sig::json_headers(&[(&SIGNATURE, &format!("ts={ts};h1={mac}"))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    const NOW: i64 = 1_700_000_000;
    const V8_TS: i64 = 1_696_195_954;
    const V8_SIG: &str = "d96299976a6eb066f484d7fde011ac56fc32b38fc9940bc419d6e537fdc6ef02";
    const V8_SECRET: &str = "pdl_ntf_01hbpjmytsa32fhr36nqgc3kgb_WvRO0eL4Bj9rgYYIBZY6wZhG4EHy9jzh";
    const V8_BAD_SECRETS: [&str; 2] = [
        "pdl_ntf_01hbpjmytsa32fhr36nqgc3kgb_TjIG2BXbm83HPXqNfziwe506sBEdqL/4",
        "pdl_ntf_01hbpjmytsa32fhr36nqgc3kgb_vB/yIOnTOCWIvpBadM5jzBZPHc7OmdSo",
    ];
    const BODY: &str = r#"{"event_id":"evt_01hv8x2acma2gz34a3xb3e8bcf","event_type":"transaction.paid","occurred_at":"2024-04-12T10:18:49.621022Z","notification_id":"ntf_01hv8x2af9bf5dv2hzr0ahfwkp","data":{"id":"txn_01hv8wptq8987qeep44cyrewp9","status":"paid","items":[{"id":"x"}]}}"#;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        crate::providers::test_support::tenant("paddle", secrets)
    }

    fn req(headers: &[&str], body: &str) -> WebhookRequest {
        let mut h = HeaderMap::new();
        for v in headers {
            h.append("paddle-signature", HeaderValue::from_str(v).unwrap());
        }
        WebhookRequest::post(h, body.to_owned())
    }

    fn h1(secret: &str, ts: i64, body: &str) -> String {
        let mac = sig::hmac_sha256(
            secret.as_bytes(),
            &[ts.to_string().as_bytes(), b":", body.as_bytes()],
        );
        hex::encode(mac)
    }

    fn header(secret: &str, ts: i64, body: &str) -> String {
        format!("ts={ts};h1={}", h1(secret, ts, body))
    }

    fn verify_at(
        r: &WebhookRequest,
        t: &TenantConfig,
        now: i64,
    ) -> Result<Envelope, ProviderError> {
        crate::providers::test_support::verify_one(&Paddle, r, t, now)
    }

    fn verify(r: &WebhookRequest, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        verify_at(r, t, NOW)
    }

    #[test]
    fn v8_vector_with_dummy_entry_and_failing_secrets() {
        assert_eq!(h1(V8_SECRET, V8_TS, "hello-world"), V8_SIG);
        let r = req(
            &[&format!("ts={V8_TS};h1=dummy;h1={V8_SIG}")],
            "hello-world",
        );
        // Authentic, but `hello-world` is no JSON event: the signature held.
        assert_eq!(
            verify_at(&r, &tenant(&[V8_SECRET]), V8_TS),
            Err(sig::payload_error("body is not a JSON object"))
        );
        for bad in V8_BAD_SECRETS {
            assert_eq!(
                verify_at(&r, &tenant(&[bad]), V8_TS),
                Err(ProviderError::SignatureMismatch)
            );
        }
        // Rotation: the valid secret among the failing ones still verifies.
        let all = tenant(&[V8_BAD_SECRETS[0], V8_SECRET, V8_BAD_SECRETS[1]]);
        assert!(matches!(
            verify_at(&r, &all, V8_TS),
            Err(ProviderError::MalformedPayload(_))
        ));
        // Only the dummy entry: nothing to compare.
        let r = req(&[&format!("ts={V8_TS};h1=dummy")], "hello-world");
        assert_eq!(
            verify_at(&r, &tenant(&[V8_SECRET]), V8_TS),
            Err(ProviderError::MalformedHeader(
                HEADER,
                "no hex h1 signature"
            ))
        );
        let h = Paddle
            .sign(b"hello-world", &tenant(&[V8_SECRET]), "", V8_TS)
            .unwrap();
        assert_eq!(
            h["paddle-signature"],
            format!("ts={V8_TS};h1={V8_SIG}").as_str()
        );
    }

    #[test]
    fn extracts_envelope_event_id_not_notification_id() {
        let r = req(&[&header("pdl_a", NOW, BODY)], BODY);
        assert_eq!(
            verify(&r, &tenant(&["pdl_a"])).unwrap(),
            Envelope {
                provider: "paddle".into(),
                tenant: "acme".into(),
                event_id: "evt_01hv8x2acma2gz34a3xb3e8bcf".into(),
                event_type: "transaction.paid".into(),
                object_id: Some("txn_01hv8wptq8987qeep44cyrewp9".into()),
                object_version: None,
                occurred_at: Some(1_712_917_129),
                delivery_id: Some("ntf_01hv8x2af9bf5dv2hzr0ahfwkp".into()),
            }
        );
    }

    #[test]
    fn event_id_stable_across_retries_and_destinations() {
        let t = tenant(&["pdl_a"]);
        let first = verify(&req(&[&header("pdl_a", NOW - 100, BODY)], BODY), &t).unwrap();
        // A retry (new ts) to another destination (new notification_id).
        let body = BODY.replace("ntf_01hv8x2af9bf5dv2hzr0ahfwkp", "ntf_other");
        let retry = verify(&req(&[&header("pdl_a", NOW, &body)], &body), &t).unwrap();
        assert_eq!(first.event_id, retry.event_id);
        assert_eq!(first.key(), retry.key());
        assert_ne!(first.delivery_id, retry.delivery_id);
    }

    #[test]
    fn tampered_body_wrong_secret_and_signed_timestamp() {
        let h = header("pdl_a", NOW, BODY);
        let tampered = BODY.replace("paid", "past");
        assert_eq!(
            verify(&req(&[&h], &tampered), &tenant(&["pdl_a"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(&req(&[&h], BODY), &tenant(&["pdl_b"])),
            Err(ProviderError::SignatureMismatch)
        );
        let moved = format!("ts={};h1={}", NOW - 1, h1("pdl_a", NOW, BODY));
        assert_eq!(
            verify(&req(&[&moved], BODY), &tenant(&["pdl_a"])),
            Err(ProviderError::SignatureMismatch)
        );
        // The separator is ':' (Stripe uses '.').
        let dot = hex::encode(sig::hmac_sha256(
            b"pdl_a",
            &[NOW.to_string().as_bytes(), b".", BODY.as_bytes()],
        ));
        assert_eq!(
            verify(
                &req(&[&format!("ts={NOW};h1={dot}")], BODY),
                &tenant(&["pdl_a"])
            ),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn rotation_secrets_and_several_h1() {
        let both = tenant(&["pdl_new", "pdl_old"]);
        for s in ["pdl_old", "pdl_new"] {
            assert!(verify(&req(&[&header(s, NOW, BODY)], BODY), &both).is_ok());
        }
        let two = format!(
            "ts={NOW};h1={};h1={}",
            h1("pdl_new", NOW, BODY),
            h1("pdl_old", NOW, BODY)
        );
        assert!(verify(&req(&[&two], BODY), &tenant(&["pdl_old"])).is_ok());
        assert!(verify(&req(&[&two], BODY), &tenant(&["pdl_new"])).is_ok());
        assert_eq!(
            verify(&req(&[&two], BODY), &tenant(&["pdl_x"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn stale_and_future_timestamps() {
        let t = tenant(&["pdl_a"]);
        for (ts, ok) in [
            (NOW - 300, true),
            (NOW + 300, true),
            (NOW - 301, false),
            (NOW + 301, false),
        ] {
            let got = verify(&req(&[&header("pdl_a", ts, BODY)], BODY), &t);
            if ok {
                assert!(got.is_ok(), "{ts}");
            } else {
                assert_eq!(got, Err(ProviderError::TimestampOutOfTolerance), "{ts}");
            }
        }
        let mut tight = tenant(&["pdl_a"]);
        tight.tolerance_secs = 5;
        let r = req(&[&header("pdl_a", NOW - 6, BODY)], BODY);
        assert_eq!(
            verify(&r, &tight),
            Err(ProviderError::TimestampOutOfTolerance)
        );
    }

    #[test]
    fn missing_garbled_and_duplicated_headers() {
        let t = tenant(&["pdl_a"]);
        let good = header("pdl_a", NOW, BODY);
        assert_eq!(
            verify(&req(&[], BODY), &t),
            Err(ProviderError::MissingHeader(HEADER))
        );
        let cases: [(&str, &str); 8] = [
            ("", "no timestamp"),
            (";;", "no timestamp"),
            ("h1=00", "no timestamp"),
            ("ts=abc;h1=00", "timestamp is not a Unix time in seconds"),
            ("ts=-1;h1=00", "timestamp is not a Unix time in seconds"),
            ("ts=1700000000", "no hex h1 signature"),
            ("ts=1700000000;garbage", "entry without '='"),
            ("ts=1700000000;ts=1700000001;h1=00", "several timestamps"),
        ];
        for (h, why) in cases {
            assert_eq!(
                verify(&req(&[h], BODY), &t),
                Err(ProviderError::MalformedHeader(HEADER, why)),
                "{h}"
            );
        }
        let mut h = HeaderMap::new();
        h.insert(
            "paddle-signature",
            HeaderValue::from_bytes(b"ts=1;h1=\xff").unwrap(),
        );
        assert_eq!(
            verify(&WebhookRequest::post(h, BODY), &t),
            Err(ProviderError::MalformedHeader(
                HEADER,
                "value is not visible ASCII"
            ))
        );
        // Unknown keys are ignored; repeats, separate or comma-joined, are fine.
        assert!(verify(&req(&[&format!("{good};h2=zz;x=1")], BODY), &t).is_ok());
        assert!(verify(&req(&[&good, &good], BODY), &t).is_ok());
        assert!(verify(&req(&[&format!("{good},{good}")], BODY), &t).is_ok());
        let stale = header("pdl_a", NOW - 1000, BODY);
        assert!(verify(&req(&[&format!("{stale},{good}")], BODY), &t).is_ok());
        assert_eq!(
            verify(&req(&[&stale], BODY), &t),
            Err(ProviderError::TimestampOutOfTolerance)
        );
        assert_eq!(
            verify(&req(&[&good], BODY), &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn authentic_but_malformed_payloads() {
        let t = tenant(&["pdl_a"]);
        let check = |body: &str, want: ProviderError| {
            let got = verify(&req(&[&header("pdl_a", NOW, body)], body), &t);
            assert!(!want.is_authentication_failure());
            assert_eq!(got, Err(want), "{body}");
        };
        check("[]", sig::payload_error("body is not a JSON object"));
        check(
            r#"{"event_type":"x","notification_id":"ntf_1"}"#,
            sig::payload_error("missing `event_id`"),
        );
        check(
            r#"{"event_id":1,"event_type":"x"}"#,
            sig::payload_error("`event_id` is not a string"),
        );
        check(
            r#"{"event_id":"","event_type":"x"}"#,
            sig::payload_error("event id is empty"),
        );
        check(
            r#"{"event_id":"evt_1"}"#,
            sig::payload_error("missing `event_type`"),
        );
        check(
            r#"{"event_id":"evt_1","event_type":"x""#,
            sig::payload_error("body is not valid JSON (line 1, column 36)"),
        );
    }

    #[test]
    fn sign_round_trip_uses_first_secret() {
        let t = tenant(&["pdl_new", "pdl_old"]);
        let h = Paddle.sign(BODY.as_bytes(), &t, "ignored", NOW).unwrap();
        let r = WebhookRequest::post(h, BODY);
        assert_eq!(
            verify(&r, &t).unwrap().event_id,
            "evt_01hv8x2acma2gz34a3xb3e8bcf"
        );
        assert_eq!(
            verify(&r, &tenant(&["pdl_old"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            Paddle.sign(b"{}", &tenant(&[]), "", NOW).unwrap_err(),
            ProviderError::NoSecret
        );
    }
}
