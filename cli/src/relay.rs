//! The relay of `einmal serve`: the sinks of the configured destinations (the one
//! `wiring::SinkContext`), and the retry loop beside the processor.

use std::sync::Arc;
use std::time::Duration;

use einmal::adapters::aws::sinks::AwsSinks;
use einmal::config_source::ConfigSource;
use einmal::https::HttpsClient;
use einmal::pipeline::relay::{Relay, RelaySettings, RelayTally, DEFAULT_RUN_LIMIT};
use einmal::ports::InboxRelay;
use einmal::wiring::SinkContext;

/// How often the loop looks for due deliveries.
pub const RELAY_INTERVAL: Duration = Duration::from_secs(1);
/// How often the backlog is logged (when there is one, or it just cleared).
const BACKLOG_INTERVAL: Duration = Duration::from_secs(60);

pub use einmal::wiring::kinds::SinkWrap;

/// The relay of `source`'s destinations, following its reloads (built with none too:
/// a reload may add one). Only a destination's configuration error stops the start,
/// named in the message; one that cannot be reached (a database that is down) is
/// logged and its deliveries retried until it can.
pub async fn build(
    store: Arc<dyn InboxRelay>,
    source: ConfigSource,
    https: HttpsClient,
    wrap: Option<SinkWrap>,
) -> Result<Arc<Relay>, String> {
    let settings = RelaySettings::from_env()?;
    let relay = Relay::reloading(
        store,
        source,
        Arc::new(SinkContext::with_aws(https, aws_sinks()).wrapped(wrap)),
        settings,
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(Arc::new(relay))
}

/// Retry what is due every [`RELAY_INTERVAL`] until `stop` resolves; log the backlog
/// every minute while there is one.
pub async fn run_loop(relay: Arc<Relay>, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    let mut last_backlog = tokio::time::Instant::now();
    let mut had_backlog = false;
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(RELAY_INTERVAL) => {}
        }
        let now = einmal::time::now_millis();
        if let Err(e) = relay.run_due(now, DEFAULT_RUN_LIMIT).await {
            tracing::warn!(error = %e, "relay: cannot read due deliveries");
        }
        if last_backlog.elapsed() >= BACKLOG_INTERVAL {
            last_backlog = tokio::time::Instant::now();
            match relay.backlog(now).await {
                Ok(backlog) => {
                    let pending: u64 = backlog.per_destination.values().map(|(n, _)| n).sum();
                    if pending > 0 || had_backlog {
                        for (destination, (count, age_ms)) in &backlog.per_destination {
                            tracing::info!(destination = %destination, pending = count,
                                oldest_age_s = age_ms / 1000, "delivery backlog");
                        }
                        tracing::info!(
                            pending,
                            held_objects = backlog.held_objects,
                            "delivery backlog"
                        );
                    }
                    had_backlog = pending > 0;
                }
                Err(e) => tracing::warn!(error = %e, "relay: cannot read the backlog"),
            }
        }
    }
}

/// The relay's counters as one log line's fields (with the minute's other figures).
pub fn tally_fields(tally: &RelayTally) -> (u64, u64, u64, u64) {
    let sum = |m: &std::collections::BTreeMap<String, u64>| m.values().sum::<u64>();
    (
        sum(&tally.delivered),
        sum(&tally.failed),
        sum(&tally.dead_lettered),
        sum(&tally.superseded),
    )
}

/// The AWS kinds' sinks of `serve`: the SDK's own resolution of region, credentials and
/// `AWS_ENDPOINT_URL`, loaded when the first AWS destination is built (a store without
/// one never reads the AWS environment).
fn aws_sinks() -> AwsSinks {
    AwsSinks::loaded_on_first_use(Box::new(|| {
        Box::pin(aws_config::load_defaults(
            aws_config::BehaviorVersion::latest(),
        ))
    }))
}
