//! The sweeper (scheduled Lambda, and a loop inside `einmal serve`): closes the dual
//! write and keeps every inbox item moving (DESIGN invariants 4 and 7).
//!
//! One pass:
//! 1. finds items stuck in `received` / `queued` / `retryable` and `processing` items
//!    whose lease ran out, through the store's index ([`InboxSweep::stuck`], never a
//!    scan), and sends their pointer again: the processor's claim is idempotent, so a duplicate
//!    message costs one refused claim, never a second effect;
//! 2. marks `dead_letter` the items whose pointers sit in the DLQ (the messages stay
//!    there for replay and are made visible again at once);
//! 3. re-sends parked (`waiting`) items not touched for `waiting_recheck_ms`, at most
//!    `batch` per pass ([`InboxSweep::waiting`]): the fallback for a wake lost to a
//!    crash between a commit and its wake; the processor decides again and parks the
//!    item anew, applies it, or dead-letters it once its wait window has run out;
//! 4. logs the backlog: one line with `backlog_count`, `oldest_pending_age_ms`,
//!    `waiting_count` and `oldest_waiting_age_ms`; the sweeper Lambda also prints the
//!    pass as one EMF line ([`SweepReport::figures`]).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::ports::{
    Inbox, InboxProcessing, InboxState, InboxSweep, ItemVersion, Queue, QueueMessage, BODY_MISSING,
    WAITING_SCAN_MAX,
};
use crate::telemetry::emf::SweepFigures;

/// Reason stored on items the sweeper marks `dead_letter`.
pub const DLQ_REASON: &str = "pointer reached the dead-letter queue";
/// How long the sweeper hides the DLQ messages it reads (released again at the end).
const DLQ_VISIBILITY: Duration = Duration::from_secs(30);
/// SQS returns at most 10 messages per receive.
const DLQ_BATCH: u32 = 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepSettings {
    /// An item untouched this long in `received` or `queued` (or whose lease ran out
    /// this long ago) is stuck. Default 1 minute: the sweeper runs every minute, so an
    /// event whose receiver died between put and send (or a replay whose send failed)
    /// is sent at the latest about two minutes later. Pointers of a queue backlog older
    /// than this are sent again (at most `batch` per pass): a duplicate costs one
    /// refused claim, never a second effect.
    pub stuck_after_ms: i64,
    /// A `retryable` item waits out its backoff first (up to `backoff_max_ms`, 15 min
    /// by default), so it counts as stuck only after this long. Default 20 minutes.
    pub retryable_after_ms: i64,
    /// Items looked at (and DLQ messages read, parked items re-sent) per pass.
    /// Default 100.
    pub batch: usize,
    /// A parked item untouched this long is re-sent (the fallback wake; each parked
    /// item at most once per interval, `batch` per pass). Default 10 minutes.
    pub waiting_recheck_ms: i64,
    /// Waiters' index entries one pass reads at most; the next pass goes on after
    /// them ([`InboxSweep::waiting`]), so every parked item is re-sent in turn.
    /// Default [`WAITING_SCAN_MAX`] (10,000).
    pub waiting_read_max: usize,
}

impl Default for SweepSettings {
    fn default() -> Self {
        SweepSettings {
            stuck_after_ms: 60_000,
            retryable_after_ms: 20 * 60_000,
            batch: 100,
            waiting_recheck_ms: 10 * 60_000,
            waiting_read_max: WAITING_SCAN_MAX,
        }
    }
}

/// `stuck_after_ms` from the environment (the sweeper Lambda).
pub const STUCK_AFTER_MS_ENV: &str = "EINMAL_SWEEP_STUCK_AFTER_MS";
/// `retryable_after_ms` from the environment.
pub const RETRYABLE_AFTER_MS_ENV: &str = "EINMAL_SWEEP_RETRYABLE_AFTER_MS";
/// `batch` from the environment.
pub const BATCH_ENV: &str = "EINMAL_SWEEP_BATCH";
/// `waiting_recheck_ms` from the environment.
pub const WAITING_RECHECK_MS_ENV: &str = "EINMAL_SWEEP_WAITING_RECHECK_MS";
/// `waiting_read_max` from the environment.
pub const WAITING_READ_MAX_ENV: &str = "EINMAL_SWEEP_WAITING_READ_MAX";

impl SweepSettings {
    /// Defaults, overridden by `EINMAL_SWEEP_*` variables; a malformed one is an error.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`SweepSettings::from_env`] with an injectable lookup (tests).
    pub fn from_lookup(env: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        fn read<T: std::str::FromStr>(
            env: &impl Fn(&str) -> Option<String>,
            name: &str,
            default: T,
        ) -> Result<T, String> {
            match env(name).filter(|v| !v.trim().is_empty()) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse()
                    .map_err(|_| format!("{name} is not a valid number: {v:?}")),
            }
        }
        let d = SweepSettings::default();
        Ok(SweepSettings {
            stuck_after_ms: read(&env, STUCK_AFTER_MS_ENV, d.stuck_after_ms)?.max(0),
            retryable_after_ms: read(&env, RETRYABLE_AFTER_MS_ENV, d.retryable_after_ms)?.max(0),
            batch: read(&env, BATCH_ENV, d.batch)?.max(1),
            waiting_recheck_ms: read(&env, WAITING_RECHECK_MS_ENV, d.waiting_recheck_ms)?.max(0),
            waiting_read_max: read(&env, WAITING_READ_MAX_ENV, d.waiting_read_max)?.max(1),
        })
    }
}

/// What one pass did and saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Stuck `received` / `queued` / `retryable` items whose pointer was sent again.
    pub reenqueued: usize,
    /// `processing` items with an expired lease, sent again for the next claim.
    pub leases_released: usize,
    /// Items marked `dead_letter` because their pointer is in the DLQ.
    pub dead_lettered: usize,
    /// Pending items seen (capped at `batch`): received/queued/retryable, and
    /// processing items without a live lease.
    pub backlog_count: usize,
    /// Age of the oldest of them (by last update), 0 when there is none.
    pub oldest_pending_age_ms: i64,
    /// Pending items past their stuck threshold this pass (re-enqueued or not).
    pub stuck_count: usize,
    /// Parked (`waiting`) items this pass read (at most `waiting_read_max`: beyond it a
    /// lower bound).
    pub waiting_count: usize,
    /// How long the longest-waiting of them has waited, 0 when there is none.
    pub oldest_waiting_age_ms: i64,
    /// Parked items re-sent this pass (the fallback wake).
    pub waiters_rechecked: usize,
    /// Store or queue calls that failed (the next pass tries again).
    pub errors: usize,
}

impl SweepReport {
    /// The pass as metrics (`PendingItems`, `OldestPendingAge`, `StuckItems`,
    /// `SweepReenqueued`, `LeasesReleased`, `DeadLettersMarked`).
    pub fn figures(&self) -> SweepFigures {
        SweepFigures {
            pending_items: self.backlog_count as u64,
            oldest_pending_age_ms: self.oldest_pending_age_ms,
            stuck_items: self.stuck_count as u64,
            reenqueued: self.reenqueued as u64,
            leases_released: self.leases_released as u64,
            dead_letters_marked: self.dead_lettered as u64,
            waiting_items: self.waiting_count as u64,
            oldest_waiting_age_ms: self.oldest_waiting_age_ms,
            waiters_rechecked: self.waiters_rechecked as u64,
        }
    }
}

pub struct Sweeper {
    pub inbox: Arc<dyn Inbox>,
    pub sweep: Arc<dyn InboxSweep>,
    pub processing: Arc<dyn InboxProcessing>,
    pub queue: Arc<dyn Queue>,
    pub settings: SweepSettings,
}

impl Sweeper {
    /// Every inbox port from one backend store.
    pub fn from_store(store: Arc<dyn crate::ports::InboxStore>) -> Self {
        Self::new(store.clone(), store.clone(), store.clone(), store)
    }

    pub fn new(
        inbox: Arc<dyn Inbox>,
        sweep: Arc<dyn InboxSweep>,
        processing: Arc<dyn InboxProcessing>,
        queue: Arc<dyn Queue>,
    ) -> Self {
        Sweeper {
            inbox,
            sweep,
            processing,
            queue,
            settings: SweepSettings::default(),
        }
    }

    pub fn with_settings(mut self, settings: SweepSettings) -> Self {
        self.settings = settings;
        self
    }

    /// One pass at `now_ms`.
    pub async fn sweep_once(&self, now_ms: i64) -> SweepReport {
        let mut report = SweepReport::default();
        self.requeue_stuck(now_ms, &mut report).await;
        self.mark_dead_letters(now_ms, &mut report).await;
        self.recheck_waiting(now_ms, &mut report).await;
        tracing::info!(
            backlog_count = report.backlog_count,
            oldest_pending_age_ms = report.oldest_pending_age_ms,
            stuck_count = report.stuck_count,
            reenqueued = report.reenqueued,
            leases_released = report.leases_released,
            dead_lettered = report.dead_lettered,
            waiting_count = report.waiting_count,
            oldest_waiting_age_ms = report.oldest_waiting_age_ms,
            waiters_rechecked = report.waiters_rechecked,
            errors = report.errors,
            "sweep"
        );
        report
    }

    async fn requeue_stuck(&self, now_ms: i64, report: &mut SweepReport) {
        // Everything pending up to now, oldest first: the backlog figures, and the
        // stuck items are at its head.
        let pending = match self.sweep.stuck(now_ms, self.settings.batch).await {
            Ok(items) => items,
            Err(e) => {
                tracing::warn!(error = %e, "sweep: cannot list pending items");
                report.errors += 1;
                return;
            }
        };
        report.backlog_count = pending.len();
        report.oldest_pending_age_ms = pending
            .iter()
            .map(|i| now_ms.saturating_sub(i.updated_at_ms))
            .max()
            .unwrap_or(0)
            .max(0);
        let cutoff = now_ms.saturating_sub(self.settings.stuck_after_ms);
        let retry_cutoff = now_ms.saturating_sub(self.settings.retryable_after_ms);
        for item in pending {
            let lease = match item.state {
                // `queued` without a message: a replay whose send failed or whose CLI
                // died between the requeue and the send.
                InboxState::Received | InboxState::Queued => false,
                InboxState::Retryable if item.updated_at_ms < retry_cutoff => false,
                InboxState::Processing => true,
                _ => continue,
            };
            let since = if lease {
                item.lease_until_ms.unwrap_or(item.updated_at_ms)
            } else {
                item.updated_at_ms
            };
            if since >= cutoff {
                continue;
            }
            report.stuck_count += 1;
            let message = QueueMessage {
                pk: item.key.clone(),
            };
            match self.queue.send(&message).await {
                Ok(()) if lease => report.leases_released += 1,
                Ok(()) => report.reenqueued += 1,
                Err(e) => {
                    tracing::warn!(error = %e, pk = %item.key, "sweep: re-enqueue failed");
                    report.errors += 1;
                    continue;
                }
            }
            tracing::info!(
                pk = %item.key,
                state = %item.state,
                stuck_for_ms = now_ms.saturating_sub(since),
                "sweep: re-enqueued"
            );
        }
    }

    async fn recheck_waiting(&self, now_ms: i64, report: &mut SweepReport) {
        let due_before = now_ms.saturating_sub(self.settings.waiting_recheck_ms);
        let scan = match self
            .sweep
            .waiting(
                due_before,
                self.settings.batch,
                self.settings.waiting_read_max,
            )
            .await
        {
            Ok(scan) => scan,
            Err(e) => {
                tracing::warn!(error = %e, "sweep: cannot list waiting items");
                report.errors += 1;
                return;
            }
        };
        report.waiting_count = scan.count;
        report.oldest_waiting_age_ms = scan
            .oldest_since_ms
            .map_or(0, |since| now_ms.saturating_sub(since).max(0));
        for key in scan.due {
            match self.queue.send(&QueueMessage { pk: key.clone() }).await {
                Ok(()) => {
                    report.waiters_rechecked += 1;
                    tracing::info!(pk = %key, "sweep: waiting item re-checked");
                }
                Err(e) => {
                    tracing::warn!(error = %e, pk = %key, "sweep: re-check of a waiting item failed");
                    report.errors += 1;
                }
            }
        }
    }

    async fn mark_dead_letters(&self, now_ms: i64, report: &mut SweepReport) {
        let mut seen = HashSet::new();
        let mut receipts = Vec::new();
        while receipts.len() < self.settings.batch {
            let batch = match self
                .queue
                .receive_dead_letters(DLQ_BATCH, DLQ_VISIBILITY)
                .await
            {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::warn!(error = %e, "sweep: cannot read the dead-letter queue");
                    report.errors += 1;
                    break;
                }
            };
            if batch.is_empty() {
                break;
            }
            for delivery in batch {
                receipts.push(delivery.receipt);
                let key = delivery.message.pk;
                if !seen.insert(key.clone()) {
                    continue;
                }
                let item = match self.inbox.get(&key).await {
                    Ok(Some(item)) if !item.state.is_terminal() => item,
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, pk = %key, "sweep: cannot read a dead letter");
                        report.errors += 1;
                        continue;
                    }
                };
                // An item read without its body never had it stored: say so, so the
                // provider's retry that stores it takes the event back.
                let reason = if item.body.is_empty() {
                    format!("{BODY_MISSING}: {DLQ_REASON}")
                } else {
                    DLQ_REASON.to_string()
                };
                // As read: a run that finished, parked or replayed it since wins.
                match self
                    .processing
                    .mark_dead_letter(&key, &reason, ItemVersion::of(&item), now_ms)
                    .await
                {
                    Ok(true) => {
                        report.dead_lettered += 1;
                        tracing::warn!(pk = %key, reason = %reason, "sweep: marked dead_letter");
                    }
                    Ok(false) => {
                        tracing::info!(pk = %key, "sweep: dead letter's item moved on; left as it is")
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, pk = %key, "sweep: cannot mark dead_letter");
                        report.errors += 1;
                    }
                }
            }
        }
        // The messages stay in the DLQ for replay: visible again at once.
        for receipt in receipts {
            if let Err(e) = self.sweep.release_dead_letter(&receipt).await {
                tracing::debug!(error = %e, "sweep: dead letter stays hidden until its timeout");
            }
        }
    }

    /// The loop of `einmal serve`: one pass every `interval` until `shutdown`.
    pub async fn run_local(&self, interval: Duration, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = self.sweep_once(crate::time::now_millis()) => {}
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_from_env_override_defaults_and_reject_garbage() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            SweepSettings::from_lookup(env(&[])).unwrap(),
            SweepSettings::default()
        );
        let s = SweepSettings::from_lookup(env(&[(STUCK_AFTER_MS_ENV, "1000"), (BATCH_ENV, "7")]))
            .unwrap();
        assert_eq!((s.stuck_after_ms, s.batch), (1000, 7));
        let err = SweepSettings::from_lookup(env(&[(BATCH_ENV, "many")])).unwrap_err();
        assert!(err.contains(BATCH_ENV), "{err}");
        let s = SweepSettings::from_lookup(env(&[(WAITING_RECHECK_MS_ENV, "60000")])).unwrap();
        assert_eq!(s.waiting_recheck_ms, 60_000);
        let s = SweepSettings::from_lookup(env(&[(WAITING_READ_MAX_ENV, "3")])).unwrap();
        assert_eq!(s.waiting_read_max, 3);
        let err = SweepSettings::from_lookup(env(&[(WAITING_READ_MAX_ENV, "3k")])).unwrap_err();
        assert!(err.contains(WAITING_READ_MAX_ENV), "{err}");
        assert_eq!(SweepSettings::default().waiting_read_max, WAITING_SCAN_MAX);
        assert_eq!(SweepSettings::default().waiting_recheck_ms, 600_000);
    }
}
