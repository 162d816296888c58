//! How long inbox items must live: at least the provider's longest retry window plus a
//! margin for operators to replay, whatever the configured `retention_days` says.
//!
//! A deduplication record that expires while the provider still retries would let a
//! late retry in as a new event, so the configured value is only ever raised, never
//! lowered, by this table. Windows are from `../shared/providers.md` (§1, §2).

/// Days an operator has, after the provider's last retry, to inspect and replay.
pub const REPLAY_MARGIN_DAYS: u32 = 7;

/// The provider's documented retry window in whole days, rounded up. Providers that do
/// not retry automatically (GitHub, Twilio, WooCommerce, GitLab) or retry for minutes
/// (Slack, Lemon Squeezy) count as one day; unconfirmed schedules use the longest
/// reported value.
pub fn retry_window_days(provider: &str) -> u32 {
    match provider {
        "adyen" => 30,                                  // queue retries for up to 30 days
        "stripe" | "paypal" | "paddle" | "square" => 3, // 3 days; Square up to 72 h
        "mollie" | "standard-webhooks" | "klarna" | "klarna-push" | "gopay" => 2, // ≈ 26–28 h
        _ => 1, // Shopify 4 h, Mailgun ≈ 8 h, Braintree, Slack, Lemon Squeezy, no-retry senders
    }
}

/// Retention for `provider`: the configured days, raised to window + margin if shorter.
pub fn retention_days(provider: &str, configured: u32) -> u32 {
    configured.max(retry_window_days(provider) + REPLAY_MARGIN_DAYS)
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
    }
}
