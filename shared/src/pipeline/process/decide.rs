//! Decide and commit (steps 2 and 3): the domain decides on the loaded records, the
//! guarded writes commit, and a conflict decides again on the new versions.

use std::time::{Duration, Instant};

use thiserror::Error;

use super::effects::{moves_payment_status, plan_writes, read_checks};
use super::hints::hint_kind;
use super::outcome::{Applied, Committed, Failure, ALREADY_APPLIED};
use super::{millis, Processor};
use crate::body;
use crate::domain::state::{CommitOne, CommitOutcome, StateKey, Waiters};
use crate::domain::{Decision, DomainEvent};
use crate::envelope::InboxKey;
use crate::pipeline::commit_group::Member;
use crate::ports::InboxItem;
use crate::telemetry::emf::RetryCause;

/// The share of the lease a run may spend on conflict rounds that make progress
/// (`lease_ms / CONTENTION_SHARE`) before it postpones the event.
const CONTENTION_SHARE: i64 = 3;
/// The longest pause between two conflict rounds.
const CONFLICT_PAUSE_MAX_MS: f64 = 50.0;

/// What [`Processor::decide_and_commit`] did with one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectOutcome {
    /// Changes were committed; the decision's result.
    Committed(String),
    /// Nothing new to commit: every change was already applied, or none was decided.
    Unchanged(String),
    /// The domain ignored the event, with the reason.
    Ignored(String),
}

/// Why [`Processor::decide_and_commit`] did not finish an event.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EffectError {
    /// Will never succeed as is (the processor dead-letters such an event).
    #[error("permanent: {0}")]
    Permanent(String),
    /// May succeed later (the processor retries such an event).
    #[error("transient: {0}")]
    Transient(String),
    /// A prerequisite is missing (the processor parks such an event until it commits).
    #[error("waiting: {0}")]
    Wait(String),
}

impl Processor {
    /// Decide and commit the event's effects (steps 2 and 3).
    pub(super) async fn apply(
        &self,
        item: &InboxItem,
        commits: Option<&Member>,
    ) -> Result<Applied, Failure> {
        if item.body_encoding != body::BODY_ENCODING {
            return Err(Failure::Permanent(format!(
                "unknown body encoding {:?}",
                item.body_encoding
            )));
        }
        let limit = usize::try_from(item.body_len).unwrap_or(usize::MAX);
        let mut raw =
            body::decompress(&item.body, limit).map_err(|e| Failure::Permanent(e.to_string()))?;
        let mut envelope = &item.envelope;
        let enriched;
        if let Some(kind) = hint_kind(envelope) {
            let (fetched_envelope, fetched) = self.enrich(envelope, kind).await?;
            enriched = fetched_envelope;
            envelope = &enriched;
            raw = fetched;
        }
        let event = DomainEvent {
            envelope,
            body: &raw,
        };
        self.commit_event(&event, Some(&item.key), commits).await
    }

    /// Steps 2 and 3 for one domain event, without an inbox item: decide and commit its
    /// effects under the same guards as [`Processor::process_message`]. Tools and load
    /// tests drive the commit path with it.
    pub async fn decide_and_commit(
        &self,
        event: &DomainEvent<'_>,
    ) -> Result<EffectOutcome, EffectError> {
        match self.commit_event(event, None, None).await {
            Ok(Applied::Completed(result, Some(_), _)) => Ok(EffectOutcome::Committed(result)),
            Ok(Applied::Completed(result, None, _)) => Ok(EffectOutcome::Unchanged(result)),
            Ok(Applied::Ignored(reason)) => Ok(EffectOutcome::Ignored(reason)),
            Err(Failure::Permanent(reason)) => Err(EffectError::Permanent(reason)),
            Err(Failure::Transient(_, reason)) => Err(EffectError::Transient(reason)),
            Err(Failure::Wait(wait)) => Err(EffectError::Wait(wait.reason)),
        }
    }

    pub(super) async fn commit_event(
        &self,
        event: &DomainEvent<'_>,
        own: Option<&InboxKey>,
        commits: Option<&Member>,
    ) -> Result<Applied, Failure> {
        let event = *event;
        let prepared = self.domain.prepare(&event)?;
        let targets = &prepared.targets;
        let target_pks: Vec<String> = targets.iter().map(StateKey::pk).collect();
        // Our turn on the records: held from the load to the commit's answer, so the
        // next decision on them loads what this one committed.
        let mut lane = Some(
            self.lanes
                .enter(&target_pks, || {
                    if let Some(member) = commits {
                        member.away();
                    }
                })
                .await,
        );
        if let Some(member) = commits {
            member.back();
        }
        let contention_ends = Instant::now() + millis(self.settings.lease_ms / CONTENTION_SHARE);
        let mut seen_versions: Option<Vec<u64>> = None;
        let mut stalled = 0u32;
        let mut round = 0u32;
        loop {
            let current = if targets.is_empty() {
                Vec::new()
            } else {
                self.state.load(targets).await?
            };
            if current.len() != targets.len() {
                return Err(Failure::Transient(
                    RetryCause::StoreUnavailable,
                    format!(
                        "state store returned {} of {} records",
                        current.len(),
                        targets.len()
                    ),
                ));
            }
            let decision = match self.domain.decide_prepared(&event, &prepared, &current) {
                Ok(decision) => decision,
                Err(e) => {
                    let failure = Failure::from(e);
                    let provider = &event.envelope.provider;
                    return Err(self.waiting(failure, &current, own, provider).await);
                }
            };
            let (changes, result) = match decision {
                Decision::Ignore { reason } => return Ok(Applied::Ignored(reason)),
                Decision::Apply { changes, result } => (changes, result),
            };
            if changes.is_empty() {
                return Ok(Applied::Completed(result, None, Vec::new()));
            }
            // The records this decision changes: their waiters are woken once the
            // change is in (also when it was in already: a crash may have cut the
            // wake off after the commit).
            let changed: Vec<String> = changes.iter().map(|c| c.key.pk()).collect();
            let outputs = self.domain.outputs(&event, &changes);
            let writes = plan_writes(&current, changes)?;
            if writes.is_empty() {
                // Found applied: a crash may have cut the wake off after the commit
                // that removed the wait marks, so ask for every record.
                drop(lane.take());
                self.wake_waiters(&changed, &Waiters::Unknown, own).await;
                return Ok(Applied::Completed(
                    ALREADY_APPLIED.to_string(),
                    None,
                    outputs,
                ));
            }
            let reads = read_checks(&current, &writes, |key| {
                self.domain.guards_read(&event, key)
            });
            let answer = match commits {
                Some(member) => member.commit_waking(&writes, &reads).await,
                None => self.state.commit_waking(&writes, &reads).await,
            };
            match answer? {
                (CommitOutcome::Committed, waiters) => {
                    // The next decision on these records may go; waking is not part
                    // of this one.
                    drop(lane.take());
                    // Changed records whose change was applied before are not written:
                    // ask for them as on a redelivery.
                    let unwritten: Vec<String> = changed
                        .iter()
                        .filter(|pk| !writes.iter().any(|w| w.record.key.pk() == **pk))
                        .cloned()
                        .collect();
                    self.wake_waiters(&unwritten, &Waiters::Unknown, own).await;
                    let written: Vec<String> = writes.iter().map(|w| w.record.key.pk()).collect();
                    self.wake_waiters(&written, &waiters, own).await;
                    let committed = Committed {
                        at_ms: (self.now_ms)(),
                        payment: moves_payment_status(&current, &writes),
                    };
                    return Ok(Applied::Completed(result, Some(committed), outputs));
                }
                (CommitOutcome::Conflict, _) => {
                    // Another process committed in between (within this one the lane
                    // keeps others out). While the records keep moving that is
                    // progress, not failure: decide again on the new versions, until a
                    // share of the lease is spent. Rounds that find nothing changed
                    // are bounded by `max_conflict_retries`.
                    let versions: Vec<u64> = current.iter().map(|r| r.version).collect();
                    if seen_versions.as_ref() == Some(&versions) {
                        stalled += 1;
                    }
                    seen_versions = Some(versions);
                    round += 1;
                    self.metrics.update(|t| t.conflicts += 1);
                    tracing::debug!(event_id = %event.envelope.event_id, round, "state conflict; deciding again");
                    if stalled > self.settings.max_conflict_retries
                        || Instant::now() >= contention_ends
                    {
                        return Err(Failure::Transient(
                            RetryCause::Contention,
                            format!(
                                "lock contention: state changed under {round} consecutive attempts; postponed"
                            ),
                        ));
                    }
                    // Spread competing workers apart: jittered, doubling, capped.
                    let ceiling = (f64::from(1u32 << round.min(6))).min(CONFLICT_PAUSE_MAX_MS);
                    let pause = ceiling * (self.jitter)();
                    tokio::time::sleep(Duration::from_micros((pause * 1000.0) as u64)).await;
                }
            }
        }
    }
}
