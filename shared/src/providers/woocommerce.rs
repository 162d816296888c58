//! WooCommerce: `X-WC-Webhook-Signature: base64(HMAC-SHA256(secret, raw body))`, where
//! the key is the secret after WordPress's `wp_specialchars_decode($secret, ENT_QUOTES)`
//! (so `&amp;`, `&lt;`, `&gt;`, `&quot;`, `&#039;` and their numeric spellings become
//! `&`, `<`, `>`, `"`, `'`). Nothing time-related is signed and WooCommerce never
//! retries, so replay protection is the dedup store.
//!
//! **Creation ping.** When a webhook is created WooCommerce POSTs the form body
//! `webhook_id=<n>` with no signature and requires exactly 200. Such a request (and
//! only that exact body shape, without a signature header) is accepted as an
//! event with id `ping:{n}` and type `ping`; the processor ignores unknown types. It
//! is unauthenticated by nature, carries no data, and is still checked against the
//! tenant option `webhook_id` when configured.
//!
//! Dedup id (there is no event id): `{X-WC-Webhook-Topic}:{payload.id}:{date_modified_gmt}`
//! (`{topic}:{id}` when the payload has no modification date, e.g. `*.deleted`; for
//! payloads without an `id`, such as `action.*` topics, `{topic}:sha256:{hex of body}`).
//! `X-WC-Webhook-Delivery-ID` is per attempt and only logged. Tenant checks (when
//! configured): option `source` = `X-WC-Webhook-Source` (trailing `/` ignored),
//! option `webhook_id` = `X-WC-Webhook-ID`.

use std::borrow::Cow;

use base64::Engine as _;
use http::HeaderName;
use sha2::{Digest, Sha256};

use super::json::{self, Raw};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct WooCommerce;

const SIGNATURE_NAME: &str = "x-wc-webhook-signature";
static SIGNATURE: HeaderName = HeaderName::from_static(SIGNATURE_NAME);
static TOPIC: HeaderName = HeaderName::from_static("x-wc-webhook-topic");
static RESOURCE: HeaderName = HeaderName::from_static("x-wc-webhook-resource");
static EVENT: HeaderName = HeaderName::from_static("x-wc-webhook-event");
static SOURCE: HeaderName = HeaderName::from_static("x-wc-webhook-source");
static WEBHOOK_ID: HeaderName = HeaderName::from_static("x-wc-webhook-id");
static DELIVERY: HeaderName = HeaderName::from_static("x-wc-webhook-delivery-id");

/// `wp_specialchars_decode($s, ENT_QUOTES)`: one left-to-right pass (like PHP's
/// `strtr`), so `&amp;lt;` becomes `&lt;`, not `<`.
pub fn wp_specialchars_decode(s: &str) -> Cow<'_, str> {
    if !s.contains('&') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        match decode_entity(rest) {
            Some((c, len)) => {
                out.push(c);
                rest = &rest[len..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// The entity at the start of `s` (which begins with `&`) and its length.
fn decode_entity(s: &str) -> Option<(char, usize)> {
    let end = s.find(';')?;
    let name = &s[1..end];
    let c = match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        _ => {
            let num = name.strip_prefix('#')?;
            let (digits, radix) = match num.strip_prefix(['x', 'X']) {
                Some(hex) => (hex, 16),
                None => (num, 10),
            };
            // WordPress only knows these code points, with any number of leading zeros.
            let allowed: &[u32] = if radix == 16 {
                &[0x27, 0x22, 0x26]
            } else {
                &[39, 34, 60, 62, 38]
            };
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            let trimmed = digits.trim_start_matches('0');
            if trimmed.len() > 2 || (radix == 10 && !trimmed.bytes().all(|b| b.is_ascii_digit())) {
                return None;
            }
            let n = u32::from_str_radix(trimmed, radix).ok()?;
            if !allowed.contains(&n) {
                return None;
            }
            char::from_u32(n)?
        }
    };
    Some((c, end + 1))
}

/// The creation ping's body: exactly `webhook_id=<digits>`.
fn ping_id(body: &[u8]) -> Option<&str> {
    let id = body.strip_prefix(b"webhook_id=")?;
    if id.is_empty() || id.len() > 20 || !id.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(id).ok()
}

fn check_webhook_id(tenant: &TenantConfig, got: Option<&str>) -> Result<(), ProviderError> {
    match tenant.option("webhook_id") {
        Some(want) if got != Some(want) => Err(ProviderError::TenantMismatch("X-WC-Webhook-ID")),
        _ => Ok(()),
    }
}

fn envelope(tenant: &TenantConfig, event_id: String, event_type: String) -> Envelope {
    Envelope {
        provider: "woocommerce".into(),
        tenant: tenant.tenant.clone(),
        event_id,
        event_type,
        object_id: None,
        object_version: None,
        occurred_at: None,
        delivery_id: None,
    }
}

fn extract(request: &WebhookRequest, tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    if let Some(want) = tenant.option("source") {
        let got = sig::single_header(request, &SOURCE)?;
        if got.map(|g| g.trim_end_matches('/')) != Some(want.trim_end_matches('/')) {
            return Err(ProviderError::TenantMismatch("X-WC-Webhook-Source"));
        }
    }
    check_webhook_id(tenant, sig::single_header(request, &WEBHOOK_ID)?)?;
    let topic = sig::single_header(request, &TOPIC)?
        .ok_or_else(|| sig::payload_error("missing X-WC-Webhook-Topic header"))?;
    let [id, modified] = json::json_fields(&request.body, [&["id"], &["date_modified_gmt"]])?;
    let id = id.and_then(Raw::text);
    let modified = modified.and_then(Raw::str).filter(|m| !m.is_empty());
    let event_id = match (&id, &modified) {
        (Some(id), Some(m)) => format!("{topic}:{id}:{m}"),
        (Some(id), None) => format!("{topic}:{id}"),
        (None, _) => format!(
            "{topic}:sha256:{}",
            hex::encode(Sha256::digest(&request.body))
        ),
    };
    sig::check_event_id(&event_id)?;
    let mut env = envelope(tenant, event_id, topic.to_owned());
    // `date_modified_gmt` is UTC without an offset, e.g. "2017-03-22T16:28:02".
    env.occurred_at = modified
        .as_deref()
        .and_then(|m| crate::time::parse_rfc3339(&format!("{m}Z")));
    env.object_id = id.map(Cow::into_owned);
    env.object_version = modified.map(Cow::into_owned);
    env.delivery_id = sig::single_header(request, &DELIVERY)?.map(str::to_owned);
    Ok(env)
}

impl Provider for WooCommerce {
    fn name(&self) -> &'static str {
        "woocommerce"
    }

    fn options(&self) -> &'static [&'static str] {
        &["topic", "source", "webhook_id"]
    }

    /// No retry.
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
        let mut candidates = Vec::with_capacity(1);
        for value in sig::header_values(request, &SIGNATURE) {
            let value = value?;
            if value.is_empty() {
                return Err(ProviderError::MalformedHeader(
                    SIGNATURE_NAME,
                    "empty value",
                ));
            }
            // API Gateway comma-joins repeats; base64 never contains a comma.
            for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                candidates.push(sig::decode_base64(SIGNATURE_NAME, part)?);
            }
        }
        if candidates.is_empty() {
            let Some(id) = ping_id(&request.body) else {
                return Err(ProviderError::MissingHeader(SIGNATURE_NAME));
            };
            check_webhook_id(tenant, Some(id))?;
            let env = envelope(tenant, format!("ping:{id}"), "ping".into());
            return Ok(VerifiedEvent::whole(env, request));
        }
        let body = &request.body[..];
        sig::verify_any(secrets, &candidates, |s| {
            let key = wp_specialchars_decode(s.expose());
            Some(sig::hmac_sha256(key.as_bytes(), &[body]))
        })?;
        let envelope = extract(request, tenant)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }

    /// Options: `topic` (default `order.updated`), `source`, `webhook_id` (default 1).
    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        _now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let secret = &sig::secrets(tenant)?[0];
        let key = wp_specialchars_decode(secret.expose());
        let mac = sig::hmac_sha256(key.as_bytes(), &[body]);
        let topic = tenant.option("topic").unwrap_or("order.updated");
        let (resource, event) = topic.split_once('.').unwrap_or((topic, ""));
        let mut h = http::HeaderMap::new();
        sig::put(&mut h, &SIGNATURE, &sig::B64.encode(mac))?;
        sig::put(&mut h, &TOPIC, topic)?;
        sig::put(&mut h, &RESOURCE, resource)?;
        if !event.is_empty() {
            sig::put(&mut h, &EVENT, event)?;
        }
        let source = tenant.option("source").unwrap_or("https://example.com/");
        sig::put(&mut h, &SOURCE, source)?;
        sig::put(
            &mut h,
            &WEBHOOK_ID,
            tenant.option("webhook_id").unwrap_or("1"),
        )?;
        sig::put(&mut h, &DELIVERY, event_id)?;
        sig::put(&mut h, &http::header::CONTENT_TYPE, "application/json")?;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use http::{HeaderMap, HeaderValue};

    const BODY: &str = r#"{"id":727,"status":"processing","date_modified_gmt":"2017-03-22T16:28:02","line_items":[{"id":315}]}"#;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        TenantConfig {
            provider: "woocommerce".into(),
            tenant: "shop".into(),
            secrets: secrets.iter().map(|s| Secret::new(*s)).collect(),
            tolerance_secs: 300,
            options: Default::default(),
        }
    }

    fn b64sig(key: &str, body: &str) -> String {
        sig::B64.encode(sig::hmac_sha256(key.as_bytes(), &[body.as_bytes()]))
    }

    fn headers(sigs: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for s in sigs {
            h.append("X-WC-Webhook-Signature", HeaderValue::from_str(s).unwrap());
        }
        h.insert(
            "X-WC-Webhook-Topic",
            HeaderValue::from_static("order.updated"),
        );
        h.insert(
            "X-WC-Webhook-Source",
            HeaderValue::from_static("https://shop.example/"),
        );
        h.insert("X-WC-Webhook-ID", HeaderValue::from_static("12"));
        h.insert(
            "X-WC-Webhook-Delivery-ID",
            HeaderValue::from_static("d41d8c"),
        );
        h
    }

    fn verify(h: HeaderMap, body: &str, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        let r = WebhookRequest::post(h, body.to_owned());
        crate::providers::test_support::verify_one(&WooCommerce, &r, t, 0)
    }

    #[test]
    fn extracts_composite_key() {
        let env = verify(headers(&[&b64sig("s", BODY)]), BODY, &tenant(&["s"])).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "woocommerce".into(),
                tenant: "shop".into(),
                event_id: "order.updated:727:2017-03-22T16:28:02".into(),
                event_type: "order.updated".into(),
                object_id: Some("727".into()),
                object_version: Some("2017-03-22T16:28:02".into()),
                occurred_at: Some(1_490_200_082),
                delivery_id: Some("d41d8c".into()),
            }
        );
        let deleted = r#"{"id":727}"#;
        let env = verify(headers(&[&b64sig("s", deleted)]), deleted, &tenant(&["s"])).unwrap();
        assert_eq!(env.event_id, "order.updated:727");
        let action = r#"{"action":"woocommerce_x","arg":5}"#;
        let env = verify(headers(&[&b64sig("s", action)]), action, &tenant(&["s"])).unwrap();
        assert!(
            env.event_id.starts_with("order.updated:sha256:"),
            "{}",
            env.event_id
        );
        assert_eq!(env.event_id.len(), "order.updated:sha256:".len() + 64);
    }

    #[test]
    fn entity_decoded_secret() {
        assert_eq!(wp_specialchars_decode("plain"), "plain");
        assert_eq!(
            wp_specialchars_decode("a&amp;b&lt;c&gt;d&quot;e&#039;f&#39;g&#x27;h&#X22;i&#0038;j"),
            "a&b<c>d\"e'f'g'h\"i&j"
        );
        // One pass only, and unknown entities stay.
        assert_eq!(wp_specialchars_decode("&amp;lt;"), "&lt;");
        assert_eq!(
            wp_specialchars_decode("&nbsp;&#65;&#x41;&#;&#x;&&amp"),
            "&nbsp;&#65;&#x41;&#;&#x;&&amp"
        );
        // WooCommerce signs with the decoded secret.
        let stored = "k&amp;y&#039;s&lt;";
        let s = b64sig("k&y's<", BODY);
        assert!(verify(headers(&[&s]), BODY, &tenant(&[stored])).is_ok());
        assert_eq!(
            verify(headers(&[&b64sig(stored, BODY)]), BODY, &tenant(&[stored])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn ping_is_accepted_unsigned() {
        let env = verify(HeaderMap::new(), "webhook_id=12", &tenant(&["s"])).unwrap();
        assert_eq!(
            (env.event_id.as_str(), env.event_type.as_str()),
            ("ping:12", "ping")
        );
        let mut t = tenant(&["s"]);
        t.options.insert("webhook_id".into(), "13".into());
        assert_eq!(
            verify(HeaderMap::new(), "webhook_id=12", &t),
            Err(ProviderError::TenantMismatch("X-WC-Webhook-ID"))
        );
        // Anything else unsigned is refused.
        for body in [
            "webhook_id=",
            "webhook_id=1&x=2",
            "webhook_id=abc",
            "",
            BODY,
        ] {
            assert_eq!(
                verify(HeaderMap::new(), body, &tenant(&["s"])),
                Err(ProviderError::MissingHeader(SIGNATURE_NAME)),
                "{body}"
            );
        }
    }

    #[test]
    fn tampered_wrong_secret_rotation() {
        let t = tenant(&["s"]);
        let s = b64sig("s", BODY);
        assert_eq!(
            verify(headers(&[&s]), &BODY.replace("727", "728"), &t),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(headers(&[&s]), BODY, &tenant(&["x"])),
            Err(ProviderError::SignatureMismatch)
        );
        let both = tenant(&["new", "old"]);
        assert!(verify(headers(&[&b64sig("old", BODY)]), BODY, &both).is_ok());
        assert!(verify(headers(&[&b64sig("new", BODY)]), BODY, &both).is_ok());
        let joined = format!("{},{}", b64sig("x", BODY), b64sig("old", BODY));
        assert!(verify(headers(&[&joined]), BODY, &both).is_ok());
        assert_eq!(
            verify(headers(&[&s]), BODY, &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn missing_and_garbled_headers() {
        let t = tenant(&["s"]);
        assert_eq!(
            verify(headers(&[]), BODY, &t),
            Err(ProviderError::MissingHeader(SIGNATURE_NAME))
        );
        for (v, why) in [
            (" ", "empty value"),
            ("!!!", "signature is not valid base64"),
            ("a", "signature is not valid base64"),
        ] {
            assert_eq!(
                verify(headers(&[v]), BODY, &t),
                Err(ProviderError::MalformedHeader(SIGNATURE_NAME, why)),
                "{v}"
            );
        }
        let mut h = headers(&[]);
        h.insert(
            "x-wc-webhook-signature",
            HeaderValue::from_bytes(b"\xffab").unwrap(),
        );
        assert!(matches!(
            verify(h, BODY, &t),
            Err(ProviderError::MalformedHeader(SIGNATURE_NAME, _))
        ));
        assert_eq!(
            verify(headers(&["AAAA"]), BODY, &t),
            Err(ProviderError::SignatureMismatch)
        );
        // Two different topics on an authentic request: ambiguous, not a panic.
        let mut h = headers(&[&b64sig("s", BODY)]);
        h.append(
            "x-wc-webhook-topic",
            HeaderValue::from_static("order.created"),
        );
        assert!(matches!(
            verify(h, BODY, &t),
            Err(ProviderError::MalformedHeader("x-wc-webhook-topic", _))
        ));
    }

    #[test]
    fn authentic_but_malformed() {
        let t = tenant(&["s"]);
        let err = verify(headers(&[&b64sig("s", "nope")]), "nope", &t).unwrap_err();
        assert_eq!(err, sig::payload_error("body is not a JSON object"));
        assert!(!err.is_authentication_failure());
        let mut h = headers(&[&b64sig("s", BODY)]);
        h.remove("x-wc-webhook-topic");
        assert_eq!(
            verify(h, BODY, &t),
            Err(sig::payload_error("missing X-WC-Webhook-Topic header"))
        );
    }

    #[test]
    fn tenant_mismatch() {
        let mut t = tenant(&["s"]);
        t.options
            .insert("source".into(), "https://shop.example".into());
        t.options.insert("webhook_id".into(), "12".into());
        let s = b64sig("s", BODY);
        assert!(verify(headers(&[&s]), BODY, &t).is_ok());
        let mut h = headers(&[&s]);
        h.insert(
            "x-wc-webhook-source",
            HeaderValue::from_static("https://evil.example/"),
        );
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::TenantMismatch("X-WC-Webhook-Source"))
        );
        let mut h = headers(&[&s]);
        h.insert("x-wc-webhook-id", HeaderValue::from_static("99"));
        assert_eq!(
            verify(h, BODY, &t),
            Err(ProviderError::TenantMismatch("X-WC-Webhook-ID"))
        );
    }

    #[test]
    fn sign_round_trip() {
        let mut t = tenant(&["n&amp;w", "old"]);
        t.options
            .insert("source".into(), "https://shop.example/".into());
        t.options.insert("topic".into(), "product.created".into());
        let h = WooCommerce.sign(BODY.as_bytes(), &t, "del-1", 0).unwrap();
        assert_eq!(h["x-wc-webhook-signature"], b64sig("n&w", BODY).as_str());
        assert_eq!(h["x-wc-webhook-resource"], "product");
        assert_eq!(h["x-wc-webhook-event"], "created");
        let env = verify(h.clone(), BODY, &t).unwrap();
        assert_eq!(env.event_id, "product.created:727:2017-03-22T16:28:02");
        assert_eq!(env.delivery_id.as_deref(), Some("del-1"));
        assert_eq!(
            verify(h, BODY, &tenant(&["old"])),
            Err(ProviderError::SignatureMismatch)
        );
    }
}
