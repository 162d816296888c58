//! Reconciliation: pull recent events from the provider's API since a stored
//! checkpoint and ingest what the inbox lacks, through the normal ingest path
//! ([`Ingestor::ingest_reconciled`]: the same conditional put + enqueue, marked
//! `source = reconcile`). A missed webhook is found here; an event the inbox already
//! holds is a duplicate of the put and changes nothing (design invariant 8).
//!
//! # Requests per provider
//!
//! | provider  | request | auth |
//! |-----------|---------|------|
//! | `stripe`  | `GET {api_base}/v1/events?created[gte]={checkpoint}&limit=100[&starting_after=…]`, paged through `has_more` | `Authorization: Bearer {api_key}` |
//! | `shopify` | `GET {api_base}/admin/api/2024-10/orders.json?updated_at_min={checkpoint}&status=any&limit=250`, paged through `Link: <…>; rel="next"` | `X-Shopify-Access-Token: {access_token}` |
//!
//! | `mollie`  | `GET {api_base}/v2/payments?limit=250`, newest first, paged through `_links.next` (the `from` cursor) | `Authorization: Bearer {api_key}` |
//! | `gopay`, `klarna-push` | no list API: one resource lookup per watched payment ([`crate::lookup`]) | as the processor's lookup |
//!
//! `api_base` defaults to `https://api.stripe.com`, `https://{shop_domain}` and the
//! lookup defaults (`https://api.mollie.com`, …).
//! Credentials are tenant options and may be `env:VAR` (see [`crate::lookup`]); a
//! tenant without its credential option is not reconciled. Credentials are never
//! logged.
//!
//! Each Stripe event object is exactly the webhook body Stripe would have sent, so its
//! envelope comes from the provider module's own extraction
//! ([`crate::providers::stripe::envelope_from_body`]) and its event id dedups against
//! the webhook. Shopify has no event list: each order becomes an `orders/updated` event
//! with event id `{shop}:orders/updated:reconcile-{order id}-{updated_at}` and the
//! order JSON as body. The id is stable per order *version*: re-running finds the same
//! ids (no duplicates), and only a newer `updated_at` yields a new event, which the
//! domain's version check orders against the webhooks.
//!
//! The listed order is the full order, so an order the business has not created from
//! Shopify (no `order` record, or one a payment provider opened, without
//! `shopify_created`) is also ingested as an `orders/create` with event id
//! `{shop}:orders/create:reconcile-{order id}` (one per order, whatever its version):
//! its `orders/create` webhook may never come, and an update alone would wait for it
//! forever. The domain applies the create once (`#created`, stock `#stock#{sku}`), so
//! a late real `orders/create`, before or after it, changes nothing; the version is
//! still the newest snapshot's, because the `orders/updated` of the listed version is
//! ingested too. Known orders get only the update. The check reads the business
//! store (the checkpoint's [`StateStore`] when none is given), one batch of at most
//! 100 keys per 100 listed orders.
//!
//! # Every page is read, or the run fails
//!
//! A page request that answers 5xx, 429 or 408, times out ([`REQUEST_TIMEOUT`]) or
//! cannot connect is retried: [`PAGE_ATTEMPTS`] attempts, pausing 250 ms, 500 ms, 1 s
//! between them. A page that still fails, a 401/403 (the message names the tenant
//! option holding the credential), another 4xx, or a `next` link (Shopify `Link`,
//! Mollie `_links.next`) to another host than the API base (not followed, so the token
//! never leaves it) fails the run with [`ReconcileError::Page`], naming the call
//! (`GET {url without query} (page n)`) and the reason; the checkpoint is not moved
//! past pages that were not read.
//!
//! # Thin providers: payment status (Mollie classic, GoPay, Klarna push)
//!
//! Their webhooks are hints without state, so what can be missed is a *status change*.
//! A run finds the payments whose final state at the provider (paid; failed, canceled,
//! expired; read as the reference domain reads them) our business state does not show,
//! and ingests a hint for each through the normal path (`source = reconcile`): the
//! same `hint.{kind}` envelope and `{id}:hint:{minute}` event id as a webhook
//! (`providers::thin`), so a real hint of the same minute is a duplicate, and a later
//! one is one more hint whose effect the domain's keys (order + action) keep single.
//! The processor then fetches the state and applies it exactly once. "Does not show"
//! means: for paid, the order is missing or not paid; for a failure, the order is
//! missing or neither paid nor failed. Payments that are not final, or that name no
//! order, change nothing.
//!
//! - **Mollie** lists payments: newest first, until a page reaches one created before
//!   the checkpoint. Each listed payment is compared with our order.
//! - **GoPay, Klarna push** have no list API. The payments we know about are the ones
//!   their hints named: the tenant's hint items received since the checkpoint, oldest
//!   first, at most [`MAX_WATCHED_ITEMS`] per run (when a run reads that many, the
//!   checkpoint stops at the last one read). A resource is looked up (one API call)
//!   when none of its hints completed (a final state was applied), none is still in
//!   processing, and at least one ended `ignored` (fetched, not final yet).
//!   Dead-lettered hints are left to the DLQ and replay. A payment never announced by
//!   any hint is not known here; the domain has no record of it either. The hints come
//!   from [`InboxHints`], an index that holds only these providers' hints: on DynamoDB
//!   a Query on the sparse, KEYS_ONLY GSI `by_hint` (hash `hint_scope` =
//!   `{provider}#{tenant}`, set at put time; range `received_at_ms`) plus a
//!   BatchGetItem of the state and object id, never a Scan, so a run costs what the
//!   tenant's recent hints cost, not what the table holds; on SQLite a partial index.
//! - The checkpoint becomes the oldest point that may still change: the oldest open
//!   payment (Mollie `createdAt`; GoPay/Klarna: the first hint of a payment still open
//!   or still in processing), at most the newest `createdAt` seen (Mollie) / now minus
//!   the overlap; never backwards. A payment that stays open keeps it from passing.
//! - Each such payment is a [`Difference`] (`provider_status` is the provider's own
//!   word: `paid`, `PAID`, `CAPTURED`, `canceled`, …), reported with or without a
//!   business store given (the decision needs one: without it, the checkpoint's
//!   [`StateStore`] is read, which is the business store in every deployment).
//!   `already_present` counts payments already in sync, and those whose hint of this
//!   minute the inbox already held (the next run looks again).
//! - A lookup or list error fails the tenant's run (checkpoint unchanged).
//!
//! # Differences
//!
//! Given the business [`StateStore`] ([`Reconciler::run_with`]), a run also compares
//! what the provider says with our `order` records for the objects it saw: the newest
//! state of each Stripe `payment_intent` (order from `metadata.order_id`) and each
//! Shopify order. When the provider says paid (`status = succeeded` /
//! `financial_status = paid`) and our order is missing or not paid, the report lists a
//! [`Difference`]; `our_status` is `missing`, the order's `payment_status`, or
//! `pending processing` when this run just ingested an event of the object (the
//! processor has not applied it yet).
//!
//! # Checkpoint
//!
//! Stored in the [`StateStore`] as the record `{tenant}#checkpoint#{provider}` with
//! `data = {"since": <unix secs>, "since_rfc3339": …}`. A first run starts at now − 3
//! days. After a *successful* run it becomes the newest `created`/`updated_at` seen
//! minus a 5-minute overlap (never moving backwards); any API, ingest or store error
//! leaves it where it was, so the next run covers the same window again.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::json;
use serde_json::value::RawValue;
use thiserror::Error;

use crate::audit::AuditRecord;
use crate::config::TenantConfig;
use crate::domain::reference::{order_key, Order, PaymentStatus};
use crate::domain::state::{CommitOutcome, StateKey, StateRecord, StateStore, StateWrite};
use crate::envelope::Envelope;
use crate::lookup::{classify_status, HttpLookup, LookupError, ResourceLookup, API_BASE_OPTION};
use crate::pipeline::ingest::{IngestError, Ingestor};
use crate::ports::{InboxHints, InboxState, StoreError};
use crate::providers::sig::{format_rfc3339, parse_rfc3339};
use crate::providers::{stripe, thin};
use crate::time;

/// Kind of the checkpoint records in the state store (id = provider).
pub const CHECKPOINT_KIND: &str = "checkpoint";
/// Where a tenant without a checkpoint starts: now minus this.
pub const DEFAULT_LOOKBACK_SECS: i64 = 3 * 86_400;
/// Subtracted from the newest timestamp seen, against events created late or with
/// clock skew.
pub const DEFAULT_OVERLAP_SECS: i64 = 5 * 60;
/// Timeout of one API page request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts per page: a 5xx, 429, timeout or connection failure is retried up to
/// `PAGE_ATTEMPTS - 1` times, after [`PAGE_RETRY_BASE`], then twice that, ... (250 ms,
/// 500 ms, 1 s: at most 1.75 s of waiting plus the attempts' timeouts per page) before
/// the run fails.
pub const PAGE_ATTEMPTS: u32 = 4;
/// First pause before a page is asked for again.
pub const PAGE_RETRY_BASE: Duration = Duration::from_millis(250);
/// Largest accepted page.
pub const MAX_PAGE_BYTES: usize = 8 * 1024 * 1024;
/// A run stops with an error (checkpoint not advanced) after this many pages.
pub const MAX_PAGES: usize = 1_000;
/// Providers reconciliation knows.
pub const PROVIDERS: [&str; 5] = ["stripe", "shopify", "mollie", "gopay", "klarna-push"];
/// The thin-event providers among them (payment status, see the module docs).
pub const THIN_PROVIDERS: [&str; 3] = ["mollie", "gopay", "klarna-push"];
/// Page size of Mollie's `GET /v2/payments` (its maximum).
pub const MOLLIE_PAGE_SIZE: usize = 250;
/// Most hint items read per GoPay / Klarna push tenant and run, oldest first from the
/// checkpoint; when a run reads this many, the checkpoint stops at the last one read
/// and the next run goes on from there.
pub const MAX_WATCHED_ITEMS: usize = 2_000;

const SHOPIFY_API_VERSION: &str = "2024-10";

#[derive(Debug, Error)]
pub enum ReconcileError {
    #[error("{0}")]
    Api(#[from] LookupError),
    /// A page of a provider's list was not read (API error after the retries, or a
    /// `next` link that is not followed): the run fails and keeps its checkpoint.
    #[error("{call}: {reason}")]
    Page { call: String, reason: String },
    #[error("provider API answered an unexpected body: {0}")]
    Payload(String),
    #[error("{0}")]
    Config(String),
    #[error("ingest failed: {0}")]
    Ingest(#[from] IngestError),
    #[error("checkpoint store failed: {0}")]
    Store(#[from] StoreError),
}

/// Which tenants to reconcile and from when.
#[derive(Debug, Clone, Default)]
pub struct ReconcileOptions {
    pub provider: Option<String>,
    pub tenant: Option<String>,
    /// Start here (unix secs) instead of the stored checkpoint.
    pub since: Option<i64>,
}

/// The result for one provider/tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantReport {
    pub provider: String,
    pub tenant: String,
    /// The start of the window read (RFC 3339).
    pub since: String,
    /// Events (Stripe), order versions (Shopify: plus one `orders/create` per listed
    /// order the business has not created) or payments (thin providers) read from the
    /// API.
    pub fetched: usize,
    /// Of those, already in the inbox (a webhook or an earlier run brought them);
    /// thin providers: already in sync with our order (see the module docs).
    pub already_present: usize,
    /// Of those, missing from the inbox and ingested now (`source = reconcile`); thin
    /// providers: the hints ingested now.
    pub ingested: usize,
    /// The checkpoint stored after the run (RFC 3339); `None` when the run failed.
    pub checkpoint: Option<String>,
    /// Why the run failed; the checkpoint was not advanced.
    pub error: Option<String>,
    /// Inbox keys of the events ingested now.
    #[serde(default)]
    pub ingested_events: Vec<String>,
    /// Provider says paid, our order is not (Stripe/Shopify: computed only with a
    /// business state store, see [`Reconciler::run_with`]; thin providers: always, one
    /// per payment a hint was ingested or is due for).
    #[serde(default)]
    pub differences: Vec<Difference>,
}

/// `our_status` of an object whose event this run just ingested.
pub const PENDING_PROCESSING: &str = "pending processing";
/// `our_status` of an order we have no record of.
pub const MISSING: &str = "missing";

/// The provider says an object is paid (thin providers: or finally failed); our order
/// says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Difference {
    pub provider: String,
    pub tenant: String,
    /// Payment intent id (Stripe), order id (Shopify), payment / order id (thin).
    pub object_id: String,
    pub order_id: String,
    /// `succeeded` (Stripe) / `paid` (Shopify) / the thin provider's status.
    pub provider_status: String,
    /// [`MISSING`], [`PENDING_PROCESSING`] or the order's `payment_status`.
    pub our_status: String,
}

/// The newest provider state of one object seen by a run.
struct Observed {
    order_id: String,
    status: String,
    paid: bool,
    ingested_now: bool,
}

type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;
type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;
type HttpsConnector = hyper_rustls::HttpsConnector<HttpConnector>;

/// Reads provider APIs and feeds the ingestor; checkpoints live in the state store.
pub struct Reconciler {
    ingestor: Arc<Ingestor>,
    state: Arc<dyn StateStore>,
    client: Client<HttpsConnector, Empty<Bytes>>,
    env: EnvLookup,
    now_secs: Clock,
    overlap_secs: i64,
    /// Fetches one payment / order of a thin provider (as the processor does).
    lookup: Arc<dyn ResourceLookup>,
    /// Where GoPay / Klarna push find the payments they watch: the inbox's hint index
    /// (see the module docs).
    hints: Option<Arc<dyn InboxHints>>,
    /// Timeout of one page request ([`REQUEST_TIMEOUT`]).
    request_timeout: Duration,
    /// First pause before a failed page is asked for again ([`PAGE_RETRY_BASE`]).
    retry_base: Duration,
}

/// One fetched event, ready for the ingestor.
struct Fetched {
    envelope: Envelope,
    body: Bytes,
    /// `created` / `updated_at` (unix secs).
    at: i64,
}

impl Reconciler {
    pub fn new(ingestor: Arc<Ingestor>, state: Arc<dyn StateStore>) -> Self {
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let builder = match hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider.clone())
        {
            Ok(builder) => builder,
            Err(e) => {
                tracing::warn!(error = %e, "no root certificates: HTTPS reconciliation will fail");
                let tls = rustls::ClientConfig::builder_with_provider(provider.into())
                    .with_safe_default_protocol_versions()
                    .expect("the default provider supports the default protocol versions")
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls)
            }
        };
        let https = builder.https_or_http().enable_http1().build();
        Reconciler {
            ingestor,
            state,
            client: Client::builder(TokioExecutor::new()).build(https),
            env: Arc::new(|var| std::env::var(var).ok()),
            now_secs: Arc::new(time::now_secs),
            overlap_secs: DEFAULT_OVERLAP_SECS,
            lookup: Arc::new(HttpLookup::new()),
            hints: None,
            request_timeout: REQUEST_TIMEOUT,
            retry_base: PAGE_RETRY_BASE,
        }
    }

    /// Replace the page timeout and the first retry pause (tests).
    pub fn with_page_timing(mut self, request_timeout: Duration, retry_base: Duration) -> Self {
        self.request_timeout = request_timeout;
        self.retry_base = retry_base;
        self
    }

    /// The inbox's hint index, where the hints of GoPay and Klarna push tenants are
    /// found; without it their reconciliation fails with a configuration error.
    pub fn with_hints(mut self, hints: Arc<dyn InboxHints>) -> Self {
        self.hints = Some(hints);
        self
    }

    /// Replace the resource lookup of the thin providers (default: [`HttpLookup`]).
    pub fn with_lookup(mut self, lookup: Arc<dyn ResourceLookup>) -> Self {
        self.lookup = lookup;
        self
    }

    /// Pin the clock (tests).
    pub fn with_clock(mut self, now_secs: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.now_secs = Arc::new(now_secs);
        self
    }

    pub fn with_overlap_secs(mut self, secs: i64) -> Self {
        self.overlap_secs = secs;
        self
    }

    /// Every selected tenant with its credential configured; one tenant's failure is
    /// reported and does not stop the others.
    pub async fn run(
        &self,
        options: &ReconcileOptions,
    ) -> Result<Vec<TenantReport>, ReconcileError> {
        self.run_with(options, None).await
    }

    /// [`Self::run`], and with `business` the differences between provider state and
    /// our `order` records (`None`: none computed).
    pub async fn run_with(
        &self,
        options: &ReconcileOptions,
        business: Option<&dyn StateStore>,
    ) -> Result<Vec<TenantReport>, ReconcileError> {
        let config = self.ingestor.config();
        if let Some(p) = options.provider.as_deref() {
            if !PROVIDERS.contains(&p) {
                return Err(ReconcileError::Config(format!(
                    "reconciliation supports {}; not {p}",
                    PROVIDERS.join(", ")
                )));
            }
        }
        let explicit = options.provider.is_some() && options.tenant.is_some();
        let mut reports = Vec::new();
        for tenant in config.tenants() {
            if !PROVIDERS.contains(&tenant.provider.as_str())
                || options
                    .provider
                    .as_deref()
                    .is_some_and(|p| p != tenant.provider)
                || options
                    .tenant
                    .as_deref()
                    .is_some_and(|t| t != tenant.tenant)
                || (!explicit && tenant.option(credential_option(&tenant.provider)).is_none())
            {
                continue;
            }
            reports.push(self.report_with(tenant, options.since, business).await);
        }
        if explicit && reports.is_empty() {
            return Err(ReconcileError::Config("no such provider/tenant".into()));
        }
        Ok(reports)
    }

    /// [`Self::reconcile_tenant`] with the error folded into the report.
    pub async fn report(&self, tenant: &TenantConfig, since: Option<i64>) -> TenantReport {
        self.report_with(tenant, since, None).await
    }

    /// [`Self::reconcile_tenant_with`] with the error folded into the report.
    pub async fn report_with(
        &self,
        tenant: &TenantConfig,
        since: Option<i64>,
        business: Option<&dyn StateStore>,
    ) -> TenantReport {
        match self.reconcile_tenant_with(tenant, since, business).await {
            Ok(report) => report,
            Err(err) => {
                tracing::warn!(provider = %tenant.provider, tenant = %tenant.tenant, error = %err, "reconciliation failed");
                let since = match since {
                    Some(s) => Ok(s),
                    None => self.checkpoint(tenant).await.map(|(s, _)| s),
                };
                TenantReport {
                    provider: tenant.provider.clone(),
                    tenant: tenant.tenant.clone(),
                    since: since.map(format_rfc3339).unwrap_or_default(),
                    fetched: 0,
                    already_present: 0,
                    ingested: 0,
                    checkpoint: None,
                    error: Some(err.to_string()),
                    ingested_events: Vec::new(),
                    differences: Vec::new(),
                }
            }
        }
    }

    /// One provider/tenant: fetch everything since the checkpoint (or `since`), ingest
    /// each event, then advance the checkpoint. Any error returns before the advance.
    pub async fn reconcile_tenant(
        &self,
        tenant: &TenantConfig,
        since: Option<i64>,
    ) -> Result<TenantReport, ReconcileError> {
        self.reconcile_tenant_with(tenant, since, None).await
    }

    /// [`Self::reconcile_tenant`], plus the differences against `business` (if given).
    pub async fn reconcile_tenant_with(
        &self,
        tenant: &TenantConfig,
        since: Option<i64>,
        business: Option<&dyn StateStore>,
    ) -> Result<TenantReport, ReconcileError> {
        let (stored, record) = self.checkpoint(tenant).await?;
        let start = since.unwrap_or(stored);
        if THIN_PROVIDERS.contains(&tenant.provider.as_str()) {
            return self
                .reconcile_thin(tenant, start, stored, record, business)
                .await;
        }
        let mut fetched = match tenant.provider.as_str() {
            "stripe" => self.fetch_stripe(tenant, start).await?,
            "shopify" => {
                let orders = business.unwrap_or(self.state.as_ref());
                self.fetch_shopify(tenant, start, orders).await?
            }
            other => {
                return Err(ReconcileError::Config(format!(
                    "reconciliation does not support {other}"
                )))
            }
        };
        // Oldest first, as the webhooks would have come.
        fetched.sort_by_key(|f| f.at);
        let mut report = TenantReport {
            provider: tenant.provider.clone(),
            tenant: tenant.tenant.clone(),
            since: format_rfc3339(start),
            fetched: fetched.len(),
            already_present: 0,
            ingested: 0,
            checkpoint: None,
            error: None,
            ingested_events: Vec::new(),
            differences: Vec::new(),
        };
        let mut newest = None::<i64>;
        let mut observed: std::collections::BTreeMap<String, Observed> = Default::default();
        for event in fetched {
            newest = newest.max(Some(event.at));
            let seen = business.and_then(|_| observe(&event));
            let outcome = self
                .ingestor
                .ingest_reconciled(event.envelope, event.body)
                .await?;
            if let Some((object_id, mut seen)) = seen {
                // Oldest first: the newest state wins; "just ingested" sticks.
                seen.ingested_now =
                    !outcome.duplicate || observed.get(&object_id).is_some_and(|o| o.ingested_now);
                observed.insert(object_id, seen);
            }
            if outcome.duplicate {
                report.already_present += 1;
            } else {
                report.ingested += 1;
                report.ingested_events.push(outcome.key.as_str().to_owned());
                tracing::info!(
                    provider = %tenant.provider, tenant = %tenant.tenant,
                    event_id = %outcome.event_id, "reconciliation ingested a missing event"
                );
            }
        }
        let next = newest.map_or(stored, |n| (n - self.overlap_secs).max(stored));
        if next > stored || !record.exists() {
            self.store_checkpoint(record, next).await?;
        }
        report.checkpoint = Some(format_rfc3339(next.max(stored)));
        if let Some(business) = business {
            report.differences = differences(business, tenant, observed).await?;
        }
        Ok(report)
    }

    /// The stored checkpoint (unix secs), or now − 3 days, with its record.
    pub async fn checkpoint(
        &self,
        tenant: &TenantConfig,
    ) -> Result<(i64, StateRecord), StoreError> {
        let key = checkpoint_key(tenant);
        let record = self.state.load(std::slice::from_ref(&key)).await?.remove(0);
        let since = record.data.get("since").and_then(serde_json::Value::as_i64);
        let since = since.unwrap_or_else(|| (self.now_secs)() - DEFAULT_LOOKBACK_SECS);
        Ok((since, record))
    }

    async fn store_checkpoint(
        &self,
        record: StateRecord,
        since: i64,
    ) -> Result<(), ReconcileError> {
        let expected_version = record.version;
        let write = StateWrite {
            record: StateRecord {
                version: expected_version + 1,
                data: json!({ "since": since, "since_rfc3339": format_rfc3339(since) }),
                ..record
            },
            expected_version,
        };
        match self.state.commit(&[write]).await? {
            CommitOutcome::Committed => Ok(()),
            // Another run moved it meanwhile: its value is as good as ours.
            CommitOutcome::Conflict => {
                tracing::info!("checkpoint changed by a concurrent run; keeping it");
                Ok(())
            }
        }
    }

    async fn fetch_stripe(
        &self,
        tenant: &TenantConfig,
        since: i64,
    ) -> Result<Vec<Fetched>, ReconcileError> {
        let base = api_base(tenant, "https://api.stripe.com")?;
        let key = self.credential(tenant, "api_key")?;
        let auth = format!("Bearer {key}");
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        for page_no in 1..=MAX_PAGES {
            let mut url = format!("{base}/v1/events?created%5Bgte%5D={since}&limit=100");
            if let Some(after) = &after {
                url.push_str("&starting_after=");
                url.extend(form_urlencoded::byte_serialize(after.as_bytes()));
            }
            let credential = ("authorization", auth.as_str(), "api_key");
            let (body, _) = self.get(&url, credential, page_no).await?;
            #[derive(Deserialize)]
            struct Page<'a> {
                #[serde(borrow)]
                data: Vec<&'a RawValue>,
                #[serde(default)]
                has_more: bool,
            }
            let page: Page = serde_json::from_slice(&body)
                .map_err(|e| ReconcileError::Payload(format!("events list: {e}")))?;
            for raw in &page.data {
                let bytes = Bytes::copy_from_slice(raw.get().as_bytes());
                let envelope = stripe::envelope_from_body(&bytes, tenant)
                    .map_err(|e| ReconcileError::Payload(format!("event: {e}")))?;
                after = Some(envelope.event_id.clone());
                let at = envelope.occurred_at.unwrap_or(since);
                out.push(Fetched {
                    envelope,
                    body: bytes,
                    at,
                });
            }
            if !page.has_more || page.data.is_empty() {
                return Ok(out);
            }
        }
        Err(ReconcileError::Payload(format!(
            "more than {MAX_PAGES} pages of events"
        )))
    }

    async fn fetch_shopify(
        &self,
        tenant: &TenantConfig,
        since: i64,
        business: &dyn StateStore,
    ) -> Result<Vec<Fetched>, ReconcileError> {
        let shop = tenant
            .option("shop_domain")
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ReconcileError::Config("tenant option `shop_domain` is not set".into()))?
            .to_ascii_lowercase();
        let default_base = format!("https://{shop}");
        let base = api_base(tenant, &default_base)?.to_string();
        let token = self.credential(tenant, "access_token")?;
        let since_text: String =
            form_urlencoded::byte_serialize(format_rfc3339(since).as_bytes()).collect();
        let mut url = Some(format!(
            "{base}/admin/api/{SHOPIFY_API_VERSION}/orders.json?updated_at_min={since_text}&status=any&limit=250"
        ));
        let mut out = Vec::new();
        for page_no in 1..=MAX_PAGES {
            let Some(current) = url.take() else {
                return Ok(out);
            };
            let credential = ("x-shopify-access-token", token.as_str(), "access_token");
            let (body, link) = self.get(&current, credential, page_no).await?;
            #[derive(Deserialize)]
            struct Page<'a> {
                #[serde(borrow)]
                orders: Vec<&'a RawValue>,
            }
            #[derive(Deserialize)]
            struct Order {
                id: serde_json::Value,
                updated_at: String,
            }
            let page: Page = serde_json::from_slice(&body)
                .map_err(|e| ReconcileError::Payload(format!("orders list: {e}")))?;
            let mut listed = Vec::with_capacity(page.orders.len());
            for raw in page.orders {
                let order: Order = serde_json::from_str(raw.get())
                    .map_err(|e| ReconcileError::Payload(format!("order: {e}")))?;
                let id = match &order.id {
                    serde_json::Value::Number(n) => n.to_string(),
                    serde_json::Value::String(s) => s.clone(),
                    _ => return Err(ReconcileError::Payload("order `id`".into())),
                };
                let at = parse_rfc3339(&order.updated_at).ok_or_else(|| {
                    ReconcileError::Payload(format!("order {id}: bad updated_at"))
                })?;
                listed.push((id, order.updated_at, at, raw));
            }
            let unknown = orders_not_created(business, tenant, &listed).await?;
            for (id, updated_at, at, raw) in listed {
                let body = Bytes::copy_from_slice(raw.get().as_bytes());
                let envelope = |event_type: &str, event_id: String| Envelope {
                    provider: "shopify".into(),
                    tenant: tenant.tenant.clone(),
                    event_id,
                    event_type: event_type.into(),
                    object_id: Some(id.clone()),
                    object_version: Some(updated_at.clone()),
                    occurred_at: Some(at),
                    delivery_id: None,
                };
                // The listed order is the full order: for an order the business has
                // not created (its orders/create never came), it is that create. The
                // `#created` and stock keys make a late real orders/create a no-op.
                if unknown.contains(&id) {
                    out.push(Fetched {
                        envelope: envelope("orders/create", shopify_create_event_id(&shop, &id)),
                        body: body.clone(),
                        at,
                    });
                }
                // And always this version as an update, which the version check orders
                // against the webhooks (it is newer than a late real create, say).
                out.push(Fetched {
                    envelope: envelope("orders/updated", shopify_event_id(&shop, &id, &updated_at)),
                    body,
                    at,
                });
            }
            // Cursor paging: follow `rel="next"`, but only on the same API base, so the
            // token never goes to another host. A link elsewhere leaves pages unread:
            // the run fails rather than move the checkpoint past them.
            url = match link.as_deref().and_then(next_link) {
                Some(next) if next.starts_with(&format!("{base}/")) => Some(next),
                Some(next) => return Err(foreign_next(&current, page_no, &next, &base)),
                None => None,
            };
        }
        Err(ReconcileError::Payload(format!(
            "more than {MAX_PAGES} pages of orders"
        )))
    }

    fn credential(&self, tenant: &TenantConfig, name: &str) -> Result<String, ReconcileError> {
        let raw = tenant
            .option(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ReconcileError::Config(format!("tenant option `{name}` is not set")))?;
        let value = match raw.strip_prefix("env:") {
            Some(var) => (self.env)(var.trim()).ok_or_else(|| {
                ReconcileError::Config(format!(
                    "tenant option `{name}` refers to environment variable {}, which is not set",
                    var.trim()
                ))
            })?,
            None => raw.to_string(),
        };
        Ok(value)
    }

    /// One page: GET `url` with `credential` = (header, value, the tenant option it
    /// comes from), retried on 5xx, 429, timeouts and connection failures
    /// ([`PAGE_ATTEMPTS`], backoff from [`PAGE_RETRY_BASE`]). The body and the `Link`
    /// header; any failure names the call and, on 401/403, the option to fix.
    async fn get(
        &self,
        url: &str,
        credential: (&str, &str, &str),
        page_no: usize,
    ) -> Result<(Vec<u8>, Option<String>), ReconcileError> {
        let (auth_header, auth_value, option) = credential;
        let call = page_call(url, page_no);
        let mut pause = self.retry_base;
        let mut attempt = 1;
        loop {
            let error = match self.get_once(url, auth_header, auth_value).await {
                Ok(page) => return Ok(page),
                Err(PageError::Refused(status)) => {
                    return Err(ReconcileError::Page {
                        call,
                        reason: format!(
                            "provider API answered {status}: the credential was refused; check the tenant option `{option}`"
                        ),
                    })
                }
                Err(PageError::Permanent(reason)) => {
                    return Err(ReconcileError::Page { call, reason })
                }
                Err(PageError::Transient(reason)) => reason,
            };
            if attempt >= PAGE_ATTEMPTS {
                return Err(ReconcileError::Page {
                    call,
                    reason: format!("{error} (after {attempt} attempts)"),
                });
            }
            tracing::info!(call = %call, attempt, error = %error, "provider API page failed; retrying");
            tokio::time::sleep(pause).await;
            pause *= 2;
            attempt += 1;
        }
    }

    async fn get_once(
        &self,
        url: &str,
        auth_header: &str,
        auth_value: &str,
    ) -> Result<(Vec<u8>, Option<String>), PageError> {
        let request = http::Request::get(url)
            .header(auth_header, auth_value)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, "einmal-reconcile")
            .body(Empty::<Bytes>::new())
            .map_err(|_| PageError::Permanent("cannot build the API request".into()))?;
        let call = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| PageError::Transient(format!("provider API unreachable: {e}")))?;
            let status = response.status();
            if status == http::StatusCode::UNAUTHORIZED || status == http::StatusCode::FORBIDDEN {
                return Err(PageError::Refused(status.as_u16()));
            }
            if !status.is_success() {
                return Err(match classify_status(status) {
                    LookupError::Transient(m) => PageError::Transient(m),
                    LookupError::Permanent(m) => PageError::Permanent(m),
                });
            }
            let link = response
                .headers()
                .get(http::header::LINK)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = Limited::new(response.into_body(), MAX_PAGE_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    PageError::Transient(format!("reading the provider API response: {e}"))
                })?;
            Ok((body.to_bytes().to_vec(), link))
        };
        match tokio::time::timeout(self.request_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(PageError::Transient(format!(
                "provider API timed out after {} ms",
                self.request_timeout.as_millis()
            ))),
        }
    }
}

/// Why one page request failed.
enum PageError {
    /// 5xx, 429, 408, timeout, connection: worth another attempt.
    Transient(String),
    /// 401 / 403: the credential.
    Refused(u16),
    /// Other 4xx and request errors.
    Permanent(String),
}

/// `GET {url without its query} (page n)`: names the call, never a credential.
fn page_call(url: &str, page_no: usize) -> String {
    let path = url.split('?').next().unwrap_or(url);
    format!("GET {path} (page {page_no})")
}

/// A `next` link to another host than the API base: not followed, so the run fails.
fn foreign_next(current: &str, page_no: usize, next: &str, base: &str) -> ReconcileError {
    let next_host = next.split('?').next().unwrap_or(next);
    ReconcileError::Page {
        call: page_call(current, page_no),
        reason: format!(
            "its next page is on another host ({next_host}), not under the API base {base}; \
             not followed (the credential stays with the API base), so the pages after \
             this one are unread and the checkpoint is not moved"
        ),
    }
}

/// Of the listed Shopify orders, those the business has not created from Shopify (no
/// order record, or one opened by a payment provider only).
async fn orders_not_created(
    business: &dyn StateStore,
    tenant: &TenantConfig,
    listed: &[(String, String, i64, &RawValue)],
) -> Result<std::collections::BTreeSet<String>, ReconcileError> {
    let mut unknown = std::collections::BTreeSet::new();
    // Bounded batches: a DynamoDB BatchGetItem takes at most 100 keys.
    for chunk in listed.chunks(100) {
        let keys: Vec<StateKey> = chunk
            .iter()
            .map(|(id, ..)| order_key(&tenant.tenant, id))
            .collect();
        for record in business.load(&keys).await? {
            let created = record.exists()
                && record.data.get("shopify_created") == Some(&serde_json::Value::Bool(true));
            if !created {
                unknown.insert(record.key.id.clone());
            }
        }
    }
    Ok(unknown)
}

/// What a thin provider's payment status means, read as the reference domain reads
/// it (`domain::reference` thin mappings): only final states are facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PaymentState {
    Paid,
    Failed,
    Open,
}

/// One payment (Klarna: order) of a thin provider, as its API reports it now.
struct ThinPayment {
    /// The resource id a hint names (`tr_…`, the GoPay payment id, the Klarna order id).
    id: String,
    status: String,
    state: PaymentState,
    order_id: Option<String>,
    /// Mollie: `createdAt`; GoPay / Klarna push: the first hint's arrival (unix secs).
    at: i64,
}

/// The hint kind of a thin provider (`hint.payment` / `hint.order`).
fn hint_kind(provider: &str) -> &'static str {
    if provider == "klarna-push" {
        "order"
    } else {
        "payment"
    }
}

fn json_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Read one fetched or listed resource of a thin provider.
fn thin_payment(provider: &str, body: &serde_json::Value) -> Result<ThinPayment, ReconcileError> {
    let (id, status, order) = match provider {
        "mollie" => ("/id", "/status", "/metadata/order_id"),
        "gopay" => ("/id", "/state", "/order_number"),
        _ => ("/order_id", "/status", "/merchant_reference1"),
    };
    let id = json_text(body.pointer(id))
        .ok_or_else(|| ReconcileError::Payload(format!("{provider}: resource without an id")))?;
    thin::check_resource_id(&id)
        .map_err(|e| ReconcileError::Payload(format!("{provider}: resource id: {e}")))?;
    let status = json_text(body.pointer(status)).ok_or_else(|| {
        ReconcileError::Payload(format!("{provider} {id}: resource without a status"))
    })?;
    let state = match (provider, status.as_str()) {
        ("mollie", "paid") | ("gopay", "PAID") => PaymentState::Paid,
        ("klarna-push", "AUTHORIZED" | "PART_CAPTURED" | "CAPTURED") => PaymentState::Paid,
        ("mollie", "failed" | "canceled" | "expired")
        | ("gopay", "CANCELED" | "TIMEOUTED")
        | ("klarna-push", "CANCELLED") => PaymentState::Failed,
        _ => PaymentState::Open,
    };
    Ok(ThinPayment {
        id,
        status,
        state,
        order_id: json_text(body.pointer(order)),
        at: 0,
    })
}

impl Reconciler {
    /// Mollie, GoPay, Klarna push: find the payments whose final state at the provider
    /// our business state does not show, and ingest a hint for each (see the module
    /// docs).
    async fn reconcile_thin(
        &self,
        tenant: &TenantConfig,
        start: i64,
        stored: i64,
        checkpoint: StateRecord,
        business: Option<&dyn StateStore>,
    ) -> Result<TenantReport, ReconcileError> {
        let provider = tenant.provider.as_str();
        let now = (self.now_secs)();
        let (payments, pending_since) = match provider {
            "mollie" => (self.list_mollie(tenant, start).await?, None),
            _ => self.watched(tenant, start).await?,
        };
        // The next run starts at the oldest payment that may still change (open at the
        // provider, or its hint still in processing), and at most at the newest seen
        // (Mollie) / now (the others) minus the overlap.
        let oldest_open = payments
            .iter()
            .filter(|p| p.state == PaymentState::Open)
            .map(|p| p.at)
            .chain(pending_since)
            .min();
        let newest = if provider == "mollie" {
            payments.iter().map(|p| p.at).max()
        } else {
            Some(now)
        }
        .map(|n| n - self.overlap_secs);
        let next = match (newest, oldest_open) {
            (Some(n), Some(o)) => Some(n.min(o)),
            (n, o) => n.or(o),
        }
        .map_or(stored, |n| n.max(stored));

        let mut report = TenantReport {
            provider: tenant.provider.clone(),
            tenant: tenant.tenant.clone(),
            since: format_rfc3339(start),
            fetched: payments.len(),
            already_present: 0,
            ingested: 0,
            checkpoint: None,
            error: None,
            ingested_events: Vec::new(),
            differences: Vec::new(),
        };
        let store = business.unwrap_or(self.state.as_ref());
        let finals: Vec<&ThinPayment> = payments
            .iter()
            .filter(|p| p.state != PaymentState::Open && p.order_id.is_some())
            .collect();
        let mut orders = Vec::with_capacity(finals.len());
        for chunk in finals.chunks(100) {
            let keys: Vec<StateKey> = chunk
                .iter()
                .map(|p| order_key(&tenant.tenant, p.order_id.as_deref().unwrap_or_default()))
                .collect();
            orders.extend(store.load(&keys).await?);
        }
        let kind = hint_kind(provider);
        for (payment, record) in finals.into_iter().zip(orders) {
            let ours = if record.exists() {
                serde_json::from_value::<Order>(record.data)
                    .map(Some)
                    .map_err(|_| "unreadable".to_owned())
            } else {
                Ok(None)
            };
            let in_sync = match (&ours, payment.state) {
                (Ok(Some(order)), PaymentState::Paid) => order.is_paid(),
                (Ok(Some(order)), PaymentState::Failed) => {
                    order.is_paid() || order.payment_status == PaymentStatus::Failed
                }
                _ => false,
            };
            if in_sync {
                report.already_present += 1;
                continue;
            }
            let ours = match ours {
                Ok(Some(order)) => serde_json::to_value(order.payment_status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                Ok(None) => MISSING.to_owned(),
                Err(unreadable) => unreadable,
            };
            // The same envelope and event id as a webhook hint of this minute: a real
            // hint arriving now is a duplicate of this one (and a later one is a new
            // hint whose effects the domain's keys make exactly-once).
            let envelope = thin::hint_envelope(provider, tenant, kind, &payment.id, now);
            let body = if provider == "mollie" {
                Bytes::from(format!("id={}", payment.id))
            } else {
                Bytes::new()
            };
            let outcome = self.ingestor.ingest_reconciled(envelope, body).await?;
            let our_status = if outcome.duplicate {
                // A hint of this minute is already stored; the next run looks again.
                report.already_present += 1;
                ours
            } else {
                report.ingested += 1;
                report.ingested_events.push(outcome.key.as_str().to_owned());
                tracing::info!(
                    provider, tenant = %tenant.tenant, object_id = %payment.id,
                    event_id = %outcome.event_id, "reconciliation ingested a hint"
                );
                PENDING_PROCESSING.to_owned()
            };
            report.differences.push(Difference {
                provider: tenant.provider.clone(),
                tenant: tenant.tenant.clone(),
                object_id: payment.id.clone(),
                order_id: payment.order_id.clone().unwrap_or_default(),
                provider_status: payment.status.clone(),
                our_status,
            });
        }
        if next > stored || !checkpoint.exists() {
            self.store_checkpoint(checkpoint, next).await?;
        }
        report.checkpoint = Some(format_rfc3339(next));
        Ok(report)
    }

    /// Mollie's payments created at or after `since`, newest first:
    /// `GET /v2/payments?limit=250`, then `_links.next` (same API base only) until a
    /// page reaches a payment older than `since`.
    async fn list_mollie(
        &self,
        tenant: &TenantConfig,
        since: i64,
    ) -> Result<Vec<ThinPayment>, ReconcileError> {
        let base = api_base(tenant, "https://api.mollie.com")?.to_string();
        let auth = format!("Bearer {}", self.credential(tenant, "api_key")?);
        #[derive(Deserialize)]
        struct Page {
            #[serde(rename = "_embedded", default)]
            embedded: Option<Embedded>,
            #[serde(rename = "_links", default)]
            links: Option<Links>,
        }
        #[derive(Deserialize)]
        struct Embedded {
            #[serde(default)]
            payments: Vec<serde_json::Value>,
        }
        #[derive(Deserialize)]
        struct Links {
            next: Option<Href>,
        }
        #[derive(Deserialize)]
        struct Href {
            href: String,
        }
        let mut url = Some(format!("{base}/v2/payments?limit={MOLLIE_PAGE_SIZE}"));
        let mut out = Vec::new();
        for page_no in 1..=MAX_PAGES {
            let Some(current) = url.take() else {
                return Ok(out);
            };
            let credential = ("authorization", auth.as_str(), "api_key");
            let (body, _) = self.get(&current, credential, page_no).await?;
            let page: Page = serde_json::from_slice(&body)
                .map_err(|e| ReconcileError::Payload(format!("payments list: {e}")))?;
            let mut reached_older = false;
            for raw in page.embedded.map(|e| e.payments).unwrap_or_default() {
                let mut payment = thin_payment("mollie", &raw)?;
                payment.at = raw
                    .get("createdAt")
                    .and_then(serde_json::Value::as_str)
                    .and_then(parse_rfc3339)
                    .ok_or_else(|| {
                        ReconcileError::Payload(format!("payment {}: bad createdAt", payment.id))
                    })?;
                if payment.at < since {
                    reached_older = true;
                    continue;
                }
                out.push(payment);
            }
            if reached_older {
                return Ok(out);
            }
            url = match page.links.and_then(|l| l.next).map(|n| n.href) {
                Some(next) if next.starts_with(&format!("{base}/")) => Some(next),
                Some(next) => return Err(foreign_next(&current, page_no, &next, &base)),
                None => None,
            };
        }
        Err(ReconcileError::Payload(format!(
            "more than {MAX_PAGES} pages of payments"
        )))
    }

    /// GoPay / Klarna push (no list API): the resources named by this tenant's hints
    /// received since `since` that no hint has completed, none is still processing,
    /// and at least one ended `ignored` (the fetched state was not final), each fetched
    /// once now. Also the oldest point the checkpoint must not pass: the arrival of the
    /// oldest hint still in processing, or the last hint read when a run reads
    /// [`MAX_WATCHED_ITEMS`] (there may be more behind it).
    async fn watched(
        &self,
        tenant: &TenantConfig,
        since: i64,
    ) -> Result<(Vec<ThinPayment>, Option<i64>), ReconcileError> {
        let provider = tenant.provider.as_str();
        let index = self.hints.as_ref().ok_or_else(|| {
            ReconcileError::Config(format!(
                "reconciling {provider} reads the inbox's hint index, which is not configured"
            ))
        })?;
        let hints = index
            .hints_since(
                provider,
                &tenant.tenant,
                since.saturating_mul(1000),
                MAX_WATCHED_ITEMS,
            )
            .await?;
        let unread_from = match hints.last() {
            Some(last) if hints.len() >= MAX_WATCHED_ITEMS => {
                tracing::warn!(
                    provider, tenant = %tenant.tenant, read = hints.len(),
                    "more hints since the checkpoint than one run reads; the next run goes on"
                );
                Some(last.received_at_ms.div_euclid(1000))
            }
            _ => None,
        };
        struct Seen {
            first_ms: i64,
            completed: bool,
            pending: bool,
            ignored: bool,
        }
        let mut by_id: std::collections::BTreeMap<String, Seen> = Default::default();
        for hint in hints {
            let seen = by_id.entry(hint.object_id).or_insert(Seen {
                first_ms: i64::MAX,
                completed: false,
                pending: false,
                ignored: false,
            });
            seen.first_ms = seen.first_ms.min(hint.received_at_ms);
            match hint.state {
                InboxState::Completed => seen.completed = true,
                InboxState::Ignored => seen.ignored = true,
                // Dead letters are the DLQ's and replay's business.
                InboxState::DeadLetter => {}
                _ => seen.pending = true,
            }
        }
        let kind = hint_kind(provider);
        let mut pending_since = unread_from;
        let mut out = Vec::new();
        for (id, seen) in by_id {
            let first = seen.first_ms.div_euclid(1000);
            if seen.completed {
                continue;
            }
            if seen.pending {
                pending_since = Some(pending_since.map_or(first, |p| p.min(first)));
                continue;
            }
            if !seen.ignored {
                continue;
            }
            let body = self.lookup.fetch(tenant, provider, kind, &id).await?;
            let value: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|e| ReconcileError::Payload(format!("{provider} {id}: {e}")))?;
            let mut payment = thin_payment(provider, &value)?;
            payment.id = id;
            payment.at = first;
            out.push(payment);
        }
        Ok((out, pending_since))
    }
}

/// The object id and provider state of a fetched event the differences look at:
/// Stripe `payment_intent.*` events with `metadata.order_id`, and Shopify orders.
fn observe(event: &Fetched) -> Option<(String, Observed)> {
    let body: serde_json::Value = serde_json::from_slice(&event.body).ok()?;
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    match event.envelope.provider.as_str() {
        "stripe" if event.envelope.event_type.starts_with("payment_intent.") => {
            let object = body.pointer("/data/object")?;
            let status = object.get("status").and_then(text).unwrap_or_default();
            Some((
                object.get("id").and_then(text)?,
                Observed {
                    order_id: object.pointer("/metadata/order_id").and_then(text)?,
                    paid: status == "succeeded",
                    status,
                    ingested_now: false,
                },
            ))
        }
        "shopify" => {
            let id = body.get("id").and_then(text)?;
            let status = body
                .get("financial_status")
                .and_then(text)
                .unwrap_or_default();
            Some((
                id.clone(),
                Observed {
                    order_id: id,
                    paid: status == "paid",
                    status,
                    ingested_now: false,
                },
            ))
        }
        _ => None,
    }
}

/// The observed objects the provider says are paid and our order does not.
async fn differences(
    business: &dyn StateStore,
    tenant: &TenantConfig,
    observed: std::collections::BTreeMap<String, Observed>,
) -> Result<Vec<Difference>, ReconcileError> {
    let paid: Vec<(String, Observed)> = observed.into_iter().filter(|(_, o)| o.paid).collect();
    if paid.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<StateKey> = paid
        .iter()
        .map(|(_, o)| order_key(&tenant.tenant, &o.order_id))
        .collect();
    let records = business.load(&keys).await?;
    let mut out = Vec::new();
    for ((object_id, seen), record) in paid.into_iter().zip(records) {
        let ours = if record.exists() {
            match serde_json::from_value::<Order>(record.data) {
                Ok(order) if order.is_paid() => continue,
                Ok(order) => serde_json::to_value(order.payment_status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                Err(_) => "unreadable".to_owned(),
            }
        } else {
            MISSING.to_owned()
        };
        let our_status = if seen.ingested_now {
            PENDING_PROCESSING.to_owned()
        } else {
            ours
        };
        out.push(Difference {
            provider: tenant.provider.clone(),
            tenant: tenant.tenant.clone(),
            object_id,
            order_id: seen.order_id,
            provider_status: seen.status,
            our_status,
        });
    }
    Ok(out)
}

/// The audit record of one reconciliation run (`action = reconcile`): the selector is
/// provider/tenant/since, the events are the inbox keys ingested, the result the
/// per-tenant counts.
pub fn audit_record(
    actor: &str,
    reason: &str,
    options: &ReconcileOptions,
    reports: &[TenantReport],
    at_ms: i64,
) -> AuditRecord {
    AuditRecord {
        id: AuditRecord::new_id(at_ms),
        at_ms,
        actor: actor.to_owned(),
        action: "reconcile".to_owned(),
        reason: reason.to_owned(),
        selector: json!({
            "provider": options.provider,
            "tenant": options.tenant,
            "since": options.since.map(format_rfc3339),
        }),
        events: reports
            .iter()
            .flat_map(|r| r.ingested_events.iter().cloned())
            .collect(),
        result: json!({
            "tenants": reports.iter().map(|r| json!({
                "provider": r.provider,
                "tenant": r.tenant,
                "since": r.since,
                "fetched": r.fetched,
                "already_present": r.already_present,
                "ingested": r.ingested,
                "differences": r.differences.len(),
                "checkpoint": r.checkpoint,
                "error": r.error,
            })).collect::<Vec<_>>(),
            "fetched": reports.iter().map(|r| r.fetched).sum::<usize>(),
            "already_present": reports.iter().map(|r| r.already_present).sum::<usize>(),
            "ingested": reports.iter().map(|r| r.ingested).sum::<usize>(),
            "differences": reports.iter().map(|r| r.differences.len()).sum::<usize>(),
            "failed": reports.iter().filter(|r| r.error.is_some()).count(),
        }),
    }
}

/// The option holding the API credential of a reconciled provider.
pub fn credential_option(provider: &str) -> &'static str {
    match provider {
        "shopify" | "gopay" => "access_token",
        "klarna-push" => "api_username",
        _ => "api_key",
    }
}

/// `{tenant}#checkpoint#{provider}`.
pub fn checkpoint_key(tenant: &TenantConfig) -> StateKey {
    StateKey::new(
        tenant.tenant.clone(),
        CHECKPOINT_KIND,
        tenant.provider.clone(),
    )
}

/// The synthetic event id of the `orders/create` for an order the business has not
/// created (stable per order: one per order however often it is reconciled).
pub fn shopify_create_event_id(shop: &str, order_id: &str) -> String {
    format!("{shop}:orders/create:reconcile-{order_id}")
}

/// The synthetic event id of one Shopify order version (stable across runs).
pub fn shopify_event_id(shop: &str, order_id: &str, updated_at: &str) -> String {
    format!("{shop}:orders/updated:reconcile-{order_id}-{updated_at}")
}

fn api_base<'a>(tenant: &'a TenantConfig, default: &'a str) -> Result<&'a str, ReconcileError> {
    let base = tenant
        .option(API_BASE_OPTION)
        .filter(|b| !b.is_empty())
        .unwrap_or(default)
        .trim_end_matches('/');
    if !(base.starts_with("https://") || base.starts_with("http://")) {
        return Err(ReconcileError::Config(
            "tenant option `api_base` must be an http(s) URL".into(),
        ));
    }
    Ok(base)
}

/// The `rel="next"` URL of a `Link` header.
fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"")
            .then(|| {
                url.trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_string()
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_header() {
        let h = r#"<https://s.myshopify.com/admin/api/2024-10/orders.json?page_info=a&limit=250>; rel="previous", <https://s.myshopify.com/admin/api/2024-10/orders.json?page_info=b&limit=250>; rel="next""#;
        assert_eq!(
            next_link(h).as_deref(),
            Some("https://s.myshopify.com/admin/api/2024-10/orders.json?page_info=b&limit=250")
        );
        assert_eq!(next_link(r#"<https://x/y>; rel="previous""#), None);
    }

    #[test]
    fn thin_states_read_as_the_domain_reads_them() {
        let state = |provider: &str, body: serde_json::Value| {
            thin_payment(provider, &body).map(|p| (p.id, p.state, p.order_id))
        };
        let mollie = |status: &str| {
            json!({"resource": "payment", "id": "tr_1", "status": status,
                   "metadata": {"order_id": "o-1"}})
        };
        for (status, expected) in [
            ("paid", PaymentState::Paid),
            ("failed", PaymentState::Failed),
            ("canceled", PaymentState::Failed),
            ("expired", PaymentState::Failed),
            ("open", PaymentState::Open),
            ("authorized", PaymentState::Open),
        ] {
            let (id, s, order) = state("mollie", mollie(status)).unwrap();
            assert_eq!(
                (id.as_str(), s, order.as_deref()),
                ("tr_1", expected, Some("o-1"))
            );
        }
        let gopay = json!({"id": 3000006529u64, "state": "PAID", "order_number": 17});
        let (id, s, order) = state("gopay", gopay).unwrap();
        assert_eq!((id.as_str(), s), ("3000006529", PaymentState::Paid));
        assert_eq!(order.as_deref(), Some("17"));
        for (status, expected) in [
            ("TIMEOUTED", PaymentState::Failed),
            ("CREATED", PaymentState::Open),
            ("REFUNDED", PaymentState::Open),
        ] {
            let body = json!({"id": 1, "state": status});
            assert_eq!(state("gopay", body).unwrap().1, expected, "{status}");
        }
        let klarna = json!({"order_id": "abc-1", "status": "CANCELLED"});
        let (_, s, order) = state("klarna-push", klarna).unwrap();
        assert_eq!((s, order), (PaymentState::Failed, None));
        // Bad input is an error, never a panic.
        for (provider, body) in [
            ("mollie", json!({"status": "paid"})),
            ("mollie", json!({"id": "tr_1"})),
            ("mollie", json!({"id": "../x", "status": "paid"})),
            ("gopay", json!({"id": [1], "state": "PAID"})),
            ("klarna-push", json!(null)),
        ] {
            assert!(
                matches!(
                    state(provider, body.clone()),
                    Err(ReconcileError::Payload(_))
                ),
                "{provider} {body}"
            );
        }
        assert_eq!(hint_kind("klarna-push"), "order");
        assert_eq!(hint_kind("gopay"), "payment");
    }

    #[test]
    fn shopify_ids_are_stable_per_version() {
        let a = shopify_event_id("s.myshopify.com", "1001", "2024-01-01T10:00:00-05:00");
        assert_eq!(
            a,
            "s.myshopify.com:orders/updated:reconcile-1001-2024-01-01T10:00:00-05:00"
        );
        assert_ne!(
            a,
            shopify_event_id("s.myshopify.com", "1001", "2024-01-01T10:00:01-05:00")
        );
    }
}
