//! Mailgun: the JSON body carries `signature: {timestamp, token, signature}` next to
//! `event-data`; `signature` = hex(HMAC-SHA256(signing key as UTF-8, timestamp + token))
//! with no separator. **The event data is not covered by the HMAC**, so:
//! - the timestamp must be within ±`tolerance_secs` of now, and
//! - a token is accepted once: an in-process cache (per tenant, bounded to
//!   [`MAX_TOKENS`] entries, each kept until its timestamp leaves the window) rejects
//!   a second use with `MalformedHeader("signature.token", …)`, i.e. 401. Mailgun
//!   signs every delivery attempt afresh (new token and timestamp), so a genuine
//!   retry carries a new token and is then deduplicated on `event-data.id` as usual;
//!   a reused token can only be a replay. The cache is per process (per Lambda
//!   instance): the dedup store on `event-data.id` remains the durable defence.
//!
//! Dedup id: `event-data.id`; type `event-data.event`. The tenant is the signing key
//! (one per account): the payload holds no signed tenant field to check, and an
//! unsigned one would prove nothing. Because the signature lives in the body,
//! [`Provider::sign`] can only add the content type; build signed bodies with
//! [`signed_body`]. Subaccount `parent-signature` is not checked (unconfirmed shape).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

use super::json::{self, Raw};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Mailgun;

/// Most tokens remembered at once; when full, expired ones are pruned and then the
/// ones closest to expiry are evicted.
pub const MAX_TOKENS: usize = 100_000;

const SIG_NAME: &str = "signature";
const TOKEN_NAME: &str = "signature.token";
const TS_NAME: &str = "signature.timestamp";

/// `"{tenant}\0{token}"` → Unix second after which the timestamp check rejects it anyway.
static SEEN: Mutex<Option<HashMap<String, i64>>> = Mutex::new(None);

/// Record `token` for `tenant`; false when it was already used within the window.
fn remember_token(tenant: &str, token: &str, expires: i64, now: i64) -> bool {
    let mut guard = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let seen = guard.get_or_insert_with(HashMap::new);
    let key = format!("{tenant}\0{token}");
    if let Some(&exp) = seen.get(&key) {
        if exp >= now {
            return false;
        }
    }
    if seen.len() >= MAX_TOKENS && !seen.contains_key(&key) {
        seen.retain(|_, exp| *exp >= now);
        if seen.len() >= MAX_TOKENS {
            // Evict the tenth closest to expiry; rare, and only authentic tokens get here.
            let mut exps: Vec<i64> = seen.values().copied().collect();
            let cut = MAX_TOKENS / 10;
            exps.select_nth_unstable(cut);
            let limit = exps[cut];
            seen.retain(|_, exp| *exp > limit);
        }
    }
    seen.insert(key, expires);
    true
}

/// The `signature` object's three strings (timestamp may also be a JSON integer).
fn signature_fields(body: &[u8]) -> Result<(String, String, Vec<u8>), ProviderError> {
    let missing = || ProviderError::MissingHeader(SIG_NAME);
    // An unparsable body cannot carry a signature: that is an authentication failure.
    let [ts, token, signature] = json::json_fields(
        body,
        [
            &["signature", "timestamp"],
            &["signature", "token"],
            &["signature", "signature"],
        ],
    )
    .map_err(|_| missing())?;
    let (Some(ts), Some(token), Some(signature)) = (ts, token, signature) else {
        return Err(missing());
    };
    let ts = ts
        .text()
        .ok_or(ProviderError::MalformedHeader(TS_NAME, "not a string"))?;
    let token = token
        .str()
        .ok_or(ProviderError::MalformedHeader(TOKEN_NAME, "not a string"))?;
    if token.is_empty() || token.len() > 256 {
        return Err(ProviderError::MalformedHeader(TOKEN_NAME, "bad length"));
    }
    let signature = signature
        .str()
        .ok_or(ProviderError::MalformedHeader(SIG_NAME, "not a string"))?;
    let signature = sig::decode_hex(SIG_NAME, &signature)?;
    Ok((ts.into_owned(), token.into_owned(), signature))
}

/// Integer seconds of a JSON number such as `1529006854.329574`.
fn float_secs(raw: Raw<'_>) -> Option<i64> {
    let s = std::str::from_utf8(raw.0).ok()?;
    let int = s.split_once('.').map_or(s, |(i, _)| i);
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    int.parse().ok()
}

fn extract(request: &WebhookRequest, tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    let [id, event, timestamp, message_id] = json::json_fields(
        &request.body,
        [
            &["event-data", "id"],
            &["event-data", "event"],
            &["event-data", "timestamp"],
            &["event-data", "message", "headers", "message-id"],
        ],
    )?;
    let id = id
        .and_then(Raw::str)
        .ok_or_else(|| sig::payload_error("missing event-data.id"))?;
    sig::check_event_id(&id)?;
    let event = json::required_str(event, "missing event-data.event")?;
    Ok(Envelope {
        provider: "mailgun".into(),
        tenant: tenant.tenant.clone(),
        event_id: id.into_owned(),
        event_type: event.into_owned(),
        object_id: message_id.and_then(Raw::str).map(Cow::into_owned),
        object_version: None,
        occurred_at: timestamp.and_then(float_secs),
        delivery_id: None,
    })
}

/// `event_data` (a JSON object) wrapped with a fresh signature object for `tenant`'s
/// first key at `now_secs`: the body Mailgun would send.
pub fn signed_body(
    event_data: &serde_json::Value,
    tenant: &TenantConfig,
    now_secs: i64,
) -> Result<Vec<u8>, ProviderError> {
    let key = sig::secrets(tenant)?[0].expose().as_bytes();
    let ts = now_secs.to_string();
    let token = hex::encode(rand::random::<[u8; 25]>());
    let mac = hex::encode(sig::hmac_sha256(key, &[ts.as_bytes(), token.as_bytes()]));
    let body = serde_json::json!({
        "signature": {"timestamp": ts, "token": token, "signature": mac},
        "event-data": event_data,
    });
    Ok(body.to_string().into_bytes())
}

impl Provider for Mailgun {
    fn name(&self) -> &'static str {
        "mailgun"
    }

    fn options(&self) -> &'static [&'static str] {
        &[]
    }

    /// About 8 h (unconfirmed).
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
        let (ts_text, token, signature) = signature_fields(&request.body)?;
        let ts = sig::parse_unix(TS_NAME, &ts_text)?;
        sig::check_timestamp(ts, now_secs, tenant.tolerance_secs, false)?;
        sig::verify_any(secrets, &[signature], |s| {
            Some(sig::hmac_sha256(
                s.expose().as_bytes(),
                &[ts_text.as_bytes(), token.as_bytes()],
            ))
        })?;
        let tol = i64::try_from(tenant.tolerance_secs).unwrap_or(i64::MAX);
        if !remember_token(&tenant.tenant, &token, ts.saturating_add(tol), now_secs) {
            return Err(ProviderError::MalformedHeader(
                TOKEN_NAME,
                "token was already used (replay)",
            ));
        }
        let envelope = extract(request, tenant)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }

    /// The signature travels in the body: see [`signed_body`]. Only the content type.
    fn sign(
        &self,
        _body: &[u8],
        tenant: &TenantConfig,
        _event_id: &str,
        _now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        sig::secrets(tenant)?;
        sig::json_headers(&[])
    }

    /// Mailgun signs inside the body: `body` is the `event-data` object to wrap.
    fn signed_request(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        now_secs: i64,
    ) -> Result<(http::HeaderMap, bytes::Bytes), ProviderError> {
        let event_data: serde_json::Value = serde_json::from_slice(body)
            .map_err(|_| sig::payload_error("event-data is not JSON"))?;
        let headers = self.sign(body, tenant, event_id, now_secs)?;
        Ok((headers, signed_body(&event_data, tenant, now_secs)?.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    const NOW: i64 = 1_529_006_854;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        crate::providers::test_support::tenant("mailgun", secrets)
    }

    fn event() -> serde_json::Value {
        serde_json::json!({
            "id": "CPgfbmQMTCKtHW6uIWtuVe",
            "event": "delivered",
            "timestamp": 1529006854.329574,
            "message": {"headers": {"message-id": "2018@example.com"}}
        })
    }

    fn body(key: &str, ts: &str, token: &str, event: &serde_json::Value) -> String {
        let mac = hex::encode(sig::hmac_sha256(
            key.as_bytes(),
            &[ts.as_bytes(), token.as_bytes()],
        ));
        serde_json::json!({
            "signature": {"timestamp": ts, "token": token, "signature": mac},
            "event-data": event,
        })
        .to_string()
    }

    /// A token unique to this test run, so the process-wide cache never interferes.
    fn fresh() -> String {
        hex::encode(rand::random::<[u8; 25]>())
    }

    fn verify_at(body: &str, t: &TenantConfig, now: i64) -> Result<Envelope, ProviderError> {
        let r = WebhookRequest::post(HeaderMap::new(), body.to_owned());
        crate::providers::test_support::verify_one(&Mailgun, &r, t, now)
    }

    fn verify(body: &str, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        verify_at(body, t, NOW)
    }

    #[test]
    fn docs_shape_and_envelope() {
        // The documented example triple: HMAC over "1529006854" + token, hex.
        let b = body("key-1", "1529006854", &fresh(), &event());
        let env = verify(&b, &tenant(&["key-1"])).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "mailgun".into(),
                tenant: "acme".into(),
                event_id: "CPgfbmQMTCKtHW6uIWtuVe".into(),
                event_type: "delivered".into(),
                object_id: Some("2018@example.com".into()),
                object_version: None,
                occurred_at: Some(1_529_006_854),
                delivery_id: None,
            }
        );
        // An independent spelling of the MAC input: no separator.
        let token = fresh();
        let mac = sig::hmac_sha256(b"key-1", &[format!("1529006854{token}").as_bytes()]);
        let b = format!(
            r#"{{"signature":{{"timestamp":1529006854,"token":"{token}","signature":"{}"}},"event-data":{{"id":"e1","event":"opened"}}}}"#,
            hex::encode(mac)
        );
        assert_eq!(verify(&b, &tenant(&["key-1"])).unwrap().event_id, "e1");
    }

    #[test]
    fn token_replay_is_rejected() {
        let t = tenant(&["key-1"]);
        let b = body("key-1", "1529006854", &fresh(), &event());
        assert!(verify(&b, &t).is_ok());
        let replay = verify(&b, &t).unwrap_err();
        assert_eq!(
            replay,
            ProviderError::MalformedHeader(TOKEN_NAME, "token was already used (replay)")
        );
        assert!(replay.is_authentication_failure());
        // The same token with other event data (the body is unsigned) is refused too.
        let token = fresh();
        assert!(verify(&body("key-1", "1529006854", &token, &event()), &t).is_ok());
        let forged = serde_json::json!({"id": "other", "event": "failed"});
        assert!(verify(&body("key-1", "1529006854", &token, &forged), &t).is_err());
        // Another tenant has its own cache entries.
        let mut other = tenant(&["key-1"]);
        other.tenant = "other".into();
        assert!(verify(&b, &other).is_ok());
        // Cache bookkeeping: expired entries are reusable, the map stays bounded.
        assert!(remember_token("x", "t", 10, 5));
        assert!(!remember_token("x", "t", 10, 10));
        assert!(remember_token("x", "t", 20, 11));
    }

    #[test]
    fn stale_and_future_timestamps() {
        let t = tenant(&["key-1"]);
        for now in [NOW + 301, NOW - 301] {
            let b = body("key-1", "1529006854", &fresh(), &event());
            assert_eq!(
                verify_at(&b, &t, now),
                Err(ProviderError::TimestampOutOfTolerance)
            );
        }
        let b = body("key-1", "1529006854", &fresh(), &event());
        assert!(verify_at(&b, &t, NOW + 300).is_ok());
    }

    #[test]
    fn tampered_wrong_key_rotation() {
        let b = body("key-1", "1529006854", &fresh(), &event());
        // The signed parts: timestamp and token.
        let tampered = b.replace(r#""timestamp":"1529006854""#, r#""timestamp":"1529006855""#);
        assert_ne!(tampered, b);
        assert_eq!(
            verify(&tampered, &tenant(&["key-1"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(&b, &tenant(&["key-2"])),
            Err(ProviderError::SignatureMismatch)
        );
        let both = tenant(&["new", "old"]);
        assert!(verify(&body("old", "1529006854", &fresh(), &event()), &both).is_ok());
        assert!(verify(&body("new", "1529006854", &fresh(), &event()), &both).is_ok());
        assert_eq!(verify(&b, &tenant(&[])), Err(ProviderError::NoSecret));
    }

    #[test]
    fn missing_and_garbled_signature() {
        let t = tenant(&["key-1"]);
        for b in [
            "",
            "not json",
            r#"{"event-data":{"id":"e"}}"#,
            r#"{"signature":{"timestamp":"1","token":"t"}}"#,
            r#"{"signature":"x"}"#,
        ] {
            assert_eq!(
                verify(b, &t),
                Err(ProviderError::MissingHeader(SIG_NAME)),
                "{b}"
            );
        }
        let cases = [
            (
                r#"{"signature":{"timestamp":"1","token":5,"signature":"00"}}"#,
                TOKEN_NAME,
            ),
            (
                r#"{"signature":{"timestamp":"1","token":"","signature":"00"}}"#,
                TOKEN_NAME,
            ),
            (
                r#"{"signature":{"timestamp":"1","token":"t","signature":"zz"}}"#,
                SIG_NAME,
            ),
            (
                r#"{"signature":{"timestamp":"1.5","token":"t","signature":"00"}}"#,
                TS_NAME,
            ),
            (
                r#"{"signature":{"timestamp":[1],"token":"t","signature":"00"}}"#,
                TS_NAME,
            ),
        ];
        for (b, name) in cases {
            let err = verify(b, &t).unwrap_err();
            assert!(
                matches!(err, ProviderError::MalformedHeader(n, _) if n == name),
                "{b}: {err:?}"
            );
        }
        // A second signature object after the first is never read: the first decides.
        let token = fresh();
        let good = body("key-1", "1529006854", &token, &event());
        let dup = good.replacen(
            '{',
            r#"{"signature":{"timestamp":"1","token":"t","signature":"00"},"#,
            1,
        );
        let err = verify(&dup, &t).unwrap_err();
        assert!(err.is_authentication_failure(), "{err:?}");
    }

    #[test]
    fn authentic_but_malformed() {
        let t = tenant(&["key-1"]);
        let b = body(
            "key-1",
            "1529006854",
            &fresh(),
            &serde_json::json!({"event": "x"}),
        );
        let err = verify(&b, &t).unwrap_err();
        assert_eq!(err, sig::payload_error("missing event-data.id"));
        assert!(!err.is_authentication_failure());
        let b = body(
            "key-1",
            "1529006854",
            &fresh(),
            &serde_json::json!({"id": "e"}),
        );
        assert_eq!(
            verify(&b, &t),
            Err(sig::payload_error("missing event-data.event"))
        );
    }

    #[test]
    fn sign_round_trip() {
        let t = tenant(&["new", "old"]);
        let b = signed_body(&event(), &t, NOW).unwrap();
        let h = Mailgun.sign(&b, &t, "", NOW).unwrap();
        let r = WebhookRequest::post(h, b.clone());
        let env = Mailgun.verify_and_extract(&r, &t, NOW).unwrap();
        assert_eq!(env[0].envelope.event_id, "CPgfbmQMTCKtHW6uIWtuVe");
        let b = signed_body(&event(), &t, NOW).unwrap();
        assert_eq!(
            verify(std::str::from_utf8(&b).unwrap(), &tenant(&["old"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            Mailgun.sign(b"{}", &tenant(&[]), "", NOW),
            Err(ProviderError::NoSecret)
        );
    }
}
