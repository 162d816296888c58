//! Klarna (the new signed "Klarna webhooks" only; the unsigned KCO push is not
//! handled): `Klarna-Signature: <hex>` = HMAC-SHA256(signing key as UTF-8, raw body),
//! with `Klarna-Signing-Key-Id` naming the key. Lowercase hex comes from a partner
//! plugin and is UNCONFIRMED officially (either hex case is accepted). Nothing
//! time-related is signed.
//!
//! Secrets: a tenant secret written `keyid:secret` belongs to that key id. Entries
//! whose key id equals the header are tried (secret part only). If none matches (an
//! unknown key id, or secrets configured without ids) every entry is tried, both
//! whole and, when it has a colon, its part after the first colon. `sign()` splits
//! the first secret the same way and sends `default` as key id when it has none.
//!
//! Dedup on `metadata.event_id`; type `metadata.event_type`, occurred at
//! `metadata.occurred_at`. If the tenant option `subject_account_id` is set,
//! `metadata.subject_account_id` must equal it.

use http::HeaderName;

use super::plain_json::{PlainJson, TenantField};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::{Secret, TenantConfig};
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Klarna;

const HEADER: &str = "klarna-signature";
const KEY_ID_HEADER: &str = "klarna-signing-key-id";
static SIGNATURE: HeaderName = HeaderName::from_static(HEADER);
static KEY_ID: HeaderName = HeaderName::from_static(KEY_ID_HEADER);

/// Key id used by `sign()` when the first secret carries none.
pub const DEFAULT_KEY_ID: &str = "default";

/// `keyid:secret` → (Some(keyid), secret); anything else → (None, whole).
fn split(secret: &Secret) -> (Option<&str>, &str) {
    match secret.expose().split_once(':') {
        Some((kid, key)) if !kid.is_empty() && !key.is_empty() => (Some(kid), key),
        _ => (None, secret.expose()),
    }
}

fn verify(
    secrets: &[Secret],
    key_id: &str,
    candidates: &[Vec<u8>],
    body: &[u8],
) -> Result<(), ProviderError> {
    let matches = |expected: &[u8; 32]| candidates.iter().any(|c| sig::ct_eq(expected, c));
    let labelled: Vec<&str> = secrets
        .iter()
        .map(split)
        .filter(|(kid, _)| *kid == Some(key_id))
        .map(|(_, key)| key)
        .collect();
    if !labelled.is_empty() {
        let ok = labelled
            .iter()
            .any(|key| matches(&sig::hmac_sha256(key.as_bytes(), &[body])));
        return if ok {
            Ok(())
        } else {
            Err(ProviderError::SignatureMismatch)
        };
    }
    for secret in secrets {
        let whole = secret.expose();
        if matches(&sig::hmac_sha256(whole.as_bytes(), &[body])) {
            return Ok(());
        }
        if let (Some(_), key) = split(secret) {
            if matches(&sig::hmac_sha256(key.as_bytes(), &[body])) {
                return Ok(());
            }
        }
    }
    Err(ProviderError::SignatureMismatch)
}

static ENVELOPE: PlainJson = PlainJson {
    provider: "klarna",
    event_id: (
        &["metadata", "event_id"],
        "missing `metadata.event_id`",
        "`metadata.event_id` is not a string",
    ),
    event_type: (
        &[&["metadata", "event_type"]],
        "missing `metadata.event_type`",
    ),
    object_id: &[],
    occurred_at: Some(&["metadata", "occurred_at"]),
    delivery_id: None,
    tenant: Some(TenantField {
        option: "subject_account_id",
        path: &["metadata", "subject_account_id"],
        absent_passes: false,
    }),
};

fn extract(body: &[u8], tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    ENVELOPE.extract(body, tenant)
}

impl Provider for Klarna {
    fn name(&self) -> &'static str {
        "klarna"
    }

    fn options(&self) -> &'static [&'static str] {
        &["subject_account_id"]
    }

    /// Retries over about 21 h (10 s to 12 h).
    fn retry_window_days(&self) -> u32 {
        2
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        _now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let secrets = sig::secrets(tenant)?;
        let candidates = sig::hex_signatures(request, &SIGNATURE, "", false)?;
        let key_id = sig::single_header(request, &KEY_ID)?
            .ok_or(ProviderError::MissingHeader(KEY_ID_HEADER))?;
        verify(secrets, key_id, &candidates, &request.body)?;
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
        let (kid, key) = split(&sig::secrets(tenant)?[0]);
        let mac = hex::encode(sig::hmac_sha256(key.as_bytes(), &[body]));
        sig::json_headers(&[(&SIGNATURE, &mac), (&KEY_ID, kid.unwrap_or(DEFAULT_KEY_ID))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    const BODY: &str = r#"{"metadata":{"event_type":"payment.transaction.captured","event_id":"d9f9b1a0-5b1a-4b0e-9b0a-0b9b0a0b9b0a","event_version":"v1","occurred_at":"2024-01-01T12:00:00Z","subject_account_id":"krn:partner:global:account:live:AB12","recipient_account_id":"krn:partner:global:account:live:AB12","product_instance_id":"krn:x","webhook_id":"krn:wh","live":false},"payload":{"transaction_id":"t1"}}"#;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        crate::providers::test_support::tenant("klarna", secrets)
    }

    fn sig_for(key: &str, body: &str) -> String {
        hex::encode(sig::hmac_sha256(key.as_bytes(), &[body.as_bytes()]))
    }

    fn req(sigs: &[&str], kid: Option<&str>, body: &str) -> WebhookRequest {
        let mut h = HeaderMap::new();
        for v in sigs {
            h.append(HEADER, HeaderValue::from_str(v).unwrap());
        }
        if let Some(k) = kid {
            h.append(KEY_ID_HEADER, HeaderValue::from_str(k).unwrap());
        }
        WebhookRequest::post(h, body.to_owned())
    }

    fn signed(key: &str, kid: &str, body: &str) -> WebhookRequest {
        req(&[&sig_for(key, body)], Some(kid), body)
    }

    fn check(r: &WebhookRequest, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        crate::providers::test_support::verify_one(&Klarna, r, t, 0)
    }

    #[test]
    fn independent_hmac_vector() {
        // No published Klarna vector; lowercase hex HMAC-SHA256 over the raw body,
        // cross-checked with the GitHub docs vector (V1).
        let v1 = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(sig_for("It's a Secret to Everybody", "Hello, World!"), v1);
        let r = req(&[v1], Some("k1"), "Hello, World!");
        assert_eq!(
            check(&r, &tenant(&["k1:It's a Secret to Everybody"])),
            Err(sig::payload_error("body is not a JSON object"))
        );
    }

    #[test]
    fn extracts_envelope() {
        let env = check(&signed("key", "k1", BODY), &tenant(&["k1:key"])).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "klarna".into(),
                tenant: "acme".into(),
                event_id: "d9f9b1a0-5b1a-4b0e-9b0a-0b9b0a0b9b0a".into(),
                event_type: "payment.transaction.captured".into(),
                object_id: None,
                object_version: None,
                occurred_at: Some(1_704_110_400),
                delivery_id: None,
            }
        );
    }

    #[test]
    fn key_id_selects_the_secret() {
        let t = tenant(&["k1:one", "k2:two"]);
        assert!(check(&signed("one", "k1", BODY), &t).is_ok());
        assert!(check(&signed("two", "k2", BODY), &t).is_ok());
        // A labelled key id only ever uses its own secret.
        assert_eq!(
            check(&signed("two", "k1", BODY), &t),
            Err(ProviderError::SignatureMismatch)
        );
        // The label is not part of the key.
        assert_eq!(
            check(&signed("k1:one", "k1", BODY), &t),
            Err(ProviderError::SignatureMismatch)
        );
        // Unknown key id: every secret is tried.
        assert!(check(&signed("two", "k9", BODY), &t).is_ok());
        // Secrets without ids: tried whole, whatever the key id.
        let plain = tenant(&["old", "new"]);
        assert!(check(&signed("new", "anything", BODY), &plain).is_ok());
        // A plain secret that contains a colon still works via the fallback.
        let colon = tenant(&["ab:cd"]);
        assert!(check(&signed("ab:cd", "k1", BODY), &colon).is_ok());
    }

    #[test]
    fn rotation_old_and_new_and_two_signatures() {
        let t = tenant(&["k2:new", "k1:old"]);
        assert!(check(&signed("old", "k1", BODY), &t).is_ok());
        assert!(check(&signed("new", "k2", BODY), &t).is_ok());
        let (old, new) = (sig_for("old", BODY), sig_for("new", BODY));
        let both = req(&[&old, &new], Some("k2"), BODY);
        assert!(check(&both, &t).is_ok());
        let joined = req(&[&format!("{old},{new}")], Some("k1"), BODY);
        assert!(check(&joined, &t).is_ok());
        assert_eq!(
            check(&both, &tenant(&["x"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn tampered_body_and_wrong_secret() {
        let t = tenant(&["k1:key"]);
        let s = sig_for("key", BODY);
        let tampered = BODY.replace("captured", "refunded");
        assert_eq!(
            check(&req(&[&s], Some("k1"), &tampered), &t),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            check(&signed("other", "k1", BODY), &t),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn missing_garbled_and_duplicated_headers() {
        let t = tenant(&["k1:key"]);
        let good = sig_for("key", BODY);
        assert_eq!(
            check(&req(&[], Some("k1"), BODY), &t),
            Err(ProviderError::MissingHeader(HEADER))
        );
        assert_eq!(
            check(&req(&[&good], None, BODY), &t),
            Err(ProviderError::MissingHeader(KEY_ID_HEADER))
        );
        for (h, why) in [
            ("", "empty value"),
            ("abc", "signature is not valid hex"),
            ("not-hex!", "signature is not valid hex"),
        ] {
            assert_eq!(
                check(&req(&[h], Some("k1"), BODY), &t),
                Err(ProviderError::MalformedHeader(HEADER, why)),
                "{h}"
            );
        }
        let mut r = req(&[&good], Some("k1"), BODY);
        r.headers
            .append(KEY_ID_HEADER, HeaderValue::from_static("k2"));
        assert_eq!(
            check(&r, &t),
            Err(ProviderError::MalformedHeader(
                KEY_ID_HEADER,
                "repeated with different values"
            ))
        );
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_bytes(b"\xff").unwrap());
        h.insert(KEY_ID_HEADER, HeaderValue::from_static("k1"));
        assert_eq!(
            check(&WebhookRequest::post(h, BODY), &t),
            Err(ProviderError::MalformedHeader(
                HEADER,
                "value is not visible ASCII"
            ))
        );
        assert!(check(&req(&[&good, &good], Some("k1"), BODY), &t).is_ok());
        assert_eq!(
            check(&signed("key", "k1", BODY), &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn authentic_but_malformed_payloads() {
        let t = tenant(&["k1:key"]);
        let run = |body: &str, want: ProviderError| {
            let got = check(&signed("key", "k1", body), &t);
            assert!(!want.is_authentication_failure());
            assert_eq!(got, Err(want), "{body}");
        };
        run("[1]", sig::payload_error("body is not a JSON object"));
        run(
            r#"{"metadata":{"event_type":"x"}}"#,
            sig::payload_error("missing `metadata.event_id`"),
        );
        run(
            r#"{"event_id":"top-level","event_type":"x"}"#,
            sig::payload_error("missing `metadata.event_id`"),
        );
        run(
            r#"{"metadata":{"event_id":null,"event_type":"x"}}"#,
            sig::payload_error("`metadata.event_id` is not a string"),
        );
        run(
            r#"{"metadata":{"event_id":"e1"}}"#,
            sig::payload_error("missing `metadata.event_type`"),
        );
    }

    #[test]
    fn subject_account_must_match_tenant_option() {
        let mut t = tenant(&["k1:key"]);
        t.options.insert(
            "subject_account_id".into(),
            "krn:partner:global:account:live:AB12".into(),
        );
        assert!(check(&signed("key", "k1", BODY), &t).is_ok());
        t.options
            .insert("subject_account_id".into(), "krn:other".into());
        assert_eq!(
            check(&signed("key", "k1", BODY), &t),
            Err(ProviderError::TenantMismatch("subject_account_id"))
        );
    }

    #[test]
    fn event_id_stable_across_retries_and_sign_round_trip() {
        let t = tenant(&["k2:new", "k1:old"]);
        let h = Klarna.sign(BODY.as_bytes(), &t, "", 0).unwrap();
        assert_eq!(h[KEY_ID_HEADER], "k2");
        let r = WebhookRequest::post(h, BODY);
        let a = check(&r, &t).unwrap();
        // A retry is the same bytes with the same headers; the clock does not matter.
        let b = Klarna.verify_and_extract(&r, &t, 1_000_000).unwrap();
        assert_eq!(a.key(), b[0].envelope.key());
        assert_eq!(
            check(&r, &tenant(&["k2:old"])),
            Err(ProviderError::SignatureMismatch)
        );
        let plain = Klarna
            .sign(BODY.as_bytes(), &tenant(&["s"]), "", 0)
            .unwrap();
        assert_eq!(plain[KEY_ID_HEADER], DEFAULT_KEY_ID);
        assert!(check(&WebhookRequest::post(plain, BODY), &tenant(&["s"])).is_ok());
        assert_eq!(
            Klarna.sign(b"{}", &tenant(&[]), "", 0).unwrap_err(),
            ProviderError::NoSecret
        );
    }
}
