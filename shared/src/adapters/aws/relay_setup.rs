//! The relay of the AWS functions: the processor delivers right after its commit, the
//! sweeper retries what failed (`Relay::run_due`) and gauges the backlog. Both build it
//! the same way, at start, from the tenant configuration they already load, and follow
//! its reloads (the 60 s refresh): a destination added, changed or removed there is
//! added, rebuilt or retired without a cold start. A destination that cannot be
//! reached at start never fails the start (`pipeline::sink_set`).

use std::sync::Arc;

use crate::config_source::ConfigSource;
use crate::pipeline::relay::{Relay, RelayError, RelaySettings, SinkFactory};
use crate::ports::InboxRelay;

/// The relay of `source`'s destinations on `store`, following its reloads, with
/// `settings` (`RelaySettings::from_env`, as `einmal serve` reads them). Built even
/// with no destination (a reload may add one, and pending deliveries to a removed
/// one still need their grace and dead letter). Only a configuration error of a
/// destination stops the start, named; one that cannot be reached is retried.
pub async fn function_relay(
    store: Arc<dyn InboxRelay>,
    source: ConfigSource,
    sinks: Arc<dyn SinkFactory>,
    settings: RelaySettings,
) -> Result<Arc<Relay>, RelayError> {
    Ok(Arc::new(
        Relay::reloading(store, source, sinks, settings).await?,
    ))
}

/// What one scheduled relay pass did: the retries, the backlog it saw (per
/// destination: pending deliveries, oldest pending event's age in ms), and the EMF
/// lines to print (the backlog gauges of every destination, zeros too, and the
/// delivery counters).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RelayPass {
    pub items: usize,
    pub attempts: usize,
    pub backlog: std::collections::BTreeMap<String, (u64, i64)>,
    pub held_objects: u64,
    /// Store calls that failed (the next pass tries again).
    pub errors: usize,
    #[serde(skip)]
    pub emf: Vec<String>,
}

/// The sweeper's relay pass at `now_ms`: `run_due` (at most `limit` items), then the
/// backlog gauges. A store failure is counted and logged, never fatal: the next
/// scheduled pass tries again.
pub async fn relay_pass(relay: &Relay, now_ms: i64, limit: usize, deployment: &str) -> RelayPass {
    let mut pass = RelayPass::default();
    match relay.run_due(now_ms, limit).await {
        Ok(report) => {
            pass.items = report.items;
            pass.attempts = report.attempts;
        }
        Err(e) => {
            tracing::warn!(error = %e, "relay: cannot run the due deliveries");
            pass.errors += 1;
        }
    }
    let counters = relay.drain_tally().emf(deployment, now_ms);
    match relay.backlog(now_ms).await {
        Ok(backlog) => {
            let gauges = backlog.emf(&relay.destination_names(), deployment, now_ms);
            pass.emf.extend(gauges.render());
            pass.backlog = backlog.per_destination;
            pass.held_objects = backlog.held_objects;
        }
        Err(e) => {
            tracing::warn!(error = %e, "relay: cannot read the backlog");
            pass.errors += 1;
        }
    }
    if !counters.is_empty() {
        pass.emf.extend(counters.render());
    }
    tracing::info!(
        items = pass.items,
        attempts = pass.attempts,
        held_objects = pass.held_objects,
        errors = pass.errors,
        "relay pass"
    );
    pass
}
