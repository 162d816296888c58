//! Slack: `X-Slack-Signature: v0=<hex>` = HMAC-SHA256(signing secret as UTF-8,
//! `"v0:{X-Slack-Request-Timestamp}:{raw body}"`), timestamp within
//! ±`tenant.tolerance_secs` (slack_sdk uses ±300 s).
//!
//! Only Events API JSON is turned into events: dedup on the envelope `event_id`
//! (stable across retries; the `X-Slack-Retry-*` headers are ignored), type is
//! `event.type`, else the top-level `type`. `url_verification` (sent when a Request URL
//! is saved; signed like every event, no event id or team) is a handshake: after the
//! signature holds, its `challenge` is echoed as `{"challenge": "…"}` with 200 and
//! nothing is stored. Form-encoded slash commands and interactivity payloads are not
//! handled, although their signatures verify the same way. If the tenant option
//! `team_id` is set, the body `team_id` must equal it.

use http::HeaderName;

use super::json::{self, Raw};
use super::plain_json::{PlainJson, TenantField};
use super::sig;
use super::{Handshake, Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Slack;

const HEADER: &str = "x-slack-signature";
const TS_HEADER: &str = "x-slack-request-timestamp";
static SIGNATURE: HeaderName = HeaderName::from_static(HEADER);
static TIMESTAMP: HeaderName = HeaderName::from_static(TS_HEADER);

fn mac(secret: &str, ts: &[u8], body: &[u8]) -> [u8; 32] {
    sig::hmac_sha256(secret.as_bytes(), &[b"v0:", ts, b":", body])
}

static ENVELOPE: PlainJson = PlainJson {
    provider: "slack",
    event_id: (
        &["event_id"],
        "missing `event_id`",
        "`event_id` is not a string",
    ),
    // The inner event's type; `url_verification` and the like have only the outer one.
    event_type: (&[&["event", "type"], &["type"]], "missing event `type`"),
    object_id: &[],
    occurred_at: Some(&["event_time"]),
    delivery_id: None,
    tenant: Some(TenantField {
        option: "team_id",
        path: &["team_id"],
        absent_passes: false,
    }),
};

fn extract(body: &[u8], tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(sig::payload_error(
            "only Events API JSON is supported (slash commands and interactivity are form-encoded)",
        ));
    }
    ENVELOPE.extract(body, tenant)
}

/// Longest challenge we echo (Slack's are about 50 characters).
const MAX_CHALLENGE_LEN: usize = 256;

/// The challenge of an authentic `url_verification` body, `None` for other bodies.
fn challenge(body: &[u8]) -> Result<Option<String>, ProviderError> {
    let [kind, challenge] = json::json_fields(body, [&["type"], &["challenge"]])?;
    if kind.and_then(Raw::str).as_deref() != Some("url_verification") {
        return Ok(None);
    }
    let challenge = challenge
        .and_then(Raw::str)
        .filter(|c| !c.is_empty() && c.len() <= MAX_CHALLENGE_LEN)
        .filter(|c| c.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| sig::payload_error("url_verification without a usable `challenge`"))?;
    Ok(Some(challenge.into_owned()))
}

impl Slack {
    /// Check timestamp and signature of `request` for `tenant`.
    fn verify(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<(), ProviderError> {
        let secrets = sig::secrets(tenant)?;
        let candidates = sig::hex_signatures(request, &SIGNATURE, "v0=", true)?;
        let ts_text = sig::single_header(request, &TIMESTAMP)?
            .ok_or(ProviderError::MissingHeader(TS_HEADER))?;
        let ts = sig::parse_unix(TS_HEADER, ts_text)?;
        sig::check_timestamp(ts, now_secs, tenant.tolerance_secs, false)?;
        let body = &request.body[..];
        // parse_unix admits digits only: the text is exactly what Slack signed.
        sig::verify_any(secrets, &candidates, |s| {
            Some(mac(s.expose(), ts_text.as_bytes(), body))
        })
    }
}

impl Provider for Slack {
    fn name(&self) -> &'static str {
        "slack"
    }

    fn options(&self) -> &'static [&'static str] {
        &["team_id"]
    }

    /// 3 retries within minutes.
    fn retry_window_days(&self) -> u32 {
        1
    }

    fn handshake(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Option<Handshake>, ProviderError> {
        // Cheap pre-filter: events that cannot be a verification skip a second MAC.
        let marker: &[u8] = b"url_verification";
        if !request.body.windows(marker.len()).any(|w| w == marker) {
            return Ok(None);
        }
        self.verify(request, tenant, now_secs)?;
        Ok(challenge(&request.body)?.map(|challenge| Handshake { challenge }))
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        self.verify(request, tenant, now_secs)?;
        let envelope = extract(&request.body, tenant)?;
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
        let ts = now_secs.to_string();
        let signature = hex::encode(mac(secret, ts.as_bytes(), body));
        sig::json_headers(&[(&SIGNATURE, &format!("v0={signature}")), (&TIMESTAMP, &ts)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    const NOW: i64 = 1_700_000_000;
    const V5_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const V5_TS: i64 = 1_531_420_618;
    const V5_BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const V5_SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
    const BODY: &str = r#"{"token":"XXYYZZ","team_id":"T123ABC456","api_app_id":"A123ABC456","event":{"type":"app_mention","user":"U1","text":"hi","ts":"1515449522.000016","channel":"C1","event_ts":"1515449522000016"},"type":"event_callback","event_id":"Ev123ABC456","event_time":1515449522,"authorizations":[{"team_id":"T9","type":"x"}]}"#;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        crate::providers::test_support::tenant("slack", secrets)
    }

    fn sig_for(secret: &str, ts: i64, body: &str) -> String {
        let m = mac(secret, ts.to_string().as_bytes(), body.as_bytes());
        format!("v0={}", hex::encode(m))
    }

    fn req(sigs: &[&str], ts: Option<&str>, body: &str) -> WebhookRequest {
        let mut h = HeaderMap::new();
        for v in sigs {
            h.append(HEADER, HeaderValue::from_str(v).unwrap());
        }
        if let Some(ts) = ts {
            h.append(TS_HEADER, HeaderValue::from_str(ts).unwrap());
        }
        WebhookRequest::post(h, body.to_owned())
    }

    fn signed(secret: &str, ts: i64, body: &str) -> WebhookRequest {
        req(&[&sig_for(secret, ts, body)], Some(&ts.to_string()), body)
    }

    fn verify_at(
        r: &WebhookRequest,
        t: &TenantConfig,
        now: i64,
    ) -> Result<Envelope, ProviderError> {
        crate::providers::test_support::verify_one(&Slack, r, t, now)
    }

    fn verify(r: &WebhookRequest, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        verify_at(r, t, NOW)
    }

    #[test]
    fn v5_vector() {
        assert_eq!(sig_for(V5_SECRET, V5_TS, V5_BODY), V5_SIG);
        let r = req(&[V5_SIG], Some("1531420618"), V5_BODY);
        // The signature holds; the slash command itself is not an Events API event.
        let got = verify_at(&r, &tenant(&[V5_SECRET]), V5_TS + 10);
        assert!(
            matches!(&got, Err(ProviderError::MalformedPayload(m)) if m.contains("form-encoded")),
            "{got:?}"
        );
        assert_eq!(
            verify_at(&r, &tenant(&["another"]), V5_TS),
            Err(ProviderError::SignatureMismatch)
        );
        let h = Slack
            .sign(V5_BODY.as_bytes(), &tenant(&[V5_SECRET]), "", V5_TS)
            .unwrap();
        assert_eq!(h[HEADER], V5_SIG);
        assert_eq!(h[TS_HEADER], "1531420618");
    }

    #[test]
    fn extracts_events_api_envelope() {
        let env = verify(&signed("s", NOW, BODY), &tenant(&["s"])).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "slack".into(),
                tenant: "acme".into(),
                event_id: "Ev123ABC456".into(),
                event_type: "app_mention".into(),
                object_id: None,
                object_version: None,
                occurred_at: Some(1_515_449_522),
                delivery_id: None,
            }
        );
        // Without an inner event type, the top-level type is used.
        let body = r#"{"type":"app_rate_limited","event_id":"Ev9","team_id":"T1"}"#;
        let env = verify(&signed("s", NOW, body), &tenant(&["s"])).unwrap();
        assert_eq!(env.event_type, "app_rate_limited");
    }

    #[test]
    fn url_verification_is_answered_after_verification() {
        let body = r#"{"token":"t","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
        let t = tenant(&["s"]);
        assert_eq!(
            Slack.handshake(&signed("s", NOW, body), &t, NOW),
            Ok(Some(Handshake {
                challenge: "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P".into()
            }))
        );
        // ...but it must be authentic and fresh first.
        assert_eq!(
            Slack.handshake(&signed("x", NOW, body), &t, NOW),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            Slack.handshake(&signed("s", NOW - 301, body), &t, NOW),
            Err(ProviderError::TimestampOutOfTolerance)
        );
        // Events are not handshakes, even when they mention the word.
        assert_eq!(Slack.handshake(&signed("s", NOW, BODY), &t, NOW), Ok(None));
        let mention = r#"{"type":"event_callback","event_id":"Ev1","team_id":"T1","event":{"type":"message","text":"url_verification"}}"#;
        assert_eq!(
            Slack.handshake(&signed("s", NOW, mention), &t, NOW),
            Ok(None)
        );
        assert!(verify(&signed("s", NOW, mention), &t).is_ok());
        // A verification without a usable challenge is malformed (400), not echoed.
        for bad in [
            r#"{"type":"url_verification"}"#,
            r#"{"type":"url_verification","challenge":""}"#,
            r#"{"type":"url_verification","challenge":"a b"}"#,
            r#"{"type":"url_verification","challenge":7}"#,
        ] {
            let got = Slack.handshake(&signed("s", NOW, bad), &t, NOW);
            assert!(
                matches!(got, Err(ProviderError::MalformedPayload(_))),
                "{bad}: {got:?}"
            );
        }
        // Through the event path it is no event: nothing to store.
        assert!(matches!(
            verify(&signed("s", NOW, body), &t),
            Err(ProviderError::MalformedPayload(_))
        ));
    }

    #[test]
    fn tampered_body_wrong_secret_and_signed_timestamp() {
        let t = tenant(&["s"]);
        let s = sig_for("s", NOW, BODY);
        let ts = NOW.to_string();
        let tampered = BODY.replace("hi", "ho");
        assert_eq!(
            verify(&req(&[&s], Some(&ts), &tampered), &t),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(&signed("s", NOW, BODY), &tenant(&["other"])),
            Err(ProviderError::SignatureMismatch)
        );
        let moved = (NOW - 1).to_string();
        assert_eq!(
            verify(&req(&[&s], Some(&moved), BODY), &t),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn rotation_secrets_and_two_signatures() {
        let both = tenant(&["new", "old"]);
        assert!(verify(&signed("old", NOW, BODY), &both).is_ok());
        assert!(verify(&signed("new", NOW, BODY), &both).is_ok());
        let ts = NOW.to_string();
        let (old, new) = (sig_for("old", NOW, BODY), sig_for("new", NOW, BODY));
        let r = req(&[&old, &new], Some(&ts), BODY);
        assert!(verify(&r, &tenant(&["new"])).is_ok());
        assert!(verify(&r, &tenant(&["old"])).is_ok());
        let joined = req(&[&format!("{new},{old}")], Some(&ts), BODY);
        assert!(verify(&joined, &tenant(&["old"])).is_ok());
        assert_eq!(
            verify(&r, &tenant(&["x"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn stale_and_future_timestamps() {
        let t = tenant(&["s"]);
        for (ts, ok) in [
            (NOW - 300, true),
            (NOW + 300, true),
            (NOW - 301, false),
            (NOW + 301, false),
        ] {
            let got = verify(&signed("s", ts, BODY), &t);
            if ok {
                assert!(got.is_ok(), "{ts}");
            } else {
                assert_eq!(got, Err(ProviderError::TimestampOutOfTolerance), "{ts}");
            }
        }
    }

    #[test]
    fn missing_garbled_and_duplicated_headers() {
        let t = tenant(&["s"]);
        let good = sig_for("s", NOW, BODY);
        let ts = NOW.to_string();
        assert_eq!(
            verify(&req(&[], Some(&ts), BODY), &t),
            Err(ProviderError::MissingHeader(HEADER))
        );
        assert_eq!(
            verify(&req(&[&good], None, BODY), &t),
            Err(ProviderError::MissingHeader(TS_HEADER))
        );
        for (h, why) in [
            ("", "empty value"),
            ("v0=", "empty value"),
            ("a2114d57", "missing signature scheme prefix"),
            ("v1=00", "missing signature scheme prefix"),
            ("v0=xyz", "signature is not valid hex"),
            ("v0=abc", "signature is not valid hex"),
        ] {
            assert_eq!(
                verify(&req(&[h], Some(&ts), BODY), &t),
                Err(ProviderError::MalformedHeader(HEADER, why)),
                "{h}"
            );
        }
        for (v, why) in [
            ("abc", "timestamp is not a Unix time in seconds"),
            ("1.5", "timestamp is not a Unix time in seconds"),
            ("-5", "timestamp is not a Unix time in seconds"),
        ] {
            assert_eq!(
                verify(&req(&[&good], Some(v), BODY), &t),
                Err(ProviderError::MalformedHeader(TS_HEADER, why)),
                "{v}"
            );
        }
        // Two different timestamps are ambiguous; identical repeats are fine.
        let mut r = req(&[&good], Some(&ts), BODY);
        r.headers
            .append(TS_HEADER, HeaderValue::from_str(&ts).unwrap());
        assert!(verify(&r, &t).is_ok());
        r.headers
            .append(TS_HEADER, HeaderValue::from_static("1700000001"));
        assert_eq!(
            verify(&r, &t),
            Err(ProviderError::MalformedHeader(
                TS_HEADER,
                "repeated with different values"
            ))
        );
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_bytes(b"v0=\xff").unwrap());
        h.insert(TS_HEADER, HeaderValue::from_str(&ts).unwrap());
        assert_eq!(
            verify(&WebhookRequest::post(h, BODY), &t),
            Err(ProviderError::MalformedHeader(
                HEADER,
                "value is not visible ASCII"
            ))
        );
        assert!(verify(&req(&[&good, &good], Some(&ts), BODY), &t).is_ok());
        assert_eq!(
            verify(&signed("s", NOW, BODY), &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn authentic_but_malformed_payloads() {
        let t = tenant(&["s"]);
        let check = |body: &str, want: ProviderError| {
            let got = verify(&signed("s", NOW, body), &t);
            assert!(!want.is_authentication_failure());
            assert_eq!(got, Err(want), "{body}");
        };
        check(
            r#"{"type":"event_callback","event":{"type":"x"}}"#,
            sig::payload_error("missing `event_id`"),
        );
        check(
            r#"{"event_id":5,"type":"event_callback"}"#,
            sig::payload_error("`event_id` is not a string"),
        );
        check(
            r#"{"event_id":"Ev1"}"#,
            sig::payload_error("missing event `type`"),
        );
        check(
            r#"{"event_id":"Ev1","type":"#,
            sig::payload_error("body is not valid JSON (line 1, column 25)"),
        );
    }

    #[test]
    fn team_id_must_match_tenant_option() {
        let mut t = tenant(&["s"]);
        t.options.insert("team_id".into(), "T123ABC456".into());
        assert!(verify(&signed("s", NOW, BODY), &t).is_ok());
        t.options.insert("team_id".into(), "T9".into());
        assert_eq!(
            verify(&signed("s", NOW, BODY), &t),
            Err(ProviderError::TenantMismatch("team_id"))
        );
    }

    #[test]
    fn event_id_stable_across_retries_and_sign_round_trip() {
        let t = tenant(&["new", "old"]);
        let first = Slack.sign(BODY.as_bytes(), &t, "", NOW - 60).unwrap();
        let mut retry = Slack.sign(BODY.as_bytes(), &t, "", NOW).unwrap();
        retry.insert("x-slack-retry-num", HeaderValue::from_static("1"));
        let a = verify(&WebhookRequest::post(first, BODY), &t).unwrap();
        let r = WebhookRequest::post(retry, BODY);
        let b = verify(&r, &t).unwrap();
        assert_eq!(a.key(), b.key());
        assert_eq!(
            verify(&r, &tenant(&["old"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            Slack.sign(b"{}", &tenant(&[]), "", NOW).unwrap_err(),
            ProviderError::NoSecret
        );
    }
}
