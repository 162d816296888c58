//! The business-state port: versioned records with the effect keys applied to them.
//!
//! Every business effect is guarded by its effect key stored on the record it changes
//! (the `applied` set) and by the record's version, both checked in the same atomic
//! commit: a TransactWriteItems on AWS (a single conditional PutItem when one record is
//! written), one SQLite transaction embedded. A redelivered or replayed event finds its
//! effect key already applied and changes nothing.
//!
//! Records that many events touch (a SKU) carry no per-event keys: the key of such a
//! change lives on the record that owns the effect (`Change::keyed_on`), committed in
//! the same atomic commit. A commit can also hold [`ReadCheck`]s: records the decision
//! read but does not write, which must still be at the version it read.
//!
//! Sizes are bounded: an `applied` set may hold at most [`MAX_APPLIED_KEYS`] keys
//! (enforced by the framework when it adds one), and a stored record at most
//! [`MAX_RECORD_BYTES`] (DynamoDB's item limit; the embedded store refuses the same,
//! so a domain that works locally does not fail on AWS). A write over the limit is
//! `StoreError::Rejected`: permanent.

use std::collections::{BTreeSet, HashSet};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::ports::StoreError;

/// Most effect keys one record's `applied` set may hold. The framework refuses (as a
/// permanent failure of the event) a commit that would grow a set past it: a record
/// that collects a key per event would otherwise grow toward the item size limit and
/// cost more write units with every event. 1,000 keys of ~50 bytes is ~50 KB.
pub const MAX_APPLIED_KEYS: usize = 1_000;

/// Largest stored record, in DynamoDB's item-size measure (attribute names + values):
/// DynamoDB's 400 KB limit, applied by the embedded store as well.
pub const MAX_RECORD_BYTES: usize = 400 * 1024;

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

impl StateRecord {
    /// The record's size as DynamoDB measures the stored item (attribute names plus
    /// values: `tenant_kind`, `tenant`, `kind`, `id`, `version`, `data` as JSON text,
    /// `applied` as a string set, `updated_at_ms`, and a wait mark's `wait_mark`).
    /// Numbers are counted at their decimal length, a slight overestimate.
    pub fn stored_size(&self) -> usize {
        let key = &self.key;
        let strings = [
            ("tenant_kind", key.tenant.len() + key.kind.len() + 1),
            ("tenant", key.tenant.len()),
            ("kind", key.kind.len()),
            ("id", key.id.len()),
            ("data", self.data.to_string().len()),
        ];
        let numbers = [("version", 20), ("updated_at_ms", 14), ("wait_mark", 14)];
        let applied: usize = self.applied.iter().map(String::len).sum();
        strings
            .iter()
            .chain(&numbers)
            .map(|(name, len)| name.len() + len)
            .sum::<usize>()
            + if self.applied.is_empty() {
                0
            } else {
                "applied".len() + applied
            }
    }
}

/// A record the decision read and does not write: the commit holds only if the record
/// is still at `version` (0 = it still does not exist).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadCheck {
    pub key: StateKey,
    pub version: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    Committed,
    /// Another writer changed one of the records since it was loaded: reload and decide again.
    Conflict,
}

/// Which written records of a commit may have events parked on them (an event waiting
/// for a prerequisite marks the record it waits on first, [`StateStore::mark_waited`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiters {
    /// The store cannot tell: look up the waiters of every written record.
    Unknown,
    /// Only these written records carried a wait mark when the commit replaced them
    /// (the commit removed it): look up their waiters, nobody waits on the others.
    Marked(Vec<StateKey>),
}

/// One commit of [`StateStore::commit_each`]: its writes and its read checks.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    pub writes: Vec<StateWrite>,
    pub reads: Vec<ReadCheck>,
}

/// The answer to one commit of [`StateStore::commit_each`].
pub type CommitAnswer = Result<(CommitOutcome, Waiters), StoreError>;

/// The business records' store. Every method is the adapter's own (no defaults), so
/// a wrapper (a fault injector in the tests) that forgets one does not compile, and
/// every scenario runs the protocol the production stores run.
#[async_trait]
pub trait StateStore: Send + Sync {
    /// Strongly consistent read of several records, in the order of `keys`.
    async fn load(&self, keys: &[StateKey]) -> Result<Vec<StateRecord>, StoreError>;
    /// Several independent commits, answered in their order. Each is all of its
    /// writes or none, each write conditioned on its expected version, and holds only
    /// if every record of its `reads` is still at its version (checked in the same
    /// atomic commit; a mismatch is `Conflict`). One commit's conflict or refusal
    /// leaves the others alone. Each answer says which written records may have
    /// waiters ([`Waiters`]: the processor looks up only those).
    async fn commit_each(&self, commits: &[Commit]) -> Vec<CommitAnswer>;
    /// Whether [`StateStore::commit_each`] puts several commits under one durable
    /// write (the embedded store: one transaction, one fsync), so that a caller with
    /// several commits at hand (the processor: a batch's business commits) does better
    /// to gather them first.
    fn gathers_commits(&self) -> bool;
    /// Mark `key` (existing or not) as waited on, before an event parks on it, so that
    /// the next commit of it reports it as [`Waiters::Marked`]. A mark on a record that
    /// does not exist lives at least until `keep_until_ms`. A store that does not mark
    /// (does nothing here) answers [`Waiters::Unknown`]; a store that marks must report
    /// every commit that removes a mark.
    async fn mark_waited(&self, key: &StateKey, keep_until_ms: i64) -> Result<(), StoreError>;
    /// Records of one kind for a tenant (operator views; small result sets).
    async fn list(
        &self,
        tenant: &str,
        kind: &str,
        limit: usize,
    ) -> Result<Vec<StateRecord>, StoreError>;
}

/// One commit through [`StateStore::commit_each`], for callers with a single commit at
/// hand. Derived for every store, never overridden: a single commit takes the same
/// path as a batch of them.
#[async_trait]
pub trait CommitOne {
    /// All writes or none, each conditioned on its expected version.
    async fn commit(&self, writes: &[StateWrite]) -> Result<CommitOutcome, StoreError>;
    /// [`CommitOne::commit`] that also holds only if every record of `reads` is still
    /// at its version.
    async fn commit_checked(
        &self,
        writes: &[StateWrite],
        reads: &[ReadCheck],
    ) -> Result<CommitOutcome, StoreError>;
    /// [`CommitOne::commit_checked`] that also says which written records may have
    /// waiters.
    async fn commit_waking(&self, writes: &[StateWrite], reads: &[ReadCheck]) -> CommitAnswer;
}

#[async_trait]
impl<S: StateStore + ?Sized> CommitOne for S {
    async fn commit(&self, writes: &[StateWrite]) -> Result<CommitOutcome, StoreError> {
        Ok(self.commit_waking(writes, &[]).await?.0)
    }

    async fn commit_checked(
        &self,
        writes: &[StateWrite],
        reads: &[ReadCheck],
    ) -> Result<CommitOutcome, StoreError> {
        Ok(self.commit_waking(writes, reads).await?.0)
    }

    async fn commit_waking(&self, writes: &[StateWrite], reads: &[ReadCheck]) -> CommitAnswer {
        let commit = Commit {
            writes: writes.to_vec(),
            reads: reads.to_vec(),
        };
        self.commit_each(std::slice::from_ref(&commit))
            .await
            .pop()
            .unwrap_or_else(|| Err(StoreError::Unavailable("commit was not answered".into())))
    }
}

/// Checks every adapter applies before it touches storage, so both answer the same
/// for a malformed commit. These are caller bugs, not conflicts: they come back as
/// `StoreError::Rejected` (retrying cannot help) with a message naming the key, and
/// nothing is written.
///
/// - a key may appear only once per commit, as a write or a read check (DynamoDB
///   refuses two operations on one item in a transaction);
/// - the new version must be greater than the expected one, otherwise the version
///   guard of the next writer would not see this write.
pub(crate) fn check_writes(writes: &[StateWrite], reads: &[ReadCheck]) -> Result<(), StoreError> {
    let mut seen = HashSet::with_capacity(writes.len() + reads.len());
    for r in reads {
        if !seen.insert(r.key.pk()) {
            return Err(StoreError::Rejected(format!(
                "invalid commit: {} is checked twice in one commit",
                r.key.pk()
            )));
        }
    }
    for w in writes {
        let pk = w.record.key.pk();
        if w.record.version <= w.expected_version {
            return Err(StoreError::Rejected(format!(
                "invalid commit: {pk} writes version {} over expected version {}",
                w.record.version, w.expected_version
            )));
        }
        if !seen.insert(pk) {
            return Err(StoreError::Rejected(format!(
                "invalid commit: {} is written twice (or written and checked) in one commit",
                w.record.key.pk()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(id: &str, expected_version: u64, version: u64) -> StateWrite {
        let mut record = StateRecord::missing(StateKey::new("t1", "sku", id));
        record.version = version;
        StateWrite {
            record,
            expected_version,
        }
    }

    fn check(id: &str) -> ReadCheck {
        ReadCheck {
            key: StateKey::new("t1", "sku", id),
            version: 1,
        }
    }

    #[test]
    fn well_formed_commits_pass() {
        assert!(check_writes(&[write("a", 0, 1), write("b", 3, 4)], &[check("c")]).is_ok());
    }

    #[test]
    fn malformed_commits_are_rejected_naming_the_key() {
        for (writes, reads) in [
            (vec![write("a", 0, 1), write("a", 1, 2)], vec![]),
            (vec![write("a", 0, 1)], vec![check("a")]),
            (vec![], vec![check("c"), check("c")]),
            (vec![write("a", 2, 2)], vec![]),
        ] {
            match check_writes(&writes, &reads) {
                Err(StoreError::Rejected(why)) => assert!(why.contains("t1#sku#"), "{why}"),
                other => panic!("{writes:?} {reads:?}: {other:?}"),
            }
        }
    }
}
