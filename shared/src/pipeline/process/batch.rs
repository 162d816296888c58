//! Batches and their messages: a batch processed concurrently (one panic retries one
//! message), its outcomes settled on the queue, and `einmal serve`'s polling loop.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt;

use super::outcome::{AckMode, MessageOutcome};
use super::{millis, Processor, LEASE_MARGIN_MS};
use crate::pipeline::commit_group;
use crate::ports::Delivery;
use crate::telemetry::emf::RetryCause;

/// Messages taken per receive by [`Processor::run_local`].
const LOCAL_BATCH: u32 = 64;
/// Batches [`Processor::run_local`] works on at once: while some wait for their
/// commits, the next one is received and decided, so the store's writer always finds
/// a full group to commit. Bounds the messages in progress to
/// `LOCAL_BATCH * LOCAL_IN_FLIGHT`.
const LOCAL_IN_FLIGHT: usize = 8;
/// Pause of [`Processor::run_local`] when the queue is empty: an event arriving then
/// waits at most this long for its receive.
const LOCAL_IDLE: Duration = Duration::from_millis(50);
/// Pause of [`Processor::run_local`] after a failed receive.
const LOCAL_ERROR_PAUSE: Duration = Duration::from_secs(1);

impl Processor {
    /// Process a batch concurrently. One bad record never fails the others: even a
    /// panic in one becomes a retry of that message alone. On a store that gathers
    /// commits, the batch's business commits go to it together
    /// ([`Processor::with_commit_gather`]).
    pub async fn process_batch(
        &self,
        deliveries: &[Delivery],
        worker: &str,
    ) -> Vec<(String, MessageOutcome)> {
        self.process_batch_traced(deliveries, &[], worker).await
    }

    /// [`Processor::process_batch`] with each message's X-Ray trace header
    /// (`trace_headers[i]` for `deliveries[i]`; missing entries mean none).
    pub async fn process_batch_traced(
        &self,
        deliveries: &[Delivery],
        trace_headers: &[Option<String>],
        worker: &str,
    ) -> Vec<(String, MessageOutcome)> {
        self.process_batch_until(deliveries, trace_headers, worker, None)
            .await
    }

    /// [`Processor::process_batch_traced`] whose inline deliveries end at
    /// `deliver_until` (the Lambda invocation's deadline less a margin): what is not
    /// delivered by then stays pending for the relay (`Relay::deliver_event_until`),
    /// so a slow destination never runs the invocation out of time after its commits.
    pub async fn process_batch_until(
        &self,
        deliveries: &[Delivery],
        trace_headers: &[Option<String>],
        worker: &str,
        deliver_until: Option<Instant>,
    ) -> Vec<(String, MessageOutcome)> {
        let gather =
            deliveries.len() > 1 && !self.commit_gather.is_zero() && self.state.gathers_commits();
        let mut members = if gather {
            commit_group::members(self.state.clone(), deliveries.len(), self.commit_gather)
        } else {
            Vec::new()
        }
        .into_iter();
        let runs = deliveries.iter().enumerate().map(|(i, delivery)| {
            let member = members.next();
            async move {
            let trace = trace_headers.get(i).and_then(|t| t.as_deref());
            // Dropped when the run ends (a panic included): the others stop waiting for it.
            let member = member;
            let outcome = AssertUnwindSafe(self.process_in(delivery, worker, trace, member.as_ref(), deliver_until))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    tracing::error!(pk = %delivery.message.pk, "processing panicked; retrying later");
                    self.count_retry(RetryCause::Panic);
                    // Counted: a message that panics every time reaches the redrive.
                    MessageOutcome::LeaveForLater { delay: self.backoff(delivery.receive_count) }
                });
            (delivery.receipt.clone(), outcome)
            }
        });
        futures::future::join_all(runs).await
    }

    /// Apply an outcome to the queue. Returns `true` when the message stays in the
    /// queue (for Lambda: report it as a batch item failure).
    pub async fn settle(
        &self,
        delivery: &Delivery,
        outcome: MessageOutcome,
        mode: AckMode,
    ) -> bool {
        let pk = &delivery.message.pk;
        let ack = || async {
            if mode == AckMode::Delete {
                if let Err(e) = self.queue.ack(&delivery.receipt).await {
                    // Redelivered later; the claim then says it is finished.
                    tracing::warn!(pk = %pk, error = %e, "could not delete a handled message");
                }
            }
            false
        };
        match outcome {
            MessageOutcome::Ack => ack().await,
            MessageOutcome::Retry { delay } => !self.postpone(delivery, delay).await,
            MessageOutcome::LeaveForLater { delay } => {
                if let Err(e) = self.queue.change_visibility(&delivery.receipt, delay).await {
                    // It comes back after the receive's visibility timeout instead.
                    tracing::warn!(pk = %pk, error = %e, "could not set the retry delay");
                }
                true
            }
            MessageOutcome::DeadLetterNow => {
                match self.queue.send_dead_letter(&delivery.message).await {
                    Ok(()) => ack().await,
                    Err(e) => {
                        // Keep it: SQS redrive moves it after maxReceiveCount receives.
                        tracing::error!(pk = %pk, error = %e, "could not send to the dead-letter queue");
                        true
                    }
                }
            }
        }
    }

    /// Replace the message by one visible after `delay` ([`Queue::postpone`]). When
    /// that fails, the message itself comes back after `delay` (its receive counted).
    /// Returns whether it was replaced (the received one is gone).
    async fn postpone(&self, delivery: &Delivery, delay: Duration) -> bool {
        match self.queue.postpone(delivery, delay).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(pk = %delivery.message.pk, error = %e, "could not postpone; the receive counts");
                if let Err(e) = self.queue.change_visibility(&delivery.receipt, delay).await {
                    // It comes back after the receive's visibility timeout instead.
                    tracing::warn!(pk = %delivery.message.pk, error = %e, "could not set the retry delay");
                }
                false
            }
        }
    }

    /// [`Processor::settle`] of a whole batch with [`AckMode::Delete`]: the pointers
    /// of dead-lettered items go to the DLQ first, then every handled message is
    /// deleted with one [`Queue::ack_batch`] while the retried ones get their
    /// visibility changes, so the batch settles in one group commit instead of one
    /// commit per message. Returns how many messages stay in the queue.
    pub async fn settle_batch(
        &self,
        deliveries: &[Delivery],
        outcomes: &[MessageOutcome],
    ) -> usize {
        let mut acks = Vec::with_capacity(deliveries.len());
        let mut later = Vec::new();
        let mut postponed = Vec::new();
        let mut dead = Vec::new();
        for (delivery, outcome) in deliveries.iter().zip(outcomes) {
            match *outcome {
                MessageOutcome::Ack => acks.push(delivery.receipt.clone()),
                MessageOutcome::Retry { delay } => postponed.push((delivery, delay)),
                MessageOutcome::LeaveForLater { delay } => later.push((delivery, delay)),
                MessageOutcome::DeadLetterNow => dead.push(delivery),
            }
        }
        let mut kept = later.len();
        let replaced = futures::future::join_all(
            postponed
                .iter()
                .map(|(delivery, delay)| self.postpone(delivery, *delay)),
        )
        .await;
        kept += replaced.iter().filter(|replaced| !**replaced).count();
        let sent = futures::future::join_all(
            dead.iter()
                .map(|d| async move { (*d, self.queue.send_dead_letter(&d.message).await) }),
        )
        .await;
        for (delivery, result) in sent {
            match result {
                Ok(()) => acks.push(delivery.receipt.clone()),
                Err(e) => {
                    // Keep it: SQS redrive moves it after maxReceiveCount receives.
                    tracing::error!(pk = %delivery.message.pk, error = %e, "could not send to the dead-letter queue");
                    kept += 1;
                }
            }
        }
        let delays = futures::future::join_all(later.iter().map(|(delivery, delay)| async move {
            if let Err(e) = self.queue.change_visibility(&delivery.receipt, *delay).await {
                // It comes back after the receive's visibility timeout instead.
                tracing::warn!(pk = %delivery.message.pk, error = %e, "could not set the retry delay");
            }
        }));
        let deleted = async {
            if acks.is_empty() {
                return;
            }
            if let Err(e) = self.queue.ack_batch(&acks).await {
                // Redelivered later; the claim then says they are finished.
                tracing::warn!(messages = acks.len(), error = %e, "could not delete handled messages");
            }
        };
        futures::future::join(delays, deleted).await;
        kept
    }

    /// The local worker loop of `einmal serve`: receive a batch, process it, settle it
    /// ([`Processor::settle_batch`]), with up to [`LOCAL_IN_FLIGHT`] batches at once
    /// (the next receive overlaps the processing of the last); pause briefly when the
    /// queue is empty. Returns when `shutdown` completes, after the batches in
    /// progress (and a receive under way) were finished.
    pub async fn run_local(&self, worker: &str, shutdown: impl Future<Output = ()>) -> LocalRun {
        tokio::pin!(shutdown);
        // Hidden at least as long as the lease, so a slow message is not received twice.
        let visibility = millis(self.settings.lease_ms + LEASE_MARGIN_MS);
        let mut run = LocalRun::default();
        let mut in_flight = futures::stream::FuturesUnordered::new();
        // Kept across iterations: a receive is never dropped half-way (its messages
        // would stay hidden for the visibility timeout).
        let mut receiving = None;
        let mut pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        loop {
            if receiving.is_none() && pause.is_none() && in_flight.len() < LOCAL_IN_FLIGHT {
                receiving = Some(self.queue.receive(LOCAL_BATCH, visibility));
            }
            tokio::select! {
                _ = &mut shutdown => break,
                Some(()) = futures::StreamExt::next(&mut in_flight), if !in_flight.is_empty() => {}
                received = optional(&mut receiving) => {
                    receiving = None;
                    match received {
                        Ok(deliveries) if !deliveries.is_empty() => {
                            run.batches += 1;
                            run.messages += deliveries.len() as u64;
                            in_flight.push(self.run_local_batch(deliveries, worker));
                        }
                        Ok(_) => pause = Some(Box::pin(tokio::time::sleep(LOCAL_IDLE))),
                        Err(e) => {
                            tracing::warn!(error = %e, "receive failed");
                            pause = Some(Box::pin(tokio::time::sleep(LOCAL_ERROR_PAUSE)));
                        }
                    }
                }
                () = optional(&mut pause) => pause = None,
            }
        }
        if let Some(receive) = receiving {
            if let Ok(deliveries) = receive.await {
                if !deliveries.is_empty() {
                    run.batches += 1;
                    run.messages += deliveries.len() as u64;
                    in_flight.push(self.run_local_batch(deliveries, worker));
                }
            }
        }
        while futures::StreamExt::next(&mut in_flight).await.is_some() {}
        run
    }

    async fn run_local_batch(&self, deliveries: Vec<Delivery>, worker: &str) {
        let outcomes: Vec<MessageOutcome> = self
            .process_batch(&deliveries, worker)
            .await
            .into_iter()
            .map(|(_, outcome)| outcome)
            .collect();
        self.settle_batch(&deliveries, &outcomes).await;
    }
}

/// What [`Processor::run_local`] handled before it stopped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LocalRun {
    /// Non-empty batches received.
    pub batches: u64,
    /// Messages in them.
    pub messages: u64,
}

/// The output of the future in `slot`; never ready while the slot is empty.
async fn optional<F: Future + Unpin>(slot: &mut Option<F>) -> F::Output {
    match slot {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}
