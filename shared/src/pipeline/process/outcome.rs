//! The outcome of a run: a pure function from what the run found to the finish it
//! writes and what becomes of its message.
//!
//! # Only a permanent fact ends an event
//!
//! Only a permanent fact ends an event. Transient ([`StoreError::Unavailable`], a
//! lookup that timed out, contention that outlasted the in-process rounds): the item
//! becomes `retryable` and its message is *postponed* ([`Queue::postpone`]: replaced
//! by one visible after an exponential backoff with full jitter, up to
//! [`ProcessSettings::backoff_max_ms`]), so a throttle or an outage of any length
//! spends none of the redrive's `maxReceiveCount`; that stays the backstop for a
//! message whose handler crashes (or panics) every time. A transient failure is
//! dead-lettered only once the event is older than its retry horizon
//! ([`ProcessSettings::retry_horizon_ms`], default the provider's retry window: by
//! then the provider has stopped retrying too). Permanent
//! ([`DomainError::Permanent`], a corrupt body or record, a write the store rejects
//! for good, [`StoreError::Rejected`], such as an item over DynamoDB's size limit):
//! `dead_letter` at once with the reason, the pointer goes to the DLQ at once.

use std::time::Duration;

use super::{retry_number, ProcessSettings};
use crate::destinations::Output;
use crate::domain::state::StateKey;
use crate::domain::DomainError;
use crate::lookup::LookupError;
use crate::ports::{
    Delivery, Finish, InboxItem, InboxState, StoreError, WaitChange, Waiting, BODY_MISSING,
    ERROR_CLASS_PERMANENT, ERROR_CLASS_TRANSIENT, NO_RECORD,
};
use crate::telemetry::emf::RetryCause;
use crate::time::human_duration;

/// Result recorded when every change of a decision had already been applied.
pub const ALREADY_APPLIED: &str = "already applied";

/// What to do with the queue message after [`Processor::process_message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageOutcome {
    /// Done (completed, ignored, a duplicate of a finished item, an expired item):
    /// delete the message.
    Ack,
    /// A transient failure: the message comes back after `delay` without spending a
    /// receive of the redrive's budget ([`Queue::postpone`]; if that fails,
    /// ChangeMessageVisibility).
    Retry { delay: Duration },
    /// Make the message visible again after `delay`, its receive counted
    /// (ChangeMessageVisibility): another worker holds a live lease, or the run
    /// panicked (SQS's redrive is the backstop for a message that crashes every time).
    LeaveForLater { delay: Duration },
    /// The item is `dead_letter`: send the pointer to the DLQ, then delete the message.
    DeadLetterNow,
}

/// Who deletes handled messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// [`Processor::settle`] deletes them (local polling).
    Delete,
    /// The caller does: the Lambda SQS event source deletes every record not
    /// reported as a batch item failure.
    ByCaller,
}

/// The failure classes of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    Transient(RetryCause, String),
    Permanent(String),
    /// A prerequisite is missing: park the item.
    Wait(WaitFor),
}

/// What a waiting decision waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WaitFor {
    /// The domain's message (`waiting: ...`).
    pub(super) reason: String,
    /// The first target and the version the decision saw; `None` when the event
    /// targeted no record.
    pub(super) record: Option<(StateKey, u64)>,
}

impl From<DomainError> for Failure {
    fn from(e: DomainError) -> Self {
        match e {
            DomainError::Permanent(_) => Failure::Permanent(e.to_string()),
            DomainError::Wait(_) => Failure::Wait(WaitFor {
                reason: e.to_string(),
                record: None,
            }),
        }
    }
}

impl From<LookupError> for Failure {
    fn from(e: LookupError) -> Self {
        match e {
            LookupError::Transient(_) => Failure::Transient(RetryCause::Lookup, e.to_string()),
            LookupError::Permanent(_) => Failure::Permanent(e.to_string()),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) => {
                Failure::Transient(RetryCause::StoreUnavailable, e.to_string())
            }
            // A record that cannot be decoded will not heal by retrying; an operator
            // repairs it and replays the dead letter. Neither will a write the store
            // refuses for good (an item over the size limit).
            StoreError::Corrupt(_) | StoreError::Rejected(_) => Failure::Permanent(e.to_string()),
        }
    }
}

/// What a successful attempt produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Applied {
    /// The result, what this attempt committed, and the decision's domain outputs
    /// (of ALL its changes, so a re-run after a crash finds the same ones).
    Completed(String, Option<Committed>, Vec<Output>),
    Ignored(String),
}

/// An effect this attempt committed: when, and whether it moved a payment status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Committed {
    pub(super) at_ms: i64,
    pub(super) payment: bool,
}

impl Failure {
    /// The body of the event was never stored: its request was not acknowledged, and
    /// the provider's retry stores it (`PutOutcome::Restored`). Transient until the
    /// retry horizon.
    pub(super) fn body_missing() -> Self {
        Failure::Transient(
            RetryCause::StoreUnavailable,
            format!(
                "{BODY_MISSING}: the event's body was never stored (its request was not \
                 acknowledged; the provider's retry stores it)"
            ),
        )
    }
}

/// What a run found, as far as its conclusion depends on it.
pub(super) struct RunFacts<'a> {
    pub(super) delivery: &'a Delivery,
    /// The item as the run began it.
    pub(super) item: &'a InboxItem,
    /// Its body was missing (the run did not decide).
    pub(super) body_missing: bool,
    /// The clock when the run began, and now.
    pub(super) began_ms: i64,
    pub(super) now_ms: i64,
    /// The jitter fraction of a backoff, in `[0, 1]`.
    pub(super) jitter: f64,
}

/// What a run concludes: the finish to write, the message's outcome once it is
/// written, and what the telemetry and the follow-ups need.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Conclusion {
    pub(super) finish: Finish,
    pub(super) outcome: MessageOutcome,
    /// The retry's cause, for the metrics.
    pub(super) retry_cause: Option<RetryCause>,
    /// The record parked on and the version the decision saw (re-checked after the park).
    pub(super) parked: Option<(StateKey, u64)>,
    /// A re-run that found every effect applied keeps the event's result.
    pub(super) kept_result: bool,
    /// The effect this run committed, for the business figures.
    pub(super) committed: Option<Committed>,
}

/// The finish of a run in `state`.
pub(super) fn finish_of(
    state: InboxState,
    error: Option<(&str, String)>,
    result: Option<String>,
    now_ms: i64,
) -> Finish {
    let (error_class, error) = match error {
        Some((class, message)) => (Some(class.to_string()), Some(message)),
        None => (None, None),
    };
    Finish {
        state,
        error_class,
        error,
        result,
        now_ms,
        wait: WaitChange::Keep,
        deliveries: None,
        relay_due_ms: None,
    }
}

/// The conclusion of a run from its result.
pub(super) fn conclude(
    run: &RunFacts<'_>,
    settings: &ProcessSettings,
    result: Result<Applied, Failure>,
) -> Conclusion {
    let item = run.item;
    let provider = &item.envelope.provider;
    let finish = |state, error, result| finish_of(state, error, result, run.now_ms);
    let dead = |class, reason| {
        let finish = finish(InboxState::DeadLetter, Some((class, reason)), None);
        (finish, MessageOutcome::DeadLetterNow)
    };
    let mut conclusion = Conclusion {
        finish: finish(InboxState::Completed, None, None),
        outcome: MessageOutcome::Ack,
        retry_cause: None,
        parked: None,
        kept_result: false,
        committed: None,
    };
    let (finish, outcome) = match result {
        Ok(Applied::Completed(result, committed, _)) => {
            conclusion.committed = committed;
            // A re-run (a forced replay of a completed event) that finds every effect
            // applied changes nothing: the event keeps its result.
            conclusion.kept_result =
                committed.is_none() && result == ALREADY_APPLIED && item.result.is_some();
            let result = (!conclusion.kept_result).then_some(result);
            (
                finish(InboxState::Completed, None, result),
                MessageOutcome::Ack,
            )
        }
        Ok(Applied::Ignored(reason)) => (
            finish(InboxState::Ignored, None, Some(reason)),
            MessageOutcome::Ack,
        ),
        Err(Failure::Permanent(reason)) => dead(ERROR_CLASS_PERMANENT, reason),
        Err(Failure::Wait(wait)) => {
            let since_ms = item.waiting.as_ref().map_or(run.began_ms, |w| w.since_ms);
            let window_ms = settings.wait_window_ms_for(provider);
            let waited_ms = run.now_ms.saturating_sub(since_ms);
            if waited_ms >= window_ms {
                let reason = format!(
                    "waited {} (window {}) for {}",
                    human_duration(waited_ms),
                    human_duration(window_ms),
                    wait.reason
                );
                dead(ERROR_CLASS_TRANSIENT, reason)
            } else {
                let on = wait
                    .record
                    .as_ref()
                    .map_or_else(|| NO_RECORD.to_string(), |(key, _)| key.pk());
                let mut parked = finish(
                    InboxState::Waiting,
                    Some((ERROR_CLASS_TRANSIENT, wait.reason.clone())),
                    None,
                );
                parked.wait = WaitChange::Park(Waiting { on, since_ms });
                conclusion.parked = wait.record.clone();
                (parked, MessageOutcome::Ack)
            }
        }
        Err(Failure::Transient(_, reason))
            if run.began_ms.saturating_sub(item.received_at_ms)
                >= settings.retry_horizon_ms_for(provider) =>
        {
            let exhausted = format!(
                "transient failures for {} (horizon {}), {} attempts",
                human_duration(run.began_ms.saturating_sub(item.received_at_ms)),
                human_duration(settings.retry_horizon_ms_for(provider)),
                item.attempts.max(retry_number(run.delivery, 0))
            );
            // A missing body says so first: a late retry of the provider that stores
            // it takes the event back (`PutOutcome::Restored`).
            let reason = if run.body_missing {
                format!("{reason}; retries exhausted: {exhausted}")
            } else {
                format!("retries exhausted: {exhausted}: {reason}")
            };
            dead(ERROR_CLASS_TRANSIENT, reason)
        }
        Err(Failure::Transient(cause, reason)) => {
            conclusion.retry_cause = Some(cause);
            let attempt = retry_number(run.delivery, item.attempts);
            (
                finish(
                    InboxState::Retryable,
                    Some((ERROR_CLASS_TRANSIENT, reason)),
                    None,
                ),
                MessageOutcome::Retry {
                    delay: settings.backoff(attempt, run.jitter),
                },
            )
        }
    };
    conclusion.finish = finish;
    conclusion.outcome = outcome;
    if conclusion.finish.state != InboxState::Waiting && item.waiting.is_some() {
        conclusion.finish.wait = WaitChange::Clear;
    }
    conclusion
}

#[cfg(test)]
mod tests;
