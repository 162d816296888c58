//! Stripe: its event list, each event exactly the webhook body Stripe would have sent.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{api_base, Fetched, ReconcileError, Reconciler, MAX_PAGES};
use crate::config::TenantConfig;
use crate::providers::stripe;

impl Reconciler {
    pub(super) async fn fetch_stripe(
        &self,
        tenant: &TenantConfig,
        since: i64,
        option: &str,
    ) -> Result<Vec<Fetched>, ReconcileError> {
        let base = api_base(tenant, "https://api.stripe.com")?;
        let key = self.credential(tenant, option)?;
        let auth = format!("Bearer {key}");
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        for page_no in 1..=MAX_PAGES {
            let mut url = format!("{base}/v1/events?created%5Bgte%5D={since}&limit=100");
            if let Some(after) = &after {
                url.push_str("&starting_after=");
                url.extend(form_urlencoded::byte_serialize(after.as_bytes()));
            }
            let credential = ("authorization", auth.as_str(), option);
            let (body, _) = self.get(&url, credential, page_no).await?;
            #[derive(Deserialize)]
            struct Page<'a> {
                #[serde(borrow)]
                data: Vec<&'a RawValue>,
                #[serde(default)]
                has_more: bool,
            }
            let page: Page = serde_json::from_slice(&body)
                .map_err(|e| ReconcileError::Payload(format!("events list: {e}")))?;
            for raw in &page.data {
                let bytes = Bytes::copy_from_slice(raw.get().as_bytes());
                let envelope = stripe::envelope_from_body(&bytes, tenant)
                    .map_err(|e| ReconcileError::Payload(format!("event: {e}")))?;
                after = Some(envelope.event_id.clone());
                let at = envelope.occurred_at.unwrap_or(since);
                out.push(Fetched {
                    envelope,
                    body: bytes,
                    at,
                });
            }
            if !page.has_more || page.data.is_empty() {
                return Ok(out);
            }
        }
        Err(ReconcileError::Payload(format!(
            "more than {MAX_PAGES} pages of events"
        )))
    }
}
