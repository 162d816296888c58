//! Event filters of a destination: patterns over provider event types and domain
//! output kinds. `*` matches any run of characters (several may appear); everything
//! else matches itself exactly, case included (providers' types are case-sensitive).

use super::DestinationConfig;

/// Longest pattern accepted: event types are short dotted names.
const MAX_PATTERN_LEN: usize = 200;

/// Check a pattern: non-empty, at most 200 characters, visible ASCII only (no spaces,
/// no control characters). `*` alone means "every event".
pub fn validate_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("an event pattern is empty".into());
    }
    if pattern.len() > MAX_PATTERN_LEN {
        return Err(format!(
            "event pattern `{}…` is longer than {MAX_PATTERN_LEN} characters",
            &pattern[..pattern
                .char_indices()
                .nth(20)
                .map_or(pattern.len(), |(i, _)| i)]
        ));
    }
    if let Some(c) = pattern.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "event pattern `{}` contains {c:?}: only visible ASCII characters and `*` are allowed",
            pattern.escape_default()
        ));
    }
    Ok(())
}

/// Does `pattern` match all of `text`? Greedy with backtracking to the last `*`:
/// linear in practice, no regex engine, no catastrophic cases.
pub fn matches(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    // Position after the last `*` seen, and where in `text` it started matching.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi + 1, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((after, start)) = star {
            // Let the last `*` swallow one more character and retry.
            pi = after;
            ti = start + 1;
            star = Some((after, start + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

fn any_matches(patterns: &[String], text: &str) -> bool {
    patterns.iter().any(|p| matches(p, text))
}

impl DestinationConfig {
    /// Is this provider event for this destination? The provider must be the
    /// destination's (when it names one) and the type must match one `events` pattern.
    pub fn matches_event(&self, provider: &str, event_type: &str) -> bool {
        self.provider.as_deref().is_none_or(|p| p == provider)
            && any_matches(&self.events, event_type)
    }

    /// Is this domain output (by kind, e.g. `notification.payment_received`) for this
    /// destination?
    pub fn matches_output(&self, kind: &str) -> bool {
        any_matches(&self.outputs, kind)
    }
}

/// Whether `d` takes the provider event `event_type` of `provider` / `tenant`
/// (tenant here, provider and patterns in [`DestinationConfig::matches_event`]).
pub fn matches_event(
    d: &DestinationConfig,
    provider: &str,
    tenant: &str,
    event_type: &str,
) -> bool {
    d.tenant == tenant && d.matches_event(provider, event_type)
}

/// Whether `d` takes the domain output `kind` of an event of `provider` / `tenant`.
pub fn matches_output(d: &DestinationConfig, provider: &str, tenant: &str, kind: &str) -> bool {
    d.tenant == tenant
        && d.provider.as_deref().is_none_or(|p| p == provider)
        && d.matches_output(kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destinations::config::{DestinationKind, LambdaDestination};
    use std::time::Duration;

    #[test]
    fn stars_match_any_run_and_the_rest_is_exact() {
        assert!(matches("payment_intent.*", "payment_intent.succeeded"));
        assert!(matches("payment_intent.*", "payment_intent."));
        assert!(!matches("payment_intent.*", "payment_intent"));
        assert!(!matches("payment_intent.*", "xpayment_intent.succeeded"));
        assert!(matches("*", ""));
        assert!(matches("*", "anything/at.all"));
        assert!(matches("charge.refunded", "charge.refunded"));
        assert!(!matches("charge.refunded", "charge.refunded.x"));
        assert!(!matches("charge.refunded", "Charge.refunded"));
        assert!(matches("*.succeeded", "payment_intent.succeeded"));
        assert!(matches("orders/*", "orders/create"));
        assert!(matches("*intent*succ*", "payment_intent.succeeded"));
        assert!(matches("a*b*c", "abc"));
        assert!(matches("a*b*c", "aXbYbZc"));
        assert!(!matches("a*b*c", "aXbYcZ"));
        assert!(matches("**", "x"));
        assert!(matches("a**", "a"));
        // Backtracking: the first `b` is not the right one.
        assert!(matches("*ab", "aab"));
        assert!(matches("*aab", "aaab"));
        assert!(!matches("", "x"));
    }

    #[test]
    fn invalid_patterns_are_named() {
        assert!(validate_pattern("payment_intent.*").is_ok());
        assert!(validate_pattern("*").is_ok());
        assert!(validate_pattern("").unwrap_err().contains("empty"));
        let err = validate_pattern("charge refunded").unwrap_err();
        assert!(
            err.contains("charge refunded") && err.contains("visible ASCII"),
            "{err}"
        );
        assert!(validate_pattern("é").is_err());
        assert!(validate_pattern(&"x".repeat(201))
            .unwrap_err()
            .contains("longer"));
    }

    fn destination(provider: Option<&str>, events: &[&str], outputs: &[&str]) -> DestinationConfig {
        DestinationConfig {
            name: "d".into(),
            tenant: "t".into(),
            provider: provider.map(Into::into),
            events: events.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            ordered: false,
            max_attempts: 1,
            max_age: Duration::from_secs(1),
            kind: DestinationKind::Lambda(LambdaDestination {
                function: "f".into(),
            }),
        }
    }

    #[test]
    fn destinations_match_their_provider_events_and_outputs() {
        let any = destination(None, &["payment_intent.*", "charge.refunded"], &[]);
        assert!(any.matches_event("stripe", "payment_intent.succeeded"));
        assert!(any.matches_event("paypal", "charge.refunded"));
        assert!(!any.matches_event("stripe", "customer.created"));
        assert!(!any.matches_output("notification.payment_received"));
        let stripe = destination(Some("stripe"), &["*"], &["notification.*"]);
        assert!(stripe.matches_event("stripe", "customer.created"));
        assert!(!stripe.matches_event("github", "push"));
        assert!(stripe.matches_output("notification.payment_received"));
        assert!(!stripe.matches_output("invoice.issued"));
        // Outputs only: no provider event matches.
        let outputs = destination(None, &[], &["*"]);
        assert!(!outputs.matches_event("stripe", "x"));
    }
}
