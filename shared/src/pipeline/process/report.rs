//! What a run reports: its log line, its retries and the business figures of its
//! effect (lag, the payment SLI).
//!
//! Every message's outcome lands in [`Processor::metrics`] (completed, ignored, dead
//! letters, retries by [`RetryCause`], processing time); every committed effect adds
//! its lag (the provider's event time, `occurred_at`, else our receive time, to the
//! commit) and, for a **payment event**, whether that lag was within the SLI
//! threshold. A payment event is one whose committed changes move a record's
//! `payment_status` field ([`PAYMENT_STATUS_FIELD`]): paid, failed, refunded; a new
//! record created in its initial `pending` status does not count. Events that never
//! commit (dead letters) are counted by `DeadLetters`, not by the SLI. The processor
//! Lambda prints the tally as one EMF line per batch.
//!

use tracing::Level;

use super::outcome::Committed;
use super::Processor;
use crate::ports::{Finish, InboxItem};
use crate::telemetry::emf::RetryCause;

impl Processor {
    pub(super) fn count_retry(&self, cause: RetryCause) {
        self.metrics
            .update(|t| *t.retries.entry(cause).or_default() += 1);
    }

    /// The business figures of a committed effect: lag from the provider's event time
    /// (our receive time when the provider gives none), and the SLI for payment events.
    pub(super) fn count_effect(
        &self,
        item: &InboxItem,
        committed: Committed,
        trace_id: Option<&str>,
    ) {
        let since_ms = item
            .envelope
            .occurred_at
            .map_or(item.received_at_ms, |secs| secs.saturating_mul(1000));
        let lag_ms = committed.at_ms.saturating_sub(since_ms).max(0);
        let within = lag_ms <= self.sli_threshold_ms;
        self.metrics.update(|t| {
            t.effect_lag_ms.add(lag_ms as f64);
            if committed.payment {
                t.payment_within_slo.add(if within { 1.0 } else { 0.0 });
            }
        });
        if committed.payment && !within {
            tracing::warn!(
                pk = %item.key, lag_ms, threshold_ms = self.sli_threshold_ms, trace_id,
                "payment effect outside the SLI threshold"
            );
        }
    }
}

/// One line per attempt: identifiers, state and the short reason; never the body.
pub(super) fn log_attempt(
    level: Level,
    item: &InboxItem,
    finish: &Finish,
    receive_count: u32,
    trace_id: Option<&str>,
    message: &str,
    detail: Option<&str>,
) {
    let env = &item.envelope;
    macro_rules! emit {
        ($level:expr) => {
            tracing::event!(
                $level,
                provider = %env.provider,
                tenant = %env.tenant,
                event_id = %env.event_id,
                event_type = %env.event_type,
                object_id = env.object_id.as_deref(),
                state = %finish.state,
                attempt = item.attempts,
                receive_count,
                delivery_id = env.delivery_id.as_deref(),
                trace_id,
                detail,
                "{message}"
            )
        };
    }
    if level == Level::ERROR {
        emit!(Level::ERROR)
    } else if level == Level::WARN {
        emit!(Level::WARN)
    } else {
        emit!(Level::INFO)
    }
}
