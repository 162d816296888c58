//! Shopify: its order list, each order version an `orders/updated` (and an
//! `orders/create` for an order the business has not created from the shop).

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{api_base, foreign_next, Fetched, ReconcileError, Reconciler, MAX_PAGES};
use crate::config::TenantConfig;
use crate::domain::payment_view::PaymentView;
use crate::domain::state::{StateKey, StateStore};
use crate::envelope::Envelope;
use crate::time::{format_rfc3339, parse_rfc3339};

const SHOPIFY_API_VERSION: &str = "2024-10";

impl Reconciler {
    pub(super) async fn fetch_shopify(
        &self,
        tenant: &TenantConfig,
        since: i64,
        business: &dyn StateStore,
        option: &str,
    ) -> Result<Vec<Fetched>, ReconcileError> {
        let shop = tenant
            .option("shop_domain")
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ReconcileError::Config("tenant option `shop_domain` is not set".into()))?
            .to_ascii_lowercase();
        let default_base = format!("https://{shop}");
        let base = api_base(tenant, &default_base)?.to_string();
        let token = self.credential(tenant, option)?;
        let since_text: String =
            form_urlencoded::byte_serialize(format_rfc3339(since).as_bytes()).collect();
        let mut url = Some(format!(
            "{base}/admin/api/{SHOPIFY_API_VERSION}/orders.json?updated_at_min={since_text}&status=any&limit=250"
        ));
        let mut out = Vec::new();
        for page_no in 1..=MAX_PAGES {
            let Some(current) = url.take() else {
                return Ok(out);
            };
            let credential = ("x-shopify-access-token", token.as_str(), option);
            let (body, link) = self.get(&current, credential, page_no).await?;
            #[derive(Deserialize)]
            struct Page<'a> {
                #[serde(borrow)]
                orders: Vec<&'a RawValue>,
            }
            #[derive(Deserialize)]
            struct Order {
                id: serde_json::Value,
                updated_at: String,
            }
            let page: Page = serde_json::from_slice(&body)
                .map_err(|e| ReconcileError::Payload(format!("orders list: {e}")))?;
            let mut listed = Vec::with_capacity(page.orders.len());
            for raw in page.orders {
                let order: Order = serde_json::from_str(raw.get())
                    .map_err(|e| ReconcileError::Payload(format!("order: {e}")))?;
                let id = match &order.id {
                    serde_json::Value::Number(n) => n.to_string(),
                    serde_json::Value::String(s) => s.clone(),
                    _ => return Err(ReconcileError::Payload("order `id`".into())),
                };
                let at = parse_rfc3339(&order.updated_at).ok_or_else(|| {
                    ReconcileError::Payload(format!("order {id}: bad updated_at"))
                })?;
                listed.push((id, order.updated_at, at, raw));
            }
            let unknown =
                orders_not_created(business, self.payments.as_ref(), tenant, &listed).await?;
            for (id, updated_at, at, raw) in listed {
                let body = Bytes::copy_from_slice(raw.get().as_bytes());
                let envelope = |event_type: &str, event_id: String| Envelope {
                    provider: "shopify".into(),
                    tenant: tenant.tenant.clone(),
                    event_id,
                    event_type: event_type.into(),
                    object_id: Some(id.clone()),
                    object_version: Some(updated_at.clone()),
                    occurred_at: Some(at),
                    delivery_id: None,
                };
                // The listed order is the full order: for an order the business has
                // not created (its orders/create never came), it is that create. The
                // `#created` and stock keys make a late real orders/create a no-op.
                if unknown.contains(&id) {
                    out.push(Fetched {
                        envelope: envelope("orders/create", shopify_create_event_id(&shop, &id)),
                        body: body.clone(),
                        at,
                    });
                }
                // And always this version as an update, which the version check orders
                // against the webhooks (it is newer than a late real create, say).
                out.push(Fetched {
                    envelope: envelope("orders/updated", shopify_event_id(&shop, &id, &updated_at)),
                    body,
                    at,
                });
            }
            // Cursor paging: follow `rel="next"`, but only on the same API base, so the
            // token never goes to another host. A link elsewhere leaves pages unread:
            // the run fails rather than move the checkpoint past them.
            url = match link.as_deref().and_then(next_link) {
                Some(next) if next.starts_with(&format!("{base}/")) => Some(next),
                Some(next) => return Err(foreign_next(&current, page_no, &next, &base)),
                None => None,
            };
        }
        Err(ReconcileError::Payload(format!(
            "more than {MAX_PAGES} pages of orders"
        )))
    }
}

/// Of the listed Shopify orders, those the business has not created from Shopify (no
/// order record, or one opened by a payment provider only).
async fn orders_not_created(
    business: &dyn StateStore,
    view: &dyn PaymentView,
    tenant: &TenantConfig,
    listed: &[(String, String, i64, &RawValue)],
) -> Result<std::collections::BTreeSet<String>, ReconcileError> {
    let mut unknown = std::collections::BTreeSet::new();
    // Bounded batches: a DynamoDB BatchGetItem takes at most 100 keys.
    for chunk in listed.chunks(100) {
        let keys: Vec<StateKey> = chunk
            .iter()
            .map(|(id, ..)| view.order_key(&tenant.tenant, id))
            .collect();
        let records = business.load(&keys).await?;
        for ((id, ..), record) in chunk.iter().zip(records) {
            if !view.belief(&record).created_from_shop {
                unknown.insert(id.clone());
            }
        }
    }
    Ok(unknown)
}

/// The synthetic event id of the `orders/create` for an order the business has not
/// created (stable per order: one per order however often it is reconciled).
pub fn shopify_create_event_id(shop: &str, order_id: &str) -> String {
    format!("{shop}:orders/create:reconcile-{order_id}")
}

/// The synthetic event id of one Shopify order version (stable across runs).
pub fn shopify_event_id(shop: &str, order_id: &str, updated_at: &str) -> String {
    format!("{shop}:orders/updated:reconcile-{order_id}-{updated_at}")
}

/// The `rel="next"` URL of a `Link` header.
fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"")
            .then(|| {
                url.trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_string()
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_header() {
        let h = r#"<https://s.myshopify.com/admin/api/2024-10/orders.json?page_info=a&limit=250>; rel="previous", <https://s.myshopify.com/admin/api/2024-10/orders.json?page_info=b&limit=250>; rel="next""#;
        assert_eq!(
            next_link(h).as_deref(),
            Some("https://s.myshopify.com/admin/api/2024-10/orders.json?page_info=b&limit=250")
        );
        assert_eq!(next_link(r#"<https://x/y>; rel="previous""#), None);
    }

    #[test]
    fn shopify_ids_are_stable_per_version() {
        let a = shopify_event_id("s.myshopify.com", "1001", "2024-01-01T10:00:00-05:00");
        assert_eq!(
            a,
            "s.myshopify.com:orders/updated:reconcile-1001-2024-01-01T10:00:00-05:00"
        );
        assert_ne!(
            a,
            shopify_event_id("s.myshopify.com", "1001", "2024-01-01T10:00:01-05:00")
        );
    }
}
