//! The reference domain's [`PaymentView`]: its `order` records, read for
//! reconciliation.

use super::{order_key, Order, PaymentStatus, ReferenceDomain};
use crate::domain::payment_view::{OrderBelief, PaymentBelief, PaymentView};
use crate::domain::state::{StateKey, StateRecord};

impl PaymentView for ReferenceDomain {
    fn order_key(&self, tenant: &str, order_id: &str) -> StateKey {
        order_key(tenant, order_id)
    }

    fn belief(&self, record: &StateRecord) -> OrderBelief {
        // Read from the raw data: an order the domain opened from Shopify says so even
        // when the rest of the record does not parse.
        let created_from_shop = record.exists()
            && record.data.get("shopify_created") == Some(&serde_json::Value::Bool(true));
        let payment = if !record.exists() {
            PaymentBelief::Missing
        } else {
            match serde_json::from_value::<Order>(record.data.clone()) {
                Ok(order) => PaymentBelief::Known {
                    paid: order.is_paid(),
                    failed: order.payment_status == PaymentStatus::Failed,
                    status: serde_json::to_value(order.payment_status)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                },
                Err(_) => PaymentBelief::Unreadable,
            }
        };
        OrderBelief {
            payment,
            created_from_shop,
        }
    }
}
