//! The process's one outbound HTTP client: resource lookups, reconciliation, PayPal's
//! certificate fetch and the HTTP destinations share its type, its builder, its root
//! certificates and (through clones) its connection pool. HTTP/1.1, rustls with the
//! system's root certificates, `https://` and plain `http://` (local provider stubs and
//! playgrounds); redirects are never followed.
//!
//! Destinations get a *guarded* client ([`HttpsClient::guarded`]): its resolver checks
//! every address a host name resolves to against the destination's
//! [`AddressPolicy`] and refuses the connection unless all pass, and the connector then
//! connects to exactly those checked addresses (no second lookup, so no DNS
//! rebinding between check and connect). IP literals never reach a resolver; the
//! caller checks them (the HTTP destination does).

use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use http_body_util::{Empty, Full};
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::TokioExecutor;

pub mod address;

use address::{is_loopback_host, AddressPolicy};

/// Idle pooled connections close after this long (a Lambda may freeze in between).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// A guarded client gives up connecting after this long (the caller's total timeout
/// may be shorter).
const GUARDED_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

type Connector = hyper_rustls::HttpsConnector<HttpConnector<Resolver>>;

/// A pooled HTTP(S) client. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct HttpsClient {
    client: Client<Connector, Full<Bytes>>,
    /// Kept to build guarded clients with the same roots (loaded once per process).
    tls: rustls::ClientConfig,
    fixed: Option<SocketAddr>,
}

/// A host name resolved to an address the destination's policy refuses. Travels as
/// the source of the connect error; [`refused_address`] finds it again.
#[derive(Debug, thiserror::Error)]
#[error("{host}: {reason}")]
pub struct RefusedAddress {
    pub host: String,
    pub reason: String,
}

/// The guard's refusal inside a request error, if that is why it failed.
pub fn refused_address<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a RefusedAddress> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(refused) = e.downcast_ref::<RefusedAddress>() {
            return Some(refused);
        }
        if let Some(refused) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<RefusedAddress>())
        {
            return Some(refused);
        }
        current = e.source();
    }
    None
}

impl HttpsClient {
    /// Hosts resolved by DNS, every address allowed (the provider APIs einmal calls).
    pub fn new() -> Self {
        Self::build(tls_config(), Resolver::Dns)
    }

    /// Every connection goes to `addr` whatever the host (benchmarks and tests, e.g.
    /// an address that never answers); TLS still checks the host name.
    pub fn connecting_to(addr: SocketAddr) -> Self {
        Self::build(tls_config(), Resolver::Fixed(addr))
    }

    /// A client for one destination: same roots, its own pool, and a resolver that
    /// refuses host names resolving to any address `allow_private` does not allow
    /// (loopback only for `localhost` names). A client made by
    /// [`HttpsClient::connecting_to`] stays fixed to its address.
    pub fn guarded(&self, allow_private: bool) -> Self {
        let resolver = match self.fixed {
            Some(fixed) => Resolver::Fixed(fixed),
            None => Resolver::Guarded { allow_private },
        };
        Self::build(self.tls.clone(), resolver)
    }

    fn build(tls: rustls::ClientConfig, resolver: Resolver) -> Self {
        let fixed = match resolver {
            Resolver::Fixed(addr) => Some(addr),
            _ => None,
        };
        let guarded = matches!(resolver, Resolver::Guarded { .. });
        let mut http = HttpConnector::new_with_resolver(resolver);
        // The TLS layer takes `https://`; the plain connector must let it through.
        http.enforce_http(false);
        if guarded {
            http.set_connect_timeout(Some(GUARDED_CONNECT_TIMEOUT));
        }
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build(https);
        HttpsClient { client, tls, fixed }
    }

    /// A request without a body (GET).
    pub fn request(&self, request: http::Request<Empty<Bytes>>) -> ResponseFuture {
        self.client
            .request(request.map(|_| Full::new(Bytes::new())))
    }

    /// A request with a body (a destination's POST).
    pub fn send(&self, request: http::Request<Full<Bytes>>) -> ResponseFuture {
        self.client.request(request)
    }
}

/// How many times this process loaded the system's roots (once: every client clones
/// the first configuration; a test checks it).
static ROOT_LOADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// rustls with the system's roots, read from disk once per process (a Lambda's cold
/// start builds several clients: lookups, PayPal, destinations). When none can be
/// loaded (a minimal container), the client still starts, logs a warning, and every
/// HTTPS request fails (as unreachable) until the certificates are installed.
fn tls_config() -> rustls::ClientConfig {
    static CONFIG: std::sync::OnceLock<rustls::ClientConfig> = std::sync::OnceLock::new();
    CONFIG.get_or_init(load_tls_config).clone()
}

fn load_tls_config() -> rustls::ClientConfig {
    use hyper_rustls::ConfigBuilderExt;
    ROOT_LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the default provider supports the default protocol versions");
    match builder.clone().with_native_roots() {
        Ok(with_roots) => with_roots.with_no_client_auth(),
        Err(e) => {
            tracing::warn!(error = %e, "no root certificates: outbound HTTPS will fail");
            builder
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        }
    }
}

impl Default for HttpsClient {
    fn default() -> Self {
        Self::new()
    }
}

/// DNS for the client: the system resolver (tokio's, in the blocking pool, off the
/// runtime's workers), the same with the destination guard, or one fixed address.
#[derive(Clone, Copy)]
enum Resolver {
    Dns,
    Guarded { allow_private: bool },
    Fixed(SocketAddr),
}

impl tower_service::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let guard = match *self {
            Resolver::Fixed(addr) => {
                return futures::future::ready(Ok(vec![addr].into_iter())).boxed()
            }
            Resolver::Dns => None,
            Resolver::Guarded { allow_private } => Some(AddressPolicy {
                loopback: is_loopback_host(name.as_str()),
                private: allow_private,
            }),
        };
        let host = name.as_str().to_owned();
        async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            match guard {
                Some(policy) => Ok(checked(host, addrs, policy)?.into_iter()),
                None => Ok(addrs.into_iter()),
            }
        }
        .boxed()
    }
}

/// `addrs` if the policy allows every one (the connector may try any of them), else
/// the refusal of the first it does not.
fn checked(
    host: String,
    addrs: Vec<SocketAddr>,
    policy: AddressPolicy,
) -> std::io::Result<Vec<SocketAddr>> {
    match addrs.iter().find_map(|a| policy.refusal(a.ip())) {
        Some(reason) => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            RefusedAddress { host, reason },
        )),
        None => Ok(addrs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_refuses_a_name_if_any_address_is_refused() {
        let addrs = |list: &[&str]| -> Vec<SocketAddr> {
            list.iter().map(|a| a.parse().unwrap()).collect()
        };
        let strict = AddressPolicy::default();
        let public = addrs(&[
            "93.184.215.14:443",
            "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:443",
        ]);
        assert_eq!(checked("a".into(), public.clone(), strict).unwrap(), public);
        // One rebinding-style private answer among public ones refuses the name.
        let mixed = addrs(&["93.184.215.14:443", "10.0.0.7:443"]);
        let err = checked("shop.example".into(), mixed, strict).unwrap_err();
        let refused = refused_address(&err).expect("the refusal travels in the error");
        assert_eq!(refused.host, "shop.example");
        assert!(
            refused.reason.contains("private address 10.0.0.7"),
            "{}",
            refused.reason
        );
        let metadata = addrs(&["169.254.169.254:80"]);
        assert!(checked("m".into(), metadata.clone(), strict).is_err());
        let internal = AddressPolicy {
            loopback: false,
            private: true,
        };
        assert!(checked("m".into(), metadata, internal).is_ok());
        assert!(checked("l".into(), addrs(&["127.0.0.1:80"]), strict).is_err());
    }

    #[test]
    fn the_roots_are_loaded_once_per_process() {
        let clients = [
            HttpsClient::new(),
            HttpsClient::new(),
            HttpsClient::connecting_to("127.0.0.1:1".parse().unwrap()),
        ];
        let _guarded = clients[0].guarded(false);
        assert_eq!(ROOT_LOADS.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_guarded_client_refuses_before_connecting() {
        // `localhost` resolves (from /etc/hosts) to loopback, which a guarded client
        // allows only for loopback names: this one is one, so the refusal comes from
        // the closed port, not the guard.
        let client = HttpsClient::new().guarded(false);
        let get = http::Request::get("http://localhost:1/x")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let err = client.send(get).await.unwrap_err();
        assert!(
            err.is_connect() && refused_address(&err).is_none(),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn plain_http_and_a_fixed_address_fail_cleanly_offline() {
        let get = |url: &str| http::Request::get(url).body(Empty::new()).unwrap();
        let client = HttpsClient::new();
        assert!(client.request(get("http://127.0.0.1:1/x")).await.is_err());
        assert!(client.request(get("https://127.0.0.1:1/x")).await.is_err());
        // A fixed address replaces DNS: the refused connection is a connect error.
        let fixed = HttpsClient::connecting_to("127.0.0.1:1".parse().unwrap());
        let err = fixed
            .request(get("https://api.paypal.com/x"))
            .await
            .unwrap_err();
        assert!(err.is_connect(), "{err:?}");
    }
}
