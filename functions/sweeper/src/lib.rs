//! The sweeper Lambda's handler: one pass per scheduled invocation (any JSON payload):
//! the sweep, then the relay's due retries and its backlog gauges (when destinations
//! are configured); the figures printed as EMF lines.

use std::sync::Arc;

use einmal::adapters::aws::sinks::AwsSinks;
use einmal::adapters::aws::{
    config_source_from_env, function_relay, relay_pass, AwsSetupError, AwsStore,
};
use einmal::https::HttpsClient;
use einmal::pipeline::relay::{Relay, RelaySettings};
use einmal::pipeline::sweep::{SweepSettings, Sweeper};
use einmal::wiring::SinkContext;
use serde_json::{json, Value};

/// The error the Lambda runtime reports.
pub use lambda_runtime::Error;

/// The sweeper function as its Lambda builds it once per execution environment.
/// `einmal serve --backend aws` builds the same and calls [`Sweep::handle`] on its
/// schedule.
pub struct Sweep {
    sweeper: Sweeper,
    relay: Option<Arc<Relay>>,
    batch: usize,
    deployment: String,
    emf: bool,
}

impl Sweep {
    /// The sweeper on `store`, its settings (`SweepSettings::from_env`) and the
    /// destinations (the same configuration as the processor's) from the environment.
    pub async fn new(
        sdk_config: &aws_config::SdkConfig,
        store: Arc<AwsStore>,
    ) -> Result<Self, Error> {
        let settings = SweepSettings::from_env()?;
        let batch = settings.batch;
        let sweeper = Sweeper::from_store(store.clone()).with_settings(settings);
        let relay =
            match config_source_from_env(sdk_config, einmal::config::ConfigScope::Whole).await {
                // It follows the configuration's reloads; a destination that cannot be
                // reached at start is retried per delivery, never a failed init.
                Ok(source) => {
                    einmal::telemetry::redact::register_config(&source.snapshot());
                    let sinks = Arc::new(SinkContext::with_aws(
                        HttpsClient::new(),
                        AwsSinks::given(sdk_config),
                    ));
                    Some(function_relay(store, source, sinks, RelaySettings::from_env()?).await?)
                }
                Err(AwsSetupError::NoConfigSource) => None,
                Err(e) => return Err(e.into()),
            };
        Ok(Sweep {
            sweeper,
            relay,
            batch,
            deployment: einmal::telemetry::emf::deployment_from_env(),
            emf: true,
        })
    }

    /// Whether the figures are printed as EMF lines on stdout (on by default).
    pub fn with_emf(mut self, emf: bool) -> Self {
        self.emf = emf;
        self
    }

    /// One scheduled pass: the sweep report and the relay pass, as the invocation's result.
    pub async fn handle(&self) -> Value {
        let now = einmal::time::now_millis();
        let report = self.sweeper.sweep_once(now).await;
        if self.emf {
            // The backlog gauges, one EMF line per run.
            einmal::telemetry::emf::print(&report.figures().emf(&self.deployment, now).render());
        }
        let relayed = match &self.relay {
            Some(relay) => {
                let pass = relay_pass(relay, now, self.batch, &self.deployment).await;
                if self.emf {
                    einmal::telemetry::emf::print(&pass.emf);
                }
                Some(pass)
            }
            None => None,
        };
        json!({ "sweep": report, "relay": relayed })
    }
}
