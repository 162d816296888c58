//! The HTTP/1.1 server loop of `einmal serve`, with bounds for hostile clients.
//!
//! - **Header read** ([`ClientLimits::header_read_timeout`], 10 s): hyper's
//!   `header_read_timeout`. Its timer starts whenever the connection waits for a request
//!   head, so it is also the keep-alive idle timeout: an idle connection is closed once
//!   it has sent nothing for that long.
//! - **Body** ([`ClientLimits::body_timeout`], 30 s): the whole body must arrive within
//!   it (`serve::receive` answers 408 otherwise); a declared `Content-Length` over the
//!   limit is refused with 413 before a byte of it is read.
//! - **Connections** ([`ClientLimits::max_connections`], 512): one permit per open
//!   connection; one over the limit is answered 503 (JSON) and closed.
//! - **Connections per peer** ([`ClientLimits::max_connections_per_peer`], 32): the
//!   same, counted per peer IP address, so one client cannot take every connection and
//!   lock the other providers out. Behind a reverse proxy the proxy is the one peer
//!   (`X-Forwarded-For` is not trusted): raise the limit to what the proxy may open.
//!   The table holds only peers with a connection open (an entry goes at zero). An
//!   IPv6 peer is its /64 (one host usually holds a whole /64).
//! - **Body bytes in flight** ([`ClientLimits::max_body_bytes_in_flight`], 64 MiB):
//!   a webhook reserves its body's declared length (the body cap without one) from a
//!   [`BodyBudget`] before reading it and holds it until answered; one that finds the
//!   budget spent is answered 503 with `Retry-After`, never a 4xx, so the provider
//!   retries it. `/console` and `/metrics` take nothing from it.
//! - **Framing errors**: what hyper answers itself for a request it cannot parse (400,
//!   414, 431 with an empty body) is rewritten to the JSON error every other answer has.
//! - **Peer**: every request carries its peer address as `ConnectInfo<SocketAddr>`
//!   (the console's login throttle counts by it).
//! - **Shutdown**: on SIGTERM or Ctrl-C the listener closes, open connections finish
//!   their request and close, bounded by [`SHUTDOWN_DRAIN`].

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use clap::Args;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_service::Service as _;

/// How long open connections may take to finish after a shutdown signal.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(10);
/// Rejections (503 to a connection over the limit) being written at once; more are
/// dropped unanswered. Each one lives at most [`REJECT_TIMEOUT`].
const MAX_PENDING_REJECTIONS: usize = 64;
const REJECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Bounds on what one client may hold (`einmal serve` flags).
#[derive(Debug, Clone, Args)]
pub struct ClientLimits {
    /// Milliseconds a client has to send a complete request head; also how long an
    /// idle keep-alive connection stays open.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_ms: u64,
    /// Milliseconds a client has to send the whole request body.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_ms: u64,
    /// Connections open at once; one more is answered 503 and closed.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub max_connections: u64,
    /// Connections one peer IP address may hold at once (behind a reverse proxy, the
    /// proxy is that peer); one more is answered 503 and closed.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub max_connections_per_peer: u64,
    /// Bytes of webhook bodies being read and handled at once, over all connections;
    /// a webhook that finds them spent is answered 503 with Retry-After.
    #[arg(long, default_value_t = 64 << 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_body_bytes_in_flight: u32,
}

impl ClientLimits {
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    pub fn body_timeout(&self) -> Duration {
        Duration::from_millis(self.body_timeout_ms)
    }

    /// The small bounds of a side listener (`--metrics-addr`): a few scrapers.
    pub fn side_listener(&self) -> ClientLimits {
        ClientLimits {
            max_connections: 16,
            max_connections_per_peer: 8,
            max_body_bytes_in_flight: 1 << 16,
            ..self.clone()
        }
    }
}

/// Seconds a webhook refused for a spent [`BodyBudget`] is asked to wait.
pub const BODY_BUDGET_RETRY_AFTER_SECS: u64 = 5;

/// Bytes of request bodies held in memory at once (one permit a byte).
#[derive(Debug, Clone)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    total: u32,
}

impl BodyBudget {
    pub fn new(limits: &ClientLimits) -> Self {
        BodyBudget {
            bytes: Arc::new(Semaphore::new(limits.max_body_bytes_in_flight as usize)),
            total: limits.max_body_bytes_in_flight,
        }
    }

    /// Reserve `bytes` (at most the whole budget, so one body always fits an idle
    /// server), or `None` when they are not free now. Never waits: a waiting request
    /// would hold its connection and the memory of its head.
    pub fn try_reserve(&self, bytes: u64) -> Option<OwnedSemaphorePermit> {
        let n = u32::try_from(bytes)
            .unwrap_or(u32::MAX)
            .clamp(1, self.total);
        self.bytes.clone().try_acquire_many_owned(n).ok()
    }
}

/// The peer a connection counts for: an IPv4 address (also when IPv4-mapped), or the
/// /64 network of an IPv6 one.
pub(crate) fn peer_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

/// Open connections per peer IP address. Only peers with a connection open have an
/// entry, so the table is bounded by the connection limit, not by traffic.
#[derive(Debug)]
struct PeerTable {
    open: Mutex<HashMap<IpAddr, u64>>,
    limit: u64,
}

/// One connection of a peer; dropping it gives the slot back.
struct PeerSlot {
    table: Arc<PeerTable>,
    ip: IpAddr,
}

impl PeerTable {
    fn new(limit: u64) -> Arc<PeerTable> {
        Arc::new(PeerTable {
            open: Mutex::new(HashMap::new()),
            limit,
        })
    }

    fn acquire(table: &Arc<PeerTable>, ip: IpAddr) -> Option<PeerSlot> {
        let mut open = table.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= table.limit {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            table: table.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serve `app` on `listener` until `shutdown` resolves, then drain (bounded).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &ClientLimits,
    shutdown: impl Future<Output = ()>,
) {
    let permits = usize::try_from(limits.max_connections).unwrap_or(usize::MAX);
    let connections = Arc::new(Semaphore::new(permits));
    let peers = PeerTable::new(limits.max_connections_per_peer);
    let rejections = Arc::new(Semaphore::new(MAX_PENDING_REJECTIONS));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout())
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Per peer first: a peer at its limit never takes a global permit.
        let Some(slot) = PeerTable::acquire(&peers, peer_of(peer.ip())) else {
            reject(stream, &rejections);
            continue;
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            drop(slot);
            reject(stream, &rejections);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(JsonFramingErrors::new(stream));
        // Each request carries its peer (`ConnectInfo`): the console's login throttle.
        let app = app.clone();
        let service =
            hyper::service::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                let mut app = app.clone();
                app.call(request)
            });
        let conn = http.serve_connection(io, service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // Client errors (resets, timeouts, bad framing) end only their connection.
            let _ = conn.await;
            drop(permit);
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            drain_secs = SHUTDOWN_DRAIN.as_secs(),
            "connections still open after the shutdown drain; closing them"
        );
    }
}

/// Resolves on SIGTERM (systemd, containers) or Ctrl-C (SIGINT).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                return;
            }
            Err(e) => tracing::warn!(error = %e, "cannot watch SIGTERM; Ctrl-C only"),
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Answer a connection over the limit with 503 and close it, in the background and
/// bounded: at most [`MAX_PENDING_REJECTIONS`] at once, each for [`REJECT_TIMEOUT`].
fn reject(mut stream: TcpStream, pending: &Arc<Semaphore>) {
    let Ok(permit) = pending.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let answer = error_response(
            "503 Service Unavailable",
            "too_many_connections",
            "too many open connections; please retry",
        );
        let _ = tokio::time::timeout(REJECT_TIMEOUT, async {
            stream.write_all(&answer).await?;
            stream.shutdown().await?;
            // Read what the client already sent, so closing does not reset the
            // connection before it read the answer.
            let mut sink = [0u8; 4096];
            while tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await? > 0 {}
            io::Result::Ok(())
        })
        .await;
        drop(permit);
    });
}

/// A complete HTTP/1.1 response with a JSON error body, closing the connection.
fn error_response(status_line: &str, code: &str, message: &str) -> Vec<u8> {
    let body = serde_json::json!({ "error": code, "message": message }).to_string();
    format!(
        "HTTP/1.1 {status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The JSON replacement for the answer hyper writes itself when it cannot parse a
/// request: that answer is the only one with an empty body and no content type (every
/// answer of the router has one), and hyper closes the connection after it.
fn framing_error_replacement(head: &[u8]) -> Option<Vec<u8>> {
    let (status_line, code, message) = if head.starts_with(b"HTTP/1.1 400 ") {
        (
            "400 Bad Request",
            "malformed_request",
            "the request is not valid HTTP/1.1",
        )
    } else if head.starts_with(b"HTTP/1.1 414 ") {
        (
            "414 URI Too Long",
            "uri_too_long",
            "the request target is too long",
        )
    } else if head.starts_with(b"HTTP/1.1 431 ") {
        (
            "431 Request Header Fields Too Large",
            "headers_too_large",
            "the request head is too large",
        )
    } else {
        return None;
    };
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    let whole = end + 4 == head.len();
    let head = head[..end].to_ascii_lowercase();
    let has = |needle: &[u8]| head.windows(needle.len()).any(|w| w == needle);
    (whole && has(b"\r\ncontent-length: 0") && !has(b"\r\ncontent-type:"))
        .then(|| error_response(status_line, code, message))
}

/// The connection's stream with hyper's own framing-error answers rewritten as JSON
/// (see [`framing_error_replacement`]). Everything else passes through unchanged.
struct JsonFramingErrors {
    inner: TcpStream,
    /// A replacement being written, and how much of it is out.
    replacing: Option<(Vec<u8>, usize)>,
}

impl JsonFramingErrors {
    fn new(inner: TcpStream) -> Self {
        Self {
            inner,
            replacing: None,
        }
    }
}

impl AsyncRead for JsonFramingErrors {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for JsonFramingErrors {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.replacing.is_none() {
            match framing_error_replacement(buf) {
                Some(replacement) if buf.len() <= 4096 => this.replacing = Some((replacement, 0)),
                _ => return Pin::new(&mut this.inner).poll_write(cx, buf),
            }
        }
        // hyper retries the same buffer until it is accepted: write the replacement
        // in its place, then report the original as written.
        let (replacement, written) = this.replacing.as_mut().expect("set above");
        while *written < replacement.len() {
            match Pin::new(&mut this.inner).poll_write(cx, &replacement[*written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_bounded_and_its_entry_goes_at_zero() {
        let table = PeerTable::new(2);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let one = PeerTable::acquire(&table, a).expect("first");
        let two = PeerTable::acquire(&table, a).expect("second");
        assert!(PeerTable::acquire(&table, a).is_none(), "over the limit");
        let other = PeerTable::acquire(&table, b).expect("another peer has room");
        drop((one, two, other));
        assert!(
            table.open.lock().unwrap().is_empty(),
            "no entry left behind"
        );
    }

    #[test]
    fn an_ipv6_peer_is_its_slash_64() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(peer_of(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(peer_of(ip("2001:db8:1:2:bbbb::9")), ip("2001:db8:1:2::"));
        assert_eq!(peer_of(ip("::ffff:10.0.0.7")), ip("10.0.0.7"));
        assert_eq!(peer_of(ip("10.0.0.7")), ip("10.0.0.7"));
    }

    #[test]
    fn the_body_budget_is_shared_and_one_body_always_fits_when_idle() {
        let limits = ClientLimits {
            header_read_timeout_ms: 1,
            body_timeout_ms: 1,
            max_connections: 1,
            max_connections_per_peer: 1,
            max_body_bytes_in_flight: 100,
        };
        let budget = BodyBudget::new(&limits);
        let first = budget.try_reserve(60).expect("free");
        assert!(budget.try_reserve(60).is_none(), "spent");
        drop(first);
        assert!(budget.try_reserve(1_000).is_some(), "clamped to the budget");
    }

    #[test]
    fn only_hypers_empty_error_answers_are_replaced() {
        let hyper_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 08:00:00 GMT\r\n\r\n";
        let replaced = framing_error_replacement(hyper_400).expect("replaced");
        let text = String::from_utf8(replaced).unwrap();
        assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\ncontent-type: application/json"));
        let body: serde_json::Value =
            serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["error"], "malformed_request");
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        assert!(framing_error_replacement(ours).is_none());
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(framing_error_replacement(ok).is_none());
        let with_body = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nx";
        assert!(framing_error_replacement(with_body).is_none());
    }
}
