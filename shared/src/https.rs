//! The process's one outbound HTTP client: resource lookups, reconciliation and PayPal's
//! certificate fetch share its type, its builder and (through clones) its connection
//! pool. HTTP/1.1, rustls with the system's root certificates, `https://` and plain
//! `http://` (local provider stubs and playgrounds); redirects are never followed.

use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use http_body_util::Empty;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::TokioExecutor;

/// Idle pooled connections close after this long (a Lambda may freeze in between).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

type Connector = hyper_rustls::HttpsConnector<HttpConnector<Resolver>>;

/// A pooled HTTP(S) client for GET requests. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct HttpsClient {
    client: Client<Connector, Empty<Bytes>>,
}

impl HttpsClient {
    /// Hosts resolved by DNS. When no root certificate can be loaded (a minimal
    /// container), the client still starts, logs a warning, and every HTTPS request
    /// fails (as unreachable) until the certificates are installed.
    pub fn new() -> Self {
        Self::build(Resolver(None))
    }

    /// Every connection goes to `addr` whatever the host (benchmarks and tests, e.g.
    /// an address that never answers); TLS still checks the host name.
    pub fn connecting_to(addr: SocketAddr) -> Self {
        Self::build(Resolver(Some(addr)))
    }

    fn build(resolver: Resolver) -> Self {
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let builder = match hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider.clone())
        {
            Ok(builder) => builder,
            Err(e) => {
                tracing::warn!(error = %e, "no root certificates: outbound HTTPS will fail");
                let tls = rustls::ClientConfig::builder_with_provider(provider.into())
                    .with_safe_default_protocol_versions()
                    .expect("the default provider supports the default protocol versions")
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls)
            }
        };
        let mut http = HttpConnector::new_with_resolver(resolver);
        // The TLS layer takes `https://`; the plain connector must let it through.
        http.enforce_http(false);
        let https = builder.https_or_http().enable_http1().wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build(https);
        HttpsClient { client }
    }

    pub fn request(&self, request: http::Request<Empty<Bytes>>) -> ResponseFuture {
        self.client.request(request)
    }
}

impl Default for HttpsClient {
    fn default() -> Self {
        Self::new()
    }
}

/// DNS for the client: the system resolver (in the blocking pool, off the runtime's
/// workers), or one fixed address.
#[derive(Clone)]
struct Resolver(Option<SocketAddr>);

impl tower_service::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        if let Some(addr) = self.0 {
            return futures::future::ready(Ok(vec![addr].into_iter())).boxed();
        }
        let host = name.as_str().to_owned();
        async move {
            let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(addrs.collect::<Vec<_>>().into_iter())
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
