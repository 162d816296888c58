//! The relay of the AWS functions: the processor delivers right after its commit, the
//! sweeper retries what failed (`Relay::run_due`) and gauges the backlog. Both build it
//! the same way, once at start, from the tenant configuration they already load.

use std::sync::Arc;

use aws_config::SdkConfig;

use super::sinks::AwsSinkFactory;
use crate::config::Config;
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
            RelayError::new(
                destination,
                format!("{} sink: {e}", destination.kind.name()),
            )
        })
    }
}

/// The relay of `config`'s destinations on `store`, or `None` when none is configured
/// (nothing to deliver), with `settings` (`RelaySettings::from_env`, as `einmal serve`
/// reads them). A destination that cannot be built stops the start, named.
pub async fn function_relay(
    store: Arc<dyn InboxRelay>,
    config: &Config,
    sinks: &dyn SinkFactory,
    settings: RelaySettings,
) -> Result<Option<Arc<Relay>>, RelayError> {
    if config.destinations().is_empty() {
        return Ok(None);
    }
    let relay = Relay::build(store, config.destinations(), sinks).await?;
    Ok(Some(Arc::new(relay.with_settings(settings))))
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
    async fn postgres_is_refused_by_name_and_http_builds() {
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
        let config = Config::from_toml(toml).expect("config");
        let relay = function_relay(Arc::new(NoStore), &config, &sinks, RelaySettings::default())
            .await
            .expect("relay");
        assert_eq!(
            relay.map(|r| r.destination_names()),
            Some(vec!["app".to_string()])
        );
        let mut pg = config.destinations()[0].clone();
        pg.name = "warehouse".into();
        pg.kind = crate::destinations::DestinationKind::Postgres(
            crate::destinations::config::PostgresDestination {
                // Nothing listens on port 9: the start fails, naming the destination.
                dsn: crate::config::Secret::new(
                    "host=127.0.0.1 port=9 user=u password=pw1 dbname=x",
                ),
                table: "events".into(),
                tls: false,
                pool_size: 1,
            },
        );
        let err = sinks.build(&pg).await.err().expect("refused");
        assert_eq!(err.destination, "warehouse");
        assert!(err.reason.contains("cannot connect to PostgreSQL"), "{err}");
        assert!(!err.reason.contains("pw1"), "{err}");
        let empty = Config::from_toml(
            "[[tenant]]\nprovider = \"stripe\"\ntenant = \"t1\"\nsecrets = [\"whsec_test\"]\n",
        )
        .expect("config");
        assert!(
            function_relay(Arc::new(NoStore), &empty, &sinks, RelaySettings::default())
                .await
                .expect("no relay")
                .is_none()
        );
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
