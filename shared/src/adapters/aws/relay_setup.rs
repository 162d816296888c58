//! The relay of the AWS functions: the processor delivers right after its commit, the
//! sweeper retries what failed (`Relay::run_due`) and gauges the backlog. Both build it
//! the same way, at start, from the tenant configuration they already load, and follow
//! its reloads (the 60 s refresh): a destination added, changed or removed there is
//! added, rebuilt or retired without a cold start. A destination that cannot be
//! reached at start never fails the start (`pipeline::sink_set`).

use std::sync::Arc;

use aws_config::SdkConfig;

use super::sinks::AwsSinkFactory;
use crate::config_source::ConfigSource;
use crate::destinations::{DestinationConfig, Sink};
use crate::https::HttpsClient;
use crate::pipeline::relay::{build_common_sink, Relay, RelayError, RelaySettings, SinkFactory};
use crate::ports::InboxRelay;

/// The sinks the functions link: HTTP (Standard Webhooks, on the process's outbound
/// client), PostgreSQL (its own pool per destination) and the AWS kinds (SQS,
/// EventBridge, Lambda, on the process's SDK config).
pub struct FunctionSinks {
    https: HttpsClient,
    aws: AwsSinkFactory,
}

impl FunctionSinks {
    pub fn new(sdk: &SdkConfig, https: HttpsClient) -> Self {
        FunctionSinks {
            https,
            aws: AwsSinkFactory::new(sdk),
        }
    }
}

#[async_trait::async_trait]
impl SinkFactory for FunctionSinks {
    async fn build(&self, destination: &DestinationConfig) -> Result<Arc<dyn Sink>, RelayError> {
        if let Some(common) = build_common_sink(destination, &self.https).await {
            return common;
        }
        self.aws.build(destination).map_err(|e| {
            RelayError::config(
                destination,
                format!("{} sink: {e}", destination.kind.name()),
            )
        })
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unreachable_postgres_is_unavailable_not_a_failed_start() {
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .build();
        let sinks = FunctionSinks::new(&sdk, HttpsClient::new());
        let toml = r#"
[[tenant]]
provider = "stripe"
tenant = "t1"
secrets = ["whsec_test"]

[[destination]]
name = "app"
tenant = "t1"
kind = "http"
events = ["*"]
url = "http://127.0.0.1:9/hook"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
"#;
        let config = crate::config::Config::from_toml(toml).expect("config");
        let source = |config: &crate::config::Config| ConfigSource::fixed(Arc::new(config.clone()));
        let sinks: Arc<dyn SinkFactory> = Arc::new(sinks);
        let relay = function_relay(
            Arc::new(NoStore),
            source(&config),
            sinks.clone(),
            RelaySettings::default(),
        )
        .await
        .expect("relay");
        assert_eq!(relay.destination_names(), vec!["app".to_string()]);
        let mut pg = config.destinations()[0].clone();
        pg.name = "warehouse".into();
        pg.kind = crate::destinations::DestinationKind::Postgres(
            crate::destinations::config::PostgresDestination {
                // Nothing listens on port 9: unavailable (retried), named, no password.
                dsn: crate::config::Secret::new(
                    "host=127.0.0.1 port=9 user=u password=pw1 dbname=x",
                ),
                table: "events".into(),
                tls: false,
                pool_size: 1,
            },
        );
        let err = sinks.build(&pg).await.err().expect("not connected");
        assert_eq!(err.destination, "warehouse");
        assert!(!err.is_config(), "{err}");
        assert!(err.reason.contains("cannot connect to PostgreSQL"), "{err}");
        assert!(!err.reason.contains("pw1"), "{err}");
        // A malformed DSN is a configuration error.
        let mut bad = pg.clone();
        if let crate::destinations::DestinationKind::Postgres(p) = &mut bad.kind {
            p.dsn = crate::config::Secret::new("host=127.0.0.1 port=abc password=pw1");
        }
        let err = sinks.build(&bad).await.err().expect("malformed");
        assert!(err.is_config() && !err.reason.contains("pw1"), "{err}");
        let empty = crate::config::Config::from_toml(
            "[[tenant]]\nprovider = \"stripe\"\ntenant = \"t1\"\nsecrets = [\"whsec_test\"]\n",
        )
        .expect("config");
        // No destination yet: still a relay, for the reloads that add one.
        let relay = function_relay(
            Arc::new(NoStore),
            source(&empty),
            sinks,
            RelaySettings::default(),
        )
        .await
        .expect("relay");
        assert!(relay.is_empty());
    }

    /// Building a relay touches no store.
    struct NoStore;

    #[async_trait::async_trait]
    impl InboxRelay for NoStore {
        async fn relay_due(
            &self,
            _: i64,
            _: usize,
        ) -> Result<Vec<crate::envelope::InboxKey>, crate::ports::StoreError> {
            unreachable!("not called")
        }
        async fn relay_pending(
            &self,
            _: usize,
        ) -> Result<Vec<crate::ports::InboxItem>, crate::ports::StoreError> {
            unreachable!("not called")
        }
        async fn relay_dead(
            &self,
            _: usize,
        ) -> Result<Vec<crate::ports::InboxItem>, crate::ports::StoreError> {
            unreachable!("not called")
        }
        async fn claim_relay(
            &self,
            _: &crate::envelope::InboxKey,
            _: &str,
            _: i64,
            _: i64,
        ) -> Result<Option<crate::ports::InboxItem>, crate::ports::StoreError> {
            unreachable!("not called")
        }
        async fn finish_relay(
            &self,
            _: &crate::envelope::InboxKey,
            _: &str,
            _: &[crate::ports::DeliveryStatus],
            _: Option<i64>,
            _: i64,
        ) -> Result<bool, crate::ports::StoreError> {
            unreachable!("not called")
        }
        async fn order_acquire(
            &self,
            _: &crate::ports::OrderClaim,
            _: i64,
        ) -> Result<crate::ports::OrderGate, crate::ports::StoreError> {
            unreachable!("not called")
        }
        async fn order_release(
            &self,
            _: &crate::ports::OrderRelease,
            _: i64,
        ) -> Result<Option<crate::envelope::InboxKey>, crate::ports::StoreError> {
            unreachable!("not called")
        }
    }
}
