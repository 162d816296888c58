//! Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=…][,v0=…]`, HMAC-SHA256 over
//! `"{t}.{raw body}"`, keyed with the whole `whsec_…` string as UTF-8 (not decoded).

use http::HeaderName;

use super::plain_json::{PlainJson, TenantField};
use super::reconcile_source::{ReconcileMethod, ReconcileSource};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct Stripe;

const HEADER: &str = "stripe-signature";
static SIGNATURE: HeaderName = HeaderName::from_static(HEADER);

/// One timestamp with the `v1` signatures that go with it. Normally there is one group;
/// API Gateway comma-joins a repeated header, which can yield several.
type Group = sig::StampedSigs;

/// Parsed `Stripe-Signature` entries. A `v1` listed before any `t` waits in `orphans`
/// for the next `t` (entry order is not guaranteed).
#[derive(Default)]
struct Parsed {
    groups: Vec<Group>,
    current: Option<usize>,
    orphans: Vec<Vec<u8>>,
}

impl Parsed {
    fn entry(&mut self, entry: &str) -> Result<(), ProviderError> {
        let Some((key, value)) = entry.split_once('=') else {
            return Err(ProviderError::MalformedHeader(HEADER, "entry without '='"));
        };
        match key.trim() {
            "t" => {
                let t = sig::parse_unix(HEADER, value.trim())?;
                let idx = match self.groups.iter().position(|g| g.ts == t) {
                    Some(i) => i,
                    None => {
                        let sigs = Vec::with_capacity(2);
                        self.groups.push(Group { ts: t, sigs });
                        self.groups.len() - 1
                    }
                };
                self.groups[idx].sigs.append(&mut self.orphans);
                self.current = Some(idx);
            }
            "v1" => {
                let s = sig::decode_hex(HEADER, value.trim())?;
                match self.current {
                    Some(i) => self.groups[i].sigs.push(s),
                    None => self.orphans.push(s),
                }
            }
            // v0 is Stripe's fake test scheme; ignoring other schemes prevents downgrades.
            _ => {}
        }
        Ok(())
    }
}

fn parse_header(request: &WebhookRequest) -> Result<Vec<Group>, ProviderError> {
    let mut parsed = Parsed::default();
    let mut present = false;
    for value in sig::header_values(request, &SIGNATURE) {
        present = true;
        for entry in value?.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            parsed.entry(entry)?;
        }
    }
    if !present {
        return Err(ProviderError::MissingHeader(HEADER));
    }
    if parsed.groups.is_empty() {
        return Err(ProviderError::MalformedHeader(HEADER, "no timestamp"));
    }
    if parsed.groups.iter().all(|g| g.sigs.is_empty()) {
        return Err(ProviderError::MalformedHeader(HEADER, "no v1 signature"));
    }
    Ok(parsed.groups)
}

static ENVELOPE: PlainJson = PlainJson {
    provider: "stripe",
    event_id: (&["id"], "missing event `id`", "event `id` is not a string"),
    event_type: (&[&["type"]], "missing event `type`"),
    // Thin (v2) events name their object under `related_object` instead of `data.object`.
    object_id: &[&["data", "object", "id"], &["related_object", "id"]],
    occurred_at: Some(&["created"]),
    delivery_id: None,
    // Connect: an event from another connected account must not land in this tenant.
    tenant: Some(TenantField {
        option: "account",
        path: &["account"],
        absent_passes: true,
    }),
};

fn extract(body: &[u8], tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    ENVELOPE.extract(body, tenant)
}

/// The envelope of one event body as the webhook path extracts it (reconciliation
/// reads `GET /v1/events`, whose items are exactly the webhook bodies).
pub fn envelope_from_body(body: &[u8], tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    extract(body, tenant)
}

impl Provider for Stripe {
    fn name(&self) -> &'static str {
        "stripe"
    }

    fn options(&self) -> &'static [&'static str] {
        &["account", "api_key", "api_base"]
    }

    /// Resends undelivered events for up to three days.
    fn retry_window_days(&self) -> u32 {
        3
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let body = sig::verify_stamped_request(request, tenant, now_secs, b".", parse_header)?;
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
        let (ts, mac) = sig::sign_stamped_hex(tenant, body, b".", now_secs)?;
        sig::json_headers(&[(&SIGNATURE, &format!("t={ts},v1={mac}"))])
    }

    fn reconcile(&self) -> Option<ReconcileSource> {
        Some(ReconcileSource {
            credential_option: "api_key",
            method: ReconcileMethod::StripeEvents,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    const NOW: i64 = 1_700_000_000;
    const V4_BODY: &str = r#"{"id":"evt_test_webhook","object":"event"}"#;
    const V4_SIG: &str = "d95c6b7477fbd7e9f90b1b0ef5f9c7ac25abca5382460e0d988c2b2a5b71b990";
    const BODY: &str = r#"{"id":"evt_1","object":"event","account":"acct_9","created":1699999990,"data":{"object":{"id":"pi_1","object":"payment_intent","metadata":{"id":"x"}}},"type":"payment_intent.succeeded"}"#;

    fn tenant(secrets: &[&str]) -> TenantConfig {
        crate::providers::test_support::tenant("stripe", secrets)
    }

    fn req(headers: &[&str], body: &str) -> WebhookRequest {
        let mut h = HeaderMap::new();
        for v in headers {
            h.append("stripe-signature", HeaderValue::from_str(v).unwrap());
        }
        WebhookRequest::post(h, body.to_owned())
    }

    fn sig_for(secret: &str, t: i64, body: &str) -> String {
        let mac = sig::hmac_sha256(
            secret.as_bytes(),
            &[t.to_string().as_bytes(), b".", body.as_bytes()],
        );
        hex::encode(mac)
    }

    fn verify(r: &WebhookRequest, t: &TenantConfig) -> Result<Envelope, ProviderError> {
        crate::providers::test_support::verify_one(&Stripe, r, t, NOW)
    }

    #[test]
    fn v4_vector() {
        assert_eq!(sig_for("whsec_test_secret", NOW, V4_BODY), V4_SIG);
        let r = req(&[&format!("t=1700000000,v1={V4_SIG}")], V4_BODY);
        let env = verify(&r, &tenant(&["whsec_test_secret"])).unwrap_err();
        // The vector body has no `type`: authentic but not extractable.
        assert_eq!(
            env,
            ProviderError::MalformedPayload("missing event `type`".into())
        );
        let headers = Stripe
            .sign(V4_BODY.as_bytes(), &tenant(&["whsec_test_secret"]), "", NOW)
            .unwrap();
        assert_eq!(
            headers["stripe-signature"],
            format!("t=1700000000,v1={V4_SIG}").as_str()
        );
    }

    #[test]
    fn v4_vector_with_v0_and_type() {
        let body = r#"{"id":"evt_test_webhook","object":"event","type":"ping"}"#;
        let s = sig_for("whsec_test_secret", NOW, body);
        let r = req(&[&format!("t={NOW},v1={s},v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39")], body);
        let env = verify(&r, &tenant(&["whsec_test_secret"])).unwrap();
        assert_eq!(env.event_id, "evt_test_webhook");
        assert_eq!(env.event_type, "ping");
        assert_eq!(env.object_id, None);
    }

    #[test]
    fn extracts_envelope() {
        let s = sig_for("whsec_a", NOW, BODY);
        let env = verify(
            &req(&[&format!("t={NOW},v1={s}")], BODY),
            &tenant(&["whsec_a"]),
        )
        .unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "stripe".into(),
                tenant: "acme".into(),
                event_id: "evt_1".into(),
                event_type: "payment_intent.succeeded".into(),
                object_id: Some("pi_1".into()),
                object_version: None,
                occurred_at: Some(1_699_999_990),
                delivery_id: None,
            }
        );
    }

    #[test]
    fn thin_event_uses_related_object_and_rfc3339_created() {
        let body = r#"{"id":"evt_t","object":"v2.core.event","type":"v1.billing.meter.no_meter_found","created":"2024-09-17T06:20:52.246Z","related_object":{"id":"mtr_1","type":"billing.meter"}}"#;
        let s = sig_for("whsec_a", NOW, body);
        let env = verify(
            &req(&[&format!("t={NOW},v1={s}")], body),
            &tenant(&["whsec_a"]),
        )
        .unwrap();
        assert_eq!(env.object_id.as_deref(), Some("mtr_1"));
        assert_eq!(env.occurred_at, Some(1_726_554_052));
    }

    #[test]
    fn secret_is_not_base64_decoded() {
        // The Standard Webhooks habit (decode after whsec_) must not apply to Stripe.
        let s = sig_for("whsec_test_secret", NOW, BODY);
        let r = req(&[&format!("t={NOW},v1={s}")], BODY);
        assert!(verify(&r, &tenant(&["whsec_test_secret"])).is_ok());
        assert_eq!(
            verify(&r, &tenant(&["test_secret"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn tampered_body_and_wrong_secret() {
        let s = sig_for("whsec_a", NOW, BODY);
        let tampered = BODY.replace("pi_1", "pi_2");
        let r = req(&[&format!("t={NOW},v1={s}")], &tampered);
        assert_eq!(
            verify(&r, &tenant(&["whsec_a"])),
            Err(ProviderError::SignatureMismatch)
        );
        let r = req(&[&format!("t={NOW},v1={s}")], BODY);
        assert_eq!(
            verify(&r, &tenant(&["whsec_b"])),
            Err(ProviderError::SignatureMismatch)
        );
        // The signature covers the timestamp too.
        let r = req(&[&format!("t={},v1={s}", NOW - 1)], BODY);
        assert_eq!(
            verify(&r, &tenant(&["whsec_a"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn rotation_secrets_and_multiple_v1() {
        let old = sig_for("whsec_old", NOW, BODY);
        let new = sig_for("whsec_new", NOW, BODY);
        let both = tenant(&["whsec_new", "whsec_old"]);
        assert!(verify(&req(&[&format!("t={NOW},v1={old}")], BODY), &both).is_ok());
        assert!(verify(&req(&[&format!("t={NOW},v1={new}")], BODY), &both).is_ok());
        // Header with two signatures: either secret alone suffices, whatever the order.
        let two = format!("t={NOW},v1={new},v1={old}");
        assert!(verify(&req(&[&two], BODY), &tenant(&["whsec_old"])).is_ok());
        assert!(verify(&req(&[&two], BODY), &tenant(&["whsec_new"])).is_ok());
        assert_eq!(
            verify(&req(&[&two], BODY), &tenant(&["whsec_x"])),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn only_v1_counts() {
        let s = sig_for("whsec_a", NOW, BODY);
        let r = req(&[&format!("t={NOW},v0={s},v2={s}")], BODY);
        assert_eq!(
            verify(&r, &tenant(&["whsec_a"])),
            Err(ProviderError::MalformedHeader(HEADER, "no v1 signature"))
        );
    }

    #[test]
    fn timestamp_tolerance_both_directions() {
        let t = tenant(&["whsec_a"]);
        for (ts, ok) in [
            (NOW - 300, true),
            (NOW + 300, true),
            (NOW - 301, false),
            (NOW + 301, false),
        ] {
            let s = sig_for("whsec_a", ts, BODY);
            let got = verify(&req(&[&format!("t={ts},v1={s}")], BODY), &t);
            if ok {
                assert!(got.is_ok(), "{ts}");
            } else {
                assert_eq!(got, Err(ProviderError::TimestampOutOfTolerance), "{ts}");
            }
        }
    }

    #[test]
    fn missing_and_garbled_headers() {
        let t = tenant(&["whsec_a"]);
        let s = sig_for("whsec_a", NOW, BODY);
        assert_eq!(
            verify(&req(&[], BODY), &t),
            Err(ProviderError::MissingHeader(HEADER))
        );
        let cases: [(&str, &str); 7] = [
            ("", "no timestamp"),
            (",,", "no timestamp"),
            ("t=abc,v1=00", "timestamp is not a Unix time in seconds"),
            (&format!("v1={s}"), "no timestamp"),
            ("t=1700000000", "no v1 signature"),
            ("t=1700000000,v1=xyz", "signature is not valid hex"),
            ("t=1700000000,garbage", "entry without '='"),
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
            "stripe-signature",
            HeaderValue::from_bytes(b"t=1,v1=\xff").unwrap(),
        );
        let r = WebhookRequest::post(h, BODY);
        assert_eq!(
            verify(&r, &t),
            Err(ProviderError::MalformedHeader(
                HEADER,
                "value is not visible ASCII"
            ))
        );
        assert_eq!(
            verify(&req(&[&format!("t={NOW},v1={s}")], BODY), &tenant(&[])),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn duplicated_and_comma_joined_headers() {
        let t = tenant(&["whsec_a"]);
        let good = format!("t={NOW},v1={}", sig_for("whsec_a", NOW, BODY));
        let stale_ts = NOW - 1000;
        let stale = format!("t={stale_ts},v1={}", sig_for("whsec_a", stale_ts, BODY));
        let forged = format!("t={NOW},v1={}", "00".repeat(32));
        // Identical duplicates, separate or comma-joined.
        assert!(verify(&req(&[&good, &good], BODY), &t).is_ok());
        assert!(verify(&req(&[&format!("{good},{good}")], BODY), &t).is_ok());
        // A joined stale + fresh pair: each v1 is checked against its own timestamp.
        assert!(verify(&req(&[&format!("{stale},{good}")], BODY), &t).is_ok());
        assert!(verify(&req(&[&format!("{good},{stale}")], BODY), &t).is_ok());
        assert_eq!(
            verify(&req(&[&stale], BODY), &t),
            Err(ProviderError::TimestampOutOfTolerance)
        );
        assert_eq!(
            verify(&req(&[&forged, &forged], BODY), &t),
            Err(ProviderError::SignatureMismatch)
        );
        // Signature listed before its timestamp still pairs up.
        let s = sig_for("whsec_a", NOW, BODY);
        assert!(verify(&req(&[&format!("v1={s},t={NOW}")], BODY), &t).is_ok());
    }

    #[test]
    fn authentic_but_malformed_payloads() {
        let t = tenant(&["whsec_a"]);
        let check = |body: &str, want: ProviderError| {
            let s = sig_for("whsec_a", NOW, body);
            let got = verify(&req(&[&format!("t={NOW},v1={s}")], body), &t);
            assert!(!want.is_authentication_failure());
            assert_eq!(got, Err(want), "{body}");
        };
        check("not json", sig::payload_error("body is not a JSON object"));
        check(r#"{"type":"x"}"#, sig::payload_error("missing event `id`"));
        check(
            r#"{"id":"","type":"x"}"#,
            sig::payload_error("event id is empty"),
        );
        check(
            r#"{"id":"evt_1","type":""}"#,
            sig::payload_error("missing event `type`"),
        );
        check(
            r#"{"id":7,"type":"x"}"#,
            sig::payload_error("event `id` is not a string"),
        );
        let long = format!(r#"{{"id":"{}","type":"x"}}"#, "a".repeat(257));
        check(
            &long,
            sig::payload_error("event id is longer than 256 bytes"),
        );
    }

    #[test]
    fn connect_account_must_match_tenant_option() {
        let mut t = tenant(&["whsec_a"]);
        t.options.insert("account".into(), "acct_9".into());
        let s = sig_for("whsec_a", NOW, BODY);
        let r = req(&[&format!("t={NOW},v1={s}")], BODY);
        assert!(verify(&r, &t).is_ok());
        t.options.insert("account".into(), "acct_other".into());
        assert_eq!(
            verify(&r, &t),
            Err(ProviderError::TenantMismatch("account"))
        );
        // Platform events (no `account`) belong to the endpoint's own account.
        let body = r#"{"id":"evt_2","type":"x"}"#;
        let s = sig_for("whsec_a", NOW, body);
        assert!(verify(&req(&[&format!("t={NOW},v1={s}")], body), &t).is_ok());
    }

    #[test]
    fn sign_round_trip_uses_first_secret() {
        let t = tenant(&["whsec_new", "whsec_old"]);
        let h = Stripe.sign(BODY.as_bytes(), &t, "evt_1", NOW).unwrap();
        let r = WebhookRequest::post(h, BODY);
        assert_eq!(verify(&r, &t).unwrap().event_id, "evt_1");
        assert_eq!(
            verify(&r, &tenant(&["whsec_old"])),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            Stripe.sign(b"{}", &tenant(&[]), "", NOW).unwrap_err(),
            ProviderError::NoSecret
        );
    }
}
