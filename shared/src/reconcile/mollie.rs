//! Mollie: its payment list, newest first, back to the checkpoint.

use serde::Deserialize;

use super::thin::{thin_payment, ThinPayment};
use super::{api_base, foreign_next, ReconcileError, Reconciler, MAX_PAGES};
use crate::config::TenantConfig;
use crate::providers::thin::ThinResource;
use crate::time::parse_rfc3339;

/// Page size of Mollie's `GET /v2/payments` (its maximum).
pub const MOLLIE_PAGE_SIZE: usize = 250;

impl Reconciler {
    /// Mollie's payments created at or after `since`, newest first:
    /// `GET /v2/payments?limit=250`, then `_links.next` (same API base only) until a
    /// page reaches a payment older than `since`.
    pub(super) async fn list_mollie(
        &self,
        tenant: &TenantConfig,
        facts: &ThinResource,
        since: i64,
        option: &str,
    ) -> Result<Vec<ThinPayment>, ReconcileError> {
        let base = api_base(tenant, "https://api.mollie.com")?.to_string();
        let auth = format!("Bearer {}", self.credential(tenant, option)?);
        #[derive(Deserialize)]
        struct Page {
            #[serde(rename = "_embedded", default)]
            embedded: Option<Embedded>,
            #[serde(rename = "_links", default)]
            links: Option<Links>,
        }
        #[derive(Deserialize)]
        struct Embedded {
            #[serde(default)]
            payments: Vec<serde_json::Value>,
        }
        #[derive(Deserialize)]
        struct Links {
            next: Option<Href>,
        }
        #[derive(Deserialize)]
        struct Href {
            href: String,
        }
        let mut url = Some(format!("{base}/v2/payments?limit={MOLLIE_PAGE_SIZE}"));
        let mut out = Vec::new();
        for page_no in 1..=MAX_PAGES {
            let Some(current) = url.take() else {
                return Ok(out);
            };
            let credential = ("authorization", auth.as_str(), option);
            let (body, _) = self.get(&current, credential, page_no).await?;
            let page: Page = serde_json::from_slice(&body)
                .map_err(|e| ReconcileError::Payload(format!("payments list: {e}")))?;
            let mut reached_older = false;
            for raw in page.embedded.map(|e| e.payments).unwrap_or_default() {
                let mut payment = thin_payment("mollie", facts, &raw)?;
                payment.at = raw
                    .get("createdAt")
                    .and_then(serde_json::Value::as_str)
                    .and_then(parse_rfc3339)
                    .ok_or_else(|| {
                        ReconcileError::Payload(format!("payment {}: bad createdAt", payment.id))
                    })?;
                if payment.at < since {
                    reached_older = true;
                    continue;
                }
                out.push(payment);
            }
            if reached_older {
                return Ok(out);
            }
            url = match page.links.and_then(|l| l.next).map(|n| n.href) {
                Some(next) if next.starts_with(&format!("{base}/")) => Some(next),
                Some(next) => return Err(foreign_next(&current, page_no, &next, &base)),
                None => None,
            };
        }
        Err(ReconcileError::Payload(format!(
            "more than {MAX_PAGES} pages of payments"
        )))
    }
}
