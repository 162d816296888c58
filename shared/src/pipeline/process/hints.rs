//! Hints (thin webhooks): the resource a hint names, fetched before the decision.
//!
//! Providers that sign nothing (Mollie classic, GoPay, Klarna KCO push) only name a
//! resource; their envelopes have the event type `hint.{kind}` (`providers::thin`).
//! Before step 2 such an item is *enriched*: the resource is fetched from the
//! provider's API with the tenant's credentials ([`ResourceLookup`], wired with
//! [`Processor::with_lookup`]) and the domain sees the fetched JSON as the body and
//! `{kind}` as the event type. Nothing of the request itself reaches the domain, so a
//! forged hint cannot cause an effect. A transient lookup failure (5xx, timeout)
//! retries like any other; a permanent one (404, bad credentials, no lookup
//! configured) dead-letters the item.
//!

use super::outcome::Failure;
use super::Processor;
use crate::envelope::Envelope;
use crate::providers::thin::HINT_PREFIX;

impl Processor {
    /// Fetch the resource a hint names: the envelope the domain sees (type `kind`) and
    /// the fetched body.
    pub(super) async fn enrich(
        &self,
        hint: &Envelope,
        kind: &str,
    ) -> Result<(Envelope, Vec<u8>), Failure> {
        let Some((lookup, source)) = &self.lookup else {
            return Err(Failure::Permanent(
                "no resource lookup configured".to_string(),
            ));
        };
        let config = source.current().await;
        let tenant = config.tenant(&hint.provider, &hint.tenant).ok_or_else(|| {
            Failure::Permanent(format!(
                "tenant {}/{} is not configured for resource lookups",
                hint.provider, hint.tenant
            ))
        })?;
        let resource_id = hint
            .object_id
            .as_deref()
            .ok_or_else(|| Failure::Permanent("hint without a resource id".to_string()))?;
        let fetched = lookup
            .fetch(tenant, &hint.provider, kind, resource_id)
            .await?;
        let envelope = Envelope {
            event_type: kind.to_string(),
            ..hint.clone()
        };
        Ok((envelope, fetched))
    }
}

/// The kind of a hint envelope (`hint.payment` → `payment`) of a thin provider (one
/// with a [`crate::providers::Provider::hint`]).
pub(super) fn hint_kind(envelope: &Envelope) -> Option<&str> {
    crate::providers::lookup(&envelope.provider)?.hint()?;
    envelope
        .event_type
        .strip_prefix(HINT_PREFIX)
        .filter(|kind| !kind.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lookup::LookupError;
    use crate::telemetry::emf::RetryCause;

    #[test]
    fn hints_are_recognised_only_for_thin_providers() {
        let env = |provider: &str, event_type: &str| Envelope {
            provider: provider.into(),
            tenant: "t".into(),
            event_id: "e".into(),
            event_type: event_type.into(),
            object_id: Some("x".into()),
            object_version: None,
            occurred_at: None,
            delivery_id: None,
        };
        assert_eq!(hint_kind(&env("mollie", "hint.payment")), Some("payment"));
        assert_eq!(hint_kind(&env("gopay", "hint.payment")), Some("payment"));
        assert_eq!(hint_kind(&env("klarna-push", "hint.order")), Some("order"));
        // Signed Mollie next-gen events are not hints.
        assert_eq!(hint_kind(&env("mollie", "payment-link.paid")), None);
        assert_eq!(hint_kind(&env("mollie", "hint.")), None);
        // Other providers' types are theirs, whatever they look like.
        assert_eq!(hint_kind(&env("standard-webhooks", "hint.payment")), None);
        assert_eq!(
            Failure::from(LookupError::Transient("x".into())),
            Failure::Transient(
                RetryCause::Lookup,
                "resource lookup failed (transient): x".into()
            )
        );
        assert!(matches!(
            Failure::from(LookupError::Permanent("x".into())),
            Failure::Permanent(_)
        ));
    }
}
