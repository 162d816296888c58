//! Mollie next-gen webhooks: `X-Mollie-Signature: sha256=<hex>` = HMAC-SHA256(shared
//! secret as UTF-8, raw body). The `sha256=` prefix is optional (mollie-api-php
//! strips it when present). During secret rotation Mollie repeats the header, one
//! value per secret: every value is checked against every tenant secret. Nothing
//! time-related is signed.
//!
//! # Classic (thin) webhooks
//!
//! A request without the header is a classic webhook: an unsigned form POST whose
//! body is `id=tr_…` and nothing else, sent for every status change of the payment.
//! It is only a hint (see [`super::thin`]): it must arrive on
//! `/webhooks/mollie/{tenant}/{token}` with the tenant's `path_token`, becomes a
//! `hint.payment` envelope keyed `{id}:hint:{minute}`, and the processor fetches
//! `GET {api_base}/v2/payments/{id}` before any effect. Only payments (`tr_`) are
//! supported; other ids (orders, subscriptions, payment links) are refused as
//! malformed. A tenant without `path_token` does not accept classic webhooks: the
//! missing header is then `MissingHeader` (or `NoSecret` when the tenant has no
//! secret either). Tenants may configure both during a migration.
//!
//! `sign` / `signed_request` produce the next-gen form when the tenant has a secret,
//! else the classic form (`Content-Type: application/x-www-form-urlencoded`, body
//! `id={event_id}`); the token goes in the URL, which `einmal send` does not add (use
//! `--url` of a proxy or call the endpoint directly).
//!
//! The event id field is UNCONFIRMED in Mollie's docs: we dedup on the body's
//! top-level `id` (the event's own id in next-gen payloads), type `type`, occurred at
//! `createdAt`, and take the optional `entityId` as object id. The tenant is the
//! webhook URL (no payload check).

use bytes::Bytes;
use http::HeaderName;

use super::plain_json::PlainJson;
use super::reconcile_source::{ReconcileMethod, ReconcileSource};
use super::sig;
use super::thin::{self, ThinResource};
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Mollie;

/// A classic webhook's payment as `GET /v2/payments/{id}` returns it.
pub static RESOURCE: ThinResource = ThinResource {
    kind: "payment",
    id: &["id"],
    status: &["status"],
    order_id: &["metadata", "order_id"],
    paid: &["paid"],
    failed: &["failed", "canceled", "expired"],
};

const HEADER: &str = "x-mollie-signature";
static SIGNATURE: HeaderName = HeaderName::from_static(HEADER);

static ENVELOPE: PlainJson = PlainJson {
    provider: "mollie",
    event_id: (&["id"], "missing event `id`", "event `id` is not a string"),
    event_type: (&[&["type"]], "missing event `type`"),
    object_id: &[&["entityId"]],
    occurred_at: Some(&["createdAt"]),
    delivery_id: None,
    tenant: None,
};

fn extract(body: &[u8], tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    ENVELOPE.extract(body, tenant)
}

/// The classic thin webhook: form body `id=tr_…`, authenticated by the path token.
fn classic(
    request: &WebhookRequest,
    tenant: &TenantConfig,
    now_secs: i64,
) -> Result<Vec<VerifiedEvent>, ProviderError> {
    thin::check_path_token(request, tenant)?;
    let id = thin::single_param(&request.body, "id")?
        .ok_or_else(|| sig::payload_error("missing form parameter `id`"))?;
    thin::check_resource_id(&id)?;
    if !id.starts_with("tr_") {
        return Err(sig::payload_error(
            "only payment ids (tr_…) are supported in classic webhooks",
        ));
    }
    let envelope = thin::hint_envelope("mollie", tenant, HINT.resource.kind, &id, now_secs);
    Ok(VerifiedEvent::whole(envelope, request))
}

/// Classic mode: the tenant has a path token and no signing secret.
fn is_classic(tenant: &TenantConfig) -> bool {
    tenant.secrets.is_empty() && thin::configured_token(tenant).is_ok()
}

/// Classic hints name payments; Mollie lists its payments, so they are not indexed.
static HINT: thin::HintSpec = thin::HintSpec {
    resource: &RESOURCE,
    indexed: false,
    lookup: thin::LookupSpec {
        default_base: "https://api.mollie.com",
        path: "/v2/payments/",
        auth: thin::ApiAuth::Bearer { token: "api_key" },
    },
};

impl Provider for Mollie {
    fn name(&self) -> &'static str {
        "mollie"
    }

    fn options(&self) -> &'static [&'static str] {
        &["path_token", "api_key", "api_base", "max_hints_per_minute"]
    }

    /// Unconfirmed; classic webhooks are reported as about 10 calls over 26 h.
    fn retry_window_days(&self) -> u32 {
        2
    }

    fn hint(&self) -> Option<&'static thin::HintSpec> {
        Some(&HINT)
    }

    /// Classic hints need only the path token; next-gen webhooks need a secret.
    fn needs_secret(&self, tenant: &TenantConfig) -> bool {
        tenant.option("path_token").is_none()
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        if !request.headers.contains_key(&SIGNATURE) {
            if thin::configured_token(tenant).is_ok() {
                return classic(request, tenant, now_secs);
            }
            sig::secrets(tenant)?;
            return Err(ProviderError::MissingHeader(HEADER));
        }
        let secrets = sig::secrets(tenant)?;
        let candidates = sig::hex_signatures(request, &SIGNATURE, "sha256=", false)?;
        sig::verify_body_hmac_sha256(secrets, &candidates, &request.body)?;
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
        let mut h = http::HeaderMap::new();
        if is_classic(tenant) {
            let form = "application/x-www-form-urlencoded";
            sig::put(&mut h, &http::header::CONTENT_TYPE, form)?;
            return Ok(h);
        }
        let key = sig::secrets(tenant)?[0].expose();
        let mac = hex::encode(sig::hmac_sha256(key.as_bytes(), &[body]));
        sig::put(&mut h, &SIGNATURE, &format!("sha256={mac}"))?;
        sig::put(&mut h, &http::header::CONTENT_TYPE, "application/json")?;
        Ok(h)
    }

    /// Classic tenants: the form body `id={event_id}` (the payment id); `body` is unused.
    fn signed_request(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        now_secs: i64,
    ) -> Result<(http::HeaderMap, Bytes), ProviderError> {
        let headers = self.sign(body, tenant, event_id, now_secs)?;
        if !is_classic(tenant) {
            return Ok((headers, Bytes::copy_from_slice(body)));
        }
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("id", event_id)
            .finish();
        Ok((headers, Bytes::from(form)))
    }

    fn reconcile(&self) -> Option<ReconcileSource> {
        Some(ReconcileSource {
            credential_option: "api_key",
            method: ReconcileMethod::MolliePayments(&RESOURCE),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    const BODY: &str = r#"{"resource":"event","id":"event_GvJ8WHrp5isUdRub9CJyH","type":"payment-link.paid","entityId":"pl_qng5gbbv8NAZ5gpM5ZYgx","createdAt":"2024-12-16T15:57:04.0Z","_embedded":{"entity":{"id":"pl_qng5gbbv8NAZ5gpM5ZYgx","resource":"payment-link"}},"_links":{"self":{"href":"x"}}}"#;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        crate::providers::test_support::tenant("mollie", secrets)
    }

    fn sig_for(secret: &str, body: &str) -> String {
        let mac = sig::hmac_sha256(secret.as_bytes(), &[body.as_bytes()]);
        format!("sha256={}", hex::encode(mac))
    }

    fn req(sigs: &[&str], body: &str) -> WebhookRequest {
        let mut h = HeaderMap::new();
        for v in sigs {
            h.append(HEADER, HeaderValue::from_str(v).unwrap());
        }
        WebhookRequest::post(h, body.to_owned())
    }

    fn verify(r: &WebhookRequest, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        crate::providers::test_support::verify_one(&Mollie, r, t, 0)
    }

    #[test]
    fn independent_hmac_vector() {
        // No published Mollie vector; the scheme equals GitHub's, so V2 (Octokit) applies.
        let v2 = "sha256=4864d2759938a15468b5df9ade20bf161da9b4f737ea61794142f3484236bda3";
        assert_eq!(sig_for("mysecret", r#"{"foo":"bar"}"#), v2);
        let r = req(&[v2], r#"{"foo":"bar"}"#);
        assert_eq!(
            verify(&r, &tenant(&["mysecret"])),
            Err(sig::payload_error("missing event `id`"))
        );
        // The prefix is optional, as in mollie-api-php.
        let r = req(&[&v2["sha256=".len()..]], r#"{"foo":"bar"}"#);
        assert!(matches!(
            verify(&r, &tenant(&["mysecret"])),
            Err(ProviderError::MalformedPayload(_))
        ));
    }

    #[test]
    fn extracts_envelope() {
        let env = verify(&req(&[&sig_for("s", BODY)], BODY), &tenant(&["s"])).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "mollie".into(),
                tenant: "acme".into(),
                event_id: "event_GvJ8WHrp5isUdRub9CJyH".into(),
                event_type: "payment-link.paid".into(),
                object_id: Some("pl_qng5gbbv8NAZ5gpM5ZYgx".into()),
                object_version: None,
                occurred_at: Some(1_734_364_624),
                delivery_id: None,
            }
        );
    }

    #[test]
    fn rotation_repeated_header_and_secrets() {
        let (old, new) = (sig_for("old", BODY), sig_for("new", BODY));
        // Mollie sends one header per secret during rotation; either may come first.
        for order in [[&old, &new], [&new, &old]] {
            let r = req(&[order[0], order[1]], BODY);
            assert!(verify(&r, &tenant(&["old"])).is_ok());
            assert!(verify(&r, &tenant(&["new"])).is_ok());
            assert_eq!(
                verify(&r, &tenant(&["x"])),
                Err(ProviderError::SignatureMismatch)
            );
        }
        // API Gateway v2 comma-joins the repeats.
        let joined = req(&[&format!("{old},{new}")], BODY);
        assert!(verify(&joined, &tenant(&["new"])).is_ok());
        let both = tenant(&["new", "old"]);
        assert!(verify(&req(&[&old], BODY), &both).is_ok());
        assert!(verify(&req(&[&new], BODY), &both).is_ok());
    }

    #[test]
    fn tampered_body_and_wrong_secret() {
        let s = sig_for("s", BODY);
        let tampered = BODY.replace("paid", "open");
        assert_eq!(
            verify(&req(&[&s], &tampered), &tenant(&["s"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify(&req(&[&s], BODY), &tenant(&["other"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn classic_thin_webhook_is_missing_header() {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        let r = WebhookRequest::post(h, "id=tr_5B8cwPMGnU6qLbRvo7qEZo");
        assert_eq!(
            verify(&r, &tenant(&["s"])),
            Err(ProviderError::MissingHeader(HEADER))
        );
    }

    fn classic_tenant(token: &str, secrets: &[&str]) -> TenantConfig {
        let mut t = tenant(secrets);
        t.options.insert("path_token".into(), token.into());
        t
    }

    fn form(body: &str, token: Option<&str>) -> WebhookRequest {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        let mut r = WebhookRequest::post(h, body.to_owned());
        r.path_token = token.map(str::to_string);
        r
    }

    #[test]
    fn classic_thin_webhook_is_a_payment_hint() {
        let t = classic_tenant("tok", &[]);
        let r = form("id=tr_5B8cwPMGnU6qLbRvo7qEZo", Some("tok"));
        let v = Mollie.verify_and_extract(&r, &t, 1_734_364_624).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].body, r.body);
        assert_eq!(
            v[0].envelope,
            Envelope {
                provider: "mollie".into(),
                tenant: "acme".into(),
                event_id: format!("tr_5B8cwPMGnU6qLbRvo7qEZo:hint:{}", 1_734_364_624 / 60),
                event_type: "hint.payment".into(),
                object_id: Some("tr_5B8cwPMGnU6qLbRvo7qEZo".into()),
                object_version: None,
                occurred_at: None,
                delivery_id: None,
            }
        );
        // A tenant migrating to next-gen accepts both kinds.
        let both = classic_tenant("tok", &["s"]);
        assert!(Mollie.verify_and_extract(&r, &both, 0).is_ok());
        assert!(verify(&req(&[&sig_for("s", BODY)], BODY), &both).is_ok());
    }

    #[test]
    fn classic_thin_webhook_authentication() {
        let t = classic_tenant("tok", &[]);
        let body = "id=tr_5B8cwPMGnU6qLbRvo7qEZo";
        let check = |r: &WebhookRequest, t: &TenantConfig| Mollie.verify_and_extract(r, t, 0);
        assert_eq!(
            check(&form(body, None), &t),
            Err(ProviderError::MissingHeader("path token"))
        );
        assert_eq!(
            check(&form(body, Some("toc")), &t),
            Err(ProviderError::SignatureMismatch)
        );
        // The token is checked before the body is looked at.
        assert_eq!(
            check(&form("garbage", Some("toc")), &t),
            Err(ProviderError::SignatureMismatch)
        );
        // Neither a secret nor a token: refused.
        assert_eq!(
            check(&form(body, Some("tok")), &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
        // A signature header on a classic-only tenant is not a way around the token.
        let mut r = req(&[&sig_for("s", BODY)], BODY);
        r.path_token = Some("tok".into());
        assert_eq!(check(&r, &t), Err(ProviderError::NoSecret));
    }

    #[test]
    fn classic_thin_webhook_malformed_bodies() {
        let t = classic_tenant("tok", &[]);
        for body in [
            "",
            "id=",
            "foo=tr_1",
            "id=ord_pbjz8x",
            "id=sub_8JfGzs6v3K",
            "id=tr_a%2Fb",
            "id=tr_1&id=tr_2",
            r#"{"id":"tr_1"}"#,
        ] {
            let err = Mollie
                .verify_and_extract(&form(body, Some("tok")), &t, 0)
                .unwrap_err();
            assert!(
                matches!(err, ProviderError::MalformedPayload(_)),
                "{body}: {err:?}"
            );
        }
    }

    #[test]
    fn classic_sign_round_trip() {
        let t = classic_tenant("tok", &[]);
        let (h, body) = Mollie.signed_request(b"{}", &t, "tr_42", 0).unwrap();
        assert_eq!(body, "id=tr_42");
        assert_eq!(
            h.get(http::header::CONTENT_TYPE).unwrap(),
            "application/x-www-form-urlencoded"
        );
        let mut r = WebhookRequest::post(h, body);
        r.path_token = Some("tok".into());
        let v = Mollie.verify_and_extract(&r, &t, 0).unwrap();
        assert_eq!(v[0].envelope.object_id.as_deref(), Some("tr_42"));
        // A tenant with a secret still signs next-gen.
        let (h, body) = Mollie
            .signed_request(BODY.as_bytes(), &classic_tenant("tok", &["s"]), "", 0)
            .unwrap();
        assert!(h.contains_key(HEADER));
        assert_eq!(body, BODY);
    }

    #[test]
    fn garbled_and_duplicated_headers() {
        let t = tenant(&["s"]);
        let good = sig_for("s", BODY);
        for (h, why) in [
            ("", "empty value"),
            ("sha256=", "empty value"),
            ("sha256=xyz", "signature is not valid hex"),
            ("sha1=00", "signature is not valid hex"),
        ] {
            assert_eq!(
                verify(&req(&[h], BODY), &t),
                Err(ProviderError::MalformedHeader(HEADER, why)),
                "{h}"
            );
        }
        // One garbled value among good ones is still refused: no guessing.
        assert_eq!(
            verify(&req(&[&good, "sha256=zz"], BODY), &t),
            Err(ProviderError::MalformedHeader(
                HEADER,
                "signature is not valid hex"
            ))
        );
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_bytes(b"sha256=\xff").unwrap());
        assert_eq!(
            verify(&WebhookRequest::post(h, BODY), &t),
            Err(ProviderError::MalformedHeader(
                HEADER,
                "value is not visible ASCII"
            ))
        );
        assert!(verify(&req(&[&good, &good], BODY), &t).is_ok());
        assert!(verify(&req(&[&good.to_uppercase()], BODY), &t).is_ok());
        assert_eq!(
            verify(&req(&[&good], BODY), &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn authentic_but_malformed_payloads() {
        let t = tenant(&["s"]);
        let check = |body: &str, want: ProviderError| {
            let got = verify(&req(&[&sig_for("s", body)], body), &t);
            assert!(!want.is_authentication_failure());
            assert_eq!(got, Err(want), "{body}");
        };
        check(
            "id=tr_5B8cwPMGnU6qLbRvo7qEZo",
            sig::payload_error("body is not a JSON object"),
        );
        check(r#"{"type":"x"}"#, sig::payload_error("missing event `id`"));
        check(
            r#"{"id":{},"type":"x"}"#,
            sig::payload_error("event `id` is not a string"),
        );
        check(r#"{"id":"e"}"#, sig::payload_error("missing event `type`"));
        check(
            r#"{"id":"e","id":"f","type":"x"}"#,
            sig::payload_error("duplicate field `id`"),
        );
    }

    #[test]
    fn event_id_stable_across_retries_and_sign_round_trip() {
        let t = tenant(&["new", "old"]);
        let h = Mollie.sign(BODY.as_bytes(), &t, "", 0).unwrap();
        let r = WebhookRequest::post(h, BODY);
        let a = verify(&r, &t).unwrap();
        let b = Mollie.verify_and_extract(&r, &t, 86_400).unwrap();
        assert_eq!(a.key(), b[0].envelope.key());
        assert_eq!(
            verify(&r, &tenant(&["old"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            Mollie.sign(b"{}", &tenant(&[]), "", 0).unwrap_err(),
            ProviderError::NoSecret
        );
    }
}
