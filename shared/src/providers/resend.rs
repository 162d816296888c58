//! Resend: signed by Svix, so the Standard Webhooks scheme under the `svix-*` header
//! names (`svix-id`, `svix-timestamp`, `svix-signature: v1,<b64>`), key = base64 after
//! `whsec_`, ±tolerance [SDK-src] (resend-node `src/webhooks/webhooks.ts` delegates to
//! the `svix` package's `Webhook.verify`). Verification is [`StandardWebhooks`]'s; only
//! the names and the body's fields differ: the event id is `svix-id` (the same on every
//! retry), the type `type`, the object `data.email_id` (or `data.id`).

use std::borrow::Cow;

use http::HeaderName;

use super::json::{self, Raw};
use super::standard_webhooks::StandardWebhooks;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::request::WebhookRequest;

pub struct Resend;

impl Provider for Resend {
    fn name(&self) -> &'static str {
        "resend"
    }

    fn options(&self) -> &'static [&'static str] {
        &[]
    }

    /// Svix's schedule spans about 28 h.
    fn retry_window_days(&self) -> u32 {
        2
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let mut events = StandardWebhooks.verify_and_extract(request, tenant, now_secs)?;
        let [kind, created, email, data_id] = json::json_fields(
            &request.body,
            [
                &["type"],
                &["created_at"],
                &["data", "email_id"],
                &["data", "id"],
            ],
        )?;
        let kind = json::required_str(kind, "missing event `type`")?;
        for event in &mut events {
            let envelope = &mut event.envelope;
            envelope.provider = "resend".into();
            envelope.event_type = kind.clone().into_owned();
            envelope.object_id = email.or(data_id).and_then(Raw::text).map(Cow::into_owned);
            envelope.occurred_at = created.and_then(Raw::time).or(envelope.occurred_at);
        }
        Ok(events)
    }

    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let standard = StandardWebhooks.sign(body, tenant, event_id, now_secs)?;
        let mut headers = http::HeaderMap::new();
        for (name, value) in &standard {
            let name = match name.as_str().strip_prefix("webhook-") {
                Some(rest) => HeaderName::try_from(format!("svix-{rest}"))
                    .expect("svix- plus a header name is a header name"),
                None => name.clone(),
            };
            headers.insert(name, value.clone());
        }
        Ok(headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::test_support::{tenant, verify_one};

    const KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const BODY: &str = r#"{"type":"email.delivered","created_at":"2024-02-22T23:41:12.126Z","data":{"email_id":"56761188-7520-42d8-8898-ff6fc54ce618","to":["a@example.com"]}}"#;

    #[test]
    fn svix_headers_and_resend_fields() {
        let t = tenant("resend", &[KEY]);
        let h = Resend.sign(BODY.as_bytes(), &t, "msg_1", 1_000).unwrap();
        assert!(h.contains_key("svix-signature") && !h.contains_key("webhook-signature"));
        let env = verify_one(&Resend, &WebhookRequest::post(h.clone(), BODY), &t, 1_000).unwrap();
        assert_eq!(env.provider, "resend");
        assert_eq!(env.event_id, "msg_1");
        assert_eq!(env.event_type, "email.delivered");
        assert_eq!(
            env.object_id.as_deref(),
            Some("56761188-7520-42d8-8898-ff6fc54ce618")
        );
        assert_eq!(
            verify_one(
                &Resend,
                &WebhookRequest::post(h.clone(), BODY),
                &t,
                1_000 + 301
            ),
            Err(ProviderError::TimestampOutOfTolerance)
        );
        assert_eq!(
            verify_one(
                &Resend,
                &WebhookRequest::post(h, BODY.replace("23:41", "23:42")),
                &t,
                1_000
            ),
            Err(ProviderError::SignatureMismatch)
        );
    }
}
