//! The registry of destination kinds and the one context that builds their sinks.
//!
//! Each kind lives in its own home: HTTP in `destinations::http`, SQS, EventBridge and
//! Lambda in `adapters::aws::sinks`, PostgreSQL in `adapters::postgres` (options'
//! check and sink; the options' type of the adapters' kinds is a variant of
//! [`DestinationKind`] on the ground floor, so the configuration holds it without
//! reaching up into an adapter). [`KINDS`] names them for the parser, with one line
//! each; [`SinkContext::build_sink`] is the one `match` that turns a destination into
//! its sink, in `einmal serve` and in the Lambdas alike.

use std::sync::Arc;

use async_trait::async_trait;

use crate::adapters::aws::sinks::{self as aws, AwsSinks};
#[cfg(feature = "postgres")]
use crate::adapters::postgres::{self, PostgresSink};
use crate::destinations::fields::Fields;
use crate::destinations::http::{self, HttpSink};
use crate::destinations::{DestinationConfig, DestinationKind, Sink};
use crate::https::HttpsClient;
use crate::pipeline::relay::{RelayError, SinkFactory};
use crate::secret::SecretLookup;

/// One destination kind: its name in `kind = "…"`, the options it reads, and its
/// parser (which reads exactly those options from the table).
pub struct Kind {
    pub name: &'static str,
    pub fields: &'static [&'static str],
    pub(crate) parse: fn(&mut Fields, SecretLookup<'_>) -> Option<DestinationKind>,
}

/// Every destination kind, one line each (a kind behind a feature only when it is built). A new kind is its home (options, their
/// check, its sink), its variant of [`DestinationKind`], a line here, and its arm in
/// [`SinkContext::build_sink`] (which the compiler asks for).
pub const KINDS: &[Kind] = &[
    Kind {
        name: "http",
        fields: http::config::FIELDS,
        parse: |f, secrets| http::config::parse(f, secrets).map(DestinationKind::Http),
    },
    Kind {
        name: "sqs",
        fields: aws::SQS_FIELDS,
        parse: |f, _| aws::parse_sqs(f).map(DestinationKind::Sqs),
    },
    #[cfg(feature = "eventbridge")]
    Kind {
        name: "eventbridge",
        fields: aws::EVENTBRIDGE_FIELDS,
        parse: |f, _| aws::parse_eventbridge(f).map(DestinationKind::EventBridge),
    },
    #[cfg(feature = "lambda")]
    Kind {
        name: "lambda",
        fields: aws::LAMBDA_FIELDS,
        parse: |f, _| aws::parse_lambda(f).map(DestinationKind::Lambda),
    },
    #[cfg(feature = "postgres")]
    Kind {
        name: "postgres",
        fields: postgres::parse::FIELDS,
        parse: |f, secrets| postgres::parse::parse(f, secrets).map(DestinationKind::Postgres),
    },
];

/// The kind named `name`.
pub fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}

/// Wraps the sink of a destination (`einmal listen` prints every attempt of its own).
pub type SinkWrap = Arc<dyn Fn(&DestinationConfig, Arc<dyn Sink>) -> Arc<dyn Sink> + Send + Sync>;

/// What every sink is built from: the process's one outbound HTTPS client and, for
/// the AWS kinds, one SDK configuration (one client per service, shared by every
/// destination of that kind). PostgreSQL sinks connect with their own pool.
pub struct SinkContext {
    https: HttpsClient,
    aws: AwsSinks,
    wrap: Option<SinkWrap>,
}

impl SinkContext {
    /// The sinks on `https` and, for the AWS kinds, `aws`: the SDK configuration a
    /// Lambda already holds ([`AwsSinks::given`]), or `einmal serve`'s, loaded when its
    /// first AWS destination is built ([`AwsSinks::loaded_on_first_use`]).
    pub fn with_aws(https: HttpsClient, aws: AwsSinks) -> Self {
        SinkContext {
            https,
            aws,
            wrap: None,
        }
    }

    /// Every sink built is passed through `wrap`.
    pub fn wrapped(mut self, wrap: Option<SinkWrap>) -> Self {
        self.wrap = wrap;
        self
    }

    /// The process's outbound client.
    pub fn https(&self) -> &HttpsClient {
        &self.https
    }

    /// The sink of `destination`, its failure classified: a bad URL, DSN or table
    /// name is a configuration error; a PostgreSQL server that cannot be reached is
    /// unavailable (retried, never a failed start).
    pub async fn build_sink(
        &self,
        destination: &DestinationConfig,
    ) -> Result<Arc<dyn Sink>, RelayError> {
        let sink: Arc<dyn Sink> = match &destination.kind {
            DestinationKind::Http(options) => Arc::new(
                HttpSink::new(options, &self.https)
                    .map_err(|e| RelayError::config(destination, e.to_string()))?,
            ),
            DestinationKind::Sqs(_)
            | DestinationKind::EventBridge(_)
            | DestinationKind::Lambda(_) => {
                self.aws.factory().await.build(destination).map_err(|e| {
                    RelayError::config(
                        destination,
                        format!("{} sink: {e}", destination.kind.name()),
                    )
                })?
            }
            #[cfg(feature = "postgres")]
            DestinationKind::Postgres(_) => Arc::new(
                PostgresSink::for_destination(destination)
                    .await
                    .map_err(|e| match e.is_config() {
                        true => RelayError::config(destination, e.to_string()),
                        false => RelayError::unavailable(destination, e.to_string()),
                    })?,
            ),
            // A binary built without the kind never parses one (its line above is absent).
            #[cfg(not(feature = "postgres"))]
            DestinationKind::Postgres(_) => {
                return Err(RelayError::config(
                    destination,
                    "kind postgres is not built into this binary (feature `postgres`)",
                ))
            }
        };
        Ok(match &self.wrap {
            Some(wrap) => wrap(destination, sink),
            None => sink,
        })
    }
}

#[async_trait]
impl SinkFactory for SinkContext {
    async fn build(&self, destination: &DestinationConfig) -> Result<Arc<dyn Sink>, RelayError> {
        self.build_sink(destination).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::adapters::aws::function_relay;
    use crate::config_source::ConfigSource;
    use crate::pipeline::relay::RelaySettings;
    use crate::ports::InboxRelay;

    #[tokio::test]
    async fn an_unreachable_postgres_is_unavailable_not_a_failed_start() {
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .build();
        let sinks = SinkContext::with_aws(HttpsClient::new(), AwsSinks::given(&sdk));
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
