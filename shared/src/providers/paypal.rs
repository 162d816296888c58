//! PayPal: RSA (`SHA256withRSA`) signatures verified offline with PayPal's certificate,
//! as the PayPal SDKs do.
//!
//! Headers: `PAYPAL-TRANSMISSION-ID`, `PAYPAL-TRANSMISSION-TIME` (RFC 3339),
//! `PAYPAL-TRANSMISSION-SIG` (base64), `PAYPAL-CERT-URL`, `PAYPAL-AUTH-ALGO`. The signed
//! string is `{transmission_id}|{transmission_time}|{webhook_id}|{crc32(raw body)}` with
//! the CRC32 as an unsigned decimal and `webhook_id` the tenant's own listener id (tenant
//! option `webhook_id`, never a header). That binding is the tenant check: the body
//! names no tenant.
//!
//! What is checked, in order (everything before the certificate costs no I/O):
//! 1. The tenant has a `webhook_id` option (else `NoSecret`).
//! 2. All five headers are present; `PAYPAL-AUTH-ALGO` is `SHA256withRSA` (ASCII case
//!    ignored); the transmission id holds no `|`; the signature is base64.
//! 3. `PAYPAL-TRANSMISSION-TIME` parses as RFC 3339 and lies within
//!    ±`tolerance_secs` of now: PayPal's own SDKs check no freshness at all.
//! 4. `PAYPAL-CERT-URL` is exactly `https://{host}/v1/notifications/certs/{name}` with
//!    `host` one of [`ALLOWED_CERT_HOSTS`] (no port, no userinfo, lower case) and `name`
//!    PayPal's own shape, `CERT-` and three groups of eight hex digits
//!    (`CERT-360caa42-fca2a594-a5cafa77`), no query or fragment. Anything else is
//!    rejected before any fetch (SSRF).
//! 5. The certificate (PEM: leaf first, then any intermediates) comes from the
//!    [`CertSource`], through a bounded per-URL cache (24 h; failures 5 min). A
//!    certificate that verified a signature is pinned apart from that cache (see below).
//! 6. The leaf chains, through the served intermediates, to a trust anchor
//!    (`rustls-webpki` path building: signatures, validity of every certificate at
//!    `now`, basic constraints, name constraints, EKU `serverAuth` if an EKU is
//!    present). Anchors: the PEM bundle named by tenant option `paypal_ca_pem` (a
//!    path, read once per process), else the verifier's default set: the DigiCert roots
//!    in `paypal_roots.pem` for the process-wide verifier. A configured bundle may hold
//!    intermediates; each certificate in it is trusted as an anchor.
//! 7. The leaf's subject has exactly one common name and it ends with `.paypal.com`
//!    (ASCII case ignored), as in the PayPal SDKs.
//! 8. The signature verifies with the leaf's RSA key (PKCS#1 v1.5, SHA-256, 2048–8192
//!    bit).
//!
//! Not checked: revocation (no CRL or OCSP, as in the SDKs), certificate transparency,
//! the leaf's subject alternative names, and PayPal's `verify-webhook-signature`
//! postback API (which needs OAuth and a round trip per event).
//!
//! # Fetching certificates
//!
//! The certificate URL comes from an unauthenticated request, so fetching it must not
//! let anyone stall the server or make it a request amplifier. `verify_and_extract` is
//! synchronous and never does I/O: it reads the cache only. The fetch happens before
//! it, in [`Provider::prepare`] ([`PayPalVerifier::prepare`]), on the async runtime:
//! - only after the headers passed every check that costs no I/O (step 1–4, the
//!   transmission time included);
//! - **single-flight per URL**: concurrent requests naming one URL await one fetch;
//! - **bounded**: at most [`FetchLimits::max_concurrent`] fetches run at once (4) and
//!   at most [`FetchLimits::burst`] new fetches start at once, refilled at
//!   [`FetchLimits::per_minute`] (4, then 10 a minute), process-wide: the shared
//!   budget. A request over these bounds does not wait, and is not called forged: it
//!   is answered 503 with `Retry-After` ([`ProviderError::CannotVerifyNow`]; PayPal
//!   retries deliveries for 3 days). Only a certificate that was fetched and does not
//!   verify makes a 401;
//! - **reserved per tenant**: the URL a tenant last verified a delivery with has a
//!   bucket of its own per tenant ([`FetchLimits::per_tenant`], 2, refilled 2 a
//!   minute, and fetch slots of its own), so a flood of other names never holds back
//!   the fetch a tenant's genuine deliveries need (its pinned certificate was dropped,
//!   or evicted by other tenants' certificates);
//! - **shaped**: once a certificate has verified a delivery, the shared budget pays
//!   only for names of a shape seen verifying (host and the name without its last
//!   group, `…/CERT-360caa42-fca2a594-`); other names draw from a small bucket
//!   ([`FetchLimits::other_shapes`], 2 a minute) so a PayPal certificate of a new shape
//!   still gets fetched. Random `CERT-…` names then cost the shared budget nothing.
//!   We chose the shape over rationing per source address: behind API Gateway or a
//!   proxy the address is the edge's unless forwarded headers are trusted, an attacker
//!   with many addresses gets a ration each, and PayPal delivers from many addresses
//!   too; the shape needs nothing but what a verified delivery showed. An attacker
//!   who copies the real shape still spends the shared budget, which is why the
//!   tenant's reserve and the pinned (and persisted) certificate do not depend on it;
//! - **short**: each fetch has [`FETCH_TIMEOUT`] (3 s) in total (DNS, connect, TLS,
//!   response; no redirects, 64 KiB cap), in a spawned task that no lock is held across;
//! - **negative caching per host**: a host that could not be reached (timeout,
//!   connection or DNS failure) gets no new fetch for [`HOST_FAILURE_TTL_SECS`] (its
//!   requests are answered 503: PayPal's outage is not a forgery), and a URL its host
//!   refused (not a certificate, HTTP 404) none for [`CERT_FAILURE_TTL_SECS`];
//! - **pinning**: a certificate whose key verified a signature is kept apart from the
//!   cache (up to [`PINNED_CERTS`], replaced only by another one that verified a
//!   signature, dropped when its chain no longer validates), so no flood of attacker
//!   URLs can evict it or make it wait for a fetch;
//! - **persisted**: with a [`CertificateCache`] (the store: `einmal serve`'s SQLite
//!   file, the receiver's DynamoDB table), a newly pinned certificate is also written
//!   there, once, before the delivery it verified is answered (PEM chain, keyed by
//!   URL, expiring with the chain's earliest notAfter), and a URL neither pinned nor
//!   cached is looked up there (one read) before any fetch. A restart, a new Lambda
//!   instance or an outage of PayPal's host then costs no fetch for a certificate that
//!   verified a delivery before. Only verification writes: unauthenticated requests
//!   read at most one missing entry each and never write, so the entries are as many
//!   as the certificates PayPal signs with, whatever the traffic. A stored chain is
//!   checked like a fetched one on every request (anchors, validity, common name).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use http::HeaderName;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, TrustAnchor, UnixTime};
use sha2::{Digest, Sha256};
use webpki::{EndEntityCert, KeyUsage};

use super::plain_json::PlainJson;
use super::sig;
use super::{Provider, ProviderError, VerifiedEvent};
use crate::config::TenantConfig;
use crate::envelope::Envelope;
use crate::https::HttpsClient;
use crate::request::WebhookRequest;
use crate::store_error::StoreError;

pub struct PayPal;

/// PayPal's certificates that verified a genuine delivery, kept in the store so that a
/// restart, a new Lambda instance or an outage of PayPal's host does not need a fetch
/// (this module). Keyed by the certificate URL. Only the verifier writes, and
/// only a chain whose key verified a signature: unauthenticated requests never write,
/// so the entries are as many as the certificates PayPal signs with. Each expires at
/// `expires_at` (Unix seconds; the chain's earliest notAfter), after which it is never
/// returned and the store deletes it (DynamoDB TTL; SQLite on the next put).
#[async_trait::async_trait]
pub trait CertificateCache: Send + Sync {
    /// The PEM chain kept for `url`, unless it expired at `now_secs`.
    async fn get_certificate(
        &self,
        url: &str,
        now_secs: i64,
    ) -> Result<Option<Vec<u8>>, StoreError>;
    /// Keep (or replace) `url`'s PEM chain until `expires_at`.
    async fn put_certificate(
        &self,
        url: &str,
        pem: &[u8],
        expires_at: i64,
    ) -> Result<(), StoreError>;
}

const ID: &str = "paypal-transmission-id";
const TIME: &str = "paypal-transmission-time";
const SIG: &str = "paypal-transmission-sig";
const CERT_URL: &str = "paypal-cert-url";
const ALGO: &str = "paypal-auth-algo";
static TRANSMISSION_ID: HeaderName = HeaderName::from_static(ID);
static TRANSMISSION_TIME: HeaderName = HeaderName::from_static(TIME);
static TRANSMISSION_SIG: HeaderName = HeaderName::from_static(SIG);
static CERT_URL_HEADER: HeaderName = HeaderName::from_static(CERT_URL);
static AUTH_ALGO: HeaderName = HeaderName::from_static(ALGO);

/// The only algorithm PayPal uses (and the only one accepted).
pub const AUTH_ALGO_SHA256_RSA: &str = "SHA256withRSA";

/// Hosts `PAYPAL-CERT-URL` may name (live and sandbox, classic and `api-m`).
pub const ALLOWED_CERT_HOSTS: [&str; 4] = [
    "api.paypal.com",
    "api-m.paypal.com",
    "api.sandbox.paypal.com",
    "api-m.sandbox.paypal.com",
];
const CERT_PATH: &str = "/v1/notifications/certs/";
/// `CERT-` and three `-`-separated groups of eight hex digits.
const CERT_NAME_GROUPS: usize = 3;
const CERT_NAME_GROUP_LEN: usize = 8;

/// Fetched certificates are reused this long.
pub const CERT_TTL_SECS: i64 = 24 * 3600;
/// A failed fetch is not retried for this long (the URL was allow-listed but useless).
pub const CERT_FAILURE_TTL_SECS: i64 = 300;
/// Certificate URLs cached at once; the oldest entry makes room.
pub const CERT_CACHE_ENTRIES: usize = 64;
/// Certificates that verified a signature, kept apart from the cache; a newly pinned
/// one replaces the oldest.
pub const PINNED_CERTS: usize = 8;
/// A host that could not be reached gets no new fetch for this long.
pub const HOST_FAILURE_TTL_SECS: i64 = 60;
/// Total time of one certificate fetch: DNS, connect, TLS, response.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(3);
const MAX_CERT_BYTES: usize = 64 * 1024;
const MAX_CHAIN_CERTS: usize = 8;

/// The DigiCert roots the process-wide verifier trusts unless a tenant configures
/// `paypal_ca_pem` (DigiCert Global Root CA, Global Root G2, High Assurance EV Root CA).
pub const DEFAULT_ROOTS_PEM: &str = include_str!("paypal_roots.pem");

/// Why a certificate could not be fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// The host did not answer (DNS, connect, TLS, timeout): no new fetch to it for
    /// [`HOST_FAILURE_TTL_SECS`].
    Unreachable(String),
    /// The host answered, but not with a certificate (e.g. HTTP 404).
    Refused(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::Unreachable(reason) => write!(f, "unreachable: {reason}"),
            FetchError::Refused(reason) => write!(f, "refused: {reason}"),
        }
    }
}

/// Where certificates come from: HTTPS in production, a fixture in tests.
pub trait CertSource: Send + Sync {
    /// The PEM text served at `url` (already allow-listed). Called at most once per URL
    /// per cache lifetime, in a task of its own, under [`FETCH_TIMEOUT`].
    fn fetch(&self, url: &str) -> BoxFuture<'static, Result<Vec<u8>, FetchError>>;
}

/// Bounds on certificate fetches, process-wide (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchLimits {
    /// Fetches running at once (the shared budget's; the tenants' reserved fetches
    /// have as many again of their own).
    pub max_concurrent: usize,
    /// New fetches that may start at once (the shared bucket's size).
    pub burst: u32,
    /// New fetches a minute once the burst is spent (the shared bucket's refill).
    pub per_minute: u32,
    /// Each tenant's own bucket (size, and refill a minute) for the certificate URL it
    /// last verified a delivery with: that fetch never waits on the shared bucket.
    pub per_tenant: u32,
    /// Once a certificate has verified a delivery, names of another shape (host and
    /// name without its last group) draw from this small bucket (size, and refill a
    /// minute) instead of the shared one.
    pub other_shapes: u32,
}

impl Default for FetchLimits {
    fn default() -> Self {
        FetchLimits {
            max_concurrent: 4,
            burst: 4,
            per_minute: 10,
            per_tenant: 2,
            other_shapes: 2,
        }
    }
}

impl FetchLimits {
    fn shared(&self) -> Rate {
        Rate {
            burst: self.burst,
            per_minute: self.per_minute,
        }
    }

    fn tenant(&self) -> Rate {
        Rate {
            burst: self.per_tenant,
            per_minute: self.per_tenant,
        }
    }

    fn other_shapes(&self) -> Rate {
        Rate {
            burst: self.other_shapes,
            per_minute: self.other_shapes,
        }
    }
}

/// A bucket's size and refill a minute.
#[derive(Debug, Clone, Copy)]
struct Rate {
    burst: u32,
    per_minute: u32,
}

/// A token bucket over the request clock (seconds).
#[derive(Debug, Clone, Copy)]
struct FetchBudget {
    /// Tokens, in sixtieths (one token = 60), so a per-second refill stays exact.
    sixtieths: u64,
    at: i64,
}

impl FetchBudget {
    fn full(rate: Rate) -> Self {
        FetchBudget {
            sixtieths: u64::from(rate.burst) * 60,
            at: i64::MIN / 2,
        }
    }

    fn refill(&mut self, rate: Rate, now: i64) {
        let cap = u64::from(rate.burst) * 60;
        let elapsed = u64::try_from(now - self.at).unwrap_or(0);
        let refill = elapsed.saturating_mul(u64::from(rate.per_minute));
        self.sixtieths = cap.min(self.sixtieths.saturating_add(refill));
        self.at = self.at.max(now);
    }

    fn take(&mut self, rate: Rate, now: i64) -> bool {
        self.refill(rate, now);
        if self.sixtieths >= 60 {
            self.sixtieths -= 60;
            true
        } else {
            false
        }
    }

    /// Seconds until a token is there (0: one is there now).
    fn wait_secs(&self, rate: Rate, now: i64) -> u64 {
        let mut b = *self;
        b.refill(rate, now);
        match b.sixtieths {
            60.. => 0,
            _ if rate.per_minute == 0 => 60,
            s => (60 - s).div_ceil(u64::from(rate.per_minute)),
        }
    }
}

/// A tenant's last verified certificate URL and the bucket reserved for it.
struct TenantReserve {
    url: String,
    budget: FetchBudget,
    at: i64,
}

/// Tenants with a reserve at most (configured tenants, not traffic, make entries; the
/// least recently verified makes room).
const MAX_TENANT_RESERVES: usize = 4096;
/// Shapes of verified certificate names kept at most (the oldest makes room).
const MAX_SHAPES: usize = 16;

/// A set of trust anchors for the certificate chain.
pub struct Anchors(Vec<TrustAnchor<'static>>);

impl Anchors {
    /// Every certificate in a PEM bundle becomes an anchor; non-PEM text is ignored.
    pub fn from_pem(pem: &[u8]) -> Result<Self, String> {
        let mut anchors = Vec::new();
        for der in CertificateDer::pem_slice_iter(pem) {
            let der = der.map_err(|e| format!("bad PEM: {e}"))?;
            let anchor = webpki::anchor_from_trusted_cert(&der)
                .map_err(|e| format!("bad anchor certificate: {e}"))?;
            anchors.push(anchor.to_owned());
        }
        if anchors.is_empty() {
            return Err("no certificate in the bundle".into());
        }
        Ok(Anchors(anchors))
    }
}

/// A parsed certificate chain, leaf first.
type Chain = Arc<Vec<CertificateDer<'static>>>;

enum Cached {
    Chain(Chain),
    Failed,
}

struct Entry {
    value: Cached,
    at: i64,
}

impl Entry {
    fn fresh(&self, now: i64) -> bool {
        let ttl = match self.value {
            Cached::Chain(_) => CERT_TTL_SECS,
            Cached::Failed => CERT_FAILURE_TTL_SECS,
        };
        // Requests race by a second or so; a clock that went back further is stale.
        (-60..ttl).contains(&(now - self.at))
    }
}

/// The verification machinery behind [`PayPal`]: a certificate source, its cache and
/// the default anchors. The process-wide one is [`verifier`]; tests build their own.
pub struct PayPalVerifier {
    default_anchors: Arc<Anchors>,
    shared: Arc<FetchState>,
}

/// What the fetch tasks share with the verifier. No lock is held across an await.
struct FetchState {
    source: Arc<dyn CertSource>,
    limits: FetchLimits,
    cache: Mutex<HashMap<String, Entry>>,
    /// URL → chain of the certificates that verified a signature.
    pinned: Mutex<HashMap<String, (Chain, i64)>>,
    /// URL → the fetch in flight (single-flight).
    inflight: Mutex<HashMap<String, Shared<BoxFuture<'static, ()>>>>,
    running: Arc<Semaphore>,
    /// The shared bucket.
    budget: Mutex<FetchBudget>,
    /// The bucket of names of a shape no verified certificate had.
    other_shapes: Mutex<FetchBudget>,
    /// Shapes ([`cert_shape`]) of the certificates that verified a delivery.
    shapes: Mutex<Vec<String>>,
    /// Tenant → the URL it last verified a delivery with, and that URL's own bucket.
    tenants: Mutex<HashMap<String, TenantReserve>>,
    /// Fetches from the tenants' reserves running at once.
    reserve_running: Arc<Semaphore>,
    /// Host → when a fetch to it last failed as unreachable.
    unreachable: Mutex<HashMap<String, i64>>,
    /// Where verified certificates are kept beyond the process, if anywhere.
    store: OnceLock<Arc<dyn CertificateCache>>,
    /// Verified certificates not yet written there: URL → (PEM chain, expires at).
    unsaved: Mutex<HashMap<String, (Vec<u8>, i64)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PayPalVerifier {
    pub fn new(source: Arc<dyn CertSource>, default_anchors: Anchors) -> Self {
        Self::with_limits(source, default_anchors, FetchLimits::default())
    }

    /// [`PayPalVerifier::new`] with other fetch bounds.
    pub fn with_limits(
        source: Arc<dyn CertSource>,
        default_anchors: Anchors,
        limits: FetchLimits,
    ) -> Self {
        Self {
            default_anchors: Arc::new(default_anchors),
            shared: Arc::new(FetchState {
                source,
                limits,
                cache: Mutex::new(HashMap::new()),
                pinned: Mutex::new(HashMap::new()),
                inflight: Mutex::new(HashMap::new()),
                running: Arc::new(Semaphore::new(limits.max_concurrent)),
                budget: Mutex::new(FetchBudget::full(limits.shared())),
                other_shapes: Mutex::new(FetchBudget::full(limits.other_shapes())),
                shapes: Mutex::new(Vec::new()),
                tenants: Mutex::new(HashMap::new()),
                reserve_running: Arc::new(Semaphore::new(limits.max_concurrent)),
                unreachable: Mutex::new(HashMap::new()),
                store: OnceLock::new(),
                unsaved: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Keep the certificates that verify deliveries in `cache` as well, and look
    /// there before fetching (module docs). Once per verifier: `false` if it already
    /// had one (which it keeps).
    pub fn persist_to(&self, cache: Arc<dyn CertificateCache>) -> bool {
        self.shared.store.set(cache).is_ok()
    }

    /// [`PayPalVerifier::persist_to`] while building.
    pub fn with_certificate_cache(self, cache: Arc<dyn CertificateCache>) -> Self {
        self.persist_to(cache);
        self
    }

    /// HTTPS fetching over `client` (a clone of the process's one client) and the
    /// embedded DigiCert roots. With `EINMAL_PAYPAL_CERT_ADDR` set (`ip:port`; benchmarks
    /// and tests only), every fetch connects there instead of resolving the host, over a
    /// dedicated client; TLS still checks the PayPal host name.
    pub fn production(client: HttpsClient) -> Self {
        let anchors =
            Anchors::from_pem(DEFAULT_ROOTS_PEM.as_bytes()).expect("embedded DigiCert roots parse");
        let source = match std::env::var(CERT_ADDR_ENV).ok().map(|a| a.parse()) {
            Some(Ok(addr)) => HttpsCertSource::connecting_to(addr),
            Some(Err(_)) => {
                tracing::error!(
                    variable = CERT_ADDR_ENV,
                    "not an ip:port; certificates are fetched from PayPal"
                );
                HttpsCertSource::with_client(client)
            }
            None => HttpsCertSource::with_client(client),
        };
        Self::new(Arc::new(source), anchors)
    }

    /// Fetch the certificate `request` names, if it is worth a fetch and the bounds
    /// allow one (module docs); the synchronous verification then finds it cached.
    /// Never fails: whatever goes wrong, verification reports it.
    pub async fn prepare(&self, request: &WebhookRequest, tenant: &TenantConfig, now_secs: i64) {
        if tenant.option("webhook_id").is_none_or(str::is_empty) {
            return;
        }
        let Ok(h) = Headers::parse(request, tenant, now_secs) else {
            return;
        };
        if sig::decode_base64(SIG, h.sig).is_err() || !is_allowed_cert_url(h.cert_url) {
            return;
        }
        if self.shared.knows(h.cert_url, now_secs) || self.load(h.cert_url, now_secs).await {
            return;
        }
        if let Some(flight) = self
            .shared
            .start_fetch(h.cert_url, &tenant.tenant, now_secs)
        {
            flight.await;
        }
    }

    /// The certificate chain served at `url`, from the pinned set or the cache. A
    /// certificate not fetched (yet) is a mismatch: nothing is fetched here.
    /// A certificate not fetched for a reason of ours (the fetch bounds, its host did
    /// not answer) is [`ProviderError::CannotVerifyNow`] (503: PayPal retries), never
    /// a mismatch: only what PayPal's host answered can make a request forged.
    fn chain(
        &self,
        url: &str,
        tenant: &str,
        now: i64,
    ) -> Result<(Arc<Vec<CertificateDer<'static>>>, bool), ProviderError> {
        if let Some((chain, _)) = lock(&self.shared.pinned).get(url) {
            return Ok((chain.clone(), true));
        }
        match self.shared.cached(url, now) {
            Some(Ok(chain)) => Ok((chain, false)),
            Some(Err(())) => Err(ProviderError::SignatureMismatch),
            None => {
                let retry_after_secs = self.shared.retry_after_secs(url, tenant, now);
                tracing::info!(
                    cert_url = url,
                    retry_after_secs,
                    "paypal: certificate not fetched (fetch bounds, or its host is unreachable)"
                );
                Err(ProviderError::CannotVerifyNow { retry_after_secs })
            }
        }
    }

    /// `url`'s chain from the store, pinned if it is there: it verified a delivery when
    /// it was stored, and it is checked again like any chain. `false`: no store, not
    /// there, or the store failed (then the fetch path decides).
    async fn load(&self, url: &str, now: i64) -> bool {
        let Some(store) = self.shared.store.get() else {
            return false;
        };
        match store.get_certificate(url, now).await {
            Ok(Some(pem)) => match parse_chain(&pem) {
                Ok(chain) => {
                    self.pin(url, chain, now);
                    true
                }
                Err(reason) => {
                    tracing::warn!(cert_url = url, reason = %reason, "paypal: stored certificate unusable");
                    false
                }
            },
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(cert_url = url, error = %e, "paypal: cannot read the stored certificates");
                false
            }
        }
    }

    /// Write the certificates that verified a delivery and are not in the store yet
    /// (one per certificate and process; a failed write is tried again after the next
    /// verification). `None`: nothing to write, or no store.
    pub fn save_verified(&self) -> Option<BoxFuture<'_, ()>> {
        let store = self.shared.store.get()?.clone();
        let pending: Vec<(String, (Vec<u8>, i64))> = {
            let mut unsaved = lock(&self.shared.unsaved);
            if unsaved.is_empty() {
                return None;
            }
            unsaved.drain().collect()
        };
        Some(
            async move {
                for (url, (pem, expires_at)) in pending {
                    match store.put_certificate(&url, &pem, expires_at).await {
                        Ok(()) => tracing::info!(
                            cert_url = %url,
                            expires_at,
                            "paypal: verified certificate kept in the store"
                        ),
                        Err(e) => {
                            tracing::warn!(cert_url = %url, error = %e, "paypal: cannot keep the verified certificate");
                            lock(&self.shared.unsaved)
                                .entry(url)
                                .or_insert((pem, expires_at));
                        }
                    }
                }
            }
            .boxed(),
        )
    }

    /// Keep the chain of a certificate that verified a signature.
    fn pin(&self, url: &str, chain: Arc<Vec<CertificateDer<'static>>>, now: i64) {
        let mut pinned = lock(&self.shared.pinned);
        if !pinned.contains_key(url) && pinned.len() >= PINNED_CERTS {
            let oldest = pinned
                .iter()
                .min_by_key(|(_, e)| e.1)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                pinned.remove(&k);
            }
        }
        pinned.insert(url.to_owned(), (chain, now));
    }

    /// Whether `url`'s certificate is pinned (tests).
    pub fn is_pinned(&self, url: &str) -> bool {
        lock(&self.shared.pinned).contains_key(url)
    }

    fn anchors(&self, tenant: &TenantConfig) -> Result<Arc<Anchors>, ProviderError> {
        match tenant.option("paypal_ca_pem") {
            None => Ok(self.default_anchors.clone()),
            Some(path) => configured_anchors(path),
        }
    }

    /// [`Provider::verify_and_extract`] with this verifier's source and anchors.
    pub fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        let webhook_id = tenant
            .option("webhook_id")
            .filter(|w| !w.is_empty())
            .ok_or(ProviderError::NoSecret)?;
        let h = Headers::parse(request, tenant, now_secs)?;
        let signature = sig::decode_base64(SIG, h.sig)?;
        let cert_url = h.cert_url;
        if !is_allowed_cert_url(cert_url) {
            return Err(ProviderError::MalformedHeader(
                CERT_URL,
                "not an allowed PayPal certificate URL",
            ));
        }
        let anchors = self.anchors(tenant)?;
        let (chain, pinned) = self.chain(cert_url, &tenant.tenant, now_secs)?;
        let leaf = check_chain(&chain, &anchors.0, now_secs).map_err(|reason| {
            tracing::warn!(cert_url, reason = %reason, "paypal: certificate rejected");
            if pinned {
                // Expired (or rotated out): fetch it again next time.
                lock(&self.shared.pinned).remove(cert_url);
            }
            ProviderError::SignatureMismatch
        })?;
        let body = &request.body[..];
        let message = signed_string(h.id, h.time, webhook_id, body);
        leaf.verify_signature(
            webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA256,
            message.as_bytes(),
            &signature,
        )
        .map_err(|_| ProviderError::SignatureMismatch)?;
        if !pinned {
            self.pin(cert_url, chain.clone(), now_secs);
            self.shared.keep(cert_url, &chain, now_secs);
        }
        self.shared.learn(cert_url, &tenant.tenant, now_secs);
        let envelope = extract(body, tenant, h.id)?;
        Ok(VerifiedEvent::whole(envelope, request))
    }
}

impl FetchState {
    /// Pinned, or cached (a chain or a failure).
    fn knows(&self, url: &str, now: i64) -> bool {
        lock(&self.pinned).contains_key(url) || self.cached(url, now).is_some()
    }

    /// Queue a newly verified chain for the store (when there is one).
    fn keep(&self, url: &str, chain: &[CertificateDer<'static>], now: i64) {
        if self.store.get().is_none() {
            return;
        }
        let expires_at = not_after(chain).unwrap_or(now + CERT_TTL_SECS);
        let mut unsaved = lock(&self.unsaved);
        if unsaved.len() < PINNED_CERTS || unsaved.contains_key(url) {
            unsaved.insert(url.to_owned(), (to_pem(chain), expires_at));
        }
    }

    fn cached(&self, url: &str, now: i64) -> Option<Result<Arc<Vec<CertificateDer<'static>>>, ()>> {
        let cache = lock(&self.cache);
        let entry = cache.get(url).filter(|e| e.fresh(now))?;
        Some(match &entry.value {
            Cached::Chain(chain) => Ok(chain.clone()),
            Cached::Failed => Err(()),
        })
    }

    /// The fetch of `url` to await: the one in flight, or a new one if the URL is not
    /// known, its host is not marked unreachable and a budget allows it (module docs).
    /// `None`: no fetch (cached, or refused).
    fn start_fetch(
        self: &Arc<Self>,
        url: &str,
        tenant: &str,
        now: i64,
    ) -> Option<Shared<BoxFuture<'static, ()>>> {
        if lock(&self.pinned).contains_key(url) || self.cached(url, now).is_some() {
            return None;
        }
        let mut inflight = lock(&self.inflight);
        if let Some(flight) = inflight.get(url) {
            return Some(flight.clone());
        }
        if self.unreachable_for(url, now).is_some() {
            return None;
        }
        let permit = match self.reserved(url, tenant, now) {
            Some(permit) => permit,
            None => {
                let Ok(permit) = self.running.clone().try_acquire_owned() else {
                    tracing::info!(
                        cert_url = url,
                        "paypal: certificate fetch refused (fetches running at the bound)"
                    );
                    return None;
                };
                if !self.take_shared(url, now) {
                    tracing::info!(
                        cert_url = url,
                        "paypal: certificate fetch refused (rate of new fetches)"
                    );
                    return None;
                }
                permit
            }
        };
        let fetch = self.source.fetch(url);
        let shared = self.clone();
        let owned = url.to_owned();
        let task = tokio::spawn(async move {
            let fetched = match tokio::time::timeout(FETCH_TIMEOUT, fetch).await {
                Ok(fetched) => fetched,
                Err(_) => Err(FetchError::Unreachable("timed out".into())),
            };
            shared.settle(&owned, fetched, now);
            drop(permit);
        });
        let flight = async move {
            let _ = task.await;
        }
        .boxed()
        .shared();
        inflight.insert(url.to_owned(), flight.clone());
        Some(flight)
    }

    /// Seconds left of `url`'s host's unreachable mark, if it has one.
    fn unreachable_for(&self, url: &str, now: i64) -> Option<u64> {
        let at = *lock(&self.unreachable).get(cert_host(url))?;
        let left = HOST_FAILURE_TTL_SECS - (now - at);
        (0..HOST_FAILURE_TTL_SECS)
            .contains(&(now - at))
            .then(|| u64::try_from(left).unwrap_or(1))
    }

    /// A permit and a token of `tenant`'s own bucket, if `url` is the one it last
    /// verified a delivery with.
    fn reserved(&self, url: &str, tenant: &str, now: i64) -> Option<OwnedSemaphorePermit> {
        let mut tenants = lock(&self.tenants);
        let reserve = tenants.get_mut(tenant).filter(|r| r.url == url)?;
        let permit = self.reserve_running.clone().try_acquire_owned().ok()?;
        reserve
            .budget
            .take(self.limits.tenant(), now)
            .then_some(permit)
    }

    /// Whether names shaped like `url` may spend the shared bucket: any name until a
    /// certificate verified a delivery, then only names of a shape seen verifying.
    fn shape_is_known(&self, url: &str) -> bool {
        let shapes = lock(&self.shapes);
        shapes.is_empty() || shapes.iter().any(|s| s == cert_shape(url))
    }

    /// A token of the bucket that pays for `url`: the shared one for a known shape,
    /// else the small one of other shapes.
    fn take_shared(&self, url: &str, now: i64) -> bool {
        if self.shape_is_known(url) {
            lock(&self.budget).take(self.limits.shared(), now)
        } else {
            lock(&self.other_shapes).take(self.limits.other_shapes(), now)
        }
    }

    /// When a request whose certificate could not be fetched should come again: the
    /// rest of its host's unreachable mark, else when the bucket that pays for it has
    /// a token (1 to 60 s).
    fn retry_after_secs(&self, url: &str, tenant: &str, now: i64) -> u64 {
        if let Some(left) = self.unreachable_for(url, now) {
            return left.clamp(1, 60);
        }
        let mut wait = if self.shape_is_known(url) {
            lock(&self.budget).wait_secs(self.limits.shared(), now)
        } else {
            lock(&self.other_shapes).wait_secs(self.limits.other_shapes(), now)
        };
        if let Some(reserve) = lock(&self.tenants).get(tenant).filter(|r| r.url == url) {
            wait = wait.min(reserve.budget.wait_secs(self.limits.tenant(), now));
        }
        wait.clamp(1, 60)
    }

    /// What a verified delivery teaches: its certificate's shape may spend the shared
    /// bucket, and its URL is the tenant's reserved one.
    fn learn(&self, url: &str, tenant: &str, now: i64) {
        let shape = cert_shape(url);
        {
            let mut shapes = lock(&self.shapes);
            if !shapes.iter().any(|s| s == shape) {
                if shapes.len() >= MAX_SHAPES {
                    shapes.remove(0);
                }
                shapes.push(shape.to_owned());
            }
        }
        let mut tenants = lock(&self.tenants);
        if let Some(reserve) = tenants.get_mut(tenant) {
            if reserve.url != url {
                reserve.url = url.to_owned();
            }
            reserve.at = now;
            return;
        }
        if tenants.len() >= MAX_TENANT_RESERVES {
            let oldest = tenants
                .iter()
                .min_by_key(|(_, r)| r.at)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                tenants.remove(&k);
            }
        }
        tenants.insert(
            tenant.to_owned(),
            TenantReserve {
                url: url.to_owned(),
                budget: FetchBudget::full(self.limits.tenant()),
                at: now,
            },
        );
    }

    /// Record a finished fetch: cache entry, unreachable host, flight done.
    fn settle(&self, url: &str, fetched: Result<Vec<u8>, FetchError>, now: i64) {
        let value = match fetched.map(|pem| parse_chain(&pem)) {
            Ok(Ok(chain)) => Cached::Chain(chain),
            Ok(Err(reason)) => {
                tracing::warn!(cert_url = url, reason = %reason, "paypal: certificate response rejected");
                Cached::Failed
            }
            Err(err) => {
                tracing::warn!(cert_url = url, reason = %err, "paypal: certificate fetch failed");
                if let FetchError::Unreachable(_) = err {
                    // The host's mark holds new fetches back; the URL itself is not
                    // known to be bad, so its requests are answered 503, not 401.
                    lock(&self.unreachable).insert(cert_host(url).to_owned(), now);
                    lock(&self.inflight).remove(url);
                    return;
                }
                Cached::Failed
            }
        };
        {
            let mut cache = lock(&self.cache);
            if cache.len() >= CERT_CACHE_ENTRIES {
                cache.retain(|_, e| e.fresh(now));
            }
            if cache.len() >= CERT_CACHE_ENTRIES {
                let oldest = cache
                    .iter()
                    .min_by_key(|(_, e)| e.at)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    cache.remove(&k);
                }
            }
            cache.insert(url.to_owned(), Entry { value, at: now });
        }
        lock(&self.inflight).remove(url);
    }
}

/// The earliest notAfter of the chain (Unix seconds): when it stops validating.
fn not_after(chain: &[CertificateDer<'_>]) -> Option<i64> {
    chain
        .iter()
        .map(|der| {
            x509_parser::parse_x509_certificate(der)
                .ok()
                .map(|(_, c)| c.validity().not_after.timestamp())
        })
        .collect::<Option<Vec<i64>>>()?
        .into_iter()
        .min()
}

/// The chain as PEM, leaf first (what a certificate host serves).
fn to_pem(chain: &[CertificateDer<'_>]) -> Vec<u8> {
    use base64::Engine;
    let mut pem = String::new();
    for der in chain {
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    pem.into_bytes()
}

/// The shape of an allow-listed certificate URL: all but the last group of its name
/// (`https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594`). PayPal's
/// certificate names seen so far differ in the last group only.
fn cert_shape(url: &str) -> &str {
    &url[..url.len() - CERT_NAME_GROUP_LEN - 1]
}

/// The host of an allow-listed certificate URL.
fn cert_host(url: &str) -> &str {
    url.trim_start_matches("https://")
        .split('/')
        .next()
        .unwrap_or_default()
}

/// The process-wide verifier used by [`PayPal`]: [`install`]ed, or else
/// [`PayPalVerifier::production`] with a client of its own on first use.
pub fn verifier() -> &'static PayPalVerifier {
    VERIFIER.get_or_init(|| {
        let v = PayPalVerifier::production(HttpsClient::new());
        if let Some(cache) = PROCESS_CACHE.get() {
            v.persist_to(cache.clone());
        }
        v
    })
}

static VERIFIER: OnceLock<PayPalVerifier> = OnceLock::new();
/// Where the process-wide verifier keeps verified certificates ([`persist_verified_to`]).
static PROCESS_CACHE: OnceLock<Arc<dyn CertificateCache>> = OnceLock::new();

/// Replace the process-wide verifier (e.g. a fixture source for an end-to-end test).
/// Only possible before its first use; otherwise the argument is handed back.
pub fn install(v: PayPalVerifier) -> Result<(), PayPalVerifier> {
    if let Some(cache) = PROCESS_CACHE.get() {
        v.persist_to(cache.clone());
    }
    VERIFIER.set(v)
}

/// The process-wide verifier keeps the certificates that verify deliveries in `cache`
/// (the composition root's store) and looks there before fetching: set once, before
/// or after the verifier's first use, without building it (a receiver with no PayPal
/// tenant never does). `false` if it already keeps them elsewhere.
pub fn persist_verified_to(cache: Arc<dyn CertificateCache>) -> bool {
    let set = PROCESS_CACHE.set(cache).is_ok();
    match (VERIFIER.get(), PROCESS_CACHE.get()) {
        (Some(v), Some(cache)) => v.persist_to(cache.clone()) || set,
        _ => set,
    }
}

/// Anchors from a PEM file, read once per path per process.
fn configured_anchors(path: &str) -> Result<Arc<Anchors>, ProviderError> {
    static LOADED: OnceLock<Mutex<HashMap<String, Arc<Anchors>>>> = OnceLock::new();
    let loaded = LOADED.get_or_init(Default::default);
    let mut loaded = loaded.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(a) = loaded.get(path) {
        return Ok(a.clone());
    }
    let anchors = std::fs::read(Path::new(path))
        .map_err(|e| e.to_string())
        .and_then(|pem| Anchors::from_pem(&pem))
        .map_err(|reason| {
            tracing::error!(path, reason = %reason, "paypal: cannot load paypal_ca_pem");
            ProviderError::NoSecret
        })?;
    let anchors = Arc::new(anchors);
    loaded.insert(path.to_owned(), anchors.clone());
    Ok(anchors)
}

struct Headers<'a> {
    id: &'a str,
    time: &'a str,
    sig: &'a str,
    cert_url: &'a str,
}

impl<'a> Headers<'a> {
    /// All headers present and well-formed, the algorithm supported, the time fresh.
    fn parse(
        request: &'a WebhookRequest,
        tenant: &TenantConfig,
        now: i64,
    ) -> Result<Self, ProviderError> {
        let get = |name: sig::Name, label: &'static str| {
            sig::single_header(request, name)?.ok_or(ProviderError::MissingHeader(label))
        };
        let id = get(&TRANSMISSION_ID, ID)?;
        let time = get(&TRANSMISSION_TIME, TIME)?;
        let sig = get(&TRANSMISSION_SIG, SIG)?;
        let cert_url = get(&CERT_URL_HEADER, CERT_URL)?;
        let algo = get(&AUTH_ALGO, ALGO)?;
        if !algo.eq_ignore_ascii_case(AUTH_ALGO_SHA256_RSA) {
            return Err(ProviderError::MalformedHeader(
                ALGO,
                "only SHA256withRSA is supported",
            ));
        }
        if id.contains('|') {
            return Err(ProviderError::MalformedHeader(ID, "contains '|'"));
        }
        let ts = crate::time::parse_rfc3339(time)
            .ok_or(ProviderError::MalformedHeader(TIME, "not an RFC 3339 time"))?;
        sig::check_timestamp(ts, now, tenant.tolerance_secs, false)?;
        Ok(Headers {
            id,
            time,
            sig,
            cert_url,
        })
    }
}

/// `{transmission_id}|{transmission_time}|{webhook_id}|{crc32(body) as unsigned decimal}`.
pub fn signed_string(transmission_id: &str, time: &str, webhook_id: &str, body: &[u8]) -> String {
    let crc = sig::Decimal::new(u64::from(crc32fast::hash(body)));
    let crc = std::str::from_utf8(crc.as_bytes()).expect("digits are ASCII");
    format!("{transmission_id}|{time}|{webhook_id}|{crc}")
}

/// `https://{allowed host}/v1/notifications/certs/{name}` and nothing else.
pub fn is_allowed_cert_url(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("https://") else {
        return false;
    };
    let Some((host, path)) = rest.split_once('/') else {
        return false;
    };
    if !ALLOWED_CERT_HOSTS.contains(&host) {
        return false;
    }
    let Some(name) = path.strip_prefix(&CERT_PATH[1..]) else {
        return false;
    };
    let Some(groups) = name.strip_prefix("CERT-") else {
        return false;
    };
    let groups: Vec<&str> = groups.split('-').collect();
    groups.len() == CERT_NAME_GROUPS
        && groups
            .iter()
            .all(|g| g.len() == CERT_NAME_GROUP_LEN && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn parse_chain(pem: &[u8]) -> Result<Arc<Vec<CertificateDer<'static>>>, String> {
    if pem.len() > MAX_CERT_BYTES {
        return Err("certificate response too large".into());
    }
    let mut chain = Vec::new();
    for der in CertificateDer::pem_slice_iter(pem) {
        chain.push(der.map_err(|e| format!("bad PEM: {e}"))?);
        if chain.len() > MAX_CHAIN_CERTS {
            return Err("too many certificates".into());
        }
    }
    if chain.is_empty() {
        return Err("no certificate in the response".into());
    }
    Ok(Arc::new(chain))
}

/// Path to an anchor at `now`, then the common-name rule; returns the leaf, or why not.
fn check_chain<'a>(
    chain: &'a [CertificateDer<'static>],
    anchors: &[TrustAnchor<'static>],
    now: i64,
) -> Result<EndEntityCert<'a>, String> {
    let (leaf, intermediates) = chain.split_first().ok_or("empty chain")?;
    let ee = EndEntityCert::try_from(leaf).map_err(|e| format!("leaf: {e}"))?;
    let now = u64::try_from(now).map_err(|_| "negative time")?;
    ee.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        anchors,
        intermediates,
        UnixTime::since_unix_epoch(Duration::from_secs(now)),
        KeyUsage::server_auth(),
        None,
        None,
    )
    .map_err(|e| format!("chain: {e}"))?;
    match common_names(leaf).as_deref() {
        Some([cn]) if has_paypal_suffix(cn) => Ok(ee),
        _ => Err("subject common name is not *.paypal.com".into()),
    }
}

fn has_paypal_suffix(cn: &str) -> bool {
    const SUFFIX: &str = ".paypal.com";
    cn.len() > SUFFIX.len()
        && cn.as_bytes()[cn.len() - SUFFIX.len()..].eq_ignore_ascii_case(SUFFIX.as_bytes())
}

/// Every commonName (2.5.4.3) in the subject of a DER certificate; `None` if it does
/// not parse or a value is not a string (UTF8String, PrintableString, IA5String,
/// NumericString).
fn common_names(certificate: &[u8]) -> Option<Vec<String>> {
    let (_, cert) = x509_parser::parse_x509_certificate(certificate).ok()?;
    cert.subject()
        .iter_common_name()
        .map(|cn| cn.as_str().ok().map(str::to_owned))
        .collect()
}

static ENVELOPE: PlainJson = PlainJson {
    provider: "paypal",
    event_id: (&["id"], "missing event `id`", "event `id` is not a string"),
    event_type: (&[&["event_type"]], "missing `event_type`"),
    object_id: &[&["resource", "id"]],
    occurred_at: Some(&["create_time"]),
    delivery_id: None,
    tenant: None,
};

fn extract(body: &[u8], tenant: &TenantConfig, delivery: &str) -> Result<Envelope, ProviderError> {
    let mut envelope = ENVELOPE.extract(body, tenant)?;
    envelope.delivery_id = Some(delivery.to_owned());
    Ok(envelope)
}

/// Environment variable (benchmarks and tests): connect every certificate fetch to
/// this `ip:port` instead of the resolved host.
pub const CERT_ADDR_ENV: &str = "EINMAL_PAYPAL_CERT_ADDR";

/// Fetches certificates over HTTPS only (system roots, HTTP/1.1, no redirects) with the
/// process's shared client. The caller bounds each fetch by [`FETCH_TIMEOUT`].
pub struct HttpsCertSource {
    client: HttpsClient,
}

impl HttpsCertSource {
    /// A client of its own, resolving PayPal's hosts by DNS.
    pub fn new() -> Self {
        Self::with_client(HttpsClient::new())
    }

    /// Fetches over `client` (a clone of the process's one client).
    pub fn with_client(client: HttpsClient) -> Self {
        HttpsCertSource { client }
    }

    /// Connect every fetch to `addr` (whatever the host), e.g. an address that never
    /// answers in a benchmark: a dedicated client. TLS still checks the host name.
    pub fn connecting_to(addr: SocketAddr) -> Self {
        Self::with_client(HttpsClient::connecting_to(addr))
    }
}

impl Default for HttpsCertSource {
    fn default() -> Self {
        Self::new()
    }
}

impl CertSource for HttpsCertSource {
    fn fetch(&self, url: &str) -> BoxFuture<'static, Result<Vec<u8>, FetchError>> {
        use http_body_util::{BodyExt, Empty, Limited};
        let client = self.client.clone();
        let request = http::Request::get(url)
            .header(http::header::ACCEPT, "*/*")
            .body(Empty::new());
        async move {
            let request = request.map_err(|e| FetchError::Refused(e.to_string()))?;
            // The shared client also speaks plain HTTP; a certificate never comes over it.
            if request.uri().scheme() != Some(&http::uri::Scheme::HTTPS) {
                return Err(FetchError::Refused("not an https URL".into()));
            }
            let response = client
                .request(request)
                .await
                .map_err(|e| FetchError::Unreachable(e.to_string()))?;
            if response.status() != http::StatusCode::OK {
                return Err(FetchError::Refused(format!("HTTP {}", response.status())));
            }
            let body = Limited::new(response.into_body(), MAX_CERT_BYTES)
                .collect()
                .await
                .map_err(|e| FetchError::Refused(e.to_string()))?;
            Ok(body.to_bytes().to_vec())
        }
        .boxed()
    }
}

impl Provider for PayPal {
    fn name(&self) -> &'static str {
        "paypal"
    }

    fn prepare<'a>(
        &'a self,
        request: &'a WebhookRequest,
        tenant: &'a TenantConfig,
        now_secs: i64,
    ) -> Option<BoxFuture<'a, ()>> {
        Some(verifier().prepare(request, tenant, now_secs).boxed())
    }

    fn options(&self) -> &'static [&'static str] {
        &["webhook_id", "paypal_ca_pem", "cert_url"]
    }

    /// Up to 25 retries over 3 days.
    fn retry_window_days(&self) -> u32 {
        3
    }

    /// Verified with PayPal's certificate; a secret (a private key PEM) only signs
    /// test requests (`sign`).
    fn needs_secret(&self, _tenant: &TenantConfig) -> bool {
        false
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        verifier().verify_and_extract(request, tenant, now_secs)
    }

    fn verified<'a>(&'a self, _tenant: &'a TenantConfig) -> Option<BoxFuture<'a, ()>> {
        verifier().save_verified()
    }

    /// For tests and `einmal send` only: signs with the tenant's first secret, an RSA
    /// private key in PEM (PKCS#8 or PKCS#1), and names option `cert_url`, which must
    /// serve the matching certificate. Real PayPal signs with its own key.
    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        let key_pem = sig::secrets(tenant)?[0].expose();
        let webhook_id = tenant.option("webhook_id").ok_or(ProviderError::NoSecret)?;
        let cert_url = tenant.option("cert_url").ok_or(ProviderError::NoSecret)?;
        let key = match PrivateKeyDer::from_pem_slice(key_pem.as_bytes()) {
            Ok(PrivateKeyDer::Pkcs8(k)) => RsaKeyPair::from_pkcs8(k.secret_pkcs8_der()),
            Ok(PrivateKeyDer::Pkcs1(k)) => RsaKeyPair::from_der(k.secret_pkcs1_der()),
            _ => return Err(ProviderError::NoSecret),
        }
        .map_err(|_| ProviderError::NoSecret)?;
        // A deterministic, UUID-shaped transmission id per (event, time).
        let d = Sha256::new()
            .chain_update(event_id)
            .chain_update(now_secs.to_be_bytes())
            .finalize();
        let h = hex::encode(&d[..16]);
        let id = format!(
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        );
        let time = crate::time::format_rfc3339(now_secs);
        let message = signed_string(&id, &time, webhook_id, body);
        let mut signature = vec![0; key.public_modulus_len()];
        key.sign(
            &RSA_PKCS1_SHA256,
            &SystemRandom::new(),
            message.as_bytes(),
            &mut signature,
        )
        .map_err(|_| ProviderError::NoSecret)?;
        let mut headers = http::HeaderMap::new();
        sig::put(&mut headers, &TRANSMISSION_ID, &id)?;
        sig::put(&mut headers, &TRANSMISSION_TIME, &time)?;
        sig::put(
            &mut headers,
            &TRANSMISSION_SIG,
            &base64::Engine::encode(&sig::B64, &signature),
        )?;
        sig::put(&mut headers, &CERT_URL_HEADER, cert_url)?;
        sig::put(&mut headers, &AUTH_ALGO, AUTH_ALGO_SHA256_RSA)?;
        sig::put(
            &mut headers,
            &http::header::CONTENT_TYPE,
            "application/json",
        )?;
        Ok(headers)
    }
}

/// [`PayPal`] on a verifier of its own instead of the process-wide one: for a test
/// that restarts the verifier (a new process or Lambda instance over the same store),
/// given to the ingestor with `Ingestor::with_provider`.
pub struct PayPalOn(Arc<PayPalVerifier>);

impl PayPalOn {
    pub fn new(verifier: Arc<PayPalVerifier>) -> Self {
        PayPalOn(verifier)
    }
}

impl Provider for PayPalOn {
    fn name(&self) -> &'static str {
        PayPal.name()
    }

    fn prepare<'a>(
        &'a self,
        request: &'a WebhookRequest,
        tenant: &'a TenantConfig,
        now_secs: i64,
    ) -> Option<BoxFuture<'a, ()>> {
        Some(self.0.prepare(request, tenant, now_secs).boxed())
    }

    fn options(&self) -> &'static [&'static str] {
        PayPal.options()
    }

    fn retry_window_days(&self) -> u32 {
        PayPal.retry_window_days()
    }

    fn needs_secret(&self, tenant: &TenantConfig) -> bool {
        PayPal.needs_secret(tenant)
    }

    fn verify_and_extract(
        &self,
        request: &WebhookRequest,
        tenant: &TenantConfig,
        now_secs: i64,
    ) -> Result<Vec<VerifiedEvent>, ProviderError> {
        self.0.verify_and_extract(request, tenant, now_secs)
    }

    fn verified<'a>(&'a self, _tenant: &'a TenantConfig) -> Option<BoxFuture<'a, ()>> {
        self.0.save_verified()
    }

    fn sign(
        &self,
        body: &[u8],
        tenant: &TenantConfig,
        event_id: &str,
        now_secs: i64,
    ) -> Result<http::HeaderMap, ProviderError> {
        PayPal.sign(body, tenant, event_id, now_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use http::{HeaderMap, HeaderValue};
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose, PKCS_RSA_SHA256,
    };

    const NOW: i64 = 1_700_000_000; // 2023-11-14T22:13:20Z
    const WEBHOOK_ID: &str = "4JH86294D6297924G";
    const BODY: &str = r#"{"id":"WH-1","create_time":"2023-11-14T22:13:00Z","resource_type":"capture","event_type":"PAYMENT.CAPTURE.COMPLETED","resource":{"id":"5O190127TN364715T","status":"COMPLETED"}}"#;
    const GOOD: &str =
        "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-0000600d";
    const SANDBOX: &str =
        "https://api-m.sandbox.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-0000600d";
    const EVIL_CN: &str =
        "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-00000e01";
    const FOREIGN: &str =
        "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-0000f0e1";
    const EXPIRED: &str =
        "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-00000e8d";
    const LEAF_ONLY: &str =
        "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-0000000f";
    const GARBAGE: &str =
        "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-00000bad";
    const MISSING: &str =
        "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-00000404";
    /// Served the good chain too: a rotation to a name of the same shape as [`GOOD`].
    const ROTATED: &str =
        "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-000a0a0a";

    /// Certificates minted in-process with rcgen (RSA keys from aws-lc-rs):
    /// root → intermediate → leaf, like PayPal's DigiCert chain.
    struct Fixture {
        root_pem: String,
        leaf_key_pem: String,
        served: HashMap<&'static str, String>,
    }

    fn ca_params(cn: &str) -> CertificateParams {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2035, 1, 1);
        p
    }

    fn leaf_params(cn: &str, from: (i32, u8, u8), to: (i32, u8, u8)) -> CertificateParams {
        let mut p = CertificateParams::new(vec![cn.to_string()]).unwrap();
        p.distinguished_name
            .push(DnType::OrganizationName, "PayPal, Inc.");
        p.distinguished_name.push(DnType::CommonName, cn);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
        p.not_after = rcgen::date_time_ymd(to.0, to.1, to.2);
        p
    }

    fn fixture() -> &'static Fixture {
        static FX: OnceLock<Fixture> = OnceLock::new();
        FX.get_or_init(|| {
            let key = || KeyPair::generate_for(&PKCS_RSA_SHA256).unwrap();
            let (root_key, inter_key, other_key, leaf_key) = (key(), key(), key(), key());
            let root_params = ca_params("Test Root CA");
            let root = root_params.self_signed(&root_key).unwrap();
            let root_issuer = Issuer::new(root_params, root_key);
            let inter_params = ca_params("Test PayPal Issuing CA");
            let inter = inter_params.signed_by(&inter_key, &root_issuer).unwrap();
            let inter_issuer = Issuer::new(inter_params, inter_key);
            let other_params = ca_params("Unrelated CA");
            let other_issuer = Issuer::new(other_params, other_key);

            let valid = ((2023, 1, 1), (2024, 12, 31));
            let leaf =
                |cn: &str, (from, to): ((i32, u8, u8), (i32, u8, u8)), by: &Issuer<'_, KeyPair>| {
                    leaf_params(cn, from, to)
                        .signed_by(&leaf_key, by)
                        .unwrap()
                        .pem()
                };
            let paypal_cn = "messageverificationcerts.paypal.com";
            let chain = |leaf_pem: String| format!("{leaf_pem}{}", inter.pem());
            let mut served = HashMap::new();
            served.insert(GOOD, chain(leaf(paypal_cn, valid, &inter_issuer)));
            served.insert(SANDBOX, chain(leaf(paypal_cn, valid, &inter_issuer)));
            served.insert(ROTATED, chain(leaf(paypal_cn, valid, &inter_issuer)));
            served.insert(
                EVIL_CN,
                chain(leaf(
                    "messageverificationcerts.paypal.com.evil.example",
                    valid,
                    &inter_issuer,
                )),
            );
            served.insert(FOREIGN, leaf(paypal_cn, valid, &other_issuer));
            served.insert(
                EXPIRED,
                chain(leaf(paypal_cn, ((2022, 1, 1), (2023, 6, 1)), &inter_issuer)),
            );
            served.insert(LEAF_ONLY, leaf(paypal_cn, valid, &inter_issuer));
            served.insert(GARBAGE, "<html>not a certificate</html>".into());
            Fixture {
                root_pem: root.pem(),
                leaf_key_pem: leaf_key.serialize_pem(),
                served,
            }
        })
    }

    /// Serves the fixture and records every fetch.
    struct FakeSource {
        calls: Mutex<Vec<String>>,
    }

    impl CertSource for FakeSource {
        fn fetch(&self, url: &str) -> BoxFuture<'static, Result<Vec<u8>, FetchError>> {
            self.calls.lock().unwrap().push(url.to_owned());
            let served = fixture()
                .served
                .get(url)
                .map(|pem| pem.clone().into_bytes())
                .ok_or_else(|| FetchError::Refused("HTTP 404".into()));
            futures::future::ready(served).boxed()
        }
    }

    /// A host that accepts and never answers: every fetch hangs (until the timeout).
    struct HangingSource {
        calls: Mutex<usize>,
    }

    impl CertSource for HangingSource {
        fn fetch(&self, _url: &str) -> BoxFuture<'static, Result<Vec<u8>, FetchError>> {
            *self.calls.lock().unwrap() += 1;
            futures::future::pending().boxed()
        }
    }

    /// A runtime on real time: a hanging fetch ends at [`FETCH_TIMEOUT`] (3 s).
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    fn url_numbered(i: usize) -> String {
        format!("https://api.paypal.com/v1/notifications/certs/CERT-0ddba11a-0000cafe-{i:08x}")
    }

    /// Names of [`GOOD`]'s shape that nothing serves (an attacker who copies the shape).
    fn url_shaped(i: usize) -> String {
        format!(
            "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-{:08x}",
            0x7000_0000 + i
        )
    }

    impl FakeSource {
        fn calls(&self) -> usize {
            self.calls.lock().unwrap().len()
        }
    }

    fn verifier_with(anchor_pem: &str) -> (PayPalVerifier, Arc<FakeSource>) {
        let source = Arc::new(FakeSource {
            calls: Mutex::new(Vec::new()),
        });
        let anchors = Anchors::from_pem(anchor_pem.as_bytes()).unwrap();
        // Unit tests of the checks fetch freely; the bounds have their own tests.
        let limits = FetchLimits {
            max_concurrent: 1000,
            burst: 1000,
            per_minute: 1000,
            per_tenant: 1000,
            other_shapes: 1000,
        };
        (
            PayPalVerifier::with_limits(source.clone(), anchors, limits),
            source,
        )
    }

    fn verifier_and_source() -> (PayPalVerifier, Arc<FakeSource>) {
        verifier_with(&fixture().root_pem)
    }

    fn tenant(webhook_id: Option<&str>, cert_url: &str) -> TenantConfig {
        tenant_named("acme", webhook_id, cert_url)
    }

    fn tenant_named(name: &str, webhook_id: Option<&str>, cert_url: &str) -> TenantConfig {
        let mut options = std::collections::BTreeMap::new();
        if let Some(w) = webhook_id {
            options.insert("webhook_id".to_string(), w.to_string());
        }
        options.insert("cert_url".to_string(), cert_url.to_string());
        TenantConfig {
            provider: "paypal".into(),
            tenant: name.into(),
            secrets: vec![Secret::new(fixture().leaf_key_pem.clone())],
            tolerance_secs: 300,
            options,
        }
    }

    /// Headers as PayPal would send them for `body` at `at`, naming `cert_url`.
    fn headers(body: &str, cert_url: &str, at: i64) -> HeaderMap {
        PayPal
            .sign(
                body.as_bytes(),
                &tenant(Some(WEBHOOK_ID), cert_url),
                "WH-1",
                at,
            )
            .unwrap()
    }

    fn verify_at(
        v: &PayPalVerifier,
        h: HeaderMap,
        body: &str,
        t: &TenantConfig,
        now: i64,
    ) -> Result<Envelope, ProviderError> {
        let r = WebhookRequest::post(h, body.to_owned());
        runtime().block_on(v.prepare(&r, t, now));
        let mut events = v.verify_and_extract(&r, t, now)?;
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].body, r.body);
        Ok(events.remove(0).envelope)
    }

    fn verify(v: &PayPalVerifier, h: HeaderMap, body: &str) -> Result<Envelope, ProviderError> {
        verify_at(v, h, body, &tenant(Some(WEBHOOK_ID), GOOD), NOW)
    }

    #[test]
    fn valid_signature_yields_envelope() {
        let (v, source) = verifier_and_source();
        let h = headers(BODY, GOOD, NOW);
        let tid = h[ID].to_str().unwrap().to_owned();
        assert_eq!(h[ALGO], "SHA256withRSA");
        assert_eq!(h[TIME], "2023-11-14T22:13:20Z");
        let env = verify(&v, h, BODY).unwrap();
        assert_eq!(
            env,
            Envelope {
                provider: "paypal".into(),
                tenant: "acme".into(),
                event_id: "WH-1".into(),
                event_type: "PAYMENT.CAPTURE.COMPLETED".into(),
                object_id: Some("5O190127TN364715T".into()),
                object_version: None,
                occurred_at: Some(1_699_999_980),
                delivery_id: Some(tid),
            }
        );
        assert_eq!(source.calls(), 1);
        // Sandbox host, same scheme.
        assert!(verify(&v, headers(BODY, SANDBOX, NOW), BODY).is_ok());
    }

    #[test]
    fn test_get_expected_sig_v13() {
        // providers.md V13 (PayPal-Python-SDK notifications_test.py): the signed string.
        let body = std::str::from_utf8(V13_BODY).unwrap();
        assert_eq!(body.len(), 1288);
        // 2771810304 = zlib.crc32(body) & 0xffffffff, computed independently in Python;
        // it exceeds i32::MAX, so a signed rendering would differ.
        assert_eq!(crc32fast::hash(V13_BODY), 2_771_810_304);
        assert_eq!(
            signed_string(
                "dfb3be50-fd74-11e4-8bf3-77339302725b",
                "2015-05-18T15:45:13Z",
                "4JH86294D6297924G",
                V13_BODY
            ),
            "dfb3be50-fd74-11e4-8bf3-77339302725b|2015-05-18T15:45:13Z|4JH86294D6297924G|2771810304"
        );
        assert_eq!(signed_string("a", "b", "c", b""), "a|b|c|0");
        // The real V13 signature cannot be checked offline: its certificate (sandbox,
        // long expired) is archived nowhere. Its headers pass every check before the
        // certificate; the fixture certificate served instead is not valid in 2015,
        // and checked in 2023 the 2015 transmission time is stale.
        let (v, source) = verifier_and_source();
        let mut h = HeaderMap::new();
        for (k, val) in [
            (ID, "dfb3be50-fd74-11e4-8bf3-77339302725b"),
            (TIME, "2015-05-18T15:45:13Z"),
            (SIG, V13_SIG),
            (CERT_URL, SANDBOX),
            (ALGO, "SHA256withRSA"),
        ] {
            h.insert(k, HeaderValue::from_static(val));
        }
        let t = tenant(Some(WEBHOOK_ID), SANDBOX);
        let at = 1_431_963_913; // 2015-05-18T15:45:13Z
        assert_eq!(
            verify_at(&v, h.clone(), body, &t, at),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify_at(&v, h, body, &t, NOW),
            Err(ProviderError::TimestampOutOfTolerance)
        );
        assert_eq!(source.calls(), 1);
    }

    #[test]
    fn tampered_body_is_rejected() {
        let (v, _) = verifier_and_source();
        let h = headers(BODY, GOOD, NOW);
        let tampered = BODY.replace("COMPLETED\"}", "DENIED\"}");
        assert_ne!(tampered, BODY);
        assert_eq!(
            verify(&v, h.clone(), &tampered),
            Err(ProviderError::SignatureMismatch)
        );
        // One trailing byte changes the CRC, and so the signed string.
        assert_eq!(
            verify(&v, h.clone(), &format!("{BODY} ")),
            Err(ProviderError::SignatureMismatch)
        );
        // The transmission id and time are signed too.
        let mut other_id = h.clone();
        other_id.insert(
            ID,
            HeaderValue::from_static("dfb3be50-0000-0000-0000-000000000000"),
        );
        assert_eq!(
            verify(&v, other_id, BODY),
            Err(ProviderError::SignatureMismatch)
        );
        let mut other_time = h;
        other_time.insert(TIME, HeaderValue::from_static("2023-11-14T22:13:21Z"));
        assert_eq!(
            verify(&v, other_time, BODY),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn webhook_id_binds_the_tenant() {
        let (v, _) = verifier_and_source();
        let h = headers(BODY, GOOD, NOW);
        assert_eq!(
            verify_at(
                &v,
                h.clone(),
                BODY,
                &tenant(Some("9XL90610J3647323C"), GOOD),
                NOW
            ),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(
            verify_at(&v, h.clone(), BODY, &tenant(None, GOOD), NOW),
            Err(ProviderError::NoSecret)
        );
        assert_eq!(
            verify_at(&v, h, BODY, &tenant(Some(""), GOOD), NOW),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn cert_urls_off_the_allow_list_are_never_fetched() {
        let (v, source) = verifier_and_source();
        let bad = [
            "http://api.paypal.com/v1/notifications/certs/CERT-good",
            "HTTPS://api.paypal.com/v1/notifications/certs/CERT-good",
            "https://evil.com/v1/notifications/certs/CERT-good",
            "https://api.paypal.com@evil.com/v1/notifications/certs/CERT-good",
            "https://evil.com@api.paypal.com/v1/notifications/certs/CERT-good",
            "https://evil.com/api.paypal.com/v1/notifications/certs/CERT-good",
            "https://api.paypal.com.evil.com/v1/notifications/certs/CERT-good",
            "https://api.paypal.com:8443/v1/notifications/certs/CERT-good",
            "https://API.PAYPAL.COM/v1/notifications/certs/CERT-good",
            "https://api.paypal.com\\@evil.com/v1/notifications/certs/CERT-good",
            "https://www.paypal.com/v1/notifications/certs/CERT-good",
            "https://api.paypal.com/v1/notifications/certs/",
            "https://api.paypal.com/v1/notifications/certs/../../oauth2/token",
            "https://api.paypal.com/v1/notifications/certs/CERT-1/extra",
            "https://api.paypal.com/v1/notifications/certs/CERT-1?x=https://evil.com/",
            "https://api.paypal.com/v1/notifications/certs/CERT-1#frag",
            "https://api.paypal.com/v1/notifications/certs/CERT%2F..",
            "https://api.paypal.com/v1/notifications/certs/.hidden",
            "https://api.paypal.com/v1/oauth2/token",
            "https://api.paypal.com",
            "file:///etc/passwd",
            "//api.paypal.com/v1/notifications/certs/CERT-good",
        ];
        for url in bad {
            assert!(!is_allowed_cert_url(url), "{url}");
            let mut h = headers(BODY, GOOD, NOW);
            h.insert(CERT_URL, HeaderValue::from_str(url).unwrap());
            assert_eq!(
                verify(&v, h, BODY),
                Err(ProviderError::MalformedHeader(
                    CERT_URL,
                    "not an allowed PayPal certificate URL"
                )),
                "{url}"
            );
        }
        assert_eq!(
            source.calls(),
            0,
            "no request may reach the certificate source"
        );
        for host in ALLOWED_CERT_HOSTS {
            let url =
                format!("https://{host}/v1/notifications/certs/CERT-360caa42-fca2a594-a5cafa77");
            assert!(is_allowed_cert_url(&url), "{url}");
        }
        // Only PayPal's own name shape: `CERT-` and three groups of eight hex digits.
        for name in [
            "CERT-good",
            "CERT-1",
            "cert-360caa42-fca2a594-a5cafa77",
            "CERT-360caa42-fca2a594",
            "CERT-360caa42-fca2a594-a5cafa77-00000000",
            "CERT-360caa42-fca2a594-a5cafa7",
            "CERT-360caa42-fca2a594-a5cafa777",
            "CERT-360caa42-fca2a594-a5cafa7g",
            "CERT-360caa42-fca2a594-a5cafa77.pem",
            "CERT-360caa42--fca2a594-a5cafa7",
            "CERT--360caa42-fca2a594-a5cafa7",
        ] {
            let url = format!("https://api.paypal.com/v1/notifications/certs/{name}");
            assert!(!is_allowed_cert_url(&url), "{url}");
        }
    }

    #[test]
    fn certificate_is_fetched_once_and_cached() {
        let (v, source) = verifier_and_source();
        for i in 0..5 {
            assert!(verify_at(
                &v,
                headers(BODY, GOOD, NOW + i),
                BODY,
                &tenant(Some(WEBHOOK_ID), GOOD),
                NOW + i
            )
            .is_ok());
        }
        assert_eq!(source.calls(), 1);
        // A failed fetch is cached briefly as well, then retried.
        let t = tenant(Some(WEBHOOK_ID), MISSING);
        for _ in 0..3 {
            assert_eq!(
                verify_at(&v, headers(BODY, MISSING, NOW), BODY, &t, NOW),
                Err(ProviderError::SignatureMismatch)
            );
        }
        assert_eq!(source.calls(), 2);
        let later = NOW + CERT_FAILURE_TTL_SECS;
        assert_eq!(
            verify_at(&v, headers(BODY, MISSING, later), BODY, &t, later),
            Err(ProviderError::SignatureMismatch)
        );
        assert_eq!(source.calls(), 3);
        // The good certificate verified a signature: it is pinned, so it is not fetched
        // again after the cache's day.
        let next_day = NOW + CERT_TTL_SECS;
        assert!(verify_at(
            &v,
            headers(BODY, GOOD, next_day),
            BODY,
            &tenant(Some(WEBHOOK_ID), GOOD),
            next_day
        )
        .is_ok());
        assert_eq!(source.calls(), 3);
        // Unparsable responses are rejected (and cached as failures).
        assert_eq!(
            verify(&v, headers(BODY, GARBAGE, NOW), BODY),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn cache_is_bounded() {
        let (v, source) = verifier_and_source();
        for i in 0..CERT_CACHE_ENTRIES + 10 {
            let url = url_numbered(i);
            let mut h = headers(BODY, GOOD, NOW);
            h.insert(CERT_URL, HeaderValue::from_str(&url).unwrap());
            assert!(verify(&v, h, BODY).is_err());
        }
        assert_eq!(source.calls(), CERT_CACHE_ENTRIES + 10);
        assert!(v.shared.cache.lock().unwrap().len() <= CERT_CACHE_ENTRIES);
    }

    #[test]
    fn the_genuine_certificate_stays_pinned_under_a_flood_of_urls() {
        let (v, source) = verifier_and_source();
        assert!(verify(&v, headers(BODY, GOOD, NOW), BODY).is_ok());
        assert!(v.is_pinned(GOOD));
        // Unverified URLs (served or not) never pin and never evict the pinned one.
        assert!(verify(&v, headers(BODY, EVIL_CN, NOW), BODY).is_err());
        assert!(!v.is_pinned(EVIL_CN));
        for i in 0..CERT_CACHE_ENTRIES * 4 {
            let mut h = headers(BODY, GOOD, NOW);
            h.insert(CERT_URL, HeaderValue::from_str(&url_numbered(i)).unwrap());
            assert!(verify(&v, h, BODY).is_err());
        }
        let calls = source.calls();
        // Two days later, past the cache's day: no fetch, the pinned chain verifies.
        let later = NOW + 2 * CERT_TTL_SECS;
        let t = tenant(Some(WEBHOOK_ID), GOOD);
        assert!(verify_at(&v, headers(BODY, GOOD, later), BODY, &t, later).is_ok());
        assert_eq!(source.calls(), calls);
        // Once its chain no longer validates (expired), the pin goes.
        let in_2025 = 1_740_000_000;
        assert!(verify_at(&v, headers(BODY, GOOD, in_2025), BODY, &t, in_2025).is_err());
        assert!(!v.is_pinned(GOOD));
    }

    #[test]
    fn fetches_are_bounded_and_an_unreachable_host_is_not_retried() {
        let source = Arc::new(HangingSource {
            calls: Mutex::new(0),
        });
        let anchors = Anchors::from_pem(fixture().root_pem.as_bytes()).unwrap();
        let limits = FetchLimits::default();
        let v = PayPalVerifier::with_limits(source.clone(), anchors, limits);
        let t = tenant(Some(WEBHOOK_ID), GOOD);
        let request = |url: &str, at: i64| {
            let mut h = headers(BODY, GOOD, at);
            h.insert(CERT_URL, HeaderValue::from_str(url).unwrap());
            WebhookRequest::post(h, BODY)
        };
        // 50 requests with fresh certificate URLs at once, against a host that hangs.
        let requests: Vec<_> = (0..50).map(|i| request(&url_numbered(i), NOW)).collect();
        runtime().block_on(futures::future::join_all(
            requests.iter().map(|r| v.prepare(r, &t, NOW)),
        ));
        let calls = *source.calls.lock().unwrap();
        assert!(
            calls <= limits.max_concurrent.min(limits.burst as usize),
            "{calls} fetches for 50 requests"
        );
        assert!(calls >= 1);
        // Not checked is not forged: 503 with the rest of the host's mark (or the
        // bucket's wait) as Retry-After, never a signature mismatch (401).
        for r in &requests {
            match v.verify_and_extract(r, &t, NOW) {
                Err(ProviderError::CannotVerifyNow { retry_after_secs }) => {
                    assert!((1..=60).contains(&retry_after_secs), "{retry_after_secs}")
                }
                other => panic!("{other:?}"),
            }
        }
        // The host timed out: no new fetch to it while it is marked unreachable…
        let r = request(&url_numbered(1000), NOW + 1);
        runtime().block_on(v.prepare(&r, &t, NOW + 1));
        assert_eq!(*source.calls.lock().unwrap(), calls);
        // …but after that, one again (the rate bucket has refilled meanwhile).
        let later = NOW + HOST_FAILURE_TTL_SECS;
        let r = request(&url_numbered(1001), later);
        runtime().block_on(v.prepare(&r, &t, later));
        assert_eq!(*source.calls.lock().unwrap(), calls + 1);
    }

    #[test]
    fn the_rate_of_new_fetches_is_bounded() {
        let source = Arc::new(FakeSource {
            calls: Mutex::new(Vec::new()),
        });
        let anchors = Anchors::from_pem(fixture().root_pem.as_bytes()).unwrap();
        let v = PayPalVerifier::new(source.clone(), anchors);
        let t = tenant(Some(WEBHOOK_ID), GOOD);
        let mut at = NOW;
        let fetch_fresh = |at: i64, i: usize| {
            let mut h = headers(BODY, GOOD, at);
            h.insert(CERT_URL, HeaderValue::from_str(&url_numbered(i)).unwrap());
            let r = WebhookRequest::post(h, BODY);
            runtime().block_on(v.prepare(&r, &t, at));
        };
        // The burst, then nothing more in the same second.
        for i in 0..20 {
            fetch_fresh(at, i);
        }
        let burst = FetchLimits::default().burst as usize;
        assert_eq!(source.calls(), burst);
        // 10 a minute after that: one every 6 s.
        at += 6;
        for i in 20..40 {
            fetch_fresh(at, i);
        }
        assert_eq!(source.calls(), burst + 1);
    }

    /// Sign `body` for `t` at `at`, naming `url`, and prepare + verify it at `at`.
    fn deliver(
        v: &PayPalVerifier,
        url: &str,
        t: &TenantConfig,
        at: i64,
    ) -> Result<Envelope, ProviderError> {
        verify_at(v, headers(BODY, url, at), BODY, t, at)
    }

    /// A request with `url` that passes every check before the certificate (its
    /// signature is the good one for another URL: never reached unless fetched).
    fn probe(v: &PayPalVerifier, url: &str, t: &TenantConfig, at: i64) {
        let mut h = headers(BODY, GOOD, at);
        h.insert(CERT_URL, HeaderValue::from_str(url).unwrap());
        let r = WebhookRequest::post(h, BODY);
        runtime().block_on(v.prepare(&r, t, at));
        assert!(v.verify_and_extract(&r, t, at).is_err(), "{url}");
    }

    fn default_verifier() -> (PayPalVerifier, Arc<FakeSource>) {
        let source = Arc::new(FakeSource {
            calls: Mutex::new(Vec::new()),
        });
        let anchors = Anchors::from_pem(fixture().root_pem.as_bytes()).unwrap();
        (PayPalVerifier::new(source.clone(), anchors), source)
    }

    #[test]
    fn a_certificate_the_budget_did_not_fetch_is_unavailable_not_forged() {
        let (v, source) = default_verifier();
        let t = tenant(Some(WEBHOOK_ID), GOOD);
        // A fresh instance: the shared bucket is spent on names nothing serves.
        for i in 0..FetchLimits::default().burst as usize {
            probe(&v, &url_numbered(i), &t, NOW);
        }
        let spent = source.calls();
        let retry_after = match deliver(&v, GOOD, &t, NOW) {
            Err(ProviderError::CannotVerifyNow { retry_after_secs }) => retry_after_secs,
            other => panic!("{other:?}"),
        };
        assert_eq!(source.calls(), spent, "refused, not fetched");
        // 10 a minute: the next token in 6 s.
        assert_eq!(retry_after, 6);
        assert!(!ProviderError::CannotVerifyNow {
            retry_after_secs: retry_after
        }
        .is_authentication_failure());
        // PayPal's retry after that is checked, and accepted.
        let later = NOW + i64::try_from(retry_after).unwrap();
        assert!(deliver(&v, GOOD, &t, later).is_ok());
        // A bad signature with the certificate that was fetched stays a mismatch.
        let mut h = headers(BODY, GOOD, later);
        h.insert(SIG, HeaderValue::from_static("AAAA"));
        assert_eq!(
            verify_at(&v, h, BODY, &t, later),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn a_tenants_last_verified_url_has_a_budget_of_its_own() {
        let (v, source) = default_verifier();
        let acme = tenant(Some(WEBHOOK_ID), GOOD);
        let other = tenant_named("other", Some(WEBHOOK_ID), GOOD);
        assert!(deliver(&v, GOOD, &acme, NOW).is_ok());
        // The pinned certificate and the cache are gone (evicted by other tenants'
        // certificates, or the chain was dropped): the next delivery needs a fetch.
        v.shared.pinned.lock().unwrap().clear();
        v.shared.cache.lock().unwrap().clear();
        // Names of the real shape spend the shared bucket.
        for i in 0..20 {
            probe(&v, &url_shaped(i), &acme, NOW);
        }
        assert_eq!(source.calls(), FetchLimits::default().burst as usize);
        // A tenant without a reserve for GOOD waits on the shared bucket…
        assert!(matches!(
            deliver(&v, GOOD, &other, NOW),
            Err(ProviderError::CannotVerifyNow { .. })
        ));
        // …the tenant that last verified with GOOD does not.
        assert!(deliver(&v, GOOD, &acme, NOW).is_ok());
        assert_eq!(source.calls(), FetchLimits::default().burst as usize + 1);
        // And its reserve is for its own last URL only, not for the attacker's names.
        let calls = source.calls();
        for i in 100..110 {
            probe(&v, &url_shaped(i), &acme, NOW);
        }
        assert_eq!(source.calls(), calls);
    }

    #[test]
    fn random_names_spend_the_shared_budget_only_until_a_shape_verified() {
        let (v, source) = default_verifier();
        let t = tenant(Some(WEBHOOK_ID), GOOD);
        assert!(deliver(&v, GOOD, &t, NOW).is_ok());
        assert_eq!(source.calls(), 1);
        // Random names of another shape: only the small bucket of other shapes.
        for i in 0..50 {
            probe(&v, &url_numbered(i), &t, NOW);
        }
        let other_shapes = FetchLimits::default().other_shapes as usize;
        assert_eq!(source.calls(), 1 + other_shapes);
        // The shared bucket is still there for a rotation to a name of the known shape.
        let rotated = tenant(Some(WEBHOOK_ID), ROTATED);
        assert!(deliver(&v, ROTATED, &rotated, NOW).is_ok());
        assert_eq!(source.calls(), 2 + other_shapes);
        // A new shape (another host) still gets fetched from the small bucket once it
        // refilled: PayPal may rotate to one.
        let sandbox = tenant(Some(WEBHOOK_ID), SANDBOX);
        assert!(matches!(
            deliver(&v, SANDBOX, &sandbox, NOW),
            Err(ProviderError::CannotVerifyNow { .. })
        ));
        assert!(deliver(&v, SANDBOX, &sandbox, NOW + 30).is_ok());
    }

    #[test]
    fn cert_shape_drops_the_last_group() {
        assert_eq!(
            cert_shape(GOOD),
            "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594"
        );
        assert_eq!(cert_shape(GOOD), cert_shape(ROTATED));
        assert_ne!(cert_shape(GOOD), cert_shape(SANDBOX));
        assert_ne!(cert_shape(GOOD), cert_shape(&url_numbered(1)));
    }

    /// Certificates kept in memory, as a store keeps them; counts the writes.
    #[derive(Default)]
    struct MemoryCerts {
        kept: Mutex<HashMap<String, (Vec<u8>, i64)>>,
        puts: Mutex<usize>,
    }

    #[async_trait::async_trait]
    impl CertificateCache for MemoryCerts {
        async fn get_certificate(
            &self,
            url: &str,
            now_secs: i64,
        ) -> Result<Option<Vec<u8>>, StoreError> {
            Ok(self
                .kept
                .lock()
                .unwrap()
                .get(url)
                .filter(|(_, expires_at)| *expires_at > now_secs)
                .map(|(pem, _)| pem.clone()))
        }

        async fn put_certificate(
            &self,
            url: &str,
            pem: &[u8],
            expires_at: i64,
        ) -> Result<(), StoreError> {
            *self.puts.lock().unwrap() += 1;
            self.kept
                .lock()
                .unwrap()
                .insert(url.to_owned(), (pem.to_vec(), expires_at));
            Ok(())
        }
    }

    /// PayPal's host is down: every fetch fails at once as unreachable.
    struct DownSource(Mutex<usize>);

    impl CertSource for DownSource {
        fn fetch(&self, _url: &str) -> BoxFuture<'static, Result<Vec<u8>, FetchError>> {
            *self.0.lock().unwrap() += 1;
            futures::future::ready(Err(FetchError::Unreachable("connection refused".into())))
                .boxed()
        }
    }

    #[test]
    fn a_verified_certificate_is_kept_and_used_after_a_restart_with_the_host_down() {
        let store = Arc::new(MemoryCerts::default());
        let (v, _) = verifier_and_source();
        let v = v.with_certificate_cache(store.clone());
        let t = tenant(Some(WEBHOOK_ID), GOOD);
        assert!(deliver(&v, GOOD, &t, NOW).is_ok());
        runtime().block_on(v.save_verified().expect("a certificate to keep"));
        assert!(v.save_verified().is_none(), "kept once");
        {
            let kept = store.kept.lock().unwrap();
            assert_eq!(kept.len(), 1);
            let (pem, expires_at) = &kept[GOOD];
            // The leaf's notAfter (2024-12-31), the earliest in the chain.
            assert_eq!(*expires_at, 1_735_603_200);
            assert_eq!(
                parse_chain(pem).unwrap(),
                parse_chain(fixture().served[GOOD].as_bytes()).unwrap()
            );
        }
        // A restart: a new verifier over the same store, PayPal's host down, and a
        // flood of random names first (default limits).
        let down = Arc::new(DownSource(Mutex::new(0)));
        let anchors = Anchors::from_pem(fixture().root_pem.as_bytes()).unwrap();
        let v = PayPalVerifier::new(down.clone(), anchors).with_certificate_cache(store.clone());
        for i in 0..20 {
            probe(&v, &url_numbered(i), &t, NOW);
        }
        let fetches = *down.0.lock().unwrap();
        assert!(!v.is_pinned(GOOD));
        assert!(deliver(&v, GOOD, &t, NOW + 1).is_ok());
        assert!(v.is_pinned(GOOD));
        assert_eq!(*down.0.lock().unwrap(), fetches, "no fetch for GOOD");
        assert!(
            v.save_verified().is_none(),
            "what came from the store is not written again"
        );
        assert_eq!(*store.puts.lock().unwrap(), 1);
        // Past its expiry the stored chain is not used (and would not verify).
        let (v, _) = verifier_and_source();
        let v = v.with_certificate_cache(store.clone());
        let in_2025 = 1_740_000_000;
        assert!(deliver(&v, GOOD, &t, in_2025).is_err());
    }

    #[test]
    fn unauthenticated_requests_never_write_the_store() {
        let store = Arc::new(MemoryCerts::default());
        let (v, source) = verifier_and_source();
        let v = v.with_certificate_cache(store.clone());
        let t = tenant(Some(WEBHOOK_ID), GOOD);
        for i in 0..20 {
            probe(&v, &url_numbered(i), &t, NOW);
        }
        // Fetched and served, but the chain or the signature does not hold.
        for url in [EVIL_CN, FOREIGN, EXPIRED, LEAF_ONLY, GARBAGE, GOOD] {
            let mut h = headers(BODY, url, NOW);
            h.insert(SIG, HeaderValue::from_static("AAAA"));
            assert!(verify_at(&v, h, BODY, &t, NOW).is_err(), "{url}");
        }
        assert!(source.calls() > 20);
        assert!(v.save_verified().is_none());
        assert_eq!(*store.puts.lock().unwrap(), 0);
        assert!(store.kept.lock().unwrap().is_empty());
    }

    #[test]
    fn concurrent_requests_naming_one_url_fetch_it_once() {
        struct SlowSource(Mutex<usize>);
        impl CertSource for SlowSource {
            fn fetch(&self, url: &str) -> BoxFuture<'static, Result<Vec<u8>, FetchError>> {
                *self.0.lock().unwrap() += 1;
                let pem = fixture().served[url].clone().into_bytes();
                async move {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Ok(pem)
                }
                .boxed()
            }
        }
        let source = Arc::new(SlowSource(Mutex::new(0)));
        let anchors = Anchors::from_pem(fixture().root_pem.as_bytes()).unwrap();
        let v = PayPalVerifier::new(source.clone(), anchors);
        let t = tenant(Some(WEBHOOK_ID), GOOD);
        let requests: Vec<_> = (0..20)
            .map(|_| WebhookRequest::post(headers(BODY, GOOD, NOW), BODY))
            .collect();
        runtime().block_on(futures::future::join_all(
            requests.iter().map(|r| v.prepare(r, &t, NOW)),
        ));
        assert_eq!(*source.0.lock().unwrap(), 1);
        for r in &requests {
            assert!(v.verify_and_extract(r, &t, NOW).is_ok());
        }
    }

    #[test]
    fn expired_certificate_is_rejected() {
        let (v, _) = verifier_and_source();
        assert_eq!(
            verify(&v, headers(BODY, EXPIRED, NOW), BODY),
            Err(ProviderError::SignatureMismatch)
        );
        // The good certificate expires at the end of 2024.
        let in_2025 = 1_740_000_000;
        assert_eq!(
            verify_at(
                &v,
                headers(BODY, GOOD, in_2025),
                BODY,
                &tenant(Some(WEBHOOK_ID), GOOD),
                in_2025
            ),
            Err(ProviderError::SignatureMismatch)
        );
        let before_valid = 1_600_000_000;
        assert_eq!(
            verify_at(
                &v,
                headers(BODY, GOOD, before_valid),
                BODY,
                &tenant(Some(WEBHOOK_ID), GOOD),
                before_valid
            ),
            Err(ProviderError::SignatureMismatch)
        );
    }

    #[test]
    fn certificate_must_chain_to_an_anchor_and_name_paypal() {
        let (v, _) = verifier_and_source();
        // Signed by a CA outside the anchor set (the leaf key is the right one).
        assert_eq!(
            verify(&v, headers(BODY, FOREIGN, NOW), BODY),
            Err(ProviderError::SignatureMismatch)
        );
        // Chains fine, but the common name is not *.paypal.com.
        assert_eq!(
            verify(&v, headers(BODY, EVIL_CN, NOW), BODY),
            Err(ProviderError::SignatureMismatch)
        );
        // Without the intermediate the path cannot be built.
        assert_eq!(
            verify(&v, headers(BODY, LEAF_ONLY, NOW), BODY),
            Err(ProviderError::SignatureMismatch)
        );
        // Anchored at the real DigiCert roots, the test chain is not trusted.
        let (digicert, _) = verifier_with(DEFAULT_ROOTS_PEM);
        assert_eq!(
            verify(&digicert, headers(BODY, GOOD, NOW), BODY),
            Err(ProviderError::SignatureMismatch)
        );
        assert!(verify(&v, headers(BODY, GOOD, NOW), BODY).is_ok());
    }

    #[test]
    fn certificate_rejection_reasons() {
        let fx = fixture();
        let anchors = Anchors::from_pem(fx.root_pem.as_bytes()).unwrap();
        let reason = |url: &str, now: i64| {
            let chain = parse_chain(fx.served[url].as_bytes()).unwrap();
            check_chain(&chain, &anchors.0, now).err()
        };
        assert_eq!(reason(GOOD, NOW), None);
        assert_eq!(reason(EXPIRED, NOW).as_deref(), Some("chain: CertExpired { time: UnixTime(1700000000), not_after: UnixTime(1685577600) }"));
        assert!(reason(GOOD, 1_740_000_000)
            .unwrap()
            .starts_with("chain: CertExpired"));
        assert!(reason(GOOD, 1_600_000_000)
            .unwrap()
            .starts_with("chain: CertNotValidYet"));
        assert_eq!(
            reason(FOREIGN, NOW).as_deref(),
            Some("chain: UnknownIssuer")
        );
        assert_eq!(
            reason(LEAF_ONLY, NOW).as_deref(),
            Some("chain: UnknownIssuer")
        );
        assert_eq!(
            reason(EVIL_CN, NOW).as_deref(),
            Some("subject common name is not *.paypal.com")
        );
        assert_eq!(
            parse_chain(fx.served[GARBAGE].as_bytes()).unwrap_err(),
            "no certificate in the response"
        );
        assert_eq!(
            check_chain(&[], &anchors.0, NOW).err().as_deref(),
            Some("empty chain")
        );
    }

    #[test]
    fn tenant_ca_bundle_overrides_default_anchors() {
        let (digicert, _) = verifier_with(DEFAULT_ROOTS_PEM);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("paypal-ca.pem");
        std::fs::write(&path, &fixture().root_pem).unwrap();
        let mut t = tenant(Some(WEBHOOK_ID), GOOD);
        t.options
            .insert("paypal_ca_pem".into(), path.to_str().unwrap().into());
        assert!(verify_at(&digicert, headers(BODY, GOOD, NOW), BODY, &t, NOW).is_ok());
        t.options.insert(
            "paypal_ca_pem".into(),
            dir.path().join("missing.pem").to_str().unwrap().into(),
        );
        assert_eq!(
            verify_at(&digicert, headers(BODY, GOOD, NOW), BODY, &t, NOW),
            Err(ProviderError::NoSecret)
        );
    }

    #[test]
    fn transmission_time_window() {
        let (v, _) = verifier_and_source();
        let t = tenant(Some(WEBHOOK_ID), GOOD);
        for (at, ok) in [
            (NOW - 300, true),
            (NOW + 300, true),
            (NOW - 301, false),
            (NOW + 301, false),
            (NOW - 86_400, false),
        ] {
            let got = verify_at(&v, headers(BODY, GOOD, at), BODY, &t, NOW);
            if ok {
                assert!(got.is_ok(), "{at}");
            } else {
                assert_eq!(got, Err(ProviderError::TimestampOutOfTolerance), "{at}");
            }
        }
        let mut h = headers(BODY, GOOD, NOW);
        h.insert(TIME, HeaderValue::from_static("1700000000"));
        assert_eq!(
            verify(&v, h, BODY),
            Err(ProviderError::MalformedHeader(TIME, "not an RFC 3339 time"))
        );
    }

    #[test]
    fn unsupported_algorithm_and_garbled_headers() {
        let (v, source) = verifier_and_source();
        for algo in ["SHA1withRSA", "SHA512withRSA", "sha256", "none"] {
            let mut h = headers(BODY, GOOD, NOW);
            h.insert(ALGO, HeaderValue::from_static(algo));
            assert_eq!(
                verify(&v, h, BODY),
                Err(ProviderError::MalformedHeader(
                    ALGO,
                    "only SHA256withRSA is supported"
                )),
                "{algo}"
            );
        }
        let mut h = headers(BODY, GOOD, NOW);
        h.insert(SIG, HeaderValue::from_static("not*base64!"));
        assert_eq!(
            verify(&v, h, BODY),
            Err(ProviderError::MalformedHeader(
                SIG,
                "signature is not valid base64"
            ))
        );
        let mut h = headers(BODY, GOOD, NOW);
        h.insert(ID, HeaderValue::from_static("a|b"));
        assert_eq!(
            verify(&v, h, BODY),
            Err(ProviderError::MalformedHeader(ID, "contains '|'"))
        );
        // A well-formed but wrong signature.
        let mut h = headers(BODY, GOOD, NOW);
        h.insert(SIG, HeaderValue::from_static("AAAA"));
        assert_eq!(verify(&v, h, BODY), Err(ProviderError::SignatureMismatch));
        assert_eq!(source.calls(), 1);
    }

    #[test]
    fn missing_headers() {
        let (v, source) = verifier_and_source();
        for name in [ID, TIME, SIG, CERT_URL, ALGO] {
            let mut h = headers(BODY, GOOD, NOW);
            h.remove(name);
            let err = verify(&v, h, BODY).unwrap_err();
            assert_eq!(err, ProviderError::MissingHeader(name));
            assert!(err.is_authentication_failure());
        }
        assert_eq!(source.calls(), 0);
    }

    #[test]
    fn authentic_but_malformed_payloads() {
        let (v, _) = verifier_and_source();
        for (body, want) in [
            ("[]", "body is not a JSON object"),
            (r#"{"event_type":"X"}"#, "missing event `id`"),
            (r#"{"id":"WH-2"}"#, "missing `event_type`"),
            (r#"{"id":7,"event_type":"X"}"#, "event `id` is not a string"),
        ] {
            let err = verify(&v, headers(body, GOOD, NOW), body).unwrap_err();
            assert_eq!(err, sig::payload_error(want), "{body}");
            assert!(!err.is_authentication_failure());
        }
    }

    #[test]
    fn common_name_rules() {
        for (cn, ok) in [
            ("messageverificationcerts.paypal.com", true),
            ("MessageVerificationCerts.PayPal.COM", true),
            ("paypal.com", false),
            ("evilpaypal.com", false),
            ("x.paypal.com.evil.com", false),
            (".paypal.com", false),
        ] {
            assert_eq!(has_paypal_suffix(cn), ok, "{cn}");
        }
        assert_eq!(common_names(&[0x30, 0x05]), None);
        assert_eq!(common_names(&[]), None);
    }

    #[test]
    fn sign_needs_key_and_options() {
        let mut t = tenant(Some(WEBHOOK_ID), GOOD);
        t.secrets = vec![Secret::new("not a pem key")];
        assert_eq!(
            PayPal.sign(b"{}", &t, "WH-1", NOW).unwrap_err(),
            ProviderError::NoSecret
        );
        t.secrets.clear();
        assert_eq!(
            PayPal.sign(b"{}", &t, "WH-1", NOW).unwrap_err(),
            ProviderError::NoSecret
        );
        let mut t = tenant(Some(WEBHOOK_ID), GOOD);
        t.options.remove("cert_url");
        assert_eq!(
            PayPal.sign(b"{}", &t, "WH-1", NOW).unwrap_err(),
            ProviderError::NoSecret
        );
        // Same inputs, same headers; another event id, another transmission id.
        let a = headers(BODY, GOOD, NOW);
        assert_eq!(a, headers(BODY, GOOD, NOW));
        let b = PayPal
            .sign(
                BODY.as_bytes(),
                &tenant(Some(WEBHOOK_ID), GOOD),
                "WH-2",
                NOW,
            )
            .unwrap();
        assert_ne!(a[ID], b[ID]);
    }

    #[test]
    fn registered_and_rejects_bad_urls_without_network() {
        let p = super::super::lookup("paypal").expect("paypal is registered");
        assert_eq!(p.name(), "paypal");
        let mut h = headers(BODY, GOOD, NOW);
        h.insert(
            CERT_URL,
            HeaderValue::from_static("https://evil.com/v1/notifications/certs/CERT-good"),
        );
        let r = WebhookRequest::post(h, BODY);
        assert_eq!(
            p.verify_and_extract(&r, &tenant(Some(WEBHOOK_ID), GOOD), NOW),
            Err(ProviderError::MalformedHeader(
                CERT_URL,
                "not an allowed PayPal certificate URL"
            ))
        );
        assert_eq!(
            Anchors::from_pem(DEFAULT_ROOTS_PEM.as_bytes())
                .unwrap()
                .0
                .len(),
            3
        );
        assert!(Anchors::from_pem(b"nothing").is_err());
    }

    #[test]
    fn https_source_fails_cleanly_offline() {
        // Exercises runtime, connector and native roots without leaving the machine.
        let rt = tokio::runtime::Runtime::new().unwrap();
        let source = HttpsCertSource::new();
        let err = rt
            .block_on(source.fetch("https://127.0.0.1:1/v1/notifications/certs/CERT-x"))
            .unwrap_err();
        assert!(matches!(err, FetchError::Unreachable(_)), "{err}");
        assert!(rt
            .block_on(source.fetch("http://127.0.0.1:1/v1/notifications/certs/CERT-x"))
            .is_err());
        // A fixed address replaces DNS: a refused connection to it is unreachable too.
        let fixed = HttpsCertSource::connecting_to("127.0.0.1:1".parse().unwrap());
        let err = rt.block_on(fixed.fetch(GOOD)).unwrap_err();
        assert!(matches!(err, FetchError::Unreachable(_)), "{err}");
    }

    const V13_SIG: &str = "thy4/U002quzxFavHPwbfJGcc46E8rc5jzgyeafWm5mICTBdY/8rl7WJpn8JA0GKA+oDTPsSruqusw+XXg5RLAP7ip53Euh9Xu3UbUhQFX7UgwzE2FeYoY6lyRMiiiQLzy9BvHfIzNIVhPad4KnC339dr6y2l+mN8ALgI4GCdIh3/SoJO5wE64Bh/ueWtt8EVuvsvXfda2Le5a2TrOI9vLEzsm9GS79hAR/5oLexNz8UiZr045Mr5ObroH4w4oNfmkTaDk9Rj0G19uvISs5QzgmBpauKr7Nw++JI0pr/v5mFctQkoWJSGfBGzPRXawrvIIVHQ9Wer48GR2g9ZiApWg==";
    const V13_BODY: &[u8] = br#"{"id":"WH-0G2756385H040842W-5Y612302CV158622M","create_time":"2015-05-18T15:45:13Z","resource_type":"sale","event_type":"PAYMENT.SALE.COMPLETED","summary":"Payment completed for $ 20.0 USD","resource":{"id":"4EU7004268015634R","create_time":"2015-05-18T15:44:02Z","update_time":"2015-05-18T15:44:21Z","amount":{"total":"20.00","currency":"USD"},"payment_mode":"INSTANT_TRANSFER","state":"completed","protection_eligibility":"ELIGIBLE","protection_eligibility_type":"ITEM_NOT_RECEIVED_ELIGIBLE,UNAUTHORIZED_PAYMENT_ELIGIBLE","parent_payment":"PAY-86C81811X5228590KKVNARQQ","transaction_fee":{"value":"0.88","currency":"USD"},"links":[{"href":"https://api.sandbox.paypal.com/v1/payments/sale/4EU7004268015634R","rel":"self","method":"GET"},{"href":"https://api.sandbox.paypal.com/v1/payments/sale/4EU7004268015634R/refund","rel":"refund","method":"POST"},{"href":"https://api.sandbox.paypal.com/v1/payments/payment/PAY-86C81811X5228590KKVNARQQ","rel":"parent_payment","method":"GET"}]},"links":[{"href":"https://api.sandbox.paypal.com/v1/notifications/webhooks-events/WH-0G2756385H040842W-5Y612302CV158622M","rel":"self","method":"GET"},{"href":"https://api.sandbox.paypal.com/v1/notifications/webhooks-events/WH-0G2756385H040842W-5Y612302CV158622M/resend","rel":"resend","method":"POST"}]}"#;
}
