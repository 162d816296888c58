//! The process function: begin → decide → commit → deliver → finish, one stage per
//! file.
//!
//! The processor Lambda (one SQS batch per invocation) and `einmal serve` (a local
//! polling loop, [`Processor::run_local`]) both call [`Processor::process_message`]
//! for each pointer message; only acknowledgement differs ([`AckMode`]).
//!
//! # Exactly-once effects
//!
//! 1. **Claim** the inbox item: one conditional write moves it to `processing` with
//!    a lease. A duplicate message of a finished item, or one whose item another
//!    worker holds, stops here. A store may start without a lease instead
//!    ([`InboxProcessing::begin`]: DynamoDB takes the item from the message that
//!    carried it, no call); its finish then applies to any item not yet terminal.
//! 2. **Decide**: the [`Domain`] names the records it needs ([`Domain::targets`]),
//!    they are loaded, and it returns the changes ([`Domain::decide`]).
//! 3. **Guard**: every change whose effect key is already applied (on the record that
//!    holds it: its own, or the owner named by [`Change::keyed_on`]) is dropped; the
//!    rest are committed in one atomic write conditioned on the versions that were
//!    loaded, together with a version check of every loaded record the decision does
//!    not change (unless the domain opts that read out, [`Domain::guards_read`]). A
//!    conflict (another event changed a record in between) reloads and decides again,
//!    for as long as the records keep moving (see [`lanes`](super::lanes): within a
//!    process, the decisions on one record take turns, so they rarely conflict).
//!    A commit that would grow a record's `applied` set past [`MAX_APPLIED_KEYS`] is a
//!    permanent failure: no record may grow with the number of events that touched it.
//! 4. **Finish** the inbox item (completed / ignored / retryable / dead_letter) with
//!    the result, only if the lease is still ours.
//!
//! A crash anywhere is safe: before the commit nothing happened; after it, the
//! redelivered message finds the effect key applied and only finishes the item.
//!
//!
//! Stages: [`begin`] (1), [`decide`] (2, 3: the domain, [`effects`]' guarded writes,
//! conflicts; [`hints`] enrich thin events first), [`deliver`] (the relay, before the
//! finish), [`outcome`] (what the run concludes: a pure function) and [`finish`] (4).
//! Waiting for a prerequisite is [`waiting`]; batches and the local loop [`batch`].

mod batch;
mod begin;
mod builder;
mod decide;
mod deliver;
mod effects;
mod finish;
mod hints;
mod outcome;
mod report;
mod settings;
mod waiting;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::commit_group::Member;
use super::lanes::Lanes;
use super::relay::Relay;
use crate::config_source::ConfigSource;
use crate::domain::state::StateStore;
use crate::domain::Domain;
use crate::lookup::ResourceLookup;
use crate::ports::{Delivery, Inbox, InboxProcessing, Queue};
use crate::telemetry::emf::WorkerMetrics;
use crate::telemetry::trace;
use outcome::{Failure, RunFacts};

pub use batch::LocalRun;
pub use decide::{EffectError, EffectOutcome};
pub use effects::PAYMENT_STATUS_FIELD;
pub use outcome::{AckMode, MessageOutcome, ALREADY_APPLIED};
pub use settings::*;
pub use waiting::WAKE_LIMIT;

/// Returning a leased message a little after its lease ends avoids a second bounce.
pub(super) const LEASE_MARGIN_MS: i64 = 250;

type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;
type Jitter = Arc<dyn Fn() -> f64 + Send + Sync>;

pub struct Processor {
    inbox: Arc<dyn Inbox>,
    processing: Arc<dyn InboxProcessing>,
    queue: Arc<dyn Queue>,
    state: Arc<dyn StateStore>,
    domain: Arc<dyn Domain>,
    settings: ProcessSettings,
    now_ms: Clock,
    jitter: Jitter,
    /// Fetches the state named by hints, with the tenants' credentials.
    lookup: Option<(Arc<dyn ResourceLookup>, Arc<ConfigSource>)>,
    metrics: Arc<WorkerMetrics>,
    sli_threshold_ms: i64,
    /// Delivers finished events to the destinations before the finish write.
    relay: Option<Arc<Relay>>,
    /// How long a batch's business commits wait for each other (zero: not gathered).
    commit_gather: Duration,
    /// Decisions on one record take turns within this process.
    lanes: Lanes,
}

impl Processor {
    /// Process one pointer message as `worker` (unique per process or invocation).
    /// Never fails: every problem becomes an outcome for the message.
    pub async fn process_message(&self, delivery: &Delivery, worker: &str) -> MessageOutcome {
        self.process_traced(delivery, worker, None).await
    }

    /// [`Processor::process_message`] for a message that carried the receiver's X-Ray
    /// trace header (SQS `AWSTraceHeader`): its trace id goes into the log lines.
    pub async fn process_traced(
        &self,
        delivery: &Delivery,
        worker: &str,
        trace_header: Option<&str>,
    ) -> MessageOutcome {
        self.process_in(delivery, worker, trace_header, None, None)
            .await
    }

    /// One message through the stages; its business commit goes through `commits`
    /// when the batch gathers them.
    async fn process_in(
        &self,
        delivery: &Delivery,
        worker: &str,
        trace_header: Option<&str>,
        commits: Option<&Member>,
        deliver_until: Option<Instant>,
    ) -> MessageOutcome {
        let trace_id = trace_header.and_then(trace::trace_id);
        let started = Instant::now();
        let began_ms = (self.now_ms)();
        let begun = match self.begin(delivery, worker, began_ms, trace_id).await {
            Ok(begun) => begun,
            Err(outcome) => return outcome,
        };
        let item = &begun.item;
        let result = if begun.body_missing {
            Err(Failure::body_missing())
        } else {
            self.apply(item, commits).await
        };
        if let Some(member) = commits {
            // Decided and committed (or not): the batch's other commits need not wait.
            member.done();
        }
        let delivered = self.deliver(item, &result, deliver_until).await;
        let run = RunFacts {
            delivery,
            item,
            body_missing: begun.body_missing,
            began_ms,
            now_ms: (self.now_ms)(),
            jitter: (self.jitter)(),
        };
        let conclusion = outcome::conclude(&run, &self.settings, result);
        if let Some(committed) = conclusion.committed {
            self.count_effect(item, committed, trace_id);
        }
        self.finish_run(
            delivery, worker, item, conclusion, delivered, trace_id, started,
        )
        .await
    }
}

/// The retry number of an attempt (1-based, for the backoff): the most of the inbox
/// item's attempts, the message's receives and its postponements.
pub(super) fn retry_number(delivery: &Delivery, attempts: u32) -> u32 {
    attempts
        .max(delivery.receive_count)
        .max(delivery.postponed.saturating_add(1))
}

pub(super) fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}
