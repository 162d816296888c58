//! Operator replay of inbox items: one event, or in bulk by provider / tenant / type /
//! time range / state, with a dry run.
//!
//! Replay goes through the normal path: the item is requeued
//! ([`InboxReplay::requeue`], one conditional write), its pointer is sent to the main
//! queue, and the processor claims it like any other message, so its effect keys
//! still keep every effect to once. A `completed` / `ignored` item stays as it is
//! unless forced. The dead letters of the items to replay are removed from the DLQ
//! *before* the requeue (received and deleted; no StartMessageMoveTask, so it works on
//! moto too): the sweeper marks `dead_letter` any unfinished item whose pointer sits in
//! the DLQ, so an old dead letter still there after the requeue would send the replayed
//! item back to `dead_letter` and its new message would be refused. A crash between the
//! delete and the requeue leaves a `dead_letter` item without a DLQ message: still listed
//! by `einmal dlq list` (it reads the inbox) and replayable. A requeue whose send fails
//! leaves a `queued` item with no dead letter, which the sweeper re-sends once stale.
//! Every real run appends one audit
//! record: who, when, why, which events, result. A dry run changes nothing and writes
//! no audit record.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};
use thiserror::Error;

use crate::audit::{AuditLog, AuditRecord};
use crate::envelope::InboxKey;
use crate::pipeline::relay::reschedule_dead_deliveries;
use crate::ports::{
    DeadLetterQueue, DeliveryState, Inbox, InboxFilter, InboxItem, InboxRelay, InboxReplay,
    InboxState, Queue, QueueMessage, RequeueOutcome, StoreError,
};
use crate::time::now_millis;

/// Items a bulk selection reads at most when no limit is given.
pub const DEFAULT_BULK_LIMIT: usize = 100_000;
/// How long received dead letters stay hidden while the DLQ is sifted.
const DLQ_SIFT_VISIBILITY: Duration = Duration::from_secs(30);
/// Receive rounds per DLQ sift at most (10 messages each).
const DLQ_SIFT_ROUNDS: usize = 10_000;

#[derive(Debug, Error)]
pub enum ReplayError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("audit log: {0}")]
    Audit(StoreError),
}

/// Who runs the replay and why (both go into the audit record).
#[derive(Debug, Clone, Serialize)]
pub struct Operator {
    pub actor: String,
    pub reason: String,
}

/// A bulk selection. `None` matches everything.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BulkSelector {
    pub provider: Option<String>,
    pub tenant: Option<String>,
    pub event_type: Option<String>,
    /// Received at or after (Unix ms).
    pub since_ms: Option<i64>,
    /// Received before (Unix ms).
    pub until_ms: Option<i64>,
    pub state: Option<InboxState>,
    /// Re-run completed / ignored items too.
    pub force: bool,
    /// Most items read (0 = [`DEFAULT_BULK_LIMIT`]).
    pub limit: usize,
}

impl BulkSelector {
    fn matches(&self, item: &InboxItem) -> bool {
        self.event_type
            .as_ref()
            .is_none_or(|t| *t == item.envelope.event_type)
            && self.since_ms.is_none_or(|s| item.received_at_ms >= s)
            && self.until_ms.is_none_or(|u| item.received_at_ms < u)
    }
}

/// What happened to one item (or, in a dry run, what would).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemOutcome {
    Replayed,
    /// A finished event whose dead-lettered deliveries were scheduled again (same
    /// keys, attempts reset); the relay delivers them on its next pass.
    Redelivered,
    AlreadyDone,
    Busy,
    Missing,
    /// Requeued, but the pointer could not be sent (or the store refused): see the log.
    Failed,
}

impl ItemOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ItemOutcome::Replayed => "replayed",
            ItemOutcome::Redelivered => "redelivered",
            ItemOutcome::AlreadyDone => "already_done",
            ItemOutcome::Busy => "busy",
            ItemOutcome::Missing => "missing",
            ItemOutcome::Failed => "failed",
        }
    }
}

/// Counts of one replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplaySummary {
    pub matched: usize,
    pub replayed: usize,
    /// Finished events whose dead-lettered deliveries were scheduled again.
    #[serde(default)]
    pub redelivered: usize,
    pub already_done: usize,
    pub busy: usize,
    pub missing: usize,
    pub failed: usize,
    /// Dead letters removed from the DLQ (before their items were requeued).
    pub dead_letters_removed: usize,
    pub dry_run: bool,
}

impl ReplaySummary {
    fn count(&mut self, outcome: ItemOutcome) {
        match outcome {
            ItemOutcome::Replayed => self.replayed += 1,
            ItemOutcome::Redelivered => self.redelivered += 1,
            ItemOutcome::AlreadyDone => self.already_done += 1,
            ItemOutcome::Busy => self.busy += 1,
            ItemOutcome::Missing => self.missing += 1,
            ItemOutcome::Failed => self.failed += 1,
        }
    }
}

/// The result of a replay: counts, per-event outcomes, the audit record written.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub summary: ReplaySummary,
    pub outcomes: Vec<(InboxKey, ItemOutcome)>,
    /// `None` for a dry run.
    pub audit_id: Option<String>,
}

/// One step of a bulk replay, for a progress bar.
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    pub done: usize,
    pub total: usize,
    pub key: &'a InboxKey,
    pub outcome: ItemOutcome,
}

/// The replay service over the storage ports.
#[derive(Clone)]
pub struct Replayer {
    inbox: Arc<dyn Inbox>,
    replay: Arc<dyn InboxReplay>,
    queue: Arc<dyn Queue>,
    dead_letters: Arc<dyn DeadLetterQueue>,
    audit: Arc<dyn AuditLog>,
    now_ms: Arc<dyn Fn() -> i64 + Send + Sync>,
    /// Re-schedules the dead-lettered deliveries of finished events.
    relay: Option<Arc<dyn InboxRelay>>,
}

impl Replayer {
    /// Every inbox port from one backend store.
    pub fn from_store(store: Arc<dyn crate::ports::InboxStore>, audit: Arc<dyn AuditLog>) -> Self {
        let relay: Arc<dyn InboxRelay> = store.clone();
        Self::new(store.clone(), store.clone(), store.clone(), store, audit).with_relay(relay)
    }

    /// Replay of a finished event with dead-lettered deliveries schedules those again
    /// ([`ItemOutcome::Redelivered`]); without it such an event is `already_done`.
    pub fn with_relay(mut self, relay: Arc<dyn InboxRelay>) -> Self {
        self.relay = Some(relay);
        self
    }

    pub fn new(
        inbox: Arc<dyn Inbox>,
        replay: Arc<dyn InboxReplay>,
        queue: Arc<dyn Queue>,
        dead_letters: Arc<dyn DeadLetterQueue>,
        audit: Arc<dyn AuditLog>,
    ) -> Self {
        Replayer {
            inbox,
            replay,
            queue,
            dead_letters,
            audit,
            now_ms: Arc::new(now_millis),
            relay: None,
        }
    }

    pub fn with_clock(mut self, now_ms: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.now_ms = Arc::new(now_ms);
        self
    }

    pub fn audit(&self) -> &Arc<dyn AuditLog> {
        &self.audit
    }

    /// Replay one event and audit it (`action = "replay"`).
    pub async fn replay_one(
        &self,
        key: &InboxKey,
        force: bool,
        operator: &Operator,
    ) -> Result<ReplayReport, ReplayError> {
        let mut summary = ReplaySummary {
            matched: 1,
            ..Default::default()
        };
        // Its dead letter goes first (see the module doc); an unreadable item is
        // requeued anyway and keeps its dead letter.
        let to_replay: HashSet<InboxKey> = match self.inbox.get(key).await {
            Ok(Some(item))
                if would_replay(&item, force, (self.now_ms)()) == ItemOutcome::Replayed =>
            {
                HashSet::from([key.clone()])
            }
            Ok(_) => HashSet::new(),
            Err(e) => {
                tracing::warn!(pk = %key, error = %e, "replay: cannot read the item");
                HashSet::new()
            }
        };
        summary.dead_letters_removed = self.sift_dead_letters(&to_replay).await;
        let outcome = self.replay_item(key, force).await;
        summary.count(outcome);
        let outcomes = vec![(key.clone(), outcome)];
        let selector = json!({ "pk": key.as_str(), "force": force });
        let audit_id = self
            .write_audit("replay", operator, selector, &summary, &outcomes)
            .await?;
        Ok(ReplayReport {
            summary,
            outcomes,
            audit_id: Some(audit_id),
        })
    }

    /// Replay several events named by key (the console's selection of dead-lettered
    /// deliveries), each as [`Replayer::replay_one`] does it, with one audit record
    /// (`action = "replay"`, the keys in its selector). Repeated keys count once.
    pub async fn replay_keys(
        &self,
        keys: &[InboxKey],
        operator: &Operator,
    ) -> Result<ReplayReport, ReplayError> {
        let mut unique: Vec<InboxKey> = Vec::with_capacity(keys.len());
        for key in keys {
            if !unique.contains(key) {
                unique.push(key.clone());
            }
        }
        let mut summary = ReplaySummary {
            matched: unique.len(),
            ..Default::default()
        };
        let now_ms = (self.now_ms)();
        let mut to_replay = HashSet::new();
        for key in &unique {
            match self.inbox.get(key).await {
                Ok(Some(item)) if would_replay(&item, false, now_ms) == ItemOutcome::Replayed => {
                    to_replay.insert(key.clone());
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(pk = %key, error = %e, "replay: cannot read the item"),
            }
        }
        summary.dead_letters_removed = self.sift_dead_letters(&to_replay).await;
        let mut outcomes = Vec::with_capacity(unique.len());
        for key in unique {
            let outcome = self.replay_item(&key, false).await;
            summary.count(outcome);
            outcomes.push((key, outcome));
        }
        let selector = json!({
            "pks": outcomes.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            "force": false,
        });
        let audit_id = self
            .write_audit("replay", operator, selector, &summary, &outcomes)
            .await?;
        Ok(ReplayReport {
            summary,
            outcomes,
            audit_id: Some(audit_id),
        })
    }

    /// The items a bulk selection matches, oldest first.
    pub async fn select(&self, selector: &BulkSelector) -> Result<Vec<InboxItem>, StoreError> {
        let limit = if selector.limit == 0 {
            DEFAULT_BULK_LIMIT
        } else {
            selector.limit
        };
        let mut items = self
            .inbox
            .list(&InboxFilter {
                state: selector.state,
                provider: selector.provider.clone(),
                tenant: selector.tenant.clone(),
                limit,
            })
            .await?;
        items.retain(|item| selector.matches(item));
        items.reverse();
        Ok(items)
    }

    /// Replay every matching item (`action = "replay-bulk"`), calling `progress` after
    /// each. A dry run only reports what would happen and writes no audit record.
    pub async fn replay_bulk(
        &self,
        selector: &BulkSelector,
        dry_run: bool,
        operator: &Operator,
        progress: &mut (dyn FnMut(Progress<'_>) + Send),
    ) -> Result<ReplayReport, ReplayError> {
        let items = self.select(selector).await?;
        let total = items.len();
        let mut summary = ReplaySummary {
            matched: total,
            dry_run,
            ..Default::default()
        };
        let mut outcomes = Vec::with_capacity(total);
        if !dry_run {
            // The dead letters of the items to replay go first (see the module doc).
            let now_ms = (self.now_ms)();
            let to_replay: HashSet<InboxKey> = items
                .iter()
                .filter(|item| would_replay(item, selector.force, now_ms) == ItemOutcome::Replayed)
                .map(|item| item.key.clone())
                .collect();
            summary.dead_letters_removed = self.sift_dead_letters(&to_replay).await;
        }
        for (i, item) in items.iter().enumerate() {
            let outcome = if dry_run {
                would_replay(item, selector.force, (self.now_ms)())
            } else {
                self.replay_item(&item.key, selector.force).await
            };
            summary.count(outcome);
            progress(Progress {
                done: i + 1,
                total,
                key: &item.key,
                outcome,
            });
            outcomes.push((item.key.clone(), outcome));
        }
        if dry_run {
            return Ok(ReplayReport {
                summary,
                outcomes,
                audit_id: None,
            });
        }
        let selector = serde_json::to_value(selector).unwrap_or(Value::Null);
        let audit_id = self
            .write_audit("replay-bulk", operator, selector, &summary, &outcomes)
            .await?;
        Ok(ReplayReport {
            summary,
            outcomes,
            audit_id: Some(audit_id),
        })
    }

    /// Requeue, then send the pointer.
    async fn replay_item(&self, key: &InboxKey, force: bool) -> ItemOutcome {
        match self.replay.requeue(key, force, (self.now_ms)()).await {
            Ok(RequeueOutcome::Requeued { from }) => {
                let message = QueueMessage { pk: key.clone() };
                match self.queue.send(&message).await {
                    Ok(()) => {
                        tracing::info!(pk = %key, from = %from, force, "replay: requeued");
                        ItemOutcome::Replayed
                    }
                    Err(e) => {
                        // The item is `queued` without a message: the sweeper re-enqueues it.
                        tracing::error!(pk = %key, error = %e, "replay: pointer send failed");
                        ItemOutcome::Failed
                    }
                }
            }
            Ok(RequeueOutcome::AlreadyDone(_)) => self.redeliver(key).await,
            Ok(RequeueOutcome::Busy { .. }) => ItemOutcome::Busy,
            Ok(RequeueOutcome::Missing) => ItemOutcome::Missing,
            Err(e) => {
                tracing::error!(pk = %key, error = %e, "replay: requeue failed");
                ItemOutcome::Failed
            }
        }
    }

    /// A finished event: schedule its dead-lettered deliveries again, if any.
    async fn redeliver(&self, key: &InboxKey) -> ItemOutcome {
        let Some(relay) = &self.relay else {
            return ItemOutcome::AlreadyDone;
        };
        let owner = format!("replay-{}", hex::encode(rand::random::<[u8; 4]>()));
        match reschedule_dead_deliveries(relay.as_ref(), key, &owner, (self.now_ms)()).await {
            Ok(Some(n)) if n > 0 => {
                tracing::info!(pk = %key, deliveries = n, "replay: dead-lettered deliveries rescheduled");
                ItemOutcome::Redelivered
            }
            Ok(Some(_)) => ItemOutcome::AlreadyDone,
            // A relay holds it right now: try again shortly.
            Ok(None) => ItemOutcome::Busy,
            Err(e) => {
                tracing::error!(pk = %key, error = %e, "replay: cannot reschedule deliveries");
                ItemOutcome::Failed
            }
        }
    }

    /// Delete the dead letters of the items about to be replayed; release the others
    /// at once. Returns how many were deleted.
    async fn sift_dead_letters(&self, to_replay: &HashSet<InboxKey>) -> usize {
        if to_replay.is_empty() {
            return 0;
        }
        let mut removed = 0;
        let mut others = Vec::new();
        for _ in 0..DLQ_SIFT_ROUNDS {
            let batch = match self
                .queue
                .receive_dead_letters(10, DLQ_SIFT_VISIBILITY)
                .await
            {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::warn!(error = %e, "replay: cannot read the dead-letter queue");
                    break;
                }
            };
            if batch.is_empty() {
                break;
            }
            for d in batch {
                if to_replay.contains(&d.message.pk) {
                    match self.dead_letters.delete_dead_letter(&d.receipt).await {
                        Ok(()) => removed += 1,
                        Err(e) => {
                            tracing::warn!(pk = %d.message.pk, error = %e, "replay: dead letter not deleted")
                        }
                    }
                } else {
                    others.push(d.receipt);
                }
            }
        }
        for receipt in others {
            if let Err(e) = self.dead_letters.release_dead_letter(&receipt).await {
                tracing::warn!(error = %e, "replay: dead letter not released");
            }
        }
        removed
    }

    async fn write_audit(
        &self,
        action: &str,
        operator: &Operator,
        selector: Value,
        summary: &ReplaySummary,
        outcomes: &[(InboxKey, ItemOutcome)],
    ) -> Result<String, ReplayError> {
        let at_ms = (self.now_ms)();
        let mut per_event: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, o) in outcomes {
            *per_event.entry(o.as_str()).or_default() += 1;
        }
        let mut result = serde_json::to_value(summary).unwrap_or(Value::Null);
        // Per-event outcomes for single replays and small bulks; counts always.
        if outcomes.len() <= 100 {
            result["outcomes"] = outcomes
                .iter()
                .map(|(k, o)| json!({ "pk": k.as_str(), "outcome": o.as_str() }))
                .collect();
        }
        let record = AuditRecord {
            id: AuditRecord::new_id(at_ms),
            at_ms,
            actor: operator.actor.clone(),
            action: action.to_string(),
            reason: operator.reason.clone(),
            selector,
            events: outcomes
                .iter()
                .map(|(k, _)| k.as_str().to_string())
                .collect(),
            result,
        };
        self.audit
            .append(&record)
            .await
            .map_err(ReplayError::Audit)?;
        Ok(record.id)
    }
}

/// What a replay would do, from the item as read (dry run).
fn would_replay(item: &InboxItem, force: bool, now_ms: i64) -> ItemOutcome {
    match item.state {
        InboxState::Completed | InboxState::Ignored
            if !force
                && item
                    .deliveries
                    .iter()
                    .any(|d| d.state == DeliveryState::DeadLetter) =>
        {
            ItemOutcome::Redelivered
        }
        InboxState::Completed | InboxState::Ignored if !force => ItemOutcome::AlreadyDone,
        InboxState::Processing if item.lease_until_ms.is_some_and(|u| u > now_ms) => {
            ItemOutcome::Busy
        }
        _ => ItemOutcome::Replayed,
    }
}
