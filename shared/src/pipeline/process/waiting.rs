//! Waiting for a prerequisite: marking the record waited on, waking its waiters after
//! a commit, and re-checking a parked event.
//!
//! [`DomainError::Wait`] (a refund before its order, ...) is not a failure and spends
//! no retry budget: the item is *parked* (`waiting`, with the record it waits on, the
//! first of its [`Domain::targets`], and since when) and its message is deleted, so
//! no receive count or redrive can dead-letter it. It is woken by a new pointer:
//! - every decision that changes a record (committed now, or found already applied on
//!   a redelivery after a crash) re-enqueues up to [`WAKE_LIMIT`] waiters parked on
//!   it, found through the store's waiters' index ([`InboxProcessing::waiters`]).
//!   Before parking, the event marks the record it waits on
//!   ([`StateStore::mark_waited`]); a commit reports the marks it removed
//!   ([`StateStore::commit_each`]), so the index is asked only for marked records
//!   (a store that cannot tell, the embedded one, is asked for every changed record;
//!   so is every store on a redelivery that finds the change applied);
//! - after parking, the processor re-reads the record it waits on: if it changed
//!   since the decision (a commit that raced the park), it wakes itself;
//! - the sweeper re-sends parked items periodically at a bounded pace (the fallback).
//!
//! A waiter still waiting when its wait window has run out
//! ([`ProcessSettings::wait_window_ms`], default the provider's retry window from
//! [`crate::retention`]) is dead-lettered with "waited … for …".
//!

use super::outcome::{Failure, WaitFor};
use super::Processor;
use crate::domain::state::{StateKey, StateRecord, Waiters};
use crate::envelope::InboxKey;
use crate::ports::QueueMessage;
use crate::telemetry::emf::RetryCause;

/// Waiters woken per changed record per decision. More waiters on one record are
/// woken by the next change of it or by the sweeper's re-check.
pub const WAKE_LIMIT: usize = 100;

/// How much longer than the wait window a wait mark on a missing record is kept.
const WAIT_MARK_MARGIN_MS: i64 = 86_400_000;

impl Processor {
    /// After parking: if the record waited on changed since the decision saw it (a
    /// commit whose wake ran before the park was visible), wake the item at once.
    pub(super) async fn recheck_parked(&self, key: &InboxKey, record: &StateKey, seen: u64) {
        match self.state.load(std::slice::from_ref(record)).await {
            Ok(current) if current.first().is_some_and(|r| r.version != seen) => {
                self.send_wake(key).await;
            }
            Ok(_) => {}
            // The sweeper's re-check covers it.
            Err(e) => tracing::warn!(pk = %key, error = %e, "cannot re-check a parked event"),
        }
    }

    /// A failed decision; for a wait, the record waited on (the first target) and, for
    /// an inbox item about to park, that record marked as waited on first, so that
    /// the commit that writes it next reports it ([`Waiters::Marked`]). The mark is
    /// set before the park and the re-check after it ([`Processor::recheck_parked`]),
    /// so a commit either sees the mark or changes the version the re-check compares.
    /// A mark that cannot be set is a transient failure: parked unmarked, the event
    /// would wait for the sweeper's re-check.
    pub(super) async fn waiting(
        &self,
        failure: Failure,
        current: &[StateRecord],
        own: Option<&InboxKey>,
        provider: &str,
    ) -> Failure {
        let Failure::Wait(wait) = failure else {
            return failure;
        };
        let Some(first) = current.first() else {
            return Failure::Wait(wait);
        };
        if own.is_some() {
            // The mark of a record that does not exist outlives every wait window.
            let keep_until_ms = (self.now_ms)()
                .saturating_add(self.settings.wait_window_ms_for(provider))
                .saturating_add(WAIT_MARK_MARGIN_MS);
            if let Err(e) = self.state.mark_waited(&first.key, keep_until_ms).await {
                return Failure::Transient(
                    RetryCause::StoreUnavailable,
                    format!("cannot mark {} as waited on: {e}", first.key.pk()),
                );
            }
        }
        Failure::Wait(WaitFor {
            record: Some((first.key.clone(), first.version)),
            ..wait
        })
    }

    /// Re-enqueue the items parked on `records` (bounded by [`WAKE_LIMIT`] each),
    /// except `own` (the event being processed), asking the store's waiters' index only
    /// for the records `waiters` says may have some. A failure is logged, not
    /// returned: the sweeper's re-check wakes what was missed.
    pub(super) async fn wake_waiters(
        &self,
        records: &[String],
        waiters: &Waiters,
        own: Option<&InboxKey>,
    ) {
        let mut records: Vec<&String> = match waiters {
            Waiters::Unknown => records.iter().collect(),
            Waiters::Marked(marked) => records
                .iter()
                .filter(|pk| marked.iter().any(|k| k.pk() == **pk))
                .collect(),
        };
        records.sort();
        records.dedup();
        for record in records {
            let waiters = match self.processing.waiters(record, WAKE_LIMIT).await {
                Ok(waiters) => waiters,
                Err(e) => {
                    tracing::warn!(record = %record, error = %e, "cannot look up waiters");
                    continue;
                }
            };
            for waiter in waiters.iter().filter(|w| Some(*w) != own) {
                self.send_wake(waiter).await;
            }
        }
    }

    pub(super) async fn send_wake(&self, key: &InboxKey) {
        let message = QueueMessage { pk: key.clone() };
        match self.queue.send(&message).await {
            Ok(()) => {
                self.metrics.update(|t| t.woken += 1);
                tracing::info!(pk = %key, "waiter woken");
            }
            Err(e) => tracing::warn!(pk = %key, error = %e, "cannot wake a waiter"),
        }
    }
}
