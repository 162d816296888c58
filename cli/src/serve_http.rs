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
//! - **Framing errors**: what hyper answers itself for a request it cannot parse (400,
//!   414, 431 with an empty body) is rewritten to the JSON error every other answer has.
//! - **Shutdown**: on SIGTERM or Ctrl-C the listener closes, open connections finish
//!   their request and close, bounded by [`SHUTDOWN_DRAIN`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use clap::Args;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

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
}

impl ClientLimits {
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    pub fn body_timeout(&self) -> Duration {
        Duration::from_millis(self.body_timeout_ms)
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
    let rejections = Arc::new(Semaphore::new(MAX_PENDING_REJECTIONS));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout())
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            reject(stream, &rejections);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(JsonFramingErrors::new(stream));
        let conn = http.serve_connection(io, TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // Client errors (resets, timeouts, bad framing) end only their connection.
            let _ = conn.await;
            drop(permit);
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
