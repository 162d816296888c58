//! HubSpot (webhooks API, signature v3): `X-HubSpot-Signature-v3: <b64>` =
//! HMAC-SHA256(app client secret as UTF-8, `method + uri + body + timestamp`), with
//! `X-HubSpot-Request-Timestamp` in **milliseconds**; the SDK refuses a timestamp more
//! than 300 s old [SDK-src] (hubspot-api-client 12.0.0 `hubspot/utils/signature.py`).
//! The URI is the full URL HubSpot called, so it is the tenant option `url` (as for
//! Square). The window is the tenant's tolerance, both directions.
//!
//! The body is a JSON array of up to 100 events; each is its own event, stored as its
//! own bytes, deduplicated on its `eventId` (the same on every `attemptNumber`). Option
//! `portal_id`: every event's `portalId` must equal it.

use http::HeaderName;
use serde_json::value::RawValue;

use super::json::{self, Raw};
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;

pub struct HubSpot;

const HEADER: &str = "x-hubspot-signature-v3";
static SIGNATURE: HeaderName = HeaderName::from_static(HEADER);
static TIMESTAMP: HeaderName = HeaderName::from_static("x-hubspot-request-timestamp");

fn url(tenant: &TenantConfig) -> Result<&str, ProviderError> {
    tenant.option("url").ok_or(ProviderError::NoSecret)
}

fn mac(secret: &str, url: &str, body: &[u8], ts: &str) -> [u8; 32] {
    sig::hmac_sha256(
        secret.as_bytes(),
        &[b"POST", url.as_bytes(), body, ts.as_bytes()],
    )
}

fn envelope(item: &RawValue, tenant: &TenantConfig) -> Result<Envelope, ProviderError> {
    let [id, kind, object, occurred, portal, attempt] = json::json_fields(
        item.get().as_bytes(),
        [
            &["eventId"],
            &["subscriptionType"],
            &["objectId"],
            &["occurredAt"],
            &["portalId"],
            &["attemptNumber"],
        ],
    )?;
    let id = id
        .and_then(Raw::text)
        .ok_or_else(|| sig::payload_error("missing `eventId`"))?;
    sig::check_event_id(&id)?;
    let kind = json::required_str(kind, "missing `subscriptionType`")?;
    if let Some(want) = tenant.option("portal_id") {
        if portal.and_then(Raw::text).as_deref() != Some(want) {
            return Err(ProviderError::TenantMismatch("portal_id"));
        }
    }
    Ok(Envelope {
        provider: "hubspot".into(),
        tenant: tenant.tenant.clone(),
        event_id: id.into_owned(),
        event_type: kind.into_owned(),
        object_id: object.and_then(Raw::text).map(|o| o.into_owned()),
        object_version: None,
        occurred_at: occurred.and_then(Raw::time).map(|ms| ms.div_euclid(1000)),
        delivery_id: attempt.and_then(Raw::text).map(|a| format!("attempt-{a}")),
    })
}

impl Provider for HubSpot {
    fn name(&self) -> &'static str {
        "hubspot"
    }

    fn options(&self) -> &'static [&'static str] {
        &["url", "portal_id"]
    }

    fn validate_tenant(&self, tenant: &TenantConfig) -> Result<(), String> {
        match tenant.option("url") {
            Some(u) if u.starts_with("https://") || u.starts_with("http://") => Ok(()),
            _ => Err("hubspot needs option `url`: the target URL exactly as registered".into()),
        }
    }

    /// Up to 10 retries spread over 24 hours [doc] (developers.hubspot.com webhooks
    /// API, "Retries"; UNCONFIRMED here: not re-read).
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
        let url = url(tenant)?;
        let ts = sig::single_header(request, &TIMESTAMP)?
            .ok_or(ProviderError::MissingHeader("x-hubspot-request-timestamp"))?;
        let ms = sig::parse_unix("x-hubspot-request-timestamp", ts)?;
        sig::check_timestamp(ms.div_euclid(1000), now_secs, tenant.tolerance_secs, false)?;
        let candidates = sig::base64_signatures(request, &SIGNATURE)?;
        let body = &request.body;
        sig::verify_any(secrets, &candidates, |s| {
            Some(mac(s.expose(), url, body, ts))
        })?;
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

    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        _event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let secret = sig::secrets(tenant)?[0].expose();
        let ts = (i128::from(now_secs) * 1000).to_string();
        let signature = base64::Engine::encode(&sig::B64, mac(secret, url(tenant)?, body, &ts));
        sig::json_headers(&[(&SIGNATURE, &signature), (&TIMESTAMP, &ts)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::test_support::tenant;

    const URL: &str = "https://example.com/webhooks/hubspot/acme";
    const BODY: &str = r#"[{"eventId":100,"subscriptionId":1,"portalId":62515,"appId":1,"occurredAt":1700000000123,"subscriptionType":"contact.creation","attemptNumber":0,"objectId":123,"changeFlag":"NEW"},{"eventId":101,"subscriptionId":1,"portalId":62515,"appId":1,"occurredAt":1700000000456,"subscriptionType":"deal.propertyChange","attemptNumber":0,"objectId":9,"propertyName":"amount","propertyValue":"10"}]"#;

    fn t(secret: &str) -> TenantConfig {
        let mut t = tenant("hubspot", &[secret]);
        t.options.insert("url".into(), URL.into());
        t.options.insert("portal_id".into(), "62515".into());
        t
    }

    #[test]
    fn each_event_of_the_batch_is_its_own_and_the_window_holds() {
        let now = 1_700_000_000;
        let h = HubSpot
            .sign(BODY.as_bytes(), &t("secret"), "", now)
            .unwrap();
        let events = HubSpot
            .verify_and_extract(&WebhookRequest::post(h.clone(), BODY), &t("secret"), now)
            .unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].envelope.event_id, "100");
        assert_eq!(events[1].envelope.event_type, "deal.propertyChange");
        assert_eq!(events[1].envelope.occurred_at, Some(1_700_000_000));
        assert!(events[0].body.starts_with(b"{\"eventId\":100") && events[0].body.ends_with(b"}"));
        let check = |r: WebhookRequest, tenant: &TenantConfig, at: i64| {
            HubSpot.verify_and_extract(&r, tenant, at).map(|_| ())
        };
        assert_eq!(
            check(
                WebhookRequest::post(h.clone(), BODY),
                &t("secret"),
                now + 301
            ),
            Err(ProviderError::TimestampOutOfTolerance)
        );
        assert_eq!(
            check(WebhookRequest::post(h.clone(), BODY), &t("other"), now),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            check(
                WebhookRequest::post(h.clone(), BODY.replace("123,", "124,")),
                &t("secret"),
                now
            ),
            Err(ProviderError::SignatureMismatch)
        );
        let mut other_url = t("secret");
        other_url.options.insert("url".into(), format!("{URL}/x"));
        assert_eq!(
            check(WebhookRequest::post(h, BODY), &other_url, now),
            Err(ProviderError::SignatureMismatch)
        );
    }
}
