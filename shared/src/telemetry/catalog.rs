//! Every metric einmal publishes, in one place: the code emits only names from here
//! and the alarm/metric consistency test checks `infra/template.yaml` against it.
//!
//! All metrics go to the [`NAMESPACE`] namespace in CloudWatch Embedded Metric Format.
//! Every metric carries the [`DEPLOYMENT`] dimension (the stack name, from
//! `EINMAL_DEPLOYMENT`) so two stacks in one account never mix. The per-provider or
//! per-cause breakdowns are a second dimension set; alarms use the
//! deployment-only set, which keeps the number of custom metrics (and their cost) small.

/// CloudWatch namespace of every custom metric.
pub const NAMESPACE: &str = "Einmal";
/// The dimension every metric carries: the deployment (stack) name.
pub const DEPLOYMENT: &str = "Deployment";
/// Breakdown dimension for intake metrics.
pub const PROVIDER: &str = "Provider";
/// Breakdown dimension for retries.
pub const CAUSE: &str = "Cause";
/// Breakdown dimension for deliveries: the destination's configured name.
pub const DESTINATION: &str = "Destination";

/// CloudWatch unit of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Count,
    Milliseconds,
    Seconds,
    /// A ratio published as 0 or 1 per event, so `Average` is the share.
    None,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Count => "Count",
            Unit::Milliseconds => "Milliseconds",
            Unit::Seconds => "Seconds",
            Unit::None => "None",
        }
    }
}

/// Which function emits a metric (documentation and the consistency test).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emitter {
    Receiver,
    Processor,
    Sweeper,
    Reconciler,
    /// The relay: the processor right after its commit, the sweeper (AWS) or
    /// `einmal serve` (embedded) for retries and the backlog gauges.
    Relay,
}

/// One metric: its name, unit, emitter and the dimension sets it is published with.
/// Every dimension set starts with [`DEPLOYMENT`].
#[derive(Debug, Clone, Copy)]
pub struct MetricSpec {
    pub name: &'static str,
    pub unit: Unit,
    pub emitter: Emitter,
    pub dimension_sets: &'static [&'static [&'static str]],
}

const BY_DEPLOYMENT: &[&[&str]] = &[&[DEPLOYMENT]];
const BY_PROVIDER: &[&[&str]] = &[&[DEPLOYMENT], &[DEPLOYMENT, PROVIDER]];
const BY_CAUSE: &[&[&str]] = &[&[DEPLOYMENT], &[DEPLOYMENT, CAUSE]];
const BY_DESTINATION: &[&[&str]] = &[&[DEPLOYMENT], &[DEPLOYMENT, DESTINATION]];

macro_rules! metrics {
    ($($konst:ident = $name:literal, $unit:ident, $emitter:ident, $dims:ident;)*) => {
        $(pub const $konst: &str = $name;)*
        /// Every metric einmal emits.
        pub const CATALOG: &[MetricSpec] = &[
            $(MetricSpec { name: $name, unit: Unit::$unit, emitter: Emitter::$emitter, dimension_sets: $dims },)*
        ];
    };
}

metrics! {
    // intake (receiver)
    WEBHOOKS_ACCEPTED = "WebhooksAccepted", Count, Receiver, BY_PROVIDER;
    WEBHOOKS_DUPLICATE = "WebhooksDuplicate", Count, Receiver, BY_PROVIDER;
    SIGNATURE_FAILURES = "SignatureFailures", Count, Receiver, BY_PROVIDER;
    WEBHOOKS_REJECTED = "WebhooksRejected", Count, Receiver, BY_PROVIDER;
    INTAKE_UNAVAILABLE = "IntakeUnavailable", Count, Receiver, BY_DEPLOYMENT;
    ACK_LATENCY = "AckLatency", Milliseconds, Receiver, BY_PROVIDER;
    // worker (processor)
    EVENTS_COMPLETED = "EventsCompleted", Count, Processor, BY_DEPLOYMENT;
    EVENTS_IGNORED = "EventsIgnored", Count, Processor, BY_DEPLOYMENT;
    PROCESSING_TIME = "ProcessingTime", Milliseconds, Processor, BY_DEPLOYMENT;
    RETRIES = "Retries", Count, Processor, BY_CAUSE;
    DEAD_LETTERS = "DeadLetters", Count, Processor, BY_DEPLOYMENT;
    // events parked for a prerequisite, and parked events re-enqueued by a commit
    EVENTS_PARKED = "EventsParked", Count, Processor, BY_DEPLOYMENT;
    WAITERS_WOKEN = "WaitersWoken", Count, Processor, BY_DEPLOYMENT;
    // Commits that found a record changed since it was loaded (decided again).
    STATE_CONFLICTS = "StateConflicts", Count, Processor, BY_DEPLOYMENT;
    // Open circuit breakers of thin-hint lookups (a gauge per batch, by provider).
    LOOKUP_CIRCUITS_OPEN = "LookupCircuitsOpen", Count, Processor, BY_PROVIDER;
    // business (processor): provider event timestamp → effect committed
    EFFECT_LAG = "EffectLag", Milliseconds, Processor, BY_DEPLOYMENT;
    // 1 when a payment event's effect landed within the SLI threshold, else 0.
    PAYMENT_WITHIN_SLO = "PaymentWithinSlo", None, Processor, BY_DEPLOYMENT;
    // backlog (sweeper)
    PENDING_ITEMS = "PendingItems", Count, Sweeper, BY_DEPLOYMENT;
    OLDEST_PENDING_AGE = "OldestPendingAge", Seconds, Sweeper, BY_DEPLOYMENT;
    STUCK_ITEMS = "StuckItems", Count, Sweeper, BY_DEPLOYMENT;
    SWEEP_REENQUEUED = "SweepReenqueued", Count, Sweeper, BY_DEPLOYMENT;
    LEASES_RELEASED = "LeasesReleased", Count, Sweeper, BY_DEPLOYMENT;
    DEAD_LETTERS_MARKED = "DeadLettersMarked", Count, Sweeper, BY_DEPLOYMENT;
    // parked items (sweeper): how many, the longest wait, re-sent by the fallback
    WAITING_ITEMS = "WaitingItems", Count, Sweeper, BY_DEPLOYMENT;
    OLDEST_WAITING_AGE = "OldestWaitingAge", Seconds, Sweeper, BY_DEPLOYMENT;
    WAITERS_RECHECKED = "WaitersRechecked", Count, Sweeper, BY_DEPLOYMENT;
    // relay: attempts by outcome, per destination
    DELIVERIES_DELIVERED = "DeliveriesDelivered", Count, Relay, BY_DESTINATION;
    DELIVERIES_FAILED = "DeliveriesFailed", Count, Relay, BY_DESTINATION;
    DELIVERIES_DEAD_LETTERED = "DeliveriesDeadLettered", Count, Relay, BY_DESTINATION;
    DELIVERIES_SUPERSEDED = "DeliveriesSuperseded", Count, Relay, BY_DESTINATION;
    // relay backlog (gauges): pending deliveries and the oldest one's event age, per
    // destination; objects of ordered destinations held by a failing delivery
    DELIVERY_BACKLOG = "DeliveryBacklog", Count, Relay, BY_DESTINATION;
    DELIVERY_BACKLOG_AGE = "DeliveryBacklogAge", Seconds, Relay, BY_DESTINATION;
    DELIVERY_HELD_OBJECTS = "DeliveryHeldObjects", Count, Relay, BY_DEPLOYMENT;
    // dead-lettered deliveries now in the store (gauge), per destination: given up
    // until replayed (`einmal dlq list`, the console's Deliveries page)
    DELIVERY_DEAD_LETTERS = "DeliveryDeadLetters", Count, Relay, BY_DESTINATION;
    // reconciliation
    RECONCILE_INGESTED = "ReconcileIngested", Count, Reconciler, BY_DEPLOYMENT;
    RECONCILE_DIFFERENCES = "ReconcileDifferences", Count, Reconciler, BY_DEPLOYMENT;
    RECONCILE_FAILURES = "ReconcileFailures", Count, Reconciler, BY_DEPLOYMENT;
}

/// The spec of `name`, if einmal emits it.
pub fn find(name: &str) -> Option<&'static MetricSpec> {
    CATALOG.iter().find(|m| m.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_set_starts_with_the_deployment() {
        let mut names: Vec<_> = CATALOG.iter().map(|m| m.name).collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "duplicate metric name");
        for m in CATALOG {
            assert!(!m.dimension_sets.is_empty(), "{}", m.name);
            for set in m.dimension_sets {
                assert_eq!(set.first(), Some(&DEPLOYMENT), "{}", m.name);
            }
        }
        assert_eq!(find("StuckItems").map(|m| m.unit), Some(Unit::Count));
        assert!(find("NoSuchMetric").is_none());
    }
}
