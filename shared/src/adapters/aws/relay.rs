//! The relay port (`InboxRelay`) on this backend: not supported yet; every call
//! fails with a clear `StoreError::Unavailable`, so a relay configured on this
//! backend stops at its first call instead of silently delivering nothing.

use async_trait::async_trait;

use super::AwsStore;
use crate::envelope::InboxKey;
use crate::ports::{
    DeliveryStatus, InboxItem, InboxRelay, OrderClaim, OrderGate, OrderPosition, StoreError,
};

fn unsupported() -> StoreError {
    StoreError::Unavailable("relay not supported yet".into())
}

#[async_trait]
impl InboxRelay for AwsStore {
    async fn relay_due(&self, _now_ms: i64, _limit: usize) -> Result<Vec<InboxKey>, StoreError> {
        Err(unsupported())
    }

    async fn relay_pending(&self, _limit: usize) -> Result<Vec<InboxItem>, StoreError> {
        Err(unsupported())
    }

    async fn claim_relay(
        &self,
        _key: &InboxKey,
        _owner: &str,
        _now_ms: i64,
        _lease_ms: i64,
    ) -> Result<Option<InboxItem>, StoreError> {
        Err(unsupported())
    }

    async fn finish_relay(
        &self,
        _key: &InboxKey,
        _owner: &str,
        _deliveries: &[DeliveryStatus],
        _relay_due_ms: Option<i64>,
        _now_ms: i64,
    ) -> Result<bool, StoreError> {
        Err(unsupported())
    }

    async fn order_acquire(
        &self,
        _claim: &OrderClaim,
        _now_ms: i64,
    ) -> Result<OrderGate, StoreError> {
        Err(unsupported())
    }

    async fn order_release(
        &self,
        _cursor: &str,
        _key: &str,
        _delivered: Option<&OrderPosition>,
        _now_ms: i64,
    ) -> Result<Option<InboxKey>, StoreError> {
        Err(unsupported())
    }
}
