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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::reference::Invoice;

    fn record(data: Option<serde_json::Value>) -> StateRecord {
        let mut record = StateRecord::missing(order_key("acme", "o-1"));
        if let Some(data) = data {
            record.version = 1;
            record.data = data;
        }
        record
    }

    fn belief(order: Option<Order>) -> OrderBelief {
        ReferenceDomain.belief(&record(order.map(|o| serde_json::to_value(o).unwrap())))
    }

    #[test]
    fn orders_read_as_beliefs() {
        assert_eq!(
            ReferenceDomain.order_key("acme", "o-1"),
            order_key("acme", "o-1")
        );
        let missing = belief(None);
        assert_eq!(missing.payment, PaymentBelief::Missing);
        assert!(!missing.created_from_shop);

        let mut order = Order::new("o-1");
        let pending = PaymentBelief::Known {
            paid: false,
            failed: false,
            status: "pending".into(),
        };
        assert_eq!(belief(Some(order.clone())).payment, pending);

        order.payment_status = PaymentStatus::Failed;
        let failed = belief(Some(order.clone())).payment;
        assert!(
            matches!(failed, PaymentBelief::Known { paid: false, failed: true, ref status } if status == "failed")
        );

        // Past the payment: refunded orders are paid too.
        order.payment_status = PaymentStatus::Refunded;
        order.invoices.push(Invoice {
            invoice_id: "i-1".into(),
            amount_minor: 100,
            source_effect: "x#paid".into(),
        });
        order.shopify_created = true;
        let refunded = belief(Some(order));
        assert!(
            matches!(refunded.payment, PaymentBelief::Known { paid: true, failed: false, ref status } if status == "refunded")
        );
        assert!(refunded.created_from_shop);

        // Unreadable, yet the shop's creation still counts.
        let odd = ReferenceDomain.belief(&record(Some(
            serde_json::json!({"shopify_created": true, "unknown": 1}),
        )));
        assert_eq!(odd.payment, PaymentBelief::Unreadable);
        assert!(odd.created_from_shop);
    }
}
