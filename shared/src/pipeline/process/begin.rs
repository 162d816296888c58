//! Begin (step 1): the item of one delivery, claimed under a lease or handed out
//! without one ([`InboxProcessing::begin`]). A duplicate message of a finished item, an
//! item another worker holds, or one that no longer exists ends the run here.
//!
//! [`InboxProcessing::begin`]: crate::ports::InboxProcessing::begin

use super::outcome::MessageOutcome;
use super::{millis, retry_number, Processor, LEASE_MARGIN_MS};
use crate::ports::{ClaimOutcome, Delivery, InboxItem, StoreError};
use crate::telemetry::emf::RetryCause;

/// The item a run goes on with.
pub(super) struct Begun {
    pub(super) item: Box<InboxItem>,
    /// Its body was never stored: nothing to decide on yet.
    pub(super) body_missing: bool,
}

impl Processor {
    pub(super) async fn begin(
        &self,
        delivery: &Delivery,
        worker: &str,
        now: i64,
        trace_id: Option<&str>,
    ) -> Result<Begun, MessageOutcome> {
        let key = &delivery.message.pk;
        let claim = self
            .processing
            .begin(delivery, worker, now, self.settings.lease_ms)
            .await;
        match claim {
            Ok(ClaimOutcome::Claimed(item)) => Ok(Begun {
                item,
                body_missing: false,
            }),
            // Its request was never acknowledged: the provider's retry stores the body
            // (`PutOutcome::Restored`). Transient until the retry horizon.
            Ok(ClaimOutcome::BodyMissing(item)) => Ok(Begun {
                item,
                body_missing: true,
            }),
            Ok(ClaimOutcome::Finished(state)) => {
                tracing::info!(pk = %key, state = %state, receive_count = delivery.receive_count,
                    trace_id, "duplicate message: event already finished");
                Err(MessageOutcome::Ack)
            }
            Ok(ClaimOutcome::Leased { until_ms }) => {
                let wait = until_ms.saturating_sub(now).max(0) + LEASE_MARGIN_MS;
                tracing::info!(pk = %key, lease_ms = wait, trace_id, "event leased by another worker");
                Err(MessageOutcome::LeaveForLater {
                    delay: millis(wait),
                })
            }
            Ok(ClaimOutcome::Missing) => {
                tracing::warn!(pk = %key, "message for an inbox item that does not exist (expired?)");
                Err(MessageOutcome::Ack)
            }
            Err(StoreError::Unavailable(e)) => {
                tracing::warn!(pk = %key, error = %e, trace_id, "claim failed; retrying later");
                self.count_retry(RetryCause::StoreUnavailable);
                Err(MessageOutcome::Retry {
                    delay: self.backoff(retry_number(delivery, 0)),
                })
            }
            Err(e @ (StoreError::Corrupt(_) | StoreError::Rejected(_))) => {
                // Nothing can be recorded on an item we cannot read: the DLQ keeps the
                // pointer for an operator.
                tracing::error!(pk = %key, error = %e, trace_id, "inbox item unreadable; dead-lettering the message");
                self.metrics.update(|t| t.dead_letters += 1);
                Err(MessageOutcome::DeadLetterNow)
            }
        }
    }
}
