//! The business-state port: versioned records with the effect keys applied to them.
//!
//! Every business effect is guarded by its effect key stored on the record it changes
//! (the `applied` set) and by the record's version, both checked in the same atomic
//! commit: a TransactWriteItems on AWS (a single conditional PutItem when one record is
//! written), one SQLite transaction embedded. A redelivered or replayed event finds its
//! effect key already applied and changes nothing.

use std::collections::BTreeSet;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::ports::StoreError;

/// Identifies one business record: `tenant#kind#id` (e.g. `shop-1#order#1001`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StateKey {
    pub tenant: String,
    pub kind: String,
    pub id: String,
}

impl StateKey {
    pub fn new(tenant: impl Into<String>, kind: impl Into<String>, id: impl Into<String>) -> Self {
        StateKey {
            tenant: tenant.into(),
            kind: kind.into(),
            id: id.into(),
        }
    }

    /// The stored primary key.
    pub fn pk(&self) -> String {
        format!("{}#{}#{}", self.tenant, self.kind, self.id)
    }
}

/// One record as loaded. A record that does not exist loads as version 0, `data` null.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateRecord {
    pub key: StateKey,
    /// Incremented by every committed write; 0 = does not exist.
    pub version: u64,
    pub data: serde_json::Value,
    /// Effect keys already applied to this record.
    pub applied: BTreeSet<String>,
}

impl StateRecord {
    pub fn missing(key: StateKey) -> Self {
        StateRecord {
            key,
            version: 0,
            data: serde_json::Value::Null,
            applied: BTreeSet::new(),
        }
    }

    pub fn exists(&self) -> bool {
        self.version > 0
    }
}

/// Write `record` (its `version` is the new version) only if the stored version is
/// still `expected_version` (0 = the record must not exist yet).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateWrite {
    pub record: StateRecord,
    pub expected_version: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    Committed,
    /// Another writer changed one of the records since it was loaded: reload and decide again.
    Conflict,
}

#[async_trait]
pub trait StateStore: Send + Sync {
    /// Strongly consistent read of several records, in the order of `keys`.
    async fn load(&self, keys: &[StateKey]) -> Result<Vec<StateRecord>, StoreError>;
    /// All writes or none, each conditioned on its expected version.
    async fn commit(&self, writes: &[StateWrite]) -> Result<CommitOutcome, StoreError>;
    /// Records of one kind for a tenant (operator views; small result sets).
    async fn list(
        &self,
        tenant: &str,
        kind: &str,
        limit: usize,
    ) -> Result<Vec<StateRecord>, StoreError>;
}
