//! The relay's destination set: each configured destination with a sink that is built
//! when first needed and rebuilt after a failed build, and the set rebuilt when the
//! tenant configuration changes.
//!
//! # A destination never gates intake or processing
//!
//! Building a sink can fail for reasons that heal (a database that is down, DNS, TLS,
//! permissions). [`SinkSlot`] keeps such a destination in the set: every delivery to
//! it is a retryable failure until a build succeeds. Builds are time-bounded
//! ([`SINK_BUILD_TIMEOUT`]), retried with backoff, and shared: while one is under way
//! every delivery awaits the same attempt (no thundering herd), and the slot's lock is
//! never held across it. Only a configuration error (a malformed DSN, an unknown kind,
//! a missing field) stops a start ([`RelayError::is_config`]).
//!
//! # Reload
//!
//! [`DestinationSet::rebuilt`] maps a new configuration onto the current set: an
//! unchanged destination keeps its slot (and its connections), a new or changed one
//! (a rotated signing secret, another URL) gets a fresh slot, built on first use. A
//! destination that disappeared is remembered with the time it went
//! ([`DestinationSet::gone_since`]): its pending deliveries wait out the relay's grace
//! period ([`super::relay::RelaySettings::destination_grace`]) before they are
//! dead-lettered, so a destination renamed in two edits, or a configuration rolled
//! back, loses nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::{BoxFuture, FutureExt, Shared};

use thiserror::Error;

use crate::config::Config;
use crate::destinations::{Delivered, DestinationConfig, Message, Sink, SinkError};

/// Why a destination's sink could not be built, naming it (never a secret).
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("destination {destination} (tenant {tenant}): {reason}")]
pub struct RelayError {
    pub destination: String,
    pub tenant: String,
    pub reason: String,
    pub failure: BuildFailure,
}

/// What kind of build failure: only a configuration error stops a start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildFailure {
    /// The configuration can never work (a malformed DSN, a refused URL, an unknown
    /// kind, a missing field): fixed only by changing it.
    Config,
    /// The destination cannot be reached now (down, DNS, TLS, permissions): its
    /// deliveries are retried while the sink is built again later.
    Unavailable,
}

impl RelayError {
    pub fn config(destination: &DestinationConfig, reason: impl Into<String>) -> Self {
        Self::with(destination, reason, BuildFailure::Config)
    }

    pub fn unavailable(destination: &DestinationConfig, reason: impl Into<String>) -> Self {
        Self::with(destination, reason, BuildFailure::Unavailable)
    }

    fn with(
        destination: &DestinationConfig,
        reason: impl Into<String>,
        failure: BuildFailure,
    ) -> Self {
        RelayError {
            destination: destination.name.clone(),
            tenant: destination.tenant.clone(),
            reason: reason.into(),
            failure,
        }
    }

    pub fn is_config(&self) -> bool {
        self.failure == BuildFailure::Config
    }
}

/// Builds the sink of one destination (`wiring::SinkContext`: the wiring knows which
/// technologies it links), classifying a failure ([`BuildFailure`]). Called at
/// start and again, through a [`SinkSlot`], until a build succeeds; a build may do I/O
/// (a PostgreSQL sink connects and checks its tables).
#[async_trait::async_trait]
pub trait SinkFactory: Send + Sync {
    async fn build(&self, destination: &DestinationConfig) -> Result<Arc<dyn Sink>, RelayError>;
}

/// One build attempt gives up after this long (a start waits at most this long for a
/// destination before it goes on without it).
pub const SINK_BUILD_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest wait between two build attempts of one destination.
pub const SINK_BUILD_BACKOFF_CAP: Duration = Duration::from_secs(30);
/// Removed destinations remembered at most (the oldest are forgotten first).
const GONE_MAX: usize = 1_000;

type Build = Shared<BoxFuture<'static, Result<Arc<dyn Sink>, RelayError>>>;

enum SlotState {
    Ready(Arc<dyn Sink>),
    /// Not built; the next build may start at `retry_at`.
    Waiting {
        retry_at: Instant,
        reason: String,
    },
    Building(Build),
}

/// The sink of one destination, built through the factory when first needed.
pub struct SinkSlot {
    config: DestinationConfig,
    factory: Arc<dyn SinkFactory>,
    backoff: (Duration, Duration),
    state: Mutex<(SlotState, u32)>,
}

impl SinkSlot {
    /// Not built yet: the first delivery builds it.
    pub fn lazy(
        config: DestinationConfig,
        factory: Arc<dyn SinkFactory>,
        backoff: (Duration, Duration),
    ) -> Self {
        let state = SlotState::Waiting {
            retry_at: Instant::now(),
            reason: String::new(),
        };
        SinkSlot {
            config,
            factory,
            backoff,
            state: Mutex::new((state, 0)),
        }
    }

    /// Build now (bounded by [`SINK_BUILD_TIMEOUT`]). A configuration error is returned
    /// (the start stops); any other failure is logged and leaves the slot to retry.
    pub async fn start(
        config: DestinationConfig,
        factory: Arc<dyn SinkFactory>,
        backoff: (Duration, Duration),
    ) -> Result<Self, RelayError> {
        let slot = Self::lazy(config, factory, backoff);
        match slot.sink().await {
            Ok(_) => Ok(slot),
            Err(SlotError::Config(e)) => Err(e),
            Err(SlotError::Unavailable(_)) => Ok(slot),
        }
    }

    pub fn config(&self) -> &DestinationConfig {
        &self.config
    }

    /// Whether a build has succeeded.
    pub fn is_ready(&self) -> bool {
        matches!(self.lock().0, SlotState::Ready(_))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (SlotState, u32)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn spawn_build(&self) -> Build {
        let (factory, config) = (self.factory.clone(), self.config.clone());
        async move {
            match tokio::time::timeout(SINK_BUILD_TIMEOUT, factory.build(&config)).await {
                Ok(built) => built,
                Err(_) => Err(RelayError::unavailable(
                    &config,
                    format!("not ready within {}s", SINK_BUILD_TIMEOUT.as_secs()),
                )),
            }
        }
        .boxed()
        .shared()
    }

    async fn sink(&self) -> Result<Arc<dyn Sink>, SlotError> {
        let build = {
            let mut guard = self.lock();
            match &guard.0 {
                SlotState::Ready(sink) => return Ok(sink.clone()),
                SlotState::Building(build) => build.clone(),
                SlotState::Waiting { retry_at, reason } if Instant::now() < *retry_at => {
                    return Err(SlotError::Unavailable(reason.clone()));
                }
                SlotState::Waiting { .. } => {
                    let build = self.spawn_build();
                    guard.0 = SlotState::Building(build.clone());
                    build
                }
            }
        };
        // Every caller awaits the same attempt; the lock is not held meanwhile.
        let result = build.clone().await;
        let mut guard = self.lock();
        let first = matches!(&guard.0, SlotState::Building(b) if b.ptr_eq(&build));
        match result {
            Ok(sink) => {
                if first {
                    guard.0 = SlotState::Ready(sink.clone());
                    guard.1 = 0;
                    tracing::info!(destination = %self.config.name, tenant = %self.config.tenant,
                        "destination ready");
                }
                Ok(sink)
            }
            Err(error) => {
                let reason = error.to_string();
                if first {
                    let failures = guard.1.saturating_add(1);
                    let (base, cap) = self.backoff;
                    let wait = base
                        .checked_mul(1u32 << failures.saturating_sub(1).min(20))
                        .unwrap_or(cap)
                        .min(cap);
                    guard.0 = SlotState::Waiting {
                        retry_at: Instant::now() + wait,
                        reason: reason.clone(),
                    };
                    guard.1 = failures;
                    // The error names the destination, never a secret (RelayError).
                    if error.is_config() {
                        tracing::error!(destination = %self.config.name, tenant = %self.config.tenant,
                            reason = %reason, "destination misconfigured; its deliveries wait for a fixed configuration");
                    } else {
                        tracing::warn!(destination = %self.config.name, tenant = %self.config.tenant,
                            reason = %reason, failures, retry_in_ms = wait.as_millis() as u64,
                            "destination not available; its deliveries are retried");
                    }
                }
                Err(if error.is_config() {
                    SlotError::Config(error)
                } else {
                    SlotError::Unavailable(reason)
                })
            }
        }
    }
}

enum SlotError {
    Config(RelayError),
    Unavailable(String),
}

#[async_trait]
impl Sink for SinkSlot {
    async fn deliver(&self, message: &Message) -> Result<Delivered, SinkError> {
        let sink = match self.sink().await {
            Ok(sink) => sink,
            // Retryable either way: a configuration fixed by a reload gets a new slot,
            // and nothing is dead-lettered for a destination that was never tried.
            Err(SlotError::Config(e)) => {
                return Err(SinkError::Retry {
                    status: None,
                    retry_after: None,
                    detail: format!("sink not built: {}", e.reason),
                })
            }
            Err(SlotError::Unavailable(reason)) => {
                return Err(SinkError::Retry {
                    status: None,
                    retry_after: None,
                    detail: format!("sink not built: {reason}"),
                })
            }
        };
        sink.deliver(message).await
    }
}

/// One configured destination with its sink.
#[derive(Clone)]
pub struct RelayDestination {
    pub config: DestinationConfig,
    pub sink: Arc<dyn Sink>,
}

/// The destinations of one configuration, and those that left it.
#[derive(Clone, Default)]
pub struct DestinationSet {
    /// The configuration the set was built from (compared by pointer on refresh).
    pub(crate) source: Option<Arc<Config>>,
    pub(crate) live: Vec<RelayDestination>,
    /// (tenant, name) → when this process first saw it missing (Unix ms).
    gone: BTreeMap<(String, String), i64>,
}

impl DestinationSet {
    pub fn new(live: Vec<RelayDestination>, source: Option<Arc<Config>>) -> Self {
        DestinationSet {
            source,
            live,
            gone: BTreeMap::new(),
        }
    }

    pub fn live(&self) -> &[RelayDestination] {
        &self.live
    }

    pub fn get(&self, tenant: &str, name: &str) -> Option<&RelayDestination> {
        self.live
            .iter()
            .find(|d| d.config.tenant == tenant && d.config.name == name)
    }

    /// When the destination `tenant`/`name` was noticed gone, if it is.
    pub fn gone_since(&self, tenant: &str, name: &str) -> Option<i64> {
        self.gone
            .get(&(tenant.to_string(), name.to_string()))
            .copied()
    }

    /// Remember `tenant`/`name` as gone from `now_ms` unless already known (a delivery
    /// to a destination this process never had: its grace starts when first seen).
    pub(crate) fn note_gone(&mut self, tenant: &str, name: &str, now_ms: i64) -> i64 {
        let since = *self
            .gone
            .entry((tenant.to_string(), name.to_string()))
            .or_insert(now_ms);
        self.prune();
        since
    }

    fn prune(&mut self) {
        while self.gone.len() > GONE_MAX {
            let oldest = self
                .gone
                .iter()
                .min_by_key(|(_, since)| **since)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(key) => self.gone.remove(&key),
                None => break,
            };
        }
    }

    /// The set for `config`: unchanged destinations keep their sinks, new and changed
    /// ones get a slot built on first use, removed ones are remembered as gone from
    /// `now_ms`. No I/O.
    pub fn rebuilt(
        &self,
        config: Arc<Config>,
        factory: &Arc<dyn SinkFactory>,
        backoff: (Duration, Duration),
        now_ms: i64,
    ) -> (DestinationSet, Changes) {
        let mut changes = Changes::default();
        let mut live = Vec::with_capacity(config.destinations().len());
        for d in config.destinations() {
            match self.get(&d.tenant, &d.name) {
                Some(old) if old.config == *d => live.push(old.clone()),
                old => {
                    let slot = SinkSlot::lazy(d.clone(), factory.clone(), backoff);
                    live.push(RelayDestination {
                        config: d.clone(),
                        sink: Arc::new(slot),
                    });
                    match old {
                        Some(_) => changes.changed.push(d.name.clone()),
                        None => changes.added.push(d.name.clone()),
                    }
                }
            }
        }
        let mut gone = self.gone.clone();
        for d in &self.live {
            let key = (d.config.tenant.clone(), d.config.name.clone());
            if !live
                .iter()
                .any(|n| n.config.tenant == key.0 && n.config.name == key.1)
            {
                changes.removed.push(d.config.name.clone());
                gone.entry(key).or_insert(now_ms);
            }
        }
        gone.retain(|(tenant, name), _| {
            !live
                .iter()
                .any(|n| &n.config.tenant == tenant && &n.config.name == name)
        });
        let mut set = DestinationSet {
            source: Some(config),
            live,
            gone,
        };
        set.prune();
        (set, changes)
    }
}

/// What a rebuild changed (names), for the log line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::destinations::http::{HttpDestination, DEFAULT_HTTP_TIMEOUT};
    use crate::destinations::{BodyFormat, DestinationKind};

    fn dest(name: &str) -> DestinationConfig {
        DestinationConfig {
            name: name.into(),
            tenant: "t1".into(),
            provider: None,
            events: vec!["*".into()],
            outputs: Vec::new(),
            ordered: false,
            max_attempts: 10,
            max_age: Duration::from_secs(3600),
            kind: DestinationKind::Http(HttpDestination {
                url: "http://127.0.0.1:9/hook".into(),
                secrets: Vec::new(),
                body: BodyFormat::Original,
                timeout: DEFAULT_HTTP_TIMEOUT,
                allow_private: false,
            }),
        }
    }

    struct Ok200;
    #[async_trait]
    impl Sink for Ok200 {
        async fn deliver(&self, _: &Message) -> Result<Delivered, SinkError> {
            Ok(Delivered::default())
        }
    }

    /// Fails its first `fail` builds (unavailable), slowly, counting the builds.
    struct Flaky {
        builds: AtomicUsize,
        fail: usize,
    }
    #[async_trait]
    impl SinkFactory for Flaky {
        async fn build(&self, d: &DestinationConfig) -> Result<Arc<dyn Sink>, RelayError> {
            let n = self.builds.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            if n < self.fail {
                return Err(RelayError::unavailable(d, "connection refused"));
            }
            Ok(Arc::new(Ok200))
        }
    }

    fn message() -> Message {
        Message {
            key: "msg_1".into(),
            destination: "a".into(),
            provider: "stripe".into(),
            tenant: "t1".into(),
            event_id: "evt_1".into(),
            event_type: "x".into(),
            object_id: None,
            object_version: None,
            occurred_at: None,
            body: b"{}".to_vec(),
            content_type: "application/json".into(),
        }
    }

    #[tokio::test]
    async fn an_unavailable_sink_is_a_retry_built_once_by_concurrent_deliveries() {
        let factory = Arc::new(Flaky {
            builds: AtomicUsize::new(0),
            fail: 1,
        });
        let backoff = (Duration::from_millis(100), Duration::from_millis(100));
        let slot = SinkSlot::start(dest("a"), factory.clone(), backoff)
            .await
            .expect("an unavailable destination does not stop the start");
        assert!(!slot.is_ready());
        // Within the backoff: a retry, without another build.
        assert!(matches!(
            slot.deliver(&message()).await,
            Err(SinkError::Retry { detail, .. }) if detail.contains("connection refused")
        ));
        assert_eq!(factory.builds.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(120)).await;
        // Eight deliveries at once share one build.
        let m = message();
        let results = futures::future::join_all((0..8).map(|_| slot.deliver(&m))).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(factory.builds.load(Ordering::SeqCst), 2);
        assert!(slot.is_ready());
    }

    #[tokio::test]
    async fn a_configuration_error_stops_the_start() {
        struct Bad;
        #[async_trait]
        impl SinkFactory for Bad {
            async fn build(&self, d: &DestinationConfig) -> Result<Arc<dyn Sink>, RelayError> {
                Err(RelayError::config(d, "invalid connection string"))
            }
        }
        let err = SinkSlot::start(dest("a"), Arc::new(Bad), (Duration::ZERO, Duration::ZERO))
            .await
            .err()
            .expect("refused");
        assert!(err.is_config() && err.to_string().contains("destination a"));
    }

    const TENANT: &str =
        "[[tenant]]\nprovider = \"stripe\"\ntenant = \"t1\"\nsecrets = [\"whsec_test\"]\n\n";
    const SIGNED: &str = "secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n";

    #[test]
    fn a_rebuild_keeps_unchanged_sinks_and_remembers_removed_destinations() {
        let factory: Arc<dyn SinkFactory> = Arc::new(Flaky {
            builds: AtomicUsize::new(0),
            fail: 0,
        });
        let toml = |extra: &str| {
            format!(
                "{TENANT}[[destination]]\nname = \"a\"\ntenant = \"t1\"\nkind = \"http\"\n\
                 events = [\"*\"]\nurl = \"http://127.0.0.1:9/a\"\n{SIGNED}{extra}"
            )
        };
        let backoff = (Duration::ZERO, Duration::ZERO);
        let one = Arc::new(Config::from_toml(&toml("")).unwrap());
        let (set, changes) = DestinationSet::default().rebuilt(one, &factory, backoff, 1);
        assert_eq!(changes.added, vec!["a".to_string()]);
        let two = Arc::new(
            Config::from_toml(&toml(&format!(
                "\n[[destination]]\nname = \"b\"\ntenant = \"t1\"\nkind = \"http\"\n\
                 events = [\"*\"]\nurl = \"http://127.0.0.1:9/b\"\n{SIGNED}"
            )))
            .unwrap(),
        );
        let (next, changes) = set.rebuilt(two.clone(), &factory, backoff, 2);
        assert_eq!(changes.added, vec!["b".to_string()]);
        assert!(changes.changed.is_empty() && changes.removed.is_empty());
        assert!(Arc::ptr_eq(
            &set.get("t1", "a").unwrap().sink,
            &next.get("t1", "a").unwrap().sink
        ));
        // Removing `a`: gone from then; adding it back forgets that.
        let only_b = Arc::new(
            Config::from_toml(&format!(
                "{TENANT}[[destination]]\nname = \"b\"\ntenant = \"t1\"\nkind = \"http\"\n\
                 events = [\"*\"]\nurl = \"http://127.0.0.1:9/b\"\n{SIGNED}"
            ))
            .unwrap(),
        );
        let (without, changes) = next.rebuilt(only_b, &factory, backoff, 3);
        assert_eq!(changes.removed, vec!["a".to_string()]);
        assert_eq!(without.gone_since("t1", "a"), Some(3));
        assert!(without.get("t1", "a").is_none());
        let (back, _) = without.rebuilt(two, &factory, backoff, 4);
        assert_eq!(back.gone_since("t1", "a"), None);
    }
}
