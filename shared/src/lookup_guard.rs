//! Bounds around the resource lookups of thin hints: at most
//! [`GuardSettings::max_concurrent_per_tenant`] lookups per tenant at once, and a circuit
//! breaker per tenant when the provider API keeps failing.
//!
//! - **Concurrency**: a lookup waits for one of the tenant's permits (4 by default) at
//!   most [`crate::lookup::LOOKUP_TIMEOUT`]; after that it is a transient failure (the
//!   processor retries it with its backoff).
//! - **Breaker**: [`GuardSettings::failure_threshold`] (5) transient failures in a row
//!   open the tenant's circuit for [`GuardSettings::open_ms`] (30 s): lookups fail at
//!   once as transient without calling the API (the processor's retries back off
//!   exponentially meanwhile, full jitter, up to its ceiling). Then one trial lookup
//!   is let through (half-open): success closes the circuit, failure opens it again.
//!   A permanent answer (404, 401) means the API is up and closes it too.
//! - **Metric**: after each lookup the number of open circuits of its provider is
//!   published as `LookupCircuitsOpen` (by provider) with the worker's metrics.
//!
//! Memory: one entry per configured thin tenant (the processor looks up only
//! configured tenants).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Semaphore;

use crate::config::TenantConfig;
use crate::lookup::{LookupError, ResourceLookup, LOOKUP_TIMEOUT};
use crate::telemetry::emf::WorkerMetrics;

/// The bounds of [`GuardedLookup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardSettings {
    pub max_concurrent_per_tenant: usize,
    pub failure_threshold: u32,
    pub open_ms: i64,
    /// How long a lookup waits for a permit.
    pub permit_wait: Duration,
}

impl Default for GuardSettings {
    fn default() -> Self {
        GuardSettings {
            max_concurrent_per_tenant: 4,
            failure_threshold: 5,
            open_ms: 30_000,
            permit_wait: LOOKUP_TIMEOUT,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Breaker {
    Closed {
        failures: u32,
    },
    Open {
        until_ms: i64,
        last_error: String,
    },
    /// One trial lookup is out.
    HalfOpen {
        last_error: String,
    },
}

struct TenantGuard {
    permits: Arc<Semaphore>,
    breaker: Mutex<Breaker>,
}

type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// A [`ResourceLookup`] with per-tenant concurrency and a circuit breaker.
pub struct GuardedLookup {
    inner: Arc<dyn ResourceLookup>,
    settings: GuardSettings,
    tenants: Mutex<HashMap<(String, String), Arc<TenantGuard>>>,
    metrics: Option<Arc<WorkerMetrics>>,
    now_ms: Clock,
}

impl GuardedLookup {
    pub fn new(inner: Arc<dyn ResourceLookup>, settings: GuardSettings) -> Self {
        GuardedLookup {
            inner,
            settings,
            tenants: Mutex::new(HashMap::new()),
            metrics: None,
            now_ms: Arc::new(crate::time::now_millis),
        }
    }

    /// Publish the breaker states with these worker metrics.
    pub fn with_metrics(mut self, metrics: Arc<WorkerMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Pin the clock (tests of the open period).
    pub fn with_clock(mut self, now_ms: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.now_ms = Arc::new(now_ms);
        self
    }

    fn guard(&self, tenant: &TenantConfig) -> Arc<TenantGuard> {
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        tenants
            .entry((tenant.provider.clone(), tenant.tenant.clone()))
            .or_insert_with(|| {
                Arc::new(TenantGuard {
                    permits: Arc::new(Semaphore::new(self.settings.max_concurrent_per_tenant)),
                    breaker: Mutex::new(Breaker::Closed { failures: 0 }),
                })
            })
            .clone()
    }

    /// Open circuits of `provider`'s tenants.
    pub fn open_circuits(&self, provider: &str) -> u64 {
        let tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        tenants
            .iter()
            .filter(|((p, _), _)| p == provider)
            .filter(|(_, g)| {
                !matches!(
                    *g.breaker.lock().unwrap_or_else(|p| p.into_inner()),
                    Breaker::Closed { .. }
                )
            })
            .count() as u64
    }

    fn publish(&self, provider: &str) {
        if let Some(metrics) = &self.metrics {
            let open = self.open_circuits(provider);
            metrics.update(|t| {
                t.lookup_circuits_open.insert(provider.to_string(), open);
            });
        }
    }

    /// [`GuardedLookup::admit`] without changing the state: refused while open (not yet
    /// expired) or while a trial is out.
    fn refusal(&self, guard: &TenantGuard) -> Result<(), LookupError> {
        let breaker = guard.breaker.lock().unwrap_or_else(|p| p.into_inner());
        match &*breaker {
            Breaker::Open { until_ms, .. } if (self.now_ms)() >= *until_ms => Ok(()),
            Breaker::Closed { .. } => Ok(()),
            Breaker::Open { last_error, .. } | Breaker::HalfOpen { last_error } => {
                Err(self.open_error(last_error))
            }
        }
    }

    fn open_error(&self, last_error: &str) -> LookupError {
        LookupError::Transient(format!(
            "circuit open: the provider API failed {} times in a row (last: {last_error})",
            self.settings.failure_threshold
        ))
    }

    /// May a lookup go out now (it holds a permit)? Moves an expired open circuit to
    /// half-open: this lookup is the trial.
    fn admit(&self, guard: &TenantGuard) -> Result<(), LookupError> {
        let mut breaker = guard.breaker.lock().unwrap_or_else(|p| p.into_inner());
        match &*breaker {
            Breaker::Closed { .. } => Ok(()),
            Breaker::Open {
                until_ms,
                last_error,
            } if (self.now_ms)() >= *until_ms => {
                *breaker = Breaker::HalfOpen {
                    last_error: last_error.clone(),
                };
                Ok(())
            }
            Breaker::Open { last_error, .. } | Breaker::HalfOpen { last_error } => {
                Err(self.open_error(last_error))
            }
        }
    }

    fn record(&self, guard: &TenantGuard, result: &Result<Vec<u8>, LookupError>) {
        let mut breaker = guard.breaker.lock().unwrap_or_else(|p| p.into_inner());
        let open = |last_error: &str| Breaker::Open {
            until_ms: (self.now_ms)() + self.settings.open_ms,
            last_error: last_error.to_string(),
        };
        *breaker = match (result, &*breaker) {
            (Ok(_) | Err(LookupError::Permanent(_)), _) => Breaker::Closed { failures: 0 },
            (Err(LookupError::Transient(e)), Breaker::HalfOpen { .. }) => open(e),
            (Err(LookupError::Transient(e)), Breaker::Closed { failures }) => {
                let failures = failures + 1;
                if failures >= self.settings.failure_threshold {
                    tracing::warn!(
                        failures,
                        open_ms = self.settings.open_ms,
                        "provider API keeps failing: lookup circuit opened"
                    );
                    open(e)
                } else {
                    Breaker::Closed { failures }
                }
            }
            // Another lookup opened it meanwhile.
            (Err(LookupError::Transient(_)), open @ Breaker::Open { .. }) => open.clone(),
        };
    }
}

#[async_trait]
impl ResourceLookup for GuardedLookup {
    async fn fetch(
        &self,
        tenant: &TenantConfig,
        provider: &str,
        event_type: &str,
        resource_id: &str,
    ) -> Result<Vec<u8>, LookupError> {
        let guard = self.guard(tenant);
        // An open circuit refuses at once, without waiting for a permit…
        if let Err(refused) = self.refusal(&guard) {
            self.publish(provider);
            return Err(refused);
        }
        let permit = tokio::time::timeout(
            self.settings.permit_wait,
            guard.permits.clone().acquire_owned(),
        )
        .await;
        let Ok(Ok(_permit)) = permit else {
            return Err(LookupError::Transient(format!(
                "{} lookups of this tenant are running; retry later",
                self.settings.max_concurrent_per_tenant
            )));
        };
        // …and one that opened while this lookup waited refuses it too.
        if let Err(refused) = self.admit(&guard) {
            self.publish(provider);
            return Err(refused);
        }
        let result = self
            .inner
            .fetch(tenant, provider, event_type, resource_id)
            .await;
        self.record(&guard, &result);
        self.publish(provider);
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

    use super::*;

    /// Fault injection: an API that answers each call from a script.
    struct Scripted {
        calls: AtomicUsize,
        fail: Mutex<Vec<bool>>,
        running: AtomicUsize,
        max_running: AtomicUsize,
        hold: Duration,
    }

    #[async_trait]
    impl ResourceLookup for Scripted {
        async fn fetch(
            &self,
            _: &TenantConfig,
            _: &str,
            _: &str,
            _: &str,
        ) -> Result<Vec<u8>, LookupError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_running.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(self.hold).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            let fail = {
                let mut script = self.fail.lock().unwrap();
                if script.is_empty() {
                    false
                } else {
                    script.remove(0)
                }
            };
            if fail {
                Err(LookupError::Transient("HTTP 503".into()))
            } else {
                Ok(b"{}".to_vec())
            }
        }
    }

    fn scripted(fail: Vec<bool>, hold: Duration) -> Arc<Scripted> {
        Arc::new(Scripted {
            calls: AtomicUsize::new(0),
            fail: Mutex::new(fail),
            running: AtomicUsize::new(0),
            max_running: AtomicUsize::new(0),
            hold,
        })
    }

    fn tenant(name: &str) -> TenantConfig {
        TenantConfig {
            provider: "mollie".into(),
            tenant: name.into(),
            secrets: vec![],
            tolerance_secs: 300,
            options: Default::default(),
        }
    }

    #[tokio::test]
    async fn concurrent_lookups_per_tenant_are_bounded() {
        let api = scripted(vec![], Duration::from_millis(100));
        let guarded = GuardedLookup::new(api.clone(), GuardSettings::default());
        let (a, b) = (tenant("a"), tenant("b"));
        let runs = (0..20).map(|i| {
            let t = if i % 2 == 0 { &a } else { &b };
            guarded.fetch(t, "mollie", "payment", "tr_1")
        });
        let results = futures::future::join_all(runs).await;
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(api.calls.load(Ordering::SeqCst), 20);
        // Two tenants, four each at most.
        assert_eq!(api.max_running.load(Ordering::SeqCst), 8);
    }

    #[tokio::test]
    async fn the_breaker_opens_after_repeated_failures_and_heals_after_a_trial() {
        let api = scripted(vec![true; 7], Duration::ZERO);
        let clock = Arc::new(AtomicI64::new(0));
        let now = clock.clone();
        let metrics = Arc::new(WorkerMetrics::default());
        let guarded = GuardedLookup::new(api.clone(), GuardSettings::default())
            .with_metrics(metrics.clone())
            .with_clock(move || now.load(Ordering::SeqCst));
        let t = tenant("a");
        for _ in 0..5 {
            assert!(guarded
                .fetch(&t, "mollie", "payment", "tr_1")
                .await
                .is_err());
        }
        assert_eq!(api.calls.load(Ordering::SeqCst), 5);
        assert_eq!(guarded.open_circuits("mollie"), 1);
        assert_eq!(metrics.drain().lookup_circuits_open["mollie"], 1);
        // Open: 100 more attempts reach no API.
        for _ in 0..100 {
            let err = guarded
                .fetch(&t, "mollie", "payment", "tr_1")
                .await
                .unwrap_err();
            assert!(
                matches!(&err, LookupError::Transient(e) if e.contains("circuit open") && e.contains("503")),
                "{err}"
            );
        }
        assert_eq!(api.calls.load(Ordering::SeqCst), 5);
        // Another tenant of the provider is not affected.
        assert!(guarded
            .fetch(&tenant("b"), "mollie", "payment", "tr_2")
            .await
            .is_err());
        assert_eq!(api.calls.load(Ordering::SeqCst), 6);
        // After the open period one trial goes out; it fails: open again.
        clock.store(30_000, Ordering::SeqCst);
        assert!(guarded
            .fetch(&t, "mollie", "payment", "tr_1")
            .await
            .is_err());
        assert_eq!(api.calls.load(Ordering::SeqCst), 7);
        assert!(guarded
            .fetch(&t, "mollie", "payment", "tr_1")
            .await
            .is_err());
        assert_eq!(api.calls.load(Ordering::SeqCst), 7);
        // The next trial succeeds: closed, lookups flow again.
        clock.store(60_000, Ordering::SeqCst);
        assert!(guarded.fetch(&t, "mollie", "payment", "tr_1").await.is_ok());
        assert!(guarded.fetch(&t, "mollie", "payment", "tr_1").await.is_ok());
        assert_eq!(api.calls.load(Ordering::SeqCst), 9);
        assert_eq!(guarded.open_circuits("mollie"), 0);
        assert_eq!(metrics.drain().lookup_circuits_open["mollie"], 0);
    }
}
