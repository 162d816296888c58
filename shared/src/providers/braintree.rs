//! Braintree: a form POST with `bt_signature` and `bt_payload` (base64 XML, with
//! newlines). `bt_signature` is `public_key|hex(HMAC-SHA1(SHA1(private_key), bt_payload))`,
//! possibly several such pairs joined with `&` (key rotation); the payload with a
//! trailing `"\n"` is accepted too, as the official SDK does. The tenant's configured
//! secrets are its private keys, and option `public_key` lists its public key(s)
//! (comma-separated); only pairs for those public keys are considered, each against
//! every private key. The payload must match `[A-Za-z0-9+=/\n]` like the SDK requires.
//!
//! Nothing time-related is signed, and there is no event id: the dedup id is
//! `{kind}:{subject id}:{timestamp}` from the decoded XML (`<notification><kind/>
//! <timestamp/><subject><X><id/>…`), read with a tiny targeted tag scanner. A subject
//! without an `<id>` (e.g. `check`) uses its element name. Tenant: the public key
//! pairing, plus option `source_merchant_id` = `<source-merchant-id>` when configured.
//! The GET `bt_challenge` URL verification is not handled here (it needs a response
//! body, not events). As for every body-signed scheme, [`Provider::sign`] only sets
//! the content type; build signed bodies with [`signed_form`].

use std::borrow::Cow;

use base64::Engine as _;
use sha1::{Digest, Sha1};

use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::{Secret, TenantConfig};
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Braintree;

const SIGNATURE_NAME: &str = "bt_signature";
const PAYLOAD_NAME: &str = "bt_payload";

/// The HMAC key: the raw SHA-1 digest of the private key.
fn key(secret: &Secret) -> [u8; 20] {
    Sha1::digest(secret.expose().as_bytes()).into()
}

/// `public_key|hex(HMAC-SHA1(SHA1(private_key), data))`, as the SDK signs challenges
/// and test payloads.
pub fn sign_pair(public_key: &str, private_key: &Secret, data: &[u8]) -> String {
    let mac = sig::hmac_sha1(&key(private_key), &[data]);
    format!("{public_key}|{}", hex::encode(mac))
}

/// A form body as Braintree posts it for `xml`, signed with the tenant's first
/// private key and first public key.
pub fn signed_form(xml: &str, tenant: &TenantConfig) -> Result<Vec<u8>, ProviderError> {
    let secret = &sig::secrets(tenant)?[0];
    let public_key = public_keys(tenant)?.next().ok_or(ProviderError::NoSecret)?;
    // `encodebytes`: base64 in lines of 76 characters, each ending in "\n".
    let b64 = sig::B64.encode(xml.as_bytes());
    let mut payload = String::with_capacity(b64.len() + b64.len() / 76 + 1);
    for chunk in b64.as_bytes().chunks(76) {
        payload.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        payload.push('\n');
    }
    let signature = sign_pair(public_key, secret, payload.as_bytes());
    Ok(form_urlencoded::Serializer::new(String::new())
        .append_pair(SIGNATURE_NAME, &signature)
        .append_pair(PAYLOAD_NAME, &payload)
        .finish()
        .into_bytes())
}

fn public_keys(tenant: &TenantConfig) -> Result<impl Iterator<Item = &str>, ProviderError> {
    let keys = tenant.option("public_key").ok_or(ProviderError::NoSecret)?;
    Ok(keys.split(',').map(str::trim).filter(|k| !k.is_empty()))
}

/// The single value of a form field; repeats with different values are refused.
fn field(body: &[u8], name: &'static str) -> Result<Option<String>, ProviderError> {
    let mut found: Option<Cow<'_, str>> = None;
    for (k, v) in form_urlencoded::parse(body) {
        if k == name {
            match &found {
                Some(prev) if *prev != v => {
                    return Err(ProviderError::MalformedHeader(
                        name,
                        "repeated with different values",
                    ))
                }
                _ => found = Some(v),
            }
        }
    }
    Ok(found.map(Cow::into_owned))
}

/// Tag-level scan of `xml`: the texts at `notification/kind`, `notification/timestamp`,
/// `notification/source-merchant-id`, and the subject's first child (name and `id`).
#[derive(Default, Debug, PartialEq, Eq)]
struct Notification {
    kind: Option<String>,
    timestamp: Option<String>,
    source_merchant_id: Option<String>,
    subject_child: Option<String>,
    subject_id: Option<String>,
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
        .trim()
        .to_owned()
}

fn scan(xml: &str) -> Result<Notification, ProviderError> {
    let bad = || sig::payload_error("bt_payload is not well-formed notification XML");
    let mut out = Notification::default();
    let mut stack: Vec<&str> = Vec::with_capacity(8);
    let mut rest = xml;
    let mut text_start: Option<&str> = None;
    while let Some(lt) = rest.find('<') {
        let text = &rest[..lt];
        rest = &rest[lt..];
        if let Some(special) = rest.strip_prefix("<?") {
            rest = &special[special.find("?>").ok_or_else(bad)? + 2..];
            continue;
        }
        if let Some(comment) = rest.strip_prefix("<!--") {
            rest = &comment[comment.find("-->").ok_or_else(bad)? + 3..];
            continue;
        }
        let gt = rest.find('>').ok_or_else(bad)?;
        let tag = &rest[1..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            if stack.pop() != Some(name.trim()) {
                return Err(bad());
            }
            // A leaf's text: the text right before its closing tag.
            if text_start.take().is_some() {
                let value = unescape(text);
                let path: Vec<&str> = stack.iter().copied().chain([name.trim()]).collect();
                match path.as_slice() {
                    ["notification", "kind"] => out.kind = Some(value),
                    ["notification", "timestamp"] => out.timestamp = Some(value),
                    ["notification", "source-merchant-id"] => out.source_merchant_id = Some(value),
                    ["notification", "subject", child, "id"]
                        if out.subject_child.as_deref() == Some(*child)
                            && out.subject_id.is_none() =>
                    {
                        out.subject_id = Some(value)
                    }
                    _ => {}
                }
            }
            continue;
        }
        let self_closing = tag.ends_with('/');
        let name = tag
            .trim_end_matches('/')
            .split_ascii_whitespace()
            .next()
            .ok_or_else(bad)?;
        if stack.len() > 64 {
            return Err(bad());
        }
        if stack.as_slice() == ["notification", "subject"] && out.subject_child.is_none() {
            out.subject_child = Some(name.to_owned());
        }
        if !self_closing {
            stack.push(name);
            text_start = Some(name);
        } else {
            text_start = None;
        }
    }
    if !stack.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

fn extract(tenant: &TenantConfig, payload: &str) -> Result<Envelope, ProviderError> {
    let compact: String = payload.chars().filter(|c| *c != '\n').collect();
    let xml = sig::B64
        .decode(compact.as_bytes())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| sig::payload_error("bt_payload is not base64 UTF-8"))?;
    let n = scan(&xml)?;
    if let Some(want) = tenant.option("source_merchant_id") {
        if n.source_merchant_id.as_deref() != Some(want) {
            return Err(ProviderError::TenantMismatch("source-merchant-id"));
        }
    }
    let kind = n
        .kind
        .filter(|k| !k.is_empty())
        .ok_or_else(|| sig::payload_error("notification has no kind"))?;
    let timestamp = n
        .timestamp
        .filter(|t| !t.is_empty())
        .ok_or_else(|| sig::payload_error("notification has no timestamp"))?;
    let subject = n
        .subject_id
        .clone()
        .filter(|s| !s.is_empty())
        .or(n.subject_child)
        .ok_or_else(|| sig::payload_error("notification has no subject"))?;
    let event_id = format!("{kind}:{subject}:{timestamp}");
    sig::check_event_id(&event_id)?;
    Ok(Envelope {
        provider: "braintree".into(),
        tenant: tenant.tenant.clone(),
        event_id,
        event_type: kind,
        object_id: n.subject_id,
        object_version: None,
        occurred_at: crate::time::parse_rfc3339(&timestamp),
        delivery_id: None,
    })
}

impl Provider for Braintree {
    fn name(&self) -> &'static str {
        "braintree"
    }

    fn options(&self) -> &'static [&'static str] {
        &["public_key", "source_merchant_id"]
    }

    /// Unconfirmed; counted as one day.
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
        let ours: Vec<&str> = public_keys(tenant)?.collect();
        if ours.is_empty() {
            return Err(ProviderError::NoSecret);
        }
        let body = &request.body[..];
        let signature =
            field(body, SIGNATURE_NAME)?.ok_or(ProviderError::MissingHeader(SIGNATURE_NAME))?;
        let payload =
            field(body, PAYLOAD_NAME)?.ok_or(ProviderError::MissingHeader(PAYLOAD_NAME))?;
        if payload.is_empty()
            || !payload
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'=' | b'/' | b'\n'))
        {
            return Err(ProviderError::MalformedHeader(
                PAYLOAD_NAME,
                "payload contains illegal characters",
            ));
        }
        let mut candidates = Vec::with_capacity(1);
        for pair in signature.split('&') {
            let Some((public_key, hex_sig)) = pair.split_once('|') else {
                return Err(ProviderError::MalformedHeader(
                    SIGNATURE_NAME,
                    "expected public_key|signature pairs",
                ));
            };
            if ours.contains(&public_key) {
                candidates.push(sig::decode_hex(SIGNATURE_NAME, hex_sig)?);
            }
        }
        if candidates.is_empty() {
            // Signed for someone else's public key: not authentic for this tenant.
            return Err(ProviderError::SignatureMismatch);
        }
        let with_newline = [payload.as_bytes(), b"\n"];
        let verified = sig::verify_any(secrets, &candidates, |s| {
            let k = key(s);
            let plain = sig::hmac_sha1(&k, &[payload.as_bytes()]);
            let newline = sig::hmac_sha1(&k, &with_newline);
            // Either form may be the signed one.
            Some(if candidates.iter().any(|c| sig::ct_eq(&newline, c)) {
                newline
            } else {
                plain
            })
        });
        verified?;
        let envelope = extract(tenant, &payload)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }

    /// The signature travels in the form body: see [`signed_form`]. Only the content type.
    fn sign(
        &self,
        _body: &[u8],
        tenant: &TenantConfig,
        _event_id: &str,
        _now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        sig::secrets(tenant)?;
        let mut h = http::HeaderMap::new();
        sig::put(
            &mut h,
            &http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )?;
        Ok(h)
    }

    /// Braintree signs inside the form: `body` is the notification XML to wrap.
    fn signed_request(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        now_secs: i64,
    ) -> Result<(http::HeaderMap, bytes::Bytes), ProviderError> {
        let xml = std::str::from_utf8(body)
            .map_err(|_| sig::payload_error("notification XML is not UTF-8"))?;
        let headers = self.sign(body, tenant, event_id, now_secs)?;
        Ok((headers, signed_form(xml, tenant)?.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    const XML: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<notification>
  <timestamp type="datetime">2024-01-01T10:00:00Z</timestamp>
  <kind>subscription_charged_successfully</kind>
  <source-merchant-id>merchant_9</source-merchant-id>
  <subject>
    <subscription>
      <add-ons type="array"/>
      <transactions type="array">
        <transaction><id>txn_1</id></transaction>
      </transactions>
      <id>sub_&amp;1</id>
    </subscription>
  </subject>
</notification>
"#;

    fn tenant(secrets: &[&str], public_key: &str) -> TenantConfig {
        let mut t = TenantConfig {
            provider: "braintree".into(),
            tenant: "acme".into(),
            secrets: secrets.iter().map(|s| Secret::new(*s)).collect(),
            tolerance_secs: 300,
            options: Default::default(),
        };
        t.options.insert("public_key".into(), public_key.into());
        t
    }

    fn verify(body: &[u8], t: &TenantConfig) -> Result<Envelope, ProviderError> {
        let r = WebhookRequest::post(HeaderMap::new(), body.to_vec());
        crate::providers::test_support::verify_one(&Braintree, &r, t, 0)
    }

    fn form(signature: &str, payload: &str) -> Vec<u8> {
        form_urlencoded::Serializer::new(String::new())
            .append_pair("bt_signature", signature)
            .append_pair("bt_payload", payload)
            .finish()
            .into_bytes()
    }

    fn payload(xml: &str) -> String {
        format!("{}\n", sig::B64.encode(xml))
    }

    #[test]
    fn v12_challenge_vector_and_algorithm() {
        let pk = Secret::new("my_private_key");
        assert_eq!(
            sign_pair("my_public_key", &pk, b"20f9f8ed05f77439fe955c977e4c8a53"),
            "my_public_key|698292e50ed3bea125923d2d036e6947b4b6548a"
        );
        // sig == hex(HMAC-SHA1(SHA1("my_private_key"), bt_payload)), checked independently.
        let p = payload(XML);
        let k = Sha1::digest(b"my_private_key");
        let want = hex::encode(sig::hmac_sha1(&k, &[p.as_bytes()]));
        assert_eq!(
            sign_pair("my_public_key", &pk, p.as_bytes()),
            format!("my_public_key|{want}")
        );
        let t = tenant(&["my_private_key"], "my_public_key");
        let env = verify(&form(&format!("my_public_key|{want}"), &p), &t).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "braintree".into(),
                tenant: "acme".into(),
                event_id: "subscription_charged_successfully:sub_&1:2024-01-01T10:00:00Z".into(),
                event_type: "subscription_charged_successfully".into(),
                object_id: Some("sub_&1".into()),
                object_version: None,
                occurred_at: Some(1_704_103_200),
                delivery_id: None,
            }
        );
    }

    #[test]
    fn payload_with_newline_and_several_pairs() {
        let pk = Secret::new("priv");
        let t = tenant(&["priv"], "pub");
        let p = payload(XML);
        let with_nl = format!("{p}\n");
        // Signed over payload + "\n" but the field lacks it.
        let s = sign_pair("pub", &pk, with_nl.as_bytes());
        assert!(verify(&form(&s, &p), &t).is_ok());
        // Several pairs: another merchant's first, ours second.
        let other = sign_pair("other_pub", &Secret::new("x"), p.as_bytes());
        let ours = sign_pair("pub", &pk, p.as_bytes());
        assert!(verify(&form(&format!("{other}&{ours}"), &p), &t).is_ok());
        // Only another public key: refused.
        assert_eq!(
            verify(&form(&other, &p), &t),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn tampered_wrong_key_rotation() {
        let t = tenant(&["priv"], "pub");
        let p = payload(XML);
        let s = sign_pair("pub", &Secret::new("priv"), p.as_bytes());
        let tampered = payload(&XML.replace("sub_", "sub_x"));
        assert_eq!(
            verify(&form(&s, &tampered), &t),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(&form(&s, &p), &tenant(&["other"], "pub")),
            Err(ProviderError::SignatureMismatch)
        );
        // Rotation: old and new private keys, and two public keys.
        let both = tenant(&["new", "priv"], "pub_new, pub");
        assert!(verify(&form(&s, &p), &both).is_ok());
        let s_new = sign_pair("pub_new", &Secret::new("new"), p.as_bytes());
        assert!(verify(&form(&s_new, &p), &both).is_ok());
        assert_eq!(
            verify(&form(&s, &p), &tenant(&[], "pub")),
            Err(ProviderError::NoSecret)
        );
        let mut no_pub = t.clone();
        no_pub.options.clear();
        assert_eq!(verify(&form(&s, &p), &no_pub), Err(ProviderError::NoSecret));
    }

    #[test]
    fn missing_and_garbled_fields() {
        let t = tenant(&["priv"], "pub");
        let p = payload(XML);
        let s = sign_pair("pub", &Secret::new("priv"), p.as_bytes());
        let only_payload = form_urlencoded::Serializer::new(String::new())
            .append_pair("bt_payload", &p)
            .finish();
        assert_eq!(
            verify(only_payload.as_bytes(), &t),
            Err(ProviderError::MissingHeader(SIGNATURE_NAME))
        );
        let only_sig = form_urlencoded::Serializer::new(String::new())
            .append_pair("bt_signature", &s)
            .finish();
        assert_eq!(
            verify(only_sig.as_bytes(), &t),
            Err(ProviderError::MissingHeader(PAYLOAD_NAME))
        );
        assert_eq!(
            verify(&form(&s, "abc def"), &t),
            Err(ProviderError::MalformedHeader(
                PAYLOAD_NAME,
                "payload contains illegal characters"
            ))
        );
        for (bad, why) in [
            ("pub", "expected public_key|signature pairs"),
            ("pub|zz", "signature is not valid hex"),
        ] {
            assert_eq!(
                verify(&form(bad, &p), &t),
                Err(ProviderError::MalformedHeader(SIGNATURE_NAME, why))
            );
        }
        // A duplicated field with another value is ambiguous.
        let mut dup = form(&s, &p);
        dup.extend_from_slice(b"&bt_payload=QUJD");
        assert!(matches!(
            verify(&dup, &t),
            Err(ProviderError::MalformedHeader(PAYLOAD_NAME, _))
        ));
        for junk in [&b""[..], b"%", b"&&=&", b"\xff\xfe"] {
            assert!(verify(junk, &t).unwrap_err().is_authentication_failure());
        }
    }

    #[test]
    fn authentic_but_malformed() {
        let t = tenant(&["priv"], "pub");
        let pk = Secret::new("priv");
        for (xml, why) in [
            (
                "<notification><kind>x</kind>",
                "bt_payload is not well-formed notification XML",
            ),
            (
                "<notification><kind>x</kind></notification>",
                "notification has no timestamp",
            ),
            (
                "<notification><timestamp>t</timestamp></notification>",
                "notification has no kind",
            ),
            (
                "<notification><kind>k</kind><timestamp>t</timestamp></notification>",
                "notification has no subject",
            ),
        ] {
            let p = payload(xml);
            let err = verify(&form(&sign_pair("pub", &pk, p.as_bytes()), &p), &t).unwrap_err();
            assert_eq!(err, sig::payload_error(why), "{xml}");
            assert!(!err.is_authentication_failure());
        }
        // Valid base64 alphabet but not decodable: still authentic, still 400.
        let p = "A\n".to_owned();
        let err = verify(&form(&sign_pair("pub", &pk, p.as_bytes()), &p), &t).unwrap_err();
        assert_eq!(err, sig::payload_error("bt_payload is not base64 UTF-8"));
    }

    #[test]
    fn check_kind_and_tenant_mismatch() {
        let xml = r#"<notification><timestamp type="datetime">2024-01-01T10:00:00Z</timestamp><kind>check</kind><subject><check type="boolean">true</check></subject></notification>"#;
        let t = tenant(&["priv"], "pub");
        let env = verify(&signed_form(xml, &t).unwrap(), &t).unwrap();
        assert_eq!(env.event_id, "check:check:2024-01-01T10:00:00Z");
        assert_eq!(env.object_id, None);
        let mut t = tenant(&["priv"], "pub");
        t.options
            .insert("source_merchant_id".into(), "merchant_9".into());
        assert!(verify(&signed_form(XML, &t).unwrap(), &t).is_ok());
        t.options
            .insert("source_merchant_id".into(), "merchant_1".into());
        assert_eq!(
            verify(&signed_form(XML, &t).unwrap(), &t),
            Err(ProviderError::TenantMismatch("source-merchant-id"))
        );
    }

    #[test]
    fn sign_round_trip() {
        let t = tenant(&["new", "old"], "pub");
        let body = signed_form(XML, &t).unwrap();
        let h = Braintree.sign(&body, &t, "", 0).unwrap();
        assert_eq!(h["content-type"], "application/x-www-form-urlencoded");
        let r = WebhookRequest::post(h, body.clone());
        let v = Braintree.verify_and_extract(&r, &t, 0).unwrap();
        assert_eq!(
            v[0].envelope.event_type,
            "subscription_charged_successfully"
        );
        assert_eq!(
            verify(&body, &tenant(&["old"], "pub")),
            Err(ProviderError::SignatureMismatch)
        );
        // A long XML wraps at 76 characters, like `encodebytes`.
        let long = XML.replace("merchant_9", &"m".repeat(200));
        let body = signed_form(&long, &t).unwrap();
        assert!(verify(&body, &t).is_ok());
    }
}
