//! The processor's settings: leases, the redrive's budget, backoff, contention, the
//! wait window and the retry horizon (one struct, read from the environment once).

use std::time::Duration;

use thiserror::Error;

/// Lease length (`EINMAL_LEASE_MS`).
pub const LEASE_MS_ENV: &str = "EINMAL_LEASE_MS";

/// Must equal the queue's redrive `maxReceiveCount` (`EINMAL_MAX_RECEIVE_COUNT`).
pub const MAX_RECEIVE_COUNT_ENV: &str = "EINMAL_MAX_RECEIVE_COUNT";

pub const BACKOFF_BASE_MS_ENV: &str = "EINMAL_BACKOFF_BASE_MS";

pub const BACKOFF_MAX_MS_ENV: &str = "EINMAL_BACKOFF_MAX_MS";

pub const MAX_CONFLICT_RETRIES_ENV: &str = "EINMAL_MAX_CONFLICT_RETRIES";

/// The wait window for every provider (`EINMAL_WAIT_WINDOW_MS`); unset = each
/// provider's retry window.
pub const WAIT_WINDOW_MS_ENV: &str = "EINMAL_WAIT_WINDOW_MS";

/// How long transient failures are retried, for every provider
/// (`EINMAL_RETRY_HORIZON_MS`); unset = each provider's retry window.
pub const RETRY_HORIZON_MS_ENV: &str = "EINMAL_RETRY_HORIZON_MS";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSettings {
    /// How long a claim holds the item; a worker that dies is replaced after it.
    /// Keep it above the longest processing time (Lambda: the function timeout).
    pub lease_ms: i64,
    /// The queue's redrive `maxReceiveCount`: the receive with this count is the
    /// last one, so a transient failure then dead-letters the item.
    pub max_receive_count: u32,
    /// Backoff before retry n (1-based): up to `min(max, base * 2^(n-1))`, full jitter.
    pub backoff_base_ms: i64,
    pub backoff_max_ms: i64,
    /// Reload-and-decide rounds after a version conflict that found the records
    /// unchanged (no progress) before the event is postponed (transient). Rounds that
    /// find a record moved on go on until a third of the lease is spent.
    pub max_conflict_retries: u32,
    /// How long an event may wait for a prerequisite before it is dead-lettered.
    /// `None`: the provider's retry window ([`crate::retention::retry_window_days`]),
    /// as long as the provider may still deliver the prerequisite late.
    pub wait_window_ms: Option<i64>,
    /// How long after its receipt an event's transient failures are retried before it
    /// is dead-lettered. `None`: the provider's retry window, as long as the provider
    /// itself would keep retrying.
    pub retry_horizon_ms: Option<i64>,
}

impl Default for ProcessSettings {
    fn default() -> Self {
        ProcessSettings {
            lease_ms: 30_000,
            max_receive_count: 5,
            backoff_base_ms: 2_000,
            backoff_max_ms: 15 * 60_000,
            max_conflict_retries: 5,
            wait_window_ms: None,
            retry_horizon_ms: None,
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("{name}: {reason}")]
pub struct SettingsError {
    pub name: &'static str,
    pub reason: String,
}

impl ProcessSettings {
    /// Defaults overridden by `EINMAL_LEASE_MS`, `EINMAL_MAX_RECEIVE_COUNT`,
    /// `EINMAL_BACKOFF_BASE_MS`, `EINMAL_BACKOFF_MAX_MS`, `EINMAL_MAX_CONFLICT_RETRIES`,
    /// `EINMAL_WAIT_WINDOW_MS`, `EINMAL_RETRY_HORIZON_MS`.
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`ProcessSettings::from_env`] with an injectable lookup. Empty counts as unset.
    pub fn from_lookup(env: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        fn read<T>(
            env: &impl Fn(&str) -> Option<String>,
            name: &'static str,
            default: T,
            min: T,
        ) -> Result<T, SettingsError>
        where
            T: std::str::FromStr + PartialOrd + std::fmt::Display,
        {
            let Some(raw) = env(name).filter(|v| !v.trim().is_empty()) else {
                return Ok(default);
            };
            let value: T = raw.trim().parse().map_err(|_| SettingsError {
                name,
                reason: format!("{raw:?} is not a number"),
            })?;
            if value < min {
                return Err(SettingsError {
                    name,
                    reason: format!("must be at least {min}"),
                });
            }
            Ok(value)
        }
        let d = ProcessSettings::default();
        let settings = ProcessSettings {
            lease_ms: read(&env, LEASE_MS_ENV, d.lease_ms, 1)?,
            max_receive_count: read(&env, MAX_RECEIVE_COUNT_ENV, d.max_receive_count, 1)?,
            backoff_base_ms: read(&env, BACKOFF_BASE_MS_ENV, d.backoff_base_ms, 0)?,
            backoff_max_ms: read(&env, BACKOFF_MAX_MS_ENV, d.backoff_max_ms, 0)?,
            max_conflict_retries: read(&env, MAX_CONFLICT_RETRIES_ENV, d.max_conflict_retries, 0)?,
            wait_window_ms: match env(WAIT_WINDOW_MS_ENV).filter(|v| !v.trim().is_empty()) {
                None => None,
                Some(_) => Some(read(&env, WAIT_WINDOW_MS_ENV, 0i64, 1)?),
            },
            retry_horizon_ms: match env(RETRY_HORIZON_MS_ENV).filter(|v| !v.trim().is_empty()) {
                None => None,
                Some(_) => Some(read(&env, RETRY_HORIZON_MS_ENV, 0i64, 1)?),
            },
        };
        if settings.backoff_max_ms < settings.backoff_base_ms {
            return Err(SettingsError {
                name: BACKOFF_MAX_MS_ENV,
                reason: format!("must be at least {BACKOFF_BASE_MS_ENV}"),
            });
        }
        Ok(settings)
    }

    /// The backoff ceiling before retry `attempt` (1-based): `min(max, base * 2^(attempt-1))`.
    pub fn backoff_cap_ms(&self, attempt: u32) -> i64 {
        let doublings = attempt.saturating_sub(1).min(62);
        self.backoff_base_ms
            .max(0)
            .saturating_mul(1i64 << doublings)
            .min(self.backoff_max_ms.max(0))
    }

    /// The wait window of an event of `provider` (see [`ProcessSettings::wait_window_ms`]).
    pub fn wait_window_ms_for(&self, provider: &str) -> i64 {
        self.wait_window_ms.unwrap_or_else(|| {
            i64::from(crate::retention::retry_window_days(provider)) * 86_400_000
        })
    }

    /// The retry horizon of an event of `provider` (see
    /// [`ProcessSettings::retry_horizon_ms`]).
    pub fn retry_horizon_ms_for(&self, provider: &str) -> i64 {
        self.retry_horizon_ms.unwrap_or_else(|| {
            i64::from(crate::retention::retry_window_days(provider)) * 86_400_000
        })
    }

    /// Full jitter: `jitter` in `[0, 1]` times the ceiling.
    pub fn backoff(&self, attempt: u32, jitter: f64) -> Duration {
        let cap = self.backoff_cap_ms(attempt) as f64;
        Duration::from_millis((cap * jitter.clamp(0.0, 1.0)).round() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_ceiling() {
        let s = ProcessSettings::default();
        let caps: Vec<i64> = (1..=12).map(|n| s.backoff_cap_ms(n)).collect();
        assert_eq!(&caps[..4], &[2_000, 4_000, 8_000, 16_000]);
        assert_eq!(caps[9], 900_000);
        assert_eq!(caps[11], 900_000);
        assert_eq!(s.backoff_cap_ms(0), 2_000);
        assert_eq!(s.backoff_cap_ms(u32::MAX), 900_000);
        assert_eq!(s.backoff(3, 1.0), Duration::from_secs(8));
        assert_eq!(s.backoff(3, 0.5), Duration::from_secs(4));
        assert_eq!(s.backoff(3, 0.0), Duration::ZERO);
        assert_eq!(s.backoff(3, 7.0), Duration::from_secs(8));
    }

    #[test]
    fn settings_from_env() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            ProcessSettings::from_lookup(env(&[])).unwrap(),
            ProcessSettings::default()
        );
        let s = ProcessSettings::from_lookup(env(&[
            (LEASE_MS_ENV, "5000"),
            (MAX_RECEIVE_COUNT_ENV, " 3 "),
            (BACKOFF_BASE_MS_ENV, ""),
        ]))
        .unwrap();
        assert_eq!(
            (s.lease_ms, s.max_receive_count, s.backoff_base_ms),
            (5_000, 3, 2_000)
        );
        let err = ProcessSettings::from_lookup(env(&[(MAX_RECEIVE_COUNT_ENV, "0")])).unwrap_err();
        assert_eq!(err.name, MAX_RECEIVE_COUNT_ENV);
        let err = ProcessSettings::from_lookup(env(&[(LEASE_MS_ENV, "soon")])).unwrap_err();
        assert!(err.to_string().contains("not a number"), "{err}");
        let err = ProcessSettings::from_lookup(env(&[(BACKOFF_MAX_MS_ENV, "10")])).unwrap_err();
        assert_eq!(err.name, BACKOFF_MAX_MS_ENV);
        // The wait window: the provider's retry window unless configured.
        let d = ProcessSettings::default();
        assert_eq!(d.wait_window_ms_for("shopify"), 86_400_000);
        assert_eq!(d.wait_window_ms_for("stripe"), 3 * 86_400_000);
        assert_eq!(d.wait_window_ms_for("adyen"), 30 * 86_400_000);
        let s = ProcessSettings::from_lookup(env(&[(WAIT_WINDOW_MS_ENV, "3600000")])).unwrap();
        assert_eq!(s.wait_window_ms_for("adyen"), 3_600_000);
        for bad in ["0", "-5", "a day"] {
            let err = ProcessSettings::from_lookup(move |k: &str| {
                (k == WAIT_WINDOW_MS_ENV).then(|| bad.to_string())
            })
            .unwrap_err();
            assert_eq!(err.name, WAIT_WINDOW_MS_ENV, "{bad}");
        }
    }
}
