//! How long inbox items must live: at least the provider's longest retry window plus a
//! margin for operators to replay, whatever the configured `retention_days` says.
//!
//! A deduplication record that expires while the provider still retries would let a
//! late retry in as a new event, so the configured value is only ever raised, never
//! lowered, by the provider's retry window ([`Provider::retry_window_days`]).

use crate::providers::{self, Provider};

/// Days an operator has, after the provider's last retry, to inspect and replay.
pub const REPLAY_MARGIN_DAYS: u32 = 7;

/// The retry window of the provider named `provider` in whole days; one day for a name
/// no provider has.
pub fn retry_window_days(provider: &str) -> u32 {
    providers::lookup(provider).map_or(1, Provider::retry_window_days)
}

/// Retention for `provider`: the configured days, raised to window + margin if shorter.
pub fn retention_days(provider: &str, configured: u32) -> u32 {
    configured.max(retry_window_days(provider) + REPLAY_MARGIN_DAYS)
}

/// The longest retention any item can get with `configured` days: what an order
/// cursor, which items of every provider may queue on, must outlive.
pub fn longest_retention_days(configured: u32) -> u32 {
    providers::all()
        .iter()
        .map(|p| retention_days(p.name(), configured))
        .max()
        .unwrap_or(configured)
        .max(retention_days("", configured))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_covers_the_retry_window_plus_the_replay_margin() {
        assert_eq!(retention_days("adyen", 30), 37, "Adyen retries for 30 days");
        assert_eq!(
            retention_days("stripe", 30),
            30,
            "30 days already cover 3 + 7"
        );
        assert_eq!(retention_days("stripe", 5), 10);
        assert_eq!(retention_days("shopify", 1), 8);
        assert_eq!(retention_days("adyen", 90), 90, "a longer setting is kept");
        assert_eq!(
            longest_retention_days(1),
            37,
            "Adyen's is the longest window"
        );
        assert_eq!(longest_retention_days(90), 90);
    }
}
