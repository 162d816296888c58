//! Finish (step 5): the run's conclusion written to the inbox item (with the
//! deliveries), only while the run still holds it; then the log line, the metrics, and
//! the follow-ups (a parked event's re-check, the next events of released objects).

use std::time::Instant;

use tracing::Level;

use super::outcome::{Conclusion, MessageOutcome};
use super::report::log_attempt;
use super::{millis, retry_number, Processor, LEASE_MARGIN_MS};
use crate::pipeline::relay::EventDeliveries;
use crate::ports::{Delivery, Handout, InboxItem, InboxState};
use crate::telemetry::emf::RetryCause;

impl Processor {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn finish_run(
        &self,
        delivery: &Delivery,
        worker: &str,
        item: &InboxItem,
        conclusion: Conclusion,
        delivered: Option<EventDeliveries>,
        trace_id: Option<&str>,
        started: Instant,
    ) -> MessageOutcome {
        let Conclusion {
            mut finish,
            outcome,
            retry_cause,
            parked,
            kept_result,
            ..
        } = conclusion;
        let key = &delivery.message.pk;
        let attempt = item.attempts;
        let mut handoffs = Vec::new();
        let resent = delivered.as_ref().map_or(0, |d| {
            d.deliveries.iter().filter(|s| s.attempts > 0).count()
        });
        if let Some(delivered) = delivered {
            finish.deliveries = Some(delivered.deliveries);
            finish.relay_due_ms = delivered.relay_due_ms;
            handoffs = delivered.handoffs;
        }
        let log = |level, message: &str, detail: Option<&str>| {
            log_attempt(
                level,
                item,
                &finish,
                delivery.receive_count,
                trace_id,
                message,
                detail,
            )
        };
        // `begin` may hand the item out without a lease (its claim then names no owner).
        let run = Handout::of(item, worker);
        let leased = matches!(run, Handout::Leased { .. });
        let finished = self.processing.finish(key, &run, &finish).await;
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        self.metrics.update(|t| {
            t.processing_ms.add(elapsed_ms);
            match (&finished, finish.state) {
                (Ok(true), InboxState::Completed) => t.completed += 1,
                (Ok(true), InboxState::Ignored) => t.ignored += 1,
                (Ok(true), InboxState::DeadLetter) => t.dead_letters += 1,
                (Ok(true), InboxState::Waiting) => t.parked += 1,
                (Ok(true), _) => {
                    if let Some(cause) = retry_cause {
                        *t.retries.entry(cause).or_default() += 1;
                    }
                }
                (Ok(false), _) => {}
                (Err(_), _) => *t.retries.entry(RetryCause::StoreUnavailable).or_default() += 1,
            }
        });
        match finished {
            Ok(true) => {
                let kept = kept_result.then(|| {
                    format!(
                        "effects already applied, nothing changed; deliveries re-sent: {resent}; \
                         result kept: {}",
                        item.result.as_deref().unwrap_or_default()
                    )
                });
                let detail =
                    (finish.error.as_deref().or(finish.result.as_deref())).or(kept.as_deref());
                let (level, message) = match finish.state {
                    InboxState::DeadLetter => (Level::ERROR, "event dead-lettered"),
                    InboxState::Retryable => (Level::WARN, "event will be retried"),
                    InboxState::Waiting => (Level::INFO, "event waits for a prerequisite"),
                    _ => (Level::INFO, "event processed"),
                };
                log(level, message, detail);
                if let Some((record, seen_version)) = parked {
                    self.recheck_parked(key, &record, seen_version).await;
                }
                if let (Some(relay), false) = (&self.relay, handoffs.is_empty()) {
                    // The next events of the objects this one released, now that its
                    // record is written.
                    relay.hand_on(handoffs).await;
                }
                outcome
            }
            Ok(false) if !leased => {
                // Handed out without a lease (`begin`): another run finished the item
                // first (a duplicate message), or a live lease holds it. Whatever we
                // committed is guarded by its effect key; nothing is left for this
                // message to do.
                log(Level::INFO, "event already finished by another run", None);
                MessageOutcome::Ack
            }
            Ok(false) => {
                // Our lease ran out and another worker claimed the item. Whatever we
                // committed is guarded by its effect key; that worker finishes it.
                log(
                    Level::WARN,
                    "lease lost before finishing; the new owner finishes",
                    None,
                );
                MessageOutcome::LeaveForLater {
                    delay: millis(self.settings.lease_ms),
                }
            }
            Err(e) => {
                // The item stays `processing` under our lease: come back after it.
                let error = e.to_string();
                log(
                    Level::WARN,
                    "could not finish the inbox item; retrying",
                    Some(&error),
                );
                let lease = millis(self.settings.lease_ms + LEASE_MARGIN_MS);
                MessageOutcome::Retry {
                    delay: self.backoff(retry_number(delivery, attempt)).max(lease),
                }
            }
        }
    }
}
