//! A configuration that refreshes itself: secrets rotated in SSM take effect without a
//! redeploy. Each request asks for the current snapshot; once it is older than the TTL,
//! one caller reloads it (the others keep using the old snapshot meanwhile). A failed
//! reload keeps the last good configuration and is retried after the TTL.
//!
//! A source is a handle: its clones share one snapshot, so the receiver's secrets, the
//! lookups' credentials and the relay's destinations all move to a reload together.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;

use crate::config::Config;
use crate::time;

/// Loads the whole tenant configuration (AWS: an SSM SecureString).
#[async_trait]
pub trait ConfigLoader: Send + Sync {
    async fn load(&self) -> Result<Config, String>;
}

#[derive(Clone)]
pub struct ConfigSource {
    inner: Arc<Shared>,
}

struct Shared {
    current: RwLock<Arc<Config>>,
    loaded_at_ms: AtomicI64,
    refresh: Option<Refresh>,
}

struct Refresh {
    loader: Arc<dyn ConfigLoader>,
    ttl_ms: i64,
    // Single flight: only one reload at a time.
    reloading: tokio::sync::Mutex<()>,
}

impl ConfigSource {
    /// A configuration that never changes (local files, tests).
    pub fn fixed(config: Arc<Config>) -> Self {
        Self::with(config, None)
    }

    fn with(config: Arc<Config>, refresh: Option<Refresh>) -> Self {
        ConfigSource {
            inner: Arc::new(Shared {
                current: RwLock::new(config),
                loaded_at_ms: AtomicI64::new(time::now_millis()),
                refresh,
            }),
        }
    }

    /// `initial` now, reloaded through `loader` once it is older than `ttl`.
    pub fn refreshing(initial: Config, loader: Arc<dyn ConfigLoader>, ttl: Duration) -> Self {
        Self::with(
            Arc::new(initial),
            Some(Refresh {
                loader,
                ttl_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
                reloading: tokio::sync::Mutex::new(()),
            }),
        )
    }

    /// `initial` now, reloaded through `loader` only when asked ([`ConfigSource::reload`]:
    /// `einmal serve` on SIGHUP).
    pub fn on_demand(initial: Config, loader: Arc<dyn ConfigLoader>) -> Self {
        Self::refreshing(initial, loader, Duration::MAX)
    }

    /// The snapshot as it is, without refreshing.
    pub fn snapshot(&self) -> Arc<Config> {
        match self.inner.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The current snapshot, reloaded first when it has expired.
    pub async fn current(&self) -> Arc<Config> {
        let Some(refresh) = &self.inner.refresh else {
            return self.snapshot();
        };
        let now = time::now_millis();
        if now - self.inner.loaded_at_ms.load(Ordering::Acquire) < refresh.ttl_ms {
            return self.snapshot();
        }
        self.load_now(refresh).await;
        self.snapshot()
    }

    /// Reload now, whatever the TTL. `false` without a loader, while another reload
    /// runs, or when it failed (the last good configuration stays; logged).
    pub async fn reload(&self) -> bool {
        match &self.inner.refresh {
            Some(refresh) => self.load_now(refresh).await,
            None => false,
        }
    }

    async fn load_now(&self, refresh: &Refresh) -> bool {
        let Ok(_guard) = refresh.reloading.try_lock() else {
            return false; // someone else is reloading
        };
        let loaded = match refresh.loader.load().await {
            Ok(config) => {
                match self.inner.current.write() {
                    Ok(mut guard) => *guard = Arc::new(config),
                    Err(poisoned) => *poisoned.into_inner() = Arc::new(config),
                }
                tracing::info!("tenant configuration reloaded");
                true
            }
            // Keep serving with the last good configuration; never log the content.
            Err(reason) => {
                tracing::warn!(%reason, "tenant configuration reload failed");
                false
            }
        };
        self.inner
            .loaded_at_ms
            .store(time::now_millis(), Ordering::Release);
        loaded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Versions {
        calls: AtomicUsize,
        fail: bool,
    }

    #[async_trait]
    impl ConfigLoader for Versions {
        async fn load(&self) -> Result<Config, String> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            if self.fail {
                return Err("unavailable".into());
            }
            Config::from_toml(&format!("[defaults]\nretention_days = {n}\n"))
                .map_err(|e| e.to_string())
        }
    }

    fn initial() -> Config {
        Config::from_toml("[defaults]\nretention_days = 99\n").unwrap()
    }

    #[tokio::test]
    async fn reloads_after_the_ttl_and_not_before() {
        let loader = Arc::new(Versions {
            calls: AtomicUsize::new(0),
            fail: false,
        });
        let source = ConfigSource::refreshing(initial(), loader.clone(), Duration::from_millis(50));
        assert_eq!(source.current().await.ingest.retention_days, 99);
        assert_eq!(loader.calls.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(source.current().await.ingest.retention_days, 1);
        assert_eq!(
            source.current().await.ingest.retention_days,
            1,
            "fresh again"
        );
        assert_eq!(loader.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failed_reload_keeps_the_last_good_configuration() {
        let loader = Arc::new(Versions {
            calls: AtomicUsize::new(0),
            fail: true,
        });
        let source = ConfigSource::refreshing(initial(), loader.clone(), Duration::ZERO);
        assert_eq!(source.current().await.ingest.retention_days, 99);
        assert_eq!(source.current().await.ingest.retention_days, 99);
        assert_eq!(loader.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn fixed_never_reloads() {
        let source = ConfigSource::fixed(Arc::new(initial()));
        assert_eq!(source.current().await.ingest.retention_days, 99);
    }

    struct Misspelt;

    #[async_trait]
    impl ConfigLoader for Misspelt {
        async fn load(&self) -> Result<Config, String> {
            let text = "[[tenant]]\nprovider = \"shopify\"\ntenant = \"s\"\nsecrets = [\"k\"]\noptions = { shop_domian = \"s.myshopify.com\" }\n";
            Config::from_toml(text).map_err(|e| e.to_string())
        }
    }

    #[tokio::test]
    async fn a_reload_with_an_unknown_option_keeps_the_last_good_configuration() {
        let source = ConfigSource::refreshing(initial(), Arc::new(Misspelt), Duration::ZERO);
        let current = source.current().await;
        assert_eq!(current.ingest.retention_days, 99);
        assert_eq!(current.tenants().count(), 0);
    }
}
