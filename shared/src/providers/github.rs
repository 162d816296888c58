//! GitHub: `X-Hub-Signature-256: sha256=<hex>` = HMAC-SHA256(secret as UTF-8, raw body).
//! The legacy SHA-1 `X-Hub-Signature` is never accepted on its own (downgrade
//! protection). Nothing time-related is signed; `X-GitHub-Delivery` is the stable id.

use http::HeaderName;

use super::json::{self, Raw};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct GitHub;

const SIGNATURE: &str = "x-hub-signature-256";
static SIGNATURE_256: HeaderName = HeaderName::from_static(SIGNATURE);
static SIGNATURE_SHA1: HeaderName = HeaderName::from_static("x-hub-signature");
static DELIVERY: HeaderName = HeaderName::from_static("x-github-delivery");
static EVENT: HeaderName = HeaderName::from_static("x-github-event");

fn candidates(request: &WebhookRequest) -> Result<Vec<Vec<u8>>, ProviderError> {
    let mut out = Vec::with_capacity(1);
    for value in sig::header_values(request, &SIGNATURE_256) {
        let value = value?;
        if value.is_empty() {
            return Err(ProviderError::MalformedHeader(SIGNATURE, "empty value"));
        }
        // API Gateway comma-joins repeats; hex never contains a comma.
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let hex = match part.split_at_checked(7) {
                Some((scheme, hex)) if scheme.eq_ignore_ascii_case("sha256=") => hex,
                _ => {
                    return Err(ProviderError::MalformedHeader(
                        SIGNATURE,
                        "expected sha256=<hex>",
                    ))
                }
            };
            out.push(sig::decode_hex(SIGNATURE, hex)?);
        }
    }
    Ok(out)
}

fn is_form_encoded(request: &WebhookRequest) -> bool {
    const FORM: &[u8] = b"application/x-www-form-urlencoded";
    let ct = request.headers.get(http::header::CONTENT_TYPE);
    let ct = ct.map(|v| v.as_bytes()).unwrap_or_default();
    ct.windows(FORM.len()).any(|w| w.eq_ignore_ascii_case(FORM))
        || request.body.starts_with(b"payload=")
}

fn extract(request: &WebhookRequest, tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    if is_form_encoded(request) {
        return Err(sig::payload_error(
            "form-encoded GitHub payloads are not supported; configure content type application/json",
        ));
    }
    let delivery = sig::single_header(request, &DELIVERY)?
        .ok_or_else(|| sig::payload_error("missing X-GitHub-Delivery header"))?;
    sig::check_event_id(delivery)?;
    let event = sig::single_header(request, &EVENT)?
        .ok_or_else(|| sig::payload_error("missing X-GitHub-Event header"))?;
    let [action, repo, installation] = json::json_fields(
        &request.body,
        [
            &["action"],
            &["repository", "full_name"],
            &["installation", "id"],
        ],
    )?;
    let event_type = match action.and_then(Raw::str).as_deref() {
        Some(action) if !action.is_empty() => format!("{event}.{action}"),
        _ => event.to_owned(),
    };
    let object_id = repo
        .and_then(Raw::text)
        .or_else(|| installation.and_then(Raw::text));
    Ok(Envelope {
        provider: "github".into(),
        tenant: tenant.tenant.clone(),
        event_id: delivery.to_owned(),
        event_type,
        object_id: object_id.map(String::from),
        object_version: None,
        occurred_at: None,
        delivery_id: Some(delivery.to_owned()),
    })
}

impl Provider for GitHub {
    fn name(&self) -> &'static str {
        "github"
    }

    fn options(&self) -> &'static [&'static str] {
        &["event"]
    }

    /// No automatic retry.
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
        // Only the SHA-256 header counts; a lone SHA-1 header is reported as missing SHA-256.
        let candidates = candidates(request)?;
        if candidates.is_empty() {
            return Err(ProviderError::MissingHeader(SIGNATURE));
        }
        sig::verify_body_hmac_sha256(secrets, &candidates, &request.body)?;
        let envelope = extract(request, tenant)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }

    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        _now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let key = sig::secrets(tenant)?[0].expose().as_bytes();
        let mut h = http::HeaderMap::new();
        let sha256 = hex::encode(sig::hmac_sha256(key, &[body]));
        sig::put(&mut h, &SIGNATURE_256, &format!("sha256={sha256}"))?;
        // GitHub still sends the SHA-1 header; we emit it for realism, never verify it.
        let sha1 = hex::encode(sig::hmac_sha1(key, &[body]));
        sig::put(&mut h, &SIGNATURE_SHA1, &format!("sha1={sha1}"))?;
        sig::put(&mut h, &DELIVERY, event_id)?;
        sig::put(&mut h, &EVENT, tenant.option("event").unwrap_or("ping"))?;
        sig::put(&mut h, &http::header::CONTENT_TYPE, "application/json")?;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use http::{HeaderMap, HeaderValue};

    const GUID: &str = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    const BODY: &str = r#"{"action":"opened","issue":{"id":1,"action":"nested"},"repository":{"id":2,"full_name":"octo/hello"},"installation":{"id":42}}"#;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        TenantConfig {
            provider: "github".into(),
            tenant: "octo".into(),
            secrets: secrets.iter().map(|s| Secret::new(*s)).collect(),
            tolerance_secs: 300,
            options: Default::default(),
        }
    }

    fn sig256(secret: &str, body: &str) -> String {
        format!(
            "sha256={}",
            hex::encode(sig::hmac_sha256(secret.as_bytes(), &[body.as_bytes()]))
        )
    }

    fn headers(sigs: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in sigs {
            h.append("X-Hub-Signature-256", HeaderValue::from_str(v).unwrap());
        }
        h.insert("X-GitHub-Delivery", HeaderValue::from_static(GUID));
        h.insert("X-GitHub-Event", HeaderValue::from_static("issues"));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h
    }

    fn verify(h: HeaderMap, body: &str, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        let r = WebhookRequest::post(h, body.to_owned());
        crate::providers::test_support::verify_one(&GitHub, &r, t, 0)
    }

    #[test]
    fn v1_github_docs_vector() {
        let want = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        let t = tenant(&["It's a Secret to Everybody"]);
        assert_eq!(sig256("It's a Secret to Everybody", "Hello, World!"), want);
        // Authentic, but not JSON: the signature holds and extraction refuses (400).
        assert_eq!(
            verify(headers(&[want]), "Hello, World!", &t),
            Err(sig::payload_error("body is not a JSON object"))
        );
        assert_eq!(
            verify(headers(&[want]), "Hello, World?", &t),
            Err(ProviderError::SignatureMismatch)
        );
        let h = GitHub.sign(b"Hello, World!", &t, GUID, 0).unwrap();
        assert_eq!(h["x-hub-signature-256"], want);
    }

    #[test]
    fn v2_octokit_vector() {
        let want = "sha256=4864d2759938a15468b5df9ade20bf161da9b4f737ea61794142f3484236bda3";
        assert_eq!(sig256("mysecret", r#"{"foo":"bar"}"#), want);
        let env = verify(headers(&[want]), r#"{"foo":"bar"}"#, &tenant(&["mysecret"])).unwrap();
        assert_eq!(env.event_type, "issues");
        assert_eq!(env.object_id, None);
    }

    #[test]
    fn extracts_envelope() {
        let env = verify(headers(&[&sig256("s", BODY)]), BODY, &tenant(&["s"])).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "github".into(),
                tenant: "octo".into(),
                event_id: GUID.into(),
                event_type: "issues.opened".into(),
                object_id: Some("octo/hello".into()),
                object_version: None,
                occurred_at: None,
                delivery_id: Some(GUID.into()),
            }
        );
        let body = r#"{"action":"created","installation":{"id":42}}"#;
        let env = verify(headers(&[&sig256("s", body)]), body, &tenant(&["s"])).unwrap();
        assert_eq!(
            (env.event_type.as_str(), env.object_id.as_deref()),
            ("issues.created", Some("42"))
        );
    }

    #[test]
    fn tampered_body_and_wrong_secret() {
        let h = headers(&[&sig256("s", BODY)]);
        assert_eq!(
            verify(
                h.clone(),
                &BODY.replace("opened", "closed"),
                &tenant(&["s"])
            ),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(h, BODY, &tenant(&["t"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn rotation() {
        let (old, new) = (sig256("old", BODY), sig256("new", BODY));
        let both = tenant(&["new", "old"]);
        assert!(verify(headers(&[&old]), BODY, &both).is_ok());
        assert!(verify(headers(&[&new]), BODY, &both).is_ok());
        assert!(verify(headers(&[&old, &new]), BODY, &tenant(&["new"])).is_ok());
        assert!(verify(headers(&[&format!("{new},{old}")]), BODY, &tenant(&["old"])).is_ok());
        assert_eq!(
            verify(headers(&[&old, &new]), BODY, &tenant(&["x"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn sha1_alone_is_refused() {
        let mut h = headers(&[]);
        let sha1 = hex::encode(sig::hmac_sha1(b"s", &[BODY.as_bytes()]));
        h.insert(
            "x-hub-signature",
            HeaderValue::from_str(&format!("sha1={sha1}")).unwrap(),
        );
        assert_eq!(
            verify(h.clone(), BODY, &tenant(&["s"])),
            Err(ProviderError::MissingHeader(SIGNATURE))
        );
        // Smuggling a SHA-1 value into the SHA-256 header fails too.
        h.insert(
            "x-hub-signature-256",
            HeaderValue::from_str(&format!("sha1={sha1}")).unwrap(),
        );
        assert_eq!(
            verify(h, BODY, &tenant(&["s"])),
            Err(ProviderError::MalformedHeader(
                SIGNATURE,
                "expected sha256=<hex>"
            ))
        );
    }

    #[test]
    fn missing_and_garbled_headers() {
        let t = tenant(&["s"]);
        assert_eq!(
            verify(headers(&[]), BODY, &t),
            Err(ProviderError::MissingHeader(SIGNATURE))
        );
        let cases = [
            ("", "empty value"),
            ("sha256=zz", "signature is not valid hex"),
            ("sha256=abc", "signature is not valid hex"),
            (
                "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
                "expected sha256=<hex>",
            ),
            ("sha2", "expected sha256=<hex>"),
            ("sha256=é", "value is not visible ASCII"),
        ];
        for (v, why) in cases {
            let mut h = headers(&[]);
            h.insert(
                "x-hub-signature-256",
                HeaderValue::from_bytes(v.as_bytes()).unwrap(),
            );
            assert_eq!(
                verify(h, BODY, &t),
                Err(ProviderError::MalformedHeader(SIGNATURE, why)),
                "{v}"
            );
        }
        // Right format, wrong length: a mismatch.
        assert_eq!(
            verify(headers(&["sha256=00"]), BODY, &t),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(headers(&[&sig256("s", BODY)]), BODY, &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn authentic_but_malformed() {
        let t = tenant(&["s"]);
        let mut h = headers(&[&sig256("s", BODY)]);
        h.remove("x-github-delivery");
        assert_eq!(
            verify(h, BODY, &t),
            Err(sig::payload_error("missing X-GitHub-Delivery header"))
        );
        let mut h = headers(&[&sig256("s", BODY)]);
        h.remove("x-github-event");
        assert_eq!(
            verify(h, BODY, &t),
            Err(sig::payload_error("missing X-GitHub-Event header"))
        );
        let form = "payload=%7B%22zen%22%3A%22hi%22%7D";
        let mut h = headers(&[&sig256("s", form)]);
        h.insert(
            "content-type",
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        let err = verify(h, form, &t).unwrap_err();
        assert_eq!(
            err,
            sig::payload_error("form-encoded GitHub payloads are not supported; configure content type application/json")
        );
        assert!(!err.is_authentication_failure());
        let broken = r#"{"action":"opened""#;
        assert_eq!(
            verify(headers(&[&sig256("s", broken)]), broken, &t),
            Err(sig::payload_error(
                "body is not valid JSON (line 1, column 18)"
            ))
        );
    }

    #[test]
    fn sign_round_trip() {
        let mut t = tenant(&["new", "old"]);
        t.options.insert("event".into(), "issues".into());
        let h = GitHub.sign(BODY.as_bytes(), &t, GUID, 0).unwrap();
        assert_eq!(
            verify(h.clone(), BODY, &t).unwrap().event_type,
            "issues.opened"
        );
        assert_eq!(
            verify(h, BODY, &tenant(&["old"])),
            Err(ProviderError::SignatureMismatch)
        );
        t.options.clear();
        let h = GitHub.sign(b"{}", &t, "d-1", 0).unwrap();
        assert_eq!(h["x-github-event"], "ping");
        let env = verify(h, "{}", &t).unwrap();
        assert_eq!(
            (env.event_id.as_str(), env.event_type.as_str()),
            ("d-1", "ping")
        );
    }
}
