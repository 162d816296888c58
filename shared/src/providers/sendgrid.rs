//! SendGrid (Twilio SendGrid Event Webhook, signed): `X-Twilio-Email-Event-Webhook-Signature:
//! <base64 ASN.1 DER>` = ECDSA P-256 / SHA-256 over `timestamp + raw body`, with the
//! timestamp in `X-Twilio-Email-Event-Webhook-Timestamp` [SDK-src] (sendgrid 6.12.5
//! `sendgrid/helpers/eventwebhook/__init__.py` `EventWebhook.verify_signature`: the
//! verification key is base64 DER `SubjectPublicKeyInfo`, as shown under Mail Settings).
//! The SDK checks no timestamp age; einmal holds it to the tenant's tolerance, both
//! directions (UNCONFIRMED that SendGrid re-signs each retry with a fresh timestamp).
//!
//! Secrets: the verification key (base64 SPKI DER). A secret may also be a base64
//! PKCS#8 P-256 private key: its public key verifies, and it signs (`einmal send`, the
//! demo tenant, tests); SendGrid never hands out its private key. Rotation: every secret
//! is tried.
//!
//! The body is a JSON array of events (up to 1,000 per POST [doc]); each event is stored
//! as its own bytes and deduplicated on its `sg_event_id` ("use … the sg_event_id as a
//! differentiator" [doc] docs.sendgrid.com/for-developers/tracking-events/troubleshooting).

use std::borrow::Cow;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    EcdsaKeyPair, KeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_ASN1,
    ECDSA_P256_SHA256_ASN1_SIGNING,
};
use base64::Engine as _;
use http::HeaderName;
use serde_json::value::RawValue;

use super::json::{self, Raw};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::{Secret, TenantConfig};
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct SendGrid;

const SIGNATURE_NAME: &str = "x-twilio-email-event-webhook-signature";
const TIMESTAMP_NAME: &str = "x-twilio-email-event-webhook-timestamp";
pub static SIGNATURE: HeaderName = HeaderName::from_static(SIGNATURE_NAME);
static TIMESTAMP: HeaderName = HeaderName::from_static(TIMESTAMP_NAME);

/// The DER bytes of a secret (base64, whitespace around it ignored).
fn der(secret: &Secret) -> Option<Vec<u8>> {
    sig::B64
        .decode(secret.expose().trim())
        .ok()
        .filter(|d| !d.is_empty())
}

/// The public key a secret stands for: SPKI DER as given, or a PKCS#8 private key's own
/// public point. `None`: not a usable key.
fn public_key(secret: &Secret) -> Option<Vec<u8>> {
    let der = der(secret)?;
    match EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &der) {
        Ok(pair) => Some(pair.public_key().as_ref().to_vec()),
        Err(_) => Some(der),
    }
}

fn envelope(item: &RawValue, tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    let [id, kind, message, timestamp] = json::json_fields(
        item.get().as_bytes(),
        [
            &["sg_event_id"],
            &["event"],
            &["sg_message_id"],
            &["timestamp"],
        ],
    )?;
    let id = json::required_str(id, "missing `sg_event_id`")?;
    sig::check_event_id(&id)?;
    let kind = json::required_str(kind, "missing `event`")?;
    Ok(Envelope {
        provider: "sendgrid".into(),
        tenant: tenant.tenant.clone(),
        event_id: id.into_owned(),
        event_type: kind.into_owned(),
        object_id: message.and_then(Raw::text).map(Cow::into_owned),
        object_version: None,
        occurred_at: timestamp.and_then(Raw::time),
        delivery_id: None,
    })
}

impl Provider for SendGrid {
    fn name(&self) -> &'static str {
        "sendgrid"
    }

    fn options(&self) -> &'static [&'static str] {
        &[]
    }

    /// "All events are retried at increasing intervals for up to 24 hours after the
    /// event occurs" [doc] (docs.sendgrid.com/for-developers/tracking-events/troubleshooting).
    fn retry_window_days(&self) -> u32 {
        1
    }

    fn validate_tenant(&self, tenant: &TenantConfig) -> Result<(), String> {
        if tenant.secrets.iter().all(|s| der(s).is_some()) {
            Ok(())
        } else {
            Err("sendgrid secrets are the base64 verification key (or a base64 PKCS#8 key)".into())
        }
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let secrets = sig::secrets(tenant)?;
        let ts = sig::single_header(request, &TIMESTAMP)?
            .ok_or(ProviderError::MissingHeader(TIMESTAMP_NAME))?;
        let at = sig::parse_unix(TIMESTAMP_NAME, ts)?;
        let signature = sig::single_header(request, &SIGNATURE)?
            .ok_or(ProviderError::MissingHeader(SIGNATURE_NAME))?;
        let signature = sig::decode_base64(SIGNATURE_NAME, signature)?;
        sig::check_timestamp(at, now_secs, tenant.tolerance_secs, false)?;
        let body = &request.body;
        let mut message = Vec::with_capacity(ts.len() + body.len());
        message.extend_from_slice(ts.as_bytes());
        message.extend_from_slice(body);
        let mut usable = false;
        let mut verified = false;
        for secret in secrets {
            let Some(key) = public_key(secret) else {
                continue;
            };
            usable = true;
            if UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &key)
                .verify(&message, &signature)
                .is_ok()
            {
                verified = true;
                break;
            }
        }
        match (usable, verified) {
            (_, true) => {}
            (true, false) => return Err(ProviderError::SignatureMismatch),
            (false, false) => return Err(ProviderError::NoSecret),
        }
        let items: Vec<&RawValue> = serde_json::from_slice(body)
            .map_err(|_| sig::payload_error("body is not a JSON array of events"))?;
        if items.is_empty() {
            return Err(sig::payload_error("body holds no event"));
        }
        items
            .into_iter()
            .map(|item| {
                Ok(VerifiedEvent {
                    envelope: envelope(item, tenant)?,
                    body: body.slice_ref(item.get().as_bytes()),
                })
            })
            .collect()
    }

    /// Signs with the first secret, which must be a PKCS#8 private key. ECDSA signatures
    /// are randomized: two signings of one body differ, both verify.
    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        _event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let der = der(&sig::secrets(tenant)?[0]).ok_or(ProviderError::NoSecret)?;
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &der)
            .map_err(|_| ProviderError::NoSecret)?;
        let ts = now_secs.to_string();
        let mut message = ts.as_bytes().to_vec();
        message.extend_from_slice(body);
        let signature = pair
            .sign(&SystemRandom::new(), &message)
            .map_err(|_| ProviderError::NoSecret)?;
        let signature = sig::B64.encode(signature.as_ref());
        sig::json_headers(&[(&SIGNATURE, &signature), (&TIMESTAMP, &ts)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::test_support::tenant;
    use http::HeaderValue;

    // The published vector of sendgrid-python's test/unit/test_eventwebhook.py (the
    // body is `json.dumps([...], sort_keys=True, separators=(',', ':')) + '\r\n'`).
    const V_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw+2fNNRaINXvVpiglSI8eNEc6wEA3F+g==";
    const V_BAD_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEqTxd43gyp8IOEto2LdIfjRQrIbsd4SXZkLW6jDutdhXSJCWHw8REntlo7aNDthvj+y7GjUuFDb/R1NGe1OPzpA==";
    const V_SIG: &str = "MEUCIGHQVtGj+Y3LkG9fLcxf3qfI10QysgDWmMOVmxG0u6ZUAiEAyBiXDWzM+uOe5W0JuG+luQAbPIqHh89M15TluLtEZtM=";
    const V_TS: i64 = 1_600_112_502;
    const V_BODY: &str = "[{\"email\":\"hello@world.com\",\"event\":\"dropped\",\"reason\":\"Bounced Address\",\"sg_event_id\":\"ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA\",\"sg_message_id\":\"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-756b745b58-kmzbl-18-5F5FC76C-9.0\",\"smtp-id\":\"<LRzXl_NHStOGhQ4kofSm_A@ismtpd0039p1iad1.sendgrid.net>\",\"timestamp\":1600112492}]\r\n";

    fn vector_headers(sig: &str, ts: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(&SIGNATURE, HeaderValue::from_str(sig).unwrap());
        h.insert(&TIMESTAMP, HeaderValue::from_str(ts).unwrap());
        h
    }

    fn check(
        h: http::HeaderMap,
        body: &str,
        t: &TenantConfig,
        now: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        SendGrid.verify_and_extract(&WebhookRequest::post(h, body.to_owned()), t, now)
    }

    /// A fresh P-256 key pair: (PKCS#8 private key, SPKI public key), base64.
    fn pair() -> (String, String) {
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &SystemRandom::new())
                .unwrap();
        let kp = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).unwrap();
        let spki = aws_lc_rs::encoding::AsDer::<aws_lc_rs::encoding::PublicKeyX509Der>::as_der(
            kp.public_key(),
        )
        .unwrap();
        (
            sig::B64.encode(pkcs8.as_ref()),
            sig::B64.encode(spki.as_ref()),
        )
    }

    #[test]
    fn published_vector_verifies_and_each_event_is_its_own() {
        let t = tenant("sendgrid", &[V_KEY]);
        let events = check(vector_headers(V_SIG, "1600112502"), V_BODY, &t, V_TS).unwrap();
        assert_eq!(events.len(), 1);
        let env = &events[0].envelope;
        assert_eq!(
            env.event_id,
            "ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA"
        );
        assert_eq!(env.event_type, "dropped");
        assert_eq!(env.occurred_at, Some(1_600_112_492));
        assert_eq!(
            env.object_id.as_deref(),
            Some("LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-756b745b58-kmzbl-18-5F5FC76C-9.0")
        );
        assert!(events[0].body.starts_with(b"{\"email\"") && events[0].body.ends_with(b"}"));
        // The vector's negative cases: another key, another payload, another timestamp.
        assert_eq!(
            check(
                vector_headers(V_SIG, "1600112502"),
                V_BODY,
                &tenant("sendgrid", &[V_BAD_KEY]),
                V_TS
            )
            .map(|_| ()),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            check(
                vector_headers(V_SIG, "1600112502"),
                V_BODY.trim_end(),
                &t,
                V_TS
            )
            .map(|_| ()),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            check(vector_headers(V_SIG, "1600112503"), V_BODY, &t, V_TS).map(|_| ()),
            Err(ProviderError::SignatureMismatch)
        );
        // Rotation: the old key next to a new one still verifies.
        assert!(check(
            vector_headers(V_SIG, "1600112502"),
            V_BODY,
            &tenant("sendgrid", &[V_BAD_KEY, V_KEY]),
            V_TS
        )
        .is_ok());
        // Signed timestamp, held to the tolerance both ways.
        for (now, ok) in [(V_TS + 300, true), (V_TS - 300, true), (V_TS + 301, false)] {
            let got = check(vector_headers(V_SIG, "1600112502"), V_BODY, &t, now).map(|_| ());
            if ok {
                assert!(got.is_ok(), "{now}");
            } else {
                assert_eq!(got, Err(ProviderError::TimestampOutOfTolerance), "{now}");
            }
        }
    }

    #[test]
    fn signs_with_a_private_key_and_refuses_what_does_not_hold() {
        let (private, public) = pair();
        let now = 1_700_000_000;
        let body = r#"[{"email":"a@example.com","event":"delivered","sg_event_id":"ev1","sg_message_id":"m1","timestamp":1699999990},{"email":"a@example.com","event":"open","sg_event_id":"ev2","sg_message_id":"m1","timestamp":1699999999}]"#;
        let h = SendGrid
            .sign(body.as_bytes(), &tenant("sendgrid", &[&private]), "", now)
            .unwrap();
        // The public key alone verifies, and so does the private key's own public point.
        for secret in [&public, &private] {
            let events = check(h.clone(), body, &tenant("sendgrid", &[secret]), now).unwrap();
            let ids: Vec<_> = events
                .iter()
                .map(|e| e.envelope.event_id.as_str())
                .collect();
            assert_eq!(ids, ["ev1", "ev2"]);
        }
        let t = tenant("sendgrid", &[&public]);
        assert_eq!(
            check(h.clone(), &body.replace("ev2", "ev3"), &t, now).map(|_| ()),
            Err(ProviderError::SignatureMismatch)
        );
        let (_, other) = pair();
        assert_eq!(
            check(h.clone(), body, &tenant("sendgrid", &[&other]), now).map(|_| ()),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            check(h.clone(), body, &t, now + 301).map(|_| ()),
            Err(ProviderError::TimestampOutOfTolerance)
        );
        // The signature covers the timestamp: another one does not verify.
        let mut moved = h.clone();
        moved.insert(&TIMESTAMP, HeaderValue::from_static("1700000001"));
        assert_eq!(
            check(moved, body, &t, now).map(|_| ()),
            Err(ProviderError::SignatureMismatch)
        );
        let mut missing = h.clone();
        missing.remove(&SIGNATURE);
        assert_eq!(
            check(missing, body, &t, now).map(|_| ()),
            Err(ProviderError::MissingHeader(SIGNATURE_NAME))
        );
        let mut garbled = h.clone();
        garbled.insert(&SIGNATURE, HeaderValue::from_static("%%%"));
        assert!(matches!(
            check(garbled, body, &t, now),
            Err(ProviderError::MalformedHeader(SIGNATURE_NAME, _))
        ));
        let mut no_ts = h.clone();
        no_ts.remove(&TIMESTAMP);
        assert_eq!(
            check(no_ts, body, &t, now).map(|_| ()),
            Err(ProviderError::MissingHeader(TIMESTAMP_NAME))
        );
        // A public key cannot sign; a secret that is not base64 is unusable.
        assert_eq!(
            SendGrid.sign(body.as_bytes(), &t, "", now).map(|_| ()),
            Err(ProviderError::NoSecret)
        );
        assert_eq!(
            check(h.clone(), body, &tenant("sendgrid", &["***"]), now).map(|_| ()),
            Err(ProviderError::NoSecret)
        );
        assert!(SendGrid
            .validate_tenant(&tenant("sendgrid", &["***"]))
            .is_err());
        // Authentic but without an event id: malformed, not an authentication failure.
        let thin = r#"[{"event":"open"}]"#;
        let h = SendGrid
            .sign(thin.as_bytes(), &tenant("sendgrid", &[&private]), "", now)
            .unwrap();
        let err = check(h, thin, &t, now).unwrap_err();
        assert!(!err.is_authentication_failure(), "{err:?}");
    }
}
