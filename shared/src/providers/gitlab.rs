//! GitLab: `X-Gitlab-Token: <secret>` (the configured secret in plain text, compared in
//! constant time with every configured secret), or, when GitLab's signing token is
//! enabled, Standard Webhooks headers: `webhook-id`, `webhook-timestamp` and
//! `webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{ts}.{raw body}")>` (±tolerance).
//!
//! When any `webhook-signature` header is present, that signature must hold (a
//! failing signature is never rescued by a token). The signing token's key encoding
//! is unconfirmed, so a secret starting with `whsec_` is base64-decoded after the
//! prefix (the Standard Webhooks convention) and any other secret is used as UTF-8.
//! Tenant option `require_signature = "true"` refuses token-only requests.
//!
//! Dedup id: `Idempotency-Key` (stable across retries and manual resends; falls back
//! to `webhook-id`, which GitLab sets to the same value). `X-Gitlab-Webhook-UUID` is
//! per request and only logged. Type: `X-Gitlab-Event`, else body `object_kind`.
//! Tenant checks (when configured): option `instance` = `X-Gitlab-Instance`, option
//! `project_id` = body `project.id` (or `project_id`).

use std::borrow::Cow;

use base64::Engine as _;
use http::HeaderName;

use super::json::{self, Raw};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::{Secret, TenantConfig};
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct GitLab;

const TOKEN_NAME: &str = "x-gitlab-token";
const SIGNATURE_NAME: &str = "webhook-signature";
static TOKEN: HeaderName = HeaderName::from_static(TOKEN_NAME);
static SW_ID: HeaderName = HeaderName::from_static("webhook-id");
static SW_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
static SW_SIGNATURE: HeaderName = HeaderName::from_static(SIGNATURE_NAME);
static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
static EVENT: HeaderName = HeaderName::from_static("x-gitlab-event");
static INSTANCE: HeaderName = HeaderName::from_static("x-gitlab-instance");
static WEBHOOK_UUID: HeaderName = HeaderName::from_static("x-gitlab-webhook-uuid");

/// The signing key of one secret (see the module docs); `None` if a `whsec_` secret
/// does not decode.
fn signing_key(secret: &Secret) -> Option<Cow<'_, [u8]>> {
    let s = secret.expose();
    match s.strip_prefix("whsec_") {
        Some(b64) => sig::B64
            .decode(b64.trim())
            .ok()
            .filter(|k| !k.is_empty())
            .map(Cow::Owned),
        None => Some(Cow::Borrowed(s.as_bytes())),
    }
}

/// Verify the Standard Webhooks signature; returns `webhook-id`.
fn verify_signed<'a>(
    request: &'a WebhookRequest,
    secrets: &[Secret],
    tolerance: u64,
    now_secs: i64,
) -> Result<&'a str, ProviderError> {
    let id =
        sig::single_header(request, &SW_ID)?.ok_or(ProviderError::MissingHeader("webhook-id"))?;
    let ts = sig::single_header(request, &SW_TIMESTAMP)?
        .ok_or(ProviderError::MissingHeader("webhook-timestamp"))?;
    let ts = sig::parse_unix("webhook-timestamp", ts)?;
    let candidates = sig::standard_v1_signatures(request, &SW_SIGNATURE)?;
    sig::verify_standard(
        secrets,
        &candidates,
        (id, ts),
        (now_secs, tolerance),
        &request.body,
        signing_key,
    )?;
    Ok(id)
}

/// Constant-time comparison of `X-Gitlab-Token` with every configured secret.
fn verify_token(request: &WebhookRequest, secrets: &[Secret]) -> Result<(), ProviderError> {
    let mut found = false;
    for value in sig::header_values(request, &TOKEN) {
        let value = value?;
        if value.is_empty() {
            return Err(ProviderError::MalformedHeader(TOKEN_NAME, "empty value"));
        }
        found = true;
        // Every value must match: a repeated header cannot smuggle a guess past a good one.
        let matches = secrets.iter().fold(false, |m, s| {
            m | sig::ct_eq(s.expose().as_bytes(), value.as_bytes())
        });
        if !matches {
            return Err(ProviderError::SignatureMismatch);
        }
    }
    if !found {
        return Err(ProviderError::MissingHeader(TOKEN_NAME));
    }
    Ok(())
}

fn extract(
    request: &WebhookRequest,
    tenant: &TenantConfig,
    sw_id: Option<&str>,
) -> Result<Envelope, ProviderError> {
    let id = match sig::single_header(request, &IDEMPOTENCY_KEY)? {
        Some(k) => k,
        None => sw_id.ok_or_else(|| sig::payload_error("missing Idempotency-Key header"))?,
    };
    sig::check_event_id(id)?;
    if let Some(want) = tenant.option("instance") {
        let got = sig::single_header(request, &INSTANCE)?;
        if got.map(|g| g.trim_end_matches('/')) != Some(want.trim_end_matches('/')) {
            return Err(ProviderError::TenantMismatch("X-Gitlab-Instance"));
        }
    }
    let [kind, project_id, project_id_flat, attr_id, updated] = json::json_fields(
        &request.body,
        [
            &["object_kind"],
            &["project", "id"],
            &["project_id"],
            &["object_attributes", "id"],
            &["object_attributes", "updated_at"],
        ],
    )?;
    let project = project_id
        .and_then(Raw::text)
        .or_else(|| project_id_flat.and_then(Raw::text));
    if let Some(want) = tenant.option("project_id") {
        if project.as_deref() != Some(want) {
            return Err(ProviderError::TenantMismatch("project.id"));
        }
    }
    let event_type = match sig::single_header(request, &EVENT)? {
        Some(event) => event.to_owned(),
        None => kind
            .and_then(Raw::str)
            .filter(|k| !k.is_empty())
            .map(Cow::into_owned)
            .ok_or_else(|| sig::payload_error("no X-Gitlab-Event header and no object_kind"))?,
    };
    let object_id = attr_id.and_then(Raw::text).or(project);
    // GitLab's own `updated_at` format ("2024-01-01 10:00:00 UTC") is not RFC 3339;
    // keep it as a version string only.
    let object_version = updated.and_then(Raw::str).map(Cow::into_owned);
    let delivery = sig::single_header(request, &WEBHOOK_UUID)?;
    Ok(Envelope {
        provider: "gitlab".into(),
        tenant: tenant.tenant.clone(),
        event_id: id.to_owned(),
        event_type,
        object_id: object_id.map(Cow::into_owned),
        object_version,
        occurred_at: None,
        delivery_id: delivery.map(str::to_owned),
    })
}

impl Provider for GitLab {
    fn name(&self) -> &'static str {
        "gitlab"
    }

    fn options(&self) -> &'static [&'static str] {
        &[
            "instance",
            "project_id",
            "require_signature",
            "sign_mode",
            "event",
        ]
    }

    /// No automatic re-send.
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
        let sw_id = if request.headers.contains_key(&SW_SIGNATURE) {
            Some(verify_signed(
                request,
                secrets,
                tenant.tolerance_secs,
                now_secs,
            )?)
        } else if tenant.option("require_signature") == Some("true") {
            return Err(ProviderError::MissingHeader(SIGNATURE_NAME));
        } else {
            verify_token(request, secrets)?;
            None
        };
        let envelope = extract(request, tenant, sw_id)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }

    /// Token mode by default; with tenant option `sign_mode = "standard-webhooks"` the
    /// Standard Webhooks headers are emitted as well (the token too).
    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let secret = &sig::secrets(tenant)?[0];
        let mut h = http::HeaderMap::new();
        sig::put(&mut h, &TOKEN, secret.expose())?;
        if tenant.option("sign_mode") == Some("standard-webhooks") {
            let key = signing_key(secret).ok_or(ProviderError::NoSecret)?;
            let (ts, signature) = sig::sign_standard(&key, event_id, body, now_secs);
            sig::put(&mut h, &SW_ID, event_id)?;
            sig::put(&mut h, &SW_TIMESTAMP, &ts)?;
            sig::put(&mut h, &SW_SIGNATURE, &signature)?;
        }
        sig::put(&mut h, &IDEMPOTENCY_KEY, event_id)?;
        sig::put(
            &mut h,
            &EVENT,
            tenant.option("event").unwrap_or("Push Hook"),
        )?;
        if let Some(instance) = tenant.option("instance") {
            sig::put(&mut h, &INSTANCE, instance)?;
        }
        let uuid = hex::encode(rand::random::<[u8; 16]>());
        sig::put(&mut h, &WEBHOOK_UUID, &uuid)?;
        sig::put(&mut h, &http::header::CONTENT_TYPE, "application/json")?;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    const KEY: &str = "6f2c1a2b-idem-key";
    const BODY: &str = r#"{"object_kind":"merge_request","project":{"id":15,"name":"x"},"object_attributes":{"id":99,"updated_at":"2024-01-01 10:00:00 UTC"}}"#;
    const NOW: i64 = 1_700_000_000;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        crate::providers::test_support::tenant("gitlab", secrets)
    }

    fn headers(token: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(t) = token {
            h.insert("X-Gitlab-Token", HeaderValue::from_str(t).unwrap());
        }
        h.insert("Idempotency-Key", HeaderValue::from_static(KEY));
        h.insert(
            "X-Gitlab-Event",
            HeaderValue::from_static("Merge Request Hook"),
        );
        h.insert(
            "X-Gitlab-Instance",
            HeaderValue::from_static("https://gitlab.com"),
        );
        h.insert("X-Gitlab-Webhook-UUID", HeaderValue::from_static("uuid-1"));
        h
    }

    fn sw_sig(key: &[u8], id: &str, ts: i64, body: &str) -> String {
        let mac = sig::hmac_sha256(
            key,
            &[
                id.as_bytes(),
                b".",
                ts.to_string().as_bytes(),
                b".",
                body.as_bytes(),
            ],
        );
        format!("v1,{}", sig::B64.encode(mac))
    }

    fn sw_headers(id: &str, ts: i64, sigs: &[&str]) -> HeaderMap {
        let mut h = headers(None);
        h.insert("webhook-id", HeaderValue::from_str(id).unwrap());
        h.insert(
            "webhook-timestamp",
            HeaderValue::from_str(&ts.to_string()).unwrap(),
        );
        for s in sigs {
            h.append("webhook-signature", HeaderValue::from_str(s).unwrap());
        }
        h
    }

    fn verify(h: HeaderMap, body: &str, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        let r = WebhookRequest::post(h, body.to_owned());
        crate::providers::test_support::verify_one(&GitLab, &r, t, NOW)
    }

    #[test]
    fn token_mode_extracts_envelope() {
        let env = verify(headers(Some("tok")), BODY, &tenant(&["tok"])).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "gitlab".into(),
                tenant: "acme".into(),
                event_id: KEY.into(),
                event_type: "Merge Request Hook".into(),
                object_id: Some("99".into()),
                object_version: Some("2024-01-01 10:00:00 UTC".into()),
                occurred_at: None,
                delivery_id: Some("uuid-1".into()),
            }
        );
        // Without X-Gitlab-Event the body's object_kind is the type.
        let mut h = headers(Some("tok"));
        h.remove("x-gitlab-event");
        let body = r#"{"object_kind":"push","project_id":7}"#;
        let env = verify(h, body, &tenant(&["tok"])).unwrap();
        assert_eq!(
            (env.event_type.as_str(), env.object_id.as_deref()),
            ("push", Some("7"))
        );
    }

    #[test]
    fn token_wrong_rotated_and_missing() {
        assert_eq!(
            verify(headers(Some("nope")), BODY, &tenant(&["tok"])),
            Err(ProviderError::SignatureMismatch)
        );
        // Prefix and extension of the secret fail too.
        for t in ["to", "tokk", "TOK"] {
            assert_eq!(
                verify(headers(Some(t)), BODY, &tenant(&["tok"])),
                Err(ProviderError::SignatureMismatch)
            );
        }
        let both = tenant(&["new", "old"]);
        assert!(verify(headers(Some("old")), BODY, &both).is_ok());
        assert!(verify(headers(Some("new")), BODY, &both).is_ok());
        assert_eq!(
            verify(headers(None), BODY, &both),
            Err(ProviderError::MissingHeader(TOKEN_NAME))
        );
        assert_eq!(
            verify(headers(Some("tok")), BODY, &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
        let mut t = tenant(&["tok"]);
        t.options.insert("require_signature".into(), "true".into());
        assert_eq!(
            verify(headers(Some("tok")), BODY, &t),
            Err(ProviderError::MissingHeader(SIGNATURE_NAME))
        );
    }

    #[test]
    fn garbled_and_duplicated_headers_never_panic() {
        let t = tenant(&["tok"]);
        // Repeated token: every value must match.
        let mut h = headers(Some("tok"));
        h.append("x-gitlab-token", HeaderValue::from_static("guess"));
        assert_eq!(verify(h, BODY, &t), Err(ProviderError::SignatureMismatch));
        let mut h = headers(Some("guess"));
        h.append("x-gitlab-token", HeaderValue::from_static("tok"));
        assert_eq!(verify(h, BODY, &t), Err(ProviderError::SignatureMismatch));
        let mut h = headers(Some("tok"));
        h.append("x-gitlab-token", HeaderValue::from_static("tok"));
        assert!(verify(h, BODY, &t).is_ok());
        let mut h = headers(None);
        h.insert(
            "x-gitlab-token",
            HeaderValue::from_bytes(b"\xfftok").unwrap(),
        );
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::MalformedHeader(
                TOKEN_NAME,
                "value is not visible ASCII"
            ))
        );
        let mut h = headers(None);
        h.insert("x-gitlab-token", HeaderValue::from_static(" "));
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::MalformedHeader(TOKEN_NAME, "empty value"))
        );
        // Two different idempotency keys: authentic but ambiguous.
        let mut h = headers(Some("tok"));
        h.append("idempotency-key", HeaderValue::from_static("other"));
        assert!(matches!(
            verify(h, BODY, &t),
            Err(ProviderError::MalformedHeader("idempotency-key", _))
        ));
        // Garbled Standard Webhooks headers.
        for s in ["", "v1", "v1,!!!", "v2,abc", "v1,AAAA,v1"] {
            let h = sw_headers(KEY, NOW, &[s]);
            let err = verify(h, BODY, &t).unwrap_err();
            assert!(
                matches!(err, ProviderError::MalformedHeader(SIGNATURE_NAME, _)),
                "{s}: {err:?}"
            );
        }
        let mut h = sw_headers(KEY, NOW, &[&sw_sig(b"tok", KEY, NOW, BODY)]);
        h.insert("webhook-timestamp", HeaderValue::from_static("12x"));
        assert!(matches!(
            verify(h, BODY, &t),
            Err(ProviderError::MalformedHeader("webhook-timestamp", _))
        ));
    }

    #[test]
    fn standard_webhooks_mode() {
        let t = tenant(&["signing-token"]);
        let good = sw_sig(b"signing-token", KEY, NOW, BODY);
        let env = verify(sw_headers(KEY, NOW, &[&good]), BODY, &t).unwrap();
        assert_eq!(env.event_id, KEY);
        // A whsec_ secret is base64-decoded (V3 Standard Webhooks vector's key).
        let v3 = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let key = sig::B64.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            sw_sig(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                r#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        let s = sw_sig(&key, KEY, NOW, BODY);
        assert!(verify(sw_headers(KEY, NOW, &[&s]), BODY, &tenant(&[v3])).is_ok());
        // Tampered body, wrong secret, stale and future timestamps.
        assert_eq!(
            verify(
                sw_headers(KEY, NOW, &[&good]),
                &BODY.replace("15", "16"),
                &t
            ),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(sw_headers(KEY, NOW, &[&good]), BODY, &tenant(&["other"])),
            Err(ProviderError::SignatureMismatch)
        );
        for ts in [NOW - 301, NOW + 301] {
            let s = sw_sig(b"signing-token", KEY, ts, BODY);
            assert_eq!(
                verify(sw_headers(KEY, ts, &[&s]), BODY, &t),
                Err(ProviderError::TimestampOutOfTolerance)
            );
        }
        // A valid token does not rescue a bad signature.
        let mut h = sw_headers(KEY, NOW, &["v1,AAAA"]);
        h.insert("x-gitlab-token", HeaderValue::from_static("signing-token"));
        assert_eq!(verify(h, BODY, &t), Err(ProviderError::SignatureMismatch));
        // Rotation: several signatures and several secrets.
        let old = sw_sig(b"old", KEY, NOW, BODY);
        let joined = format!("v1,AAAA {old}");
        assert!(verify(
            sw_headers(KEY, NOW, &[&joined]),
            BODY,
            &tenant(&["new", "old"])
        )
        .is_ok());
        // Missing webhook-id.
        let mut h = sw_headers(KEY, NOW, &[&good]);
        h.remove("webhook-id");
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::MissingHeader("webhook-id"))
        );
        // Idempotency-Key absent: webhook-id is the event id.
        let mut h = sw_headers("wh-1", NOW, &[&sw_sig(b"signing-token", "wh-1", NOW, BODY)]);
        h.remove("idempotency-key");
        assert_eq!(verify(h, BODY, &t).unwrap().event_id, "wh-1");
    }

    #[test]
    fn authentic_but_malformed() {
        let t = tenant(&["tok"]);
        let mut h = headers(Some("tok"));
        h.remove("idempotency-key");
        let err = verify(h, BODY, &t).unwrap_err();
        assert_eq!(err, sig::payload_error("missing Idempotency-Key header"));
        assert!(!err.is_authentication_failure());
        // The UUID is never used as the event id.
        assert_eq!(
            verify(headers(Some("tok")), "not json", &t),
            Err(sig::payload_error("body is not a JSON object"))
        );
        let mut h = headers(Some("tok"));
        h.remove("x-gitlab-event");
        assert_eq!(
            verify(h, r#"{"project_id":1}"#, &t),
            Err(sig::payload_error(
                "no X-Gitlab-Event header and no object_kind"
            ))
        );
    }

    #[test]
    fn tenant_mismatch() {
        let mut t = tenant(&["tok"]);
        t.options
            .insert("instance".into(), "https://gitlab.com/".into());
        t.options.insert("project_id".into(), "15".into());
        assert!(verify(headers(Some("tok")), BODY, &t).is_ok());
        let mut h = headers(Some("tok"));
        h.insert(
            "x-gitlab-instance",
            HeaderValue::from_static("https://evil.example"),
        );
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::TenantMismatch("X-Gitlab-Instance"))
        );
        let mut h = headers(Some("tok"));
        h.remove("x-gitlab-instance");
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::TenantMismatch("X-Gitlab-Instance"))
        );
        assert_eq!(
            verify(headers(Some("tok")), &BODY.replace(":15", ":16"), &t),
            Err(ProviderError::TenantMismatch("project.id"))
        );
    }

    #[test]
    fn sign_round_trip() {
        let mut t = tenant(&["new", "old"]);
        t.options
            .insert("instance".into(), "https://gitlab.example".into());
        let h = GitLab.sign(BODY.as_bytes(), &t, "k-1", NOW).unwrap();
        assert_eq!(h["x-gitlab-token"], "new");
        let env = verify(h.clone(), BODY, &t).unwrap();
        assert_eq!(
            (env.event_id.as_str(), env.event_type.as_str()),
            ("k-1", "Push Hook")
        );
        assert_eq!(
            verify(h, BODY, &tenant(&["old"])),
            Err(ProviderError::SignatureMismatch)
        );
        t.options
            .insert("sign_mode".into(), "standard-webhooks".into());
        let mut h = GitLab.sign(BODY.as_bytes(), &t, "k-2", NOW).unwrap();
        h.remove("x-gitlab-token");
        assert_eq!(verify(h.clone(), BODY, &t).unwrap().event_id, "k-2");
        assert_eq!(
            verify(h, BODY, &tenant(&["old"])),
            Err(ProviderError::SignatureMismatch)
        );
    }
}
