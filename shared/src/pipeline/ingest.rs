//! The ingest function: verify → validate → conditional put → enqueue → answer.
//!
//! The receiver Lambda and `einmal serve` both call [`Ingestor::ingest`]; only the
//! transport differs. What a provider sees (status code) follows from the
//! [`IngestError`] variant, decided here and nowhere else.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use thiserror::Error;

use crate::body;
use crate::config::{Config, IngestSettings, TenantConfig};
use crate::config_source::ConfigSource;
use crate::envelope::InboxKey;
use crate::pipeline::hint_limit::HintLimiter;
use crate::ports::{
    Inbox, InboxItem, InboxState, PutOutcome, Queue, QueueError, QueueMessage, Source, StoreError,
};
use crate::providers::{self, thin, Handshake, Provider, ProviderError, VerifiedEvent};
use crate::request::WebhookRequest;
use crate::retention;
use crate::telemetry::emf::{IntakeRecord, IntakeResult, UNKNOWN_PROVIDER};
use crate::telemetry::trace::TraceHeader;
use crate::telemetry::{redact, IngestMetrics};
use crate::time;

/// How long a `received` item may wait for its original request's queue send before a
/// duplicate re-enqueues it. Bounded by the receiver's own timeout: after that, the
/// first request has either sent the message or died.
pub const DEFAULT_INFLIGHT_GRACE_MS: i64 = 15_000;

#[derive(Debug, Error)]
pub enum IngestError {
    /// Unknown provider or tenant: one answer for both, so nothing about tenants leaks.
    #[error("not found")]
    NotFound,
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The tenant's hint intake limit (`max_hints_per_minute`) is spent.
    #[error("too many hints for this tenant; retry after {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },
    #[error("body exceeds the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("event body does not fit one inbox item even compressed ({stored} of {limit} bytes)")]
    StoredBodyTooLarge { stored: usize, limit: usize },
    #[error("{0}")]
    Unauthenticated(ProviderError),
    #[error("{0}")]
    Malformed(ProviderError),
    /// The signature could not be checked now (PayPal's certificate not fetched: fetch
    /// budget, host unreachable): 503 with `Retry-After`, so the provider retries;
    /// never 401, which would tell it the delivery was forged.
    #[error("signature cannot be checked now; retry after {retry_after_secs} s")]
    CannotVerifyNow { retry_after_secs: u64 },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Queue(#[from] QueueError),
    #[error("{0}")]
    Body(#[from] body::BodyError),
}

impl IngestError {
    pub fn status(&self) -> u16 {
        match self {
            IngestError::NotFound => 404,
            IngestError::MethodNotAllowed => 405,
            IngestError::RateLimited { .. } => 429,
            IngestError::BodyTooLarge { .. } | IngestError::StoredBodyTooLarge { .. } => 413,
            IngestError::Unauthenticated(_) => 401,
            IngestError::Malformed(_) => 400,
            // Retryable on our side: 503 makes the provider deliver again.
            IngestError::Store(_)
            | IngestError::Queue(_)
            | IngestError::Body(_)
            | IngestError::CannotVerifyNow { .. } => 503,
        }
    }

    /// A stable machine-readable code for the JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            IngestError::NotFound => "not_found",
            IngestError::MethodNotAllowed => "method_not_allowed",
            IngestError::RateLimited { .. } => "rate_limited",
            IngestError::BodyTooLarge { .. } | IngestError::StoredBodyTooLarge { .. } => {
                "payload_too_large"
            }
            IngestError::Unauthenticated(_) => "invalid_signature",
            IngestError::Malformed(_) => "malformed_request",
            IngestError::Store(_) | IngestError::Queue(_) | IngestError::Body(_) => "unavailable",
            IngestError::CannotVerifyNow { .. } => "verification_unavailable",
        }
    }

    /// The message shown to the caller. Storage details stay in our logs.
    fn public_message(&self) -> String {
        match self {
            IngestError::Store(_) | IngestError::Queue(_) | IngestError::Body(_) => {
                "temporarily unable to store the event; please retry".to_string()
            }
            other => other.to_string(),
        }
    }

    fn count(&self, metrics: &IngestMetrics) {
        let counter = match self {
            IngestError::NotFound | IngestError::MethodNotAllowed => &metrics.not_found,
            IngestError::RateLimited { .. } => &metrics.rate_limited,
            IngestError::BodyTooLarge { .. } | IngestError::StoredBodyTooLarge { .. } => {
                &metrics.oversize
            }
            IngestError::Unauthenticated(_) => &metrics.signature_failures,
            IngestError::Malformed(_) => &metrics.malformed,
            IngestError::Store(_)
            | IngestError::Queue(_)
            | IngestError::Body(_)
            | IngestError::CannotVerifyNow { .. } => &metrics.unavailable,
        };
        IngestMetrics::incr(counter);
    }

    /// The metric class of this error.
    fn intake_result(&self) -> IntakeResult {
        match self {
            IngestError::Unauthenticated(_) => IntakeResult::SignatureFailure,
            IngestError::Store(_)
            | IngestError::Queue(_)
            | IngestError::Body(_)
            | IngestError::CannotVerifyNow { .. } => IntakeResult::Unavailable,
            _ => IntakeResult::Rejected,
        }
    }
}

/// What an accepted request was: events (stored or duplicates), or a provider's
/// endpoint-verification handshake, answered without storing anything.
enum Intake {
    Events(Vec<EventOutcome>),
    Handshake(Handshake),
}

/// What happened to one event of an accepted request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventOutcome {
    pub key: InboxKey,
    pub event_id: String,
    pub duplicate: bool,
    /// A duplicate whose earlier enqueue was not confirmed was sent to the queue again.
    pub reenqueued: bool,
}

/// An HTTP-shaped answer every transport can send as is.
#[derive(Debug, Clone, PartialEq)]
pub struct IngestResponse {
    pub status: u16,
    pub body: serde_json::Value,
    /// A plain-text body some providers expect on success instead of JSON (Adyen's
    /// `[accepted]`); `body` keeps the JSON details for logs and tests.
    pub plain: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429, and the 503 of a signature that could
    /// not be checked now).
    pub retry_after_secs: Option<u64>,
}

impl IngestResponse {
    /// The one answer for unknown routes, providers and tenants.
    pub fn not_found() -> Self {
        IngestResponse::from_error(&IngestError::NotFound)
    }

    /// Content type and body text as the transport should send them.
    pub fn render(&self) -> (&'static str, String) {
        match self.plain {
            Some(text) => ("text/plain", text.to_string()),
            None => ("application/json", self.body.to_string()),
        }
    }

    fn from_error(err: &IngestError) -> Self {
        IngestResponse {
            plain: None,
            status: err.status(),
            body: json!({ "error": err.code(), "message": err.public_message() }),
            retry_after_secs: match err {
                IngestError::RateLimited { retry_after_secs }
                | IngestError::CannotVerifyNow { retry_after_secs } => Some(*retry_after_secs),
                _ => None,
            },
        }
    }

    fn from_outcomes(outcomes: &[EventOutcome]) -> Self {
        let body = match outcomes {
            [one] => json!({
                "status": "accepted",
                "event_id": one.event_id,
                "duplicate": one.duplicate,
            }),
            many => json!({
                "status": "accepted",
                "duplicate": many.iter().all(|o| o.duplicate),
                "events": many.iter().map(|o| json!({"event_id": o.event_id, "duplicate": o.duplicate})).collect::<Vec<_>>(),
            }),
        };
        IngestResponse {
            status: 200,
            body,
            plain: None,
            retry_after_secs: None,
        }
    }
}

type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

pub struct Ingestor {
    config: ConfigSource,
    inbox: Arc<dyn Inbox>,
    queue: Arc<dyn Queue>,
    metrics: Arc<IngestMetrics>,
    inflight_grace_ms: i64,
    now_ms: Clock,
    /// The configuration whose secrets the log redaction knows: its address, and the
    /// configuration itself (held, so the address cannot be reused by a newer one).
    redacting: AtomicUsize,
    redacted: std::sync::Mutex<Option<Arc<Config>>>,
    /// Per-tenant intake limit of thin hints (per process: see `hint_limit`).
    hints: HintLimiter,
    /// Providers used instead of the registered ones of the same name.
    providers: Vec<Arc<dyn Provider>>,
}

impl Ingestor {
    pub fn new(config: Arc<Config>, inbox: Arc<dyn Inbox>, queue: Arc<dyn Queue>) -> Self {
        Self::from_source(ConfigSource::fixed(config), inbox, queue)
    }

    /// Tenants from a source that may refresh itself (AWS: SSM with a TTL); the inbox and
    /// the queue from one backend store.
    pub fn from_store(config: ConfigSource, store: Arc<dyn crate::ports::InboxStore>) -> Self {
        Self::from_source(config, store.clone(), store)
    }

    /// Tenants from a source that may refresh itself (AWS: SSM with a TTL).
    pub fn from_source(config: ConfigSource, inbox: Arc<dyn Inbox>, queue: Arc<dyn Queue>) -> Self {
        Ingestor {
            config,
            inbox,
            queue,
            metrics: Arc::new(IngestMetrics::default()),
            inflight_grace_ms: DEFAULT_INFLIGHT_GRACE_MS,
            now_ms: Arc::new(time::now_millis),
            redacting: AtomicUsize::new(0),
            redacted: std::sync::Mutex::new(None),
            hints: HintLimiter::default(),
            providers: Vec::new(),
        }
    }

    /// Use `provider` instead of the registered provider of its name (tests: PayPal on
    /// a verifier of their own, restarted over the same store).
    pub fn with_provider(mut self, provider: Arc<dyn Provider>) -> Self {
        self.providers.retain(|p| p.name() != provider.name());
        self.providers.push(provider);
        self
    }

    /// The provider named `name`: an override, else the registered one.
    fn provider(&self, name: &str) -> Option<&dyn Provider> {
        match self.providers.iter().find(|p| p.name() == name) {
            Some(p) => Some(&**p),
            None => providers::lookup(name),
        }
    }

    pub fn with_inflight_grace_ms(mut self, grace_ms: i64) -> Self {
        self.inflight_grace_ms = grace_ms;
        self
    }

    /// Pin the clock (tests of tolerance windows and grace periods).
    pub fn with_clock(mut self, now_ms: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.now_ms = Arc::new(now_ms);
        self
    }

    pub fn metrics(&self) -> &Arc<IngestMetrics> {
        &self.metrics
    }

    /// The configuration as last loaded.
    pub fn config(&self) -> Arc<Config> {
        self.config.snapshot()
    }

    /// The answer for a body the transport refused to buffer because it exceeds `limit`.
    pub fn oversize(&self, limit: usize) -> IngestResponse {
        let err = IngestError::BodyTooLarge { limit };
        err.count(&self.metrics);
        IngestResponse::from_error(&err)
    }

    /// Handle one request for `/webhooks/{provider}/{tenant}` and produce the answer.
    pub async fn ingest(
        &self,
        provider: &str,
        tenant: &str,
        request: &WebhookRequest,
    ) -> IngestResponse {
        self.ingest_traced(provider, tenant, request, None).await.0
    }

    /// [`Ingestor::ingest`] under an X-Ray trace (its header goes with the queue
    /// message, its id into the log lines), also returning what the request counts for
    /// in the metrics (the receiver prints it as one EMF line).
    pub async fn ingest_traced(
        &self,
        provider: &str,
        tenant: &str,
        request: &WebhookRequest,
        trace: Option<&TraceHeader>,
    ) -> (IngestResponse, IntakeRecord) {
        let started = Instant::now();
        let known = self.provider(provider);
        let trace_id = trace.and_then(TraceHeader::root);
        let (response, result) = match self
            .try_ingest_traced(provider, tenant, request, trace)
            .await
        {
            Ok(Intake::Handshake(answer)) => {
                tracing::info!(provider, tenant, trace_id, "handshake answered");
                let response = IngestResponse {
                    status: 200,
                    body: json!({ "challenge": answer.challenge }),
                    plain: None,
                    retry_after_secs: None,
                };
                let result = IntakeResult::Accepted {
                    new: 0,
                    duplicates: 0,
                };
                (response, result)
            }
            Ok(Intake::Events(outcomes)) => {
                let duplicates = outcomes.iter().filter(|o| o.duplicate).count();
                let result = IntakeResult::Accepted {
                    new: u32::try_from(outcomes.len() - duplicates).unwrap_or(u32::MAX),
                    duplicates: u32::try_from(duplicates).unwrap_or(u32::MAX),
                };
                let response = IngestResponse {
                    plain: known.and_then(|p| p.accepted_body()),
                    ..IngestResponse::from_outcomes(&outcomes)
                };
                (response, result)
            }
            Err(err) => {
                err.count(&self.metrics);
                match &err {
                    IngestError::Store(_) | IngestError::Queue(_) | IngestError::Body(_) => {
                        tracing::error!(provider, tenant, trace_id, error = %err, "ingest unavailable")
                    }
                    _ => tracing::info!(
                        provider,
                        tenant,
                        trace_id,
                        status = err.status(),
                        reason = err.code(),
                        "webhook rejected"
                    ),
                }
                (IngestResponse::from_error(&err), err.intake_result())
            }
        };
        let record = IntakeRecord {
            provider: known.map_or(UNKNOWN_PROVIDER, |p| p.name()),
            result,
            ack_ms: started.elapsed().as_secs_f64() * 1000.0,
        };
        (response, record)
    }

    /// The ingest steps with typed errors. Nothing is written before every event of the
    /// request has been verified and checked against the size limits.
    pub async fn try_ingest(
        &self,
        provider_name: &str,
        tenant_name: &str,
        request: &WebhookRequest,
    ) -> Result<Vec<EventOutcome>, IngestError> {
        let intake = self
            .try_ingest_traced(provider_name, tenant_name, request, None)
            .await?;
        Ok(match intake {
            Intake::Events(outcomes) => outcomes,
            // Answered, nothing stored.
            Intake::Handshake(_) => Vec::new(),
        })
    }

    async fn try_ingest_traced(
        &self,
        provider_name: &str,
        tenant_name: &str,
        request: &WebhookRequest,
        trace: Option<&TraceHeader>,
    ) -> Result<Intake, IngestError> {
        let provider = self.provider(provider_name).ok_or(IngestError::NotFound)?;
        let config = self.config.current().await;
        self.redact_secrets_of(&config);
        let tenant = config
            .tenant(provider_name, tenant_name)
            .ok_or(IngestError::NotFound)?;
        // A third path segment only for a provider that authenticates by one:
        // otherwise `/webhooks/stripe/demo/anything` would alias the tenant's endpoint.
        // (A token-URL provider's tenant without a token answers 401 when verified.)
        if request.path_token.is_some()
            && !provider.options().contains(&thin::PATH_TOKEN_OPTION)
            && tenant.option(thin::PATH_TOKEN_OPTION).is_none()
        {
            return Err(IngestError::NotFound);
        }
        if !provider.accepts_method(&request.method) {
            return Err(IngestError::MethodNotAllowed);
        }
        let limit = config.ingest.max_body_bytes;
        if request.body.len() > limit {
            return Err(IngestError::BodyTooLarge { limit });
        }
        let now_ms = (self.now_ms)();
        let handshake = provider
            .handshake(request, tenant, now_ms / 1000)
            .map_err(classify)?;
        if let Some(answer) = handshake {
            return Ok(Intake::Handshake(answer));
        }
        // Network prerequisites of the signature check (PayPal's certificate), bounded.
        if let Some(prepared) = provider.prepare(request, tenant, now_ms / 1000) {
            prepared.await;
        }
        let events = verify(provider, request, tenant, now_ms / 1000)?;
        // What the verification established that outlives the process (PayPal's
        // certificate), kept before the answer: a Lambda may be frozen right after it.
        if let Some(kept) = provider.verified(tenant) {
            kept.await;
        }
        let items = events
            .into_iter()
            .map(|event| inbox_item(&config.ingest, event, now_ms))
            .collect::<Result<Vec<_>, _>>()?;

        // Hints are limited per tenant before anything is stored (at most one a request).
        let is_hint = |item: &InboxItem| item.envelope.event_type.starts_with(thin::HINT_PREFIX);
        if items.iter().any(is_hint) {
            self.hints
                .take(tenant, now_ms)
                .map_err(|retry_after_secs| IngestError::RateLimited { retry_after_secs })?;
        }
        let mut outcomes = Vec::with_capacity(items.len());
        for item in &items {
            let outcome = self.store_and_enqueue(item, now_ms, trace).await;
            if is_hint(item)
                && !matches!(
                    outcome,
                    Ok(EventOutcome {
                        duplicate: false,
                        ..
                    })
                )
            {
                // Nothing new stored (a retry within the hint's minute, or a failure).
                self.hints.give_back(tenant);
            }
            outcomes.push(outcome?);
        }
        Ok(Intake::Events(outcomes))
    }

    /// Teach the log redaction this configuration's secrets, once per loaded
    /// configuration (a refresh brings rotated secrets): one pointer comparison per
    /// request otherwise.
    fn redact_secrets_of(&self, config: &Arc<Config>) {
        let address = Arc::as_ptr(config) as usize;
        if self.redacting.load(Ordering::Acquire) == address {
            return;
        }
        let mut held = self.redacted.lock().unwrap_or_else(|p| p.into_inner());
        if !held.as_ref().is_some_and(|c| Arc::ptr_eq(c, config)) {
            redact::register_config(config);
            *held = Some(config.clone());
            self.redacting.store(address, Ordering::Release);
        }
    }

    /// New event: put + send (two sequential calls). Duplicate: the put alone, plus a
    /// send when the stored item's enqueue was never confirmed (closes the dual write).
    async fn store_and_enqueue(
        &self,
        item: &InboxItem,
        now_ms: i64,
        trace: Option<&TraceHeader>,
    ) -> Result<EventOutcome, IngestError> {
        let env = &item.envelope;
        let trace_id = trace.and_then(TraceHeader::root);
        let outcome = |duplicate, reenqueued| EventOutcome {
            key: item.key.clone(),
            event_id: env.event_id.clone(),
            duplicate,
            reenqueued,
        };
        match self.inbox.put_new(item).await? {
            PutOutcome::Inserted => {
                self.enqueue(item, true, trace).await?;
                IngestMetrics::incr(&self.metrics.accepted);
                tracing::info!(
                    provider = %env.provider, tenant = %env.tenant, event_id = %env.event_id,
                    event_type = %env.event_type, object_id = env.object_id.as_deref(),
                    delivery_id = env.delivery_id.as_deref(), state = "received", trace_id,
                    "webhook accepted"
                );
                Ok(outcome(false, false))
            }
            PutOutcome::Restored(existing) => {
                // Stored before but never acknowledged, and without its body until now:
                // its pointer goes out like a new event's (the pointer alone, so the
                // processor reads the item as it is now).
                IngestMetrics::incr(&self.metrics.duplicates);
                self.enqueue(item, false, trace).await?;
                IngestMetrics::incr(&self.metrics.reenqueued);
                tracing::warn!(
                    provider = %env.provider, tenant = %env.tenant, event_id = %env.event_id,
                    object_id = env.object_id.as_deref(), delivery_id = env.delivery_id.as_deref(),
                    state = %existing.state, trace_id, "duplicate webhook stored the missing body"
                );
                Ok(outcome(true, true))
            }
            PutOutcome::Duplicate(existing) => {
                IngestMetrics::incr(&self.metrics.duplicates);
                let unconfirmed = existing.state == InboxState::Received
                    && (existing.enqueue_failed
                        || now_ms - existing.received_at_ms >= self.inflight_grace_ms);
                if unconfirmed {
                    // The pointer alone: the processor reads the stored item.
                    self.enqueue(item, false, trace).await?;
                    IngestMetrics::incr(&self.metrics.reenqueued);
                }
                tracing::info!(
                    provider = %env.provider, tenant = %env.tenant, event_id = %env.event_id,
                    object_id = env.object_id.as_deref(), delivery_id = env.delivery_id.as_deref(),
                    state = %existing.state, reenqueued = unconfirmed, trace_id, "duplicate webhook"
                );
                Ok(outcome(true, unconfirmed))
            }
        }
    }

    /// Send `item`'s message: with the item itself when it was just stored (`carry`:
    /// a queue that can carry it spares the processor a read), else the pointer.
    async fn enqueue(
        &self,
        item: &InboxItem,
        carry: bool,
        trace: Option<&TraceHeader>,
    ) -> Result<(), IngestError> {
        let key = &item.key;
        let header = trace.map(TraceHeader::as_str);
        let sent = if carry {
            self.queue.send_item(item, header).await
        } else {
            let message = QueueMessage { pk: key.clone() };
            self.queue.send_traced(&message, header).await
        };
        if let Err(send_err) = sent {
            // Best effort: lets the provider's retry re-enqueue at once instead of
            // after the grace period. The 503 goes out either way.
            if let Err(mark_err) = self.inbox.mark_enqueue_failed(key).await {
                tracing::warn!(pk = %key, error = %mark_err, "could not record the failed enqueue");
            }
            return Err(send_err.into());
        }
        Ok(())
    }

    /// Store one event fetched from the provider's authenticated API (reconciliation)
    /// through the same conditional put + enqueue as a webhook, marked
    /// [`Source::Reconcile`]. No signature: the data came from the API, not a request.
    /// An event the inbox already holds is a duplicate and changes nothing.
    pub async fn ingest_reconciled(
        &self,
        envelope: crate::envelope::Envelope,
        body: bytes::Bytes,
    ) -> Result<EventOutcome, IngestError> {
        let config = self.config.current().await;
        self.redact_secrets_of(&config);
        if config
            .tenant(&envelope.provider, &envelope.tenant)
            .is_none()
        {
            return Err(IngestError::NotFound);
        }
        let limit = config.ingest.max_body_bytes;
        if body.len() > limit {
            return Err(IngestError::BodyTooLarge { limit });
        }
        check_identifiers(&envelope)?;
        let now_ms = (self.now_ms)();
        let event = VerifiedEvent { envelope, body };
        let mut item = inbox_item(&config.ingest, event, now_ms)?;
        item.source = Source::Reconcile;
        self.store_and_enqueue(&item, now_ms, TraceHeader::from_env().as_ref())
            .await
    }
}

/// 401 for what could not be authenticated, 400 for authentic but malformed requests,
/// 503 for what could not be checked now.
fn classify(err: ProviderError) -> IngestError {
    if let ProviderError::CannotVerifyNow { retry_after_secs } = err {
        IngestError::CannotVerifyNow { retry_after_secs }
    } else if err.is_authentication_failure() {
        IngestError::Unauthenticated(err)
    } else {
        IngestError::Malformed(err)
    }
}

fn verify(
    provider: &dyn Provider,
    request: &WebhookRequest,
    tenant: &TenantConfig,
    now_secs: i64,
) -> Result<Vec<VerifiedEvent>, IngestError> {
    let events = provider
        .verify_and_extract(request, tenant, now_secs)
        .map_err(classify)?;
    if events.is_empty() {
        return Err(IngestError::Malformed(ProviderError::MalformedPayload(
            "the request carries no event".to_string(),
        )));
    }
    for event in &events {
        check_identifiers(&event.envelope)?;
    }
    Ok(events)
}

/// An event type or id with a control or format character (ESC, BEL, a bidi override,
/// a zero-width space) is refused (400) before anything is stored: the CLI prints
/// both, and they would act on or disguise the operator's terminal (`crate::text`).
fn check_identifiers(envelope: &crate::envelope::Envelope) -> Result<(), IngestError> {
    crate::text::check_identifier("event type", &envelope.event_type)
        .and_then(|()| crate::text::check_identifier("event id", &envelope.event_id))
        .map_err(|reason| IngestError::Malformed(ProviderError::MalformedPayload(reason)))
}

/// The inbox item for one verified event: compressed body, retention, state `received`.
fn inbox_item(
    settings: &IngestSettings,
    event: VerifiedEvent,
    now_ms: i64,
) -> Result<InboxItem, IngestError> {
    let compressed = body::compress(&event.body)?;
    let limit = settings.max_stored_body_bytes;

    if compressed.len() > limit {
        return Err(IngestError::StoredBodyTooLarge {
            stored: compressed.len(),
            limit,
        });
    }
    let days = retention::retention_days(&event.envelope.provider, settings.retention_days);
    let retention_secs = i64::from(days) * 86_400;
    Ok(InboxItem {
        key: event.envelope.key(),
        envelope: event.envelope,
        state: InboxState::Received,
        source: Source::Webhook,
        attempts: 0,
        received_at_ms: now_ms,
        updated_at_ms: now_ms,
        expires_at: now_ms / 1000 + retention_secs,
        enqueue_failed: false,
        last_error: None,
        last_error_class: None,
        lease_until_ms: None,
        lease_owner: None,
        result: None,
        body_encoding: body::BODY_ENCODING.to_string(),
        body_len: event.body.len() as u64,
        body: compressed,
        waiting: None,
        deliveries: Vec::new(),
        relay_due_ms: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_that_cannot_be_checked_now_is_503_with_retry_after_never_401() {
        let err = classify(ProviderError::CannotVerifyNow {
            retry_after_secs: 6,
        });
        assert_eq!(err.status(), 503);
        assert_eq!(err.code(), "verification_unavailable");
        assert_eq!(err.intake_result(), IntakeResult::Unavailable);
        let response = IngestResponse::from_error(&err);
        assert_eq!(response.retry_after_secs, Some(6));
        assert_eq!(response.body["error"], "verification_unavailable");
        // What was checked and failed stays 401.
        let forged = classify(ProviderError::SignatureMismatch);
        assert_eq!(forged.status(), 401);
        assert_eq!(IngestResponse::from_error(&forged).retry_after_secs, None);
    }
}
