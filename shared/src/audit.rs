//! The audit log of manual actions (replays, …): who, when, why, which events,
//! result. Append-only: records are inserted, never updated or deleted.
//!
//! Two adapters: [`crate::adapters::embedded::EmbeddedAuditLog`] (`audit.sqlite` next to
//! the embedded store) and [`crate::adapters::aws::DynamoAuditLog`] (a DynamoDB table).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ports::StoreError;

/// `list` limit when asked for 0.
const DEFAULT_LIMIT: usize = 100;

/// One manual action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Unique, sortable by time (`<at_ms>-<random>`).
    pub id: String,
    pub at_ms: i64,
    /// Who: `$USER` or `--actor`.
    pub actor: String,
    /// `replay`, `replay-bulk`, …
    pub action: String,
    /// Why, in the operator's words.
    pub reason: String,
    /// What was selected: the event, or the bulk filter (JSON).
    pub selector: Value,
    /// Inbox keys the action touched.
    pub events: Vec<String>,
    /// What happened (counts, per-event outcomes).
    pub result: Value,
}

impl AuditRecord {
    /// A fresh id for a record written at `at_ms`.
    pub fn new_id(at_ms: i64) -> String {
        format!("{at_ms:013}-{:016x}", rand::random::<u64>())
    }
}

#[async_trait]
pub trait AuditLog: Send + Sync {
    /// Append a record (refused if its id exists: records are never overwritten).
    async fn append(&self, record: &AuditRecord) -> Result<(), StoreError>;
    /// Newest first; `limit` 0 means 100.
    async fn list(&self, limit: usize) -> Result<Vec<AuditRecord>, StoreError>;
}

pub(crate) fn limit_or_default(limit: usize) -> usize {
    if limit == 0 {
        DEFAULT_LIMIT
    } else {
        limit
    }
}
