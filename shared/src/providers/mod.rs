//! Provider modules: one per provider. Each verifies authenticity on the exact raw
//! body bytes and extracts the [`Envelope`].
//!
//! Verification always happens before anything is stored (invariant 1). Errors are
//! classified once: authentication failures become 401, malformed-but-authentic
//! requests 400 (see `pipeline::ingest`).

use bytes::Bytes;
use thiserror::Error;

use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::request::WebhookRequest;
use reconcile_source::ReconcileSource;

pub mod adyen;
pub mod body_hmac;
pub mod braintree;
pub mod coinbase_commerce;
pub mod generic;
pub mod github;
pub mod gitlab;
pub mod gopay;
pub mod hubspot;
pub mod json;
pub mod klarna;
pub mod klarna_push;
pub mod lemon_squeezy;
pub mod mailgun;
pub mod mollie;
pub mod paddle;
pub mod paypal;
pub mod paystack;
pub mod plain_json;
pub mod razorpay;
pub mod reconcile_source;
pub mod resend;
pub mod sendgrid;
pub mod shopify;
pub mod sig;
pub mod slack;
pub mod square;
pub mod standard_webhooks;
pub mod stripe;
pub mod thin;
pub mod twilio;
pub mod woocommerce;
pub mod worldline;
pub mod zendesk;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ProviderError {
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    #[error("malformed header {0}: {1}")]
    MalformedHeader(&'static str, &'static str),
    #[error("signature does not match")]
    SignatureMismatch,
    #[error("timestamp outside the allowed tolerance")]
    TimestampOutOfTolerance,
    #[error("no secret is configured for this tenant")]
    NoSecret,
    /// Authentic, but the request does not belong to this tenant (e.g. Shopify shop domain).
    #[error("request does not belong to this tenant: {0}")]
    TenantMismatch(&'static str),
    /// Authentic, but the payload lacks what we need (event id, type) or is not valid JSON.
    #[error("malformed payload: {0}")]
    MalformedPayload(String),
    /// The request could not be checked now for a reason on our side (PayPal: its
    /// certificate could not be fetched within the fetch budget, or PayPal's host did
    /// not answer): neither authentic nor forged as far as we know. HTTP 503 with
    /// `Retry-After`, nothing stored; the provider's retry gets another chance.
    #[error("the signature cannot be checked now; retry after {retry_after_secs} s")]
    CannotVerifyNow { retry_after_secs: u64 },
}

impl ProviderError {
    /// True when the request could not be authenticated (HTTP 401); false when it was
    /// authentic but malformed (HTTP 400), or could not be checked now (HTTP 503).
    pub fn is_authentication_failure(&self) -> bool {
        matches!(
            self,
            ProviderError::MissingHeader(_)
                | ProviderError::MalformedHeader(_, _)
                | ProviderError::SignatureMismatch
                | ProviderError::TimestampOutOfTolerance
                | ProviderError::NoSecret
                | ProviderError::TenantMismatch(_)
        )
    }
}

/// One verified event. Most requests carry one; Adyen batches several items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedEvent {
    pub envelope: Envelope,
    /// The bytes to store for this event: the whole raw body, or the item of a batch.
    pub body: Bytes,
}

impl VerifiedEvent {
    /// The usual case: one event whose stored body is the whole raw request body.
    pub fn whole(envelope: Envelope, request: &WebhookRequest) -> Vec<VerifiedEvent> {
        vec![VerifiedEvent {
            envelope,
            body: request.body.clone(),
        }]
    }
}

/// The answer to a provider's endpoint-verification handshake: sent with 200 after the
/// signature held; nothing is stored or enqueued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// The value to echo (Slack `url_verification` `challenge`).
    pub challenge: String,
}

pub trait Provider: Send + Sync {
    /// The path segment in `/webhooks/{provider}/{tenant}`.
    fn name(&self) -> &'static str;

    /// Every tenant option this provider reads (webhooks, `einmal send`, API lookups,
    /// reconciliation). Loading a configuration rejects any other name.
    fn options(&self) -> &'static [&'static str];

    /// Whether a tenant must configure at least one secret (not for hint-only tenants,
    /// which the path token guards).
    fn needs_secret(&self, _tenant: &TenantConfig) -> bool {
        true
    }

    // ---- Provider facts: retry window, hints, tenant checks ------------------------

    /// The documented retry window in whole days, rounded up: inbox items outlive it by
    /// a replay margin (`crate::retention`), and events wait at most this long for a
    /// prerequisite (`pipeline::process`). Providers that do not retry automatically,
    /// or only for minutes or hours, say 1; unconfirmed schedules take the longest
    /// reported value (`../shared/providers.md` §1, §2).
    fn retry_window_days(&self) -> u32;

    /// For a thin-event provider, what its hints name and how the processor fetches
    /// it; `None` (the default) for providers whose events carry their own state.
    fn hint(&self) -> Option<&'static thin::HintSpec> {
        None
    }

    /// Checks of a signing tenant's configuration (one that lists secrets) beyond its
    /// option names, run at load time; the error is the reason shown to the operator.
    fn validate_tenant(&self, _tenant: &TenantConfig) -> Result<(), String> {
        Ok(())
    }

    /// The HTTP methods this provider delivers with (POST for almost all; GoPay GETs).
    fn accepts_method(&self, method: &http::Method) -> bool {
        method == http::Method::POST
    }

    /// Fetch what verification needs from the network, before the synchronous
    /// [`Provider::verify_and_extract`] (PayPal's certificate). Bounded, and it never
    /// fails: verification reports what went wrong. `None` (the default): nothing to
    /// fetch.
    fn prepare<'a>(
        &'a self,
        _request: &'a WebhookRequest,
        _tenant: &'a TenantConfig,
        _now_secs: i64,
    ) -> Option<futures::future::BoxFuture<'a, ()>> {
        None
    }

    /// After [`Provider::verify_and_extract`] accepted a request and before its events
    /// are stored: keep what the verification established beyond the process
    /// (PayPal: a certificate that verified for the first time goes to the store, so
    /// a restart need not fetch it). Bounded, and it never fails: what goes wrong is
    /// logged and tried again after a later verification. `None` (the default):
    /// nothing to keep.
    fn verified<'a>(
        &'a self,
        _tenant: &'a TenantConfig,
    ) -> Option<futures::future::BoxFuture<'a, ()>> {
        None
    }

    /// Verify the request for `tenant` (its secrets, tolerance, options) at `now_secs`,
    /// then extract the envelope(s). Must not parse the body before the signature holds.
    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError>;

    /// Produce the headers that make `body` valid for `tenant` (first secret) at
    /// `now_secs`. Used by `einmal send`, the benchmarks and tests; `event_id` is used
    /// by providers that carry the id in a header.
    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError>;

    /// An endpoint-verification handshake (Slack `url_verification`): `Some` when the
    /// request is one and its signature holds, `None` when it is not one (then it goes
    /// through [`Provider::verify_and_extract`]). Runs before that, on every request of
    /// the provider, so it must be cheap to say `None`.
    fn handshake(
        &self,
        _request: &WebhookRequest,
        _tenant: &TenantConfig,
        _now_secs: i64,
    ) -> Result<Option<Handshake>, ProviderError> {
        Ok(None)
    }

    /// A plain-text success body the provider expects instead of our JSON (Adyen).
    fn accepted_body(&self) -> Option<&'static str> {
        None
    }

    /// Headers and body exactly as the provider would send `body`. Most providers sign
    /// in headers; those that sign inside the body (Adyen, Mailgun, Braintree) override.
    fn signed_request(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        now_secs: i64,
    ) -> Result<(http::HeaderMap, Bytes), ProviderError> {
        let headers = self.sign(body, tenant, event_id, now_secs)?;
        Ok((headers, Bytes::copy_from_slice(body)))
    }

    // Reconciliation.

    /// How `einmal reconcile` reads what this provider may not have told us; `None`
    /// (the default): the provider is not reconciled.
    fn reconcile(&self) -> Option<ReconcileSource> {
        None
    }
}

/// The providers reconciliation knows, in registry order.
pub fn reconciled() -> impl Iterator<Item = (&'static dyn Provider, ReconcileSource)> {
    all()
        .iter()
        .filter_map(|p| p.reconcile().map(|source| (*p, source)))
}

/// All providers einmal knows; the path segment is each one's `name()`.
static ALL: &[&dyn Provider] = &[
    &stripe::Stripe,
    &shopify::Shopify,
    &github::GitHub,
    &standard_webhooks::StandardWebhooks,
    // Issue 4 providers:
    &paddle::Paddle,
    &square::Square,
    &slack::Slack,
    &lemon_squeezy::LemonSqueezy,
    &klarna::Klarna,
    &mollie::Mollie,
    &twilio::Twilio,
    &woocommerce::WooCommerce,
    &braintree::Braintree,
    &gitlab::GitLab,
    &mailgun::Mailgun,
    &adyen::Adyen,
    &paypal::PayPal,
    &generic::GenericHmac,
    // Issue 28 providers:
    &razorpay::Razorpay,
    &paystack::Paystack,
    &worldline::Worldline,
    &coinbase_commerce::CoinbaseCommerce,
    &resend::Resend,
    &hubspot::HubSpot,
    &sendgrid::SendGrid,
    &zendesk::Zendesk,
    // Thin-event providers (hints; the processor fetches the state):
    &gopay::GoPay,
    &klarna_push::KlarnaPush,
];

/// All providers einmal knows, by path name.
pub fn all() -> &'static [&'static dyn Provider] {
    ALL
}

/// Look a provider up by its path segment.
pub fn lookup(name: &str) -> Option<&'static dyn Provider> {
    all().iter().copied().find(|p| p.name() == name)
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::{Provider, ProviderError};
    use crate::config::{Secret, TenantConfig};
    use crate::envelope::Envelope;
    use crate::request::WebhookRequest;

    /// Verify `request` as exactly one whole event (its stored body is the request's
    /// raw body) and return its envelope: the common assertion of the provider tests.
    pub(crate) fn verify_one(
        provider: &dyn Provider,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Envelope, ProviderError> {
        let mut events = provider.verify_and_extract(request, tenant, now_secs)?;
        assert_eq!(events.len(), 1, "one event per request");
        assert_eq!(events[0].body, request.body, "the whole raw body is stored");
        Ok(events.remove(0).envelope)
    }

    /// Tenant `acme` of `provider` with these secrets, 300 s tolerance, no options.
    pub(crate) fn tenant(provider: &str, secrets: &[&str]) -> TenantConfig {
        TenantConfig {
            provider: provider.into(),
            tenant: "acme".into(),
            secrets: secrets.iter().map(|s| Secret::new(*s)).collect(),
            tolerance_secs: 300,
            options: Default::default(),
        }
    }
}
