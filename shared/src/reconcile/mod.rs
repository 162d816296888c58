//! Reconciliation: pull recent events from the provider's API since a stored
//! checkpoint and ingest what the inbox lacks, through the normal ingest path
//! ([`Ingestor::ingest_reconciled`]: the same conditional put + enqueue, marked
//! `source = reconcile`). A missed webhook is found here; an event the inbox already
//! holds is a duplicate of the put and changes nothing (design invariant 8).
//!
//! A provider is reconciled when it declares a reconcile source
//! ([`crate::providers::Provider::reconcile`]: the credential option and the method).
//! One file per method: `stripe.rs` (event list), `shopify.rs` (order list),
//! `mollie.rs` (payment list), `watched.rs` (GoPay, Klarna push: the hints' payments),
//! with `thin.rs` (payment status of the thin providers) and `report.rs` (reports,
//! differences, the audit record); the page requests (retried) stay here, with the
//! client. What the business believes about its orders comes from the domain's
//! [`PaymentView`]; reconciliation knows no domain's records.
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
//! expired; the provider's own table, `providers::thin::ThinResource`, which the
//! reference domain reads too) our business state does not show,
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
//! what the provider says with what the business believes about its orders (the
//! domain's [`PaymentView`], given to [`Reconciler::new`]) for the objects it saw: the newest
//! state of each Stripe `payment_intent` (order from `metadata.order_id`) and each
//! Shopify order. When the provider says paid (`status = succeeded` /
//! `financial_status = paid`) and our order is missing or not paid, the report lists a
//! [`Difference`]; `our_status` is `missing`, the order's `payment_status`, or
//! `pending processing` when this run just ingested an event of the object (the
//! processor has not applied it yet). The business is read before the run ingests
//! anything: a processor that applies the ingested event before the report is built
//! must not hide what the run repaired.
//!
//! # Checkpoint
//!
//! Stored in the [`StateStore`] as the record `{tenant}#checkpoint#{provider}` with
//! `data = {"since": <unix secs>, "since_rfc3339": …}`. A first run starts at now − 3
//! days. After a *successful* run it becomes the newest `created`/`updated_at` seen
//! minus a 5-minute overlap (never moving backwards); any API, ingest or store error
//! leaves it where it was, so the next run covers the same window again.

mod mollie;
mod report;
mod shopify;
mod stripe;
mod thin;
mod watched;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use serde_json::json;
use thiserror::Error;

use crate::config::TenantConfig;
use crate::domain::payment_view::PaymentView;
use crate::domain::state::{
    CommitOne, CommitOutcome, StateKey, StateRecord, StateStore, StateWrite,
};
use crate::envelope::Envelope;
use crate::lookup::{classify_status, HttpLookup, LookupError, ResourceLookup, API_BASE_OPTION};
use crate::pipeline::ingest::{IngestError, Ingestor};
use crate::ports::{InboxHints, StoreError};
use crate::providers;
use crate::providers::reconcile_source::{ReconcileMethod, ReconcileSource};
use crate::time;
use crate::time::format_rfc3339;

pub use mollie::MOLLIE_PAGE_SIZE;
pub use report::{
    audit_record, Difference, TenantReport, MAX_AUDITED_DIFFERENCES, MISSING, PENDING_PROCESSING,
    UNREADABLE,
};
pub use shopify::{shopify_create_event_id, shopify_event_id};
pub use watched::MAX_WATCHED_ITEMS;

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

type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;
type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Reads provider APIs and feeds the ingestor; checkpoints live in the state store.
pub struct Reconciler {
    ingestor: Arc<Ingestor>,
    state: Arc<dyn StateStore>,
    client: crate::https::HttpsClient,
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
    /// What the business believes about its orders (the domain's [`PaymentView`]).
    payments: Arc<dyn PaymentView>,
}

/// One fetched event, ready for the ingestor.
struct Fetched {
    envelope: Envelope,
    body: Bytes,
    /// `created` / `updated_at` (unix secs).
    at: i64,
}

impl Reconciler {
    /// Pages and thin-provider lookups over `http` (a clone of the process's one client);
    /// `payments` is the business domain's view of its orders, which the differences,
    /// Shopify's unknown orders and the thin providers compare with.
    pub fn new(
        ingestor: Arc<Ingestor>,
        state: Arc<dyn StateStore>,
        payments: Arc<dyn PaymentView>,
        http: crate::https::HttpsClient,
    ) -> Self {
        Reconciler {
            ingestor,
            state,
            lookup: Arc::new(HttpLookup::with_client(http.clone())),
            client: http,
            env: Arc::new(|var| std::env::var(var).ok()),
            now_secs: Arc::new(time::now_secs),
            overlap_secs: DEFAULT_OVERLAP_SECS,
            hints: None,
            request_timeout: REQUEST_TIMEOUT,
            retry_base: PAGE_RETRY_BASE,
            payments,
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
    /// the business's orders, read through its [`PaymentView`] (`None`: none computed).
    pub async fn run_with(
        &self,
        options: &ReconcileOptions,
        business: Option<&dyn StateStore>,
    ) -> Result<Vec<TenantReport>, ReconcileError> {
        let config = self.ingestor.config();
        if let Some(p) = options.provider.as_deref() {
            if source_of(p).is_none() {
                let known: Vec<&str> = providers::reconciled().map(|(p, _)| p.name()).collect();
                return Err(ReconcileError::Config(format!(
                    "reconciliation supports {}; not {p}",
                    known.join(", ")
                )));
            }
        }
        let explicit = options.provider.is_some() && options.tenant.is_some();
        let mut reports = Vec::new();
        for tenant in config.tenants() {
            let Some(source) = source_of(&tenant.provider) else {
                continue;
            };
            if options
                .provider
                .as_deref()
                .is_some_and(|p| p != tenant.provider)
                || options
                    .tenant
                    .as_deref()
                    .is_some_and(|t| t != tenant.tenant)
                || (!explicit && tenant.option(source.credential_option).is_none())
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
                    error: Some(err.to_string()),
                    ..TenantReport::fetched(
                        tenant,
                        since.map(format_rfc3339).unwrap_or_default(),
                        0,
                    )
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
        let source = source_of(&tenant.provider).ok_or_else(|| {
            ReconcileError::Config(format!(
                "reconciliation does not support {}",
                tenant.provider
            ))
        })?;
        let credential = source.credential_option;
        let mut fetched = match source.method {
            ReconcileMethod::StripeEvents => self.fetch_stripe(tenant, start, credential).await?,
            ReconcileMethod::ShopifyOrders => {
                let orders = business.unwrap_or(self.state.as_ref());
                self.fetch_shopify(tenant, start, orders, credential)
                    .await?
            }
            ReconcileMethod::MolliePayments(_) | ReconcileMethod::WatchedHints(_) => {
                return self
                    .reconcile_thin(tenant, &source, start, stored, record, business)
                    .await;
            }
        };
        // Oldest first, as the webhooks would have come.
        fetched.sort_by_key(|f| f.at);
        let mut report = TenantReport::fetched(tenant, format_rfc3339(start), fetched.len());
        let mut newest = None::<i64>;
        let mut observed: std::collections::BTreeMap<String, report::Observed> = Default::default();
        // The objects the differences look at (oldest first: the newest state wins),
        // and what the business believes of them before anything is ingested.
        let objects: Vec<Option<String>> = fetched
            .iter()
            .map(|event| {
                let (object_id, seen) = business.and_then(|_| report::observe(event))?;
                observed.insert(object_id.clone(), seen);
                Some(object_id)
            })
            .collect();
        let before = match business {
            Some(business) => {
                report::unpaid_beliefs(business, self.payments.as_ref(), tenant, &observed).await?
            }
            None => Default::default(),
        };
        for (event, object_id) in fetched.into_iter().zip(objects) {
            newest = newest.max(Some(event.at));
            let outcome = self
                .ingestor
                .ingest_reconciled(event.envelope, event.body)
                .await?;
            if let (Some(seen), false) = (
                object_id.and_then(|id| observed.get_mut(&id)),
                outcome.duplicate,
            ) {
                seen.ingested_now = true;
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
        if business.is_some() {
            report.differences = report::differences(tenant, observed, &before);
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

/// `{tenant}#checkpoint#{provider}`.
pub fn checkpoint_key(tenant: &TenantConfig) -> StateKey {
    StateKey::new(
        tenant.tenant.clone(),
        CHECKPOINT_KIND,
        tenant.provider.clone(),
    )
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

/// The reconcile source of `provider`, if it is reconciled.
fn source_of(provider: &str) -> Option<ReconcileSource> {
    providers::lookup(provider)?.reconcile()
}
