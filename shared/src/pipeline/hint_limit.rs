//! Per-tenant intake limit of thin hints (Mollie classic, GoPay, Klarna push).
//!
//! A hint is authenticated only by the URL token, stores an inbox item and costs one
//! provider API call later. Whoever holds the token could otherwise fill the inbox
//! and the provider's rate limit with distinct ids. Each tenant gets a token bucket of
//! [`MAX_HINTS_OPTION`] hints (default [`DEFAULT_MAX_HINTS_PER_MINUTE`]) refilled at
//! that rate a minute: a hint beyond it is answered 429 with `Retry-After` and
//! nothing is stored. A duplicate (a retry within the hint's minute) gives its token
//! back: it stores nothing new.
//!
//! The buckets live in the process: on Lambda each receiver instance has its own,
//! so the effective limit is the tenant's limit times the instances the tenant's
//! hints reach (concurrency rises with sustained traffic). That is enough for what it
//! guards: the per-instance limit caps what one burst stores and costs, and the
//! receiver's reserved concurrency (the API's throttling, or `ReceiverReservedConcurrency`
//! on a function URL) caps the instances; the lookups downstream have their own
//! per-tenant bound and circuit breaker (`crate::lookup::GuardedLookup`). An exact
//! global limit would need a shared counter (a DynamoDB update per hint), doubling the
//! cost of every hint for an attack that needs a leaked token.
//!
//! Memory: one bucket per configured thin tenant (only configured tenants reach it).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::config::TenantConfig;

/// Tenant option: hints accepted per minute (a whole number, at least 1).
pub const MAX_HINTS_OPTION: &str = "max_hints_per_minute";
pub const DEFAULT_MAX_HINTS_PER_MINUTE: u32 = 600;
/// Highest accepted value of [`MAX_HINTS_OPTION`].
pub const MAX_HINTS_PER_MINUTE_LIMIT: u32 = 1_000_000;

/// The tenant's `max_hints_per_minute`, or why the value is not acceptable.
pub fn max_hints_per_minute(tenant: &TenantConfig) -> Result<u32, String> {
    match tenant.option(MAX_HINTS_OPTION) {
        None => Ok(DEFAULT_MAX_HINTS_PER_MINUTE),
        Some(raw) => match raw.trim().parse::<u32>() {
            Ok(n) if (1..=MAX_HINTS_PER_MINUTE_LIMIT).contains(&n) => Ok(n),
            _ => Err(format!(
                "option `{MAX_HINTS_OPTION}` must be a whole number from 1 to {MAX_HINTS_PER_MINUTE_LIMIT}, not {raw:?}"
            )),
        },
    }
}

#[derive(Debug)]
struct Bucket {
    /// Tokens, in thousandths (exact refill at any rate).
    milli: u64,
    at_ms: i64,
}

/// The buckets of every tenant that received hints.
#[derive(Debug, Default)]
pub struct HintLimiter {
    buckets: Mutex<HashMap<(String, String), Bucket>>,
}

impl HintLimiter {
    /// Take one token for `tenant` at `now_ms`: `Ok(())`, or the seconds until the next
    /// token (for `Retry-After`).
    pub fn take(&self, tenant: &TenantConfig, now_ms: i64) -> Result<(), u64> {
        let per_minute = max_hints_per_minute(tenant).unwrap_or(DEFAULT_MAX_HINTS_PER_MINUTE);
        let cap = u64::from(per_minute) * 1000;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets
            .entry((tenant.provider.clone(), tenant.tenant.clone()))
            .or_insert(Bucket {
                milli: cap,
                at_ms: now_ms,
            });
        // milli-tokens gained: elapsed_ms * per_minute * 1000 / 60_000.
        let elapsed = u64::try_from(now_ms - bucket.at_ms).unwrap_or(0);
        let gained = elapsed.saturating_mul(u64::from(per_minute)) / 60;
        bucket.milli = cap.min(bucket.milli.saturating_add(gained));
        bucket.at_ms = bucket.at_ms.max(now_ms);
        if bucket.milli >= 1000 {
            bucket.milli -= 1000;
            return Ok(());
        }
        // ms until one whole token: missing milli-tokens * 60 / per_minute.
        let missing = 1000 - bucket.milli;
        let wait_ms = (missing * 60).div_ceil(u64::from(per_minute));
        Err(wait_ms.div_ceil(1000).max(1))
    }

    /// Give back a token taken for a hint that stored nothing new (a duplicate).
    pub fn give_back(&self, tenant: &TenantConfig) {
        let per_minute = max_hints_per_minute(tenant).unwrap_or(DEFAULT_MAX_HINTS_PER_MINUTE);
        let cap = u64::from(per_minute) * 1000;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bucket) = buckets.get_mut(&(tenant.provider.clone(), tenant.tenant.clone())) {
            bucket.milli = cap.min(bucket.milli + 1000);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(limit: Option<&str>) -> TenantConfig {
        TenantConfig {
            provider: "gopay".into(),
            tenant: "acme".into(),
            secrets: vec![],
            tolerance_secs: 300,
            options: limit
                .map(|l| [(MAX_HINTS_OPTION.to_string(), l.to_string())].into())
                .unwrap_or_default(),
        }
    }

    #[test]
    fn the_limit_is_a_bucket_per_minute() {
        let limiter = HintLimiter::default();
        let t = tenant(Some("6"));
        for _ in 0..6 {
            assert_eq!(limiter.take(&t, 0), Ok(()));
        }
        // One token every 10 s.
        assert_eq!(limiter.take(&t, 0), Err(10));
        assert_eq!(limiter.take(&t, 9_000), Err(1));
        assert_eq!(limiter.take(&t, 10_000), Ok(()));
        assert_eq!(limiter.take(&t, 10_000), Err(10));
        limiter.give_back(&t);
        assert_eq!(limiter.take(&t, 10_000), Ok(()));
        // A quiet minute refills it completely, never beyond.
        for _ in 0..6 {
            assert_eq!(limiter.take(&t, 600_000), Ok(()));
        }
        assert!(limiter.take(&t, 600_000).is_err());
    }

    #[test]
    fn the_option_is_strict() {
        assert_eq!(max_hints_per_minute(&tenant(None)), Ok(600));
        assert_eq!(max_hints_per_minute(&tenant(Some("120"))), Ok(120));
        for bad in ["0", "-1", "ten", "", "1.5", "1000001"] {
            assert!(max_hints_per_minute(&tenant(Some(bad))).is_err(), "{bad}");
        }
        // 600 a minute: the next token is at most a second away.
        let limiter = HintLimiter::default();
        let t = tenant(None);
        for _ in 0..600 {
            assert_eq!(limiter.take(&t, 0), Ok(()));
        }
        assert_eq!(limiter.take(&t, 0), Err(1));
    }
}
