//! The console's access rule, its sessions, the login throttle and the CSRF token.
//!
//! With a token configured, a request presents it as `Authorization: Bearer …`, or
//! presents a session: the login form checks the token (constant time) and sets a
//! cookie holding a random session id, never the token. Sessions live in memory
//! ([`Sessions`]: at most [`MAX_SESSIONS`], the oldest evicted, each for
//! [`SESSION_TTL`]); logging out or a restart ends them. Wrong tokens (login form or
//! bearer) count per peer ([`Throttle`]): after [`MAX_FAILURES`] in a minute, 429
//! with `Retry-After` until the minute is over.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{view, Console, BASE};

/// The session cookie (HttpOnly, SameSite=Strict, Path=/console; Secure as set).
pub(super) const COOKIE: &str = "einmal_console";
/// Shortest token accepted: a guessable token is no protection.
pub(super) const MIN_TOKEN_LEN: usize = 16;
/// Sessions held at once; a new one beyond evicts the oldest.
pub(super) const MAX_SESSIONS: usize = 1_024;
/// How long a session lasts after the login.
pub(super) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Wrong tokens one peer may give per [`THROTTLE_WINDOW`].
pub(super) const MAX_FAILURES: u32 = 5;
pub(super) const THROTTLE_WINDOW: Duration = Duration::from_secs(60);
/// Peers the throttle remembers at once (the oldest window goes first).
const MAX_THROTTLED_PEERS: usize = 4_096;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(
        "the console on {0} is reachable from other machines: give a token \
         (--token or EINMAL_CONSOLE_TOKEN, at least 16 characters), or bind to 127.0.0.1"
    )]
    Required(SocketAddr),
    #[error("the console token is empty")]
    Empty,
    #[error("the console token is too short (at least 16 characters)")]
    TooShort,
}

/// 32 random bytes, hex.
pub(super) fn random_token() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// Equal in constant time (the length is not secret).
pub(super) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// The sessions the login form opened, by the SHA-256 of their id (a lookup's timing
/// says nothing about a live id).
pub(super) struct Sessions {
    open: Mutex<HashMap<[u8; 32], Instant>>,
    ttl: Duration,
    max: usize,
}

fn session_key(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    pub(super) fn new(ttl: Duration, max: usize) -> Sessions {
        Sessions {
            open: Mutex::new(HashMap::new()),
            ttl,
            max,
        }
    }

    /// A new session's id: expired ones go, then the oldest while at the cap.
    pub(super) fn open(&self) -> String {
        let id = random_token();
        let now = Instant::now();
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|_, opened| now.duration_since(*opened) < self.ttl);
        while open.len() >= self.max {
            let Some(oldest) = open.iter().min_by_key(|(_, at)| **at).map(|(k, _)| *k) else {
                break;
            };
            open.remove(&oldest);
        }
        open.insert(session_key(&id), now);
        id
    }

    /// Whether `id` is a live session (an expired one is removed).
    pub(super) fn valid(&self, id: &str) -> bool {
        let key = session_key(id);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        match open.get(&key) {
            Some(opened) if opened.elapsed() < self.ttl => true,
            Some(_) => {
                open.remove(&key);
                false
            }
            None => false,
        }
    }

    pub(super) fn close(&self, id: &str) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.remove(&session_key(id));
    }
}

/// Wrong tokens per peer (an IPv6 peer is its /64), in fixed one-minute windows.
pub(super) struct Throttle {
    peers: Mutex<HashMap<IpAddr, (Instant, u32)>>,
    window: Duration,
}

impl Throttle {
    pub(super) fn new(window: Duration) -> Throttle {
        Throttle {
            peers: Mutex::new(HashMap::new()),
            window,
        }
    }

    /// `Err(seconds to wait)` when the peer used up its wrong tokens for now.
    pub(super) fn check(&self, peer: IpAddr) -> Result<(), u64> {
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        match peers.get(&peer) {
            Some((since, n)) if *n >= MAX_FAILURES && since.elapsed() < self.window => {
                let left = self.window.saturating_sub(since.elapsed());
                Err(left.as_secs().max(1))
            }
            _ => Ok(()),
        }
    }

    pub(super) fn fail(&self, peer: IpAddr) {
        let now = Instant::now();
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if !peers.contains_key(&peer) && peers.len() >= MAX_THROTTLED_PEERS {
            peers.retain(|_, (since, _)| now.duration_since(*since) < self.window);
            while peers.len() >= MAX_THROTTLED_PEERS {
                let Some(oldest) = peers.iter().min_by_key(|(_, v)| v.0).map(|(k, _)| *k) else {
                    break;
                };
                peers.remove(&oldest);
            }
        }
        let entry = peers.entry(peer).or_insert((now, 0));
        if now.duration_since(entry.0) >= self.window {
            *entry = (now, 0);
        }
        entry.1 += 1;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.peers.lock().unwrap().len()
    }
}

/// The peer a request came from (the throttle's key); unknown when served without
/// the peer address (every such request then shares one key).
fn peer(request_ext: &axum::http::Extensions) -> IpAddr {
    request_ext
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| crate::serve_http::peer_of(addr.ip()))
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// What a request presents.
enum Presented {
    Bearer(String),
    Session(String),
    Nothing,
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim().to_owned())
}

/// The bearer header, else the session cookie.
fn presented(headers: &HeaderMap) -> Presented {
    if let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Presented::Bearer(bearer.trim().to_owned());
    }
    match session_cookie(headers) {
        Some(id) => Presented::Session(id),
        None => Presented::Nothing,
    }
}

fn throttled(headers: &HeaderMap, wait_secs: u64) -> Response {
    let message = "too many wrong console tokens from this address: wait a minute";
    let mut response = if view::wants_html(headers) {
        (
            StatusCode::TOO_MANY_REQUESTS,
            view::public_page("Log in", login_markup(Some(message))),
        )
            .into_response()
    } else {
        view::json_error(StatusCode::TOO_MANY_REQUESTS, "throttled", message)
    };
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, wait_secs.into());
    response
}

fn unauthorized(headers: &HeaderMap, message: &str) -> Response {
    let status = StatusCode::UNAUTHORIZED;
    if view::wants_html(headers) {
        (
            status,
            view::public_page("Log in", login_markup(Some(message))),
        )
            .into_response()
    } else {
        view::json_error(status, "unauthorized", message)
    }
}

/// Every page but the login: with a token configured, the request must present it
/// or a live session.
pub(super) async fn require_token(
    State(console): State<Arc<Console>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &console.token else {
        return next.run(request).await;
    };
    let headers = request.headers();
    match presented(headers) {
        Presented::Bearer(given) => {
            let peer = peer(request.extensions());
            if let Err(wait) = console.throttle.check(peer) {
                return throttled(headers, wait);
            }
            if same(&given, token) {
                return next.run(request).await;
            }
            console.throttle.fail(peer);
            unauthorized(headers, "wrong console token")
        }
        Presented::Session(id) if console.sessions.valid(&id) => next.run(request).await,
        Presented::Session(_) => unauthorized(headers, "the session expired or is unknown: log in"),
        Presented::Nothing => unauthorized(headers, "this console needs its token: log in"),
    }
}

fn login_markup(message: Option<&str>) -> maud::Markup {
    html! {
        @if let Some(m) = message { p.error { (m) } }
        form method="post" action={ (BASE) "/login" } {
            label { "Token " input type="password" name="token" autocomplete="current-password"; }
            " " button type="submit" { "Log in" }
        }
    }
}

pub(super) async fn login_form() -> Response {
    view::public_page("Log in", login_markup(None)).into_response()
}

/// The session cookie's attributes: `Secure` when configured or when the browser
/// says it is on an https origin (a TLS proxy in front).
fn cookie_attributes(console: &Console, headers: &HeaderMap) -> String {
    let over_tls = headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|o| o.to_ascii_lowercase().starts_with("https://"));
    format!(
        "HttpOnly; SameSite=Strict; Path={BASE}{}",
        if console.secure_cookie || over_tls {
            "; Secure"
        } else {
            ""
        }
    )
}

/// POST /console/login: a right token opens a session, sets its cookie and goes to
/// the overview; a wrong one counts against the peer.
pub(super) async fn login(State(console): State<Arc<Console>>, request: Request) -> Response {
    let Some(expected) = console.token.clone() else {
        return Redirect::to(BASE).into_response();
    };
    let peer = peer(request.extensions());
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    if let Err(wait) = console.throttle.check(peer) {
        return throttled(&headers, wait);
    }
    // The guard read the body whole already (and bounded it).
    let body = axum::body::to_bytes(body, super::guard::MAX_FORM_BYTES)
        .await
        .unwrap_or_default();
    let token = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned());
    match token {
        Some(given) if same(&given, &expected) => {
            let id = console.sessions.open();
            let cookie = format!(
                "{COOKIE}={id}; Max-Age={}; {}",
                SESSION_TTL.as_secs(),
                cookie_attributes(&console, &headers)
            );
            ([(header::SET_COOKIE, cookie)], Redirect::to(BASE)).into_response()
        }
        _ => {
            console.throttle.fail(peer);
            unauthorized(&headers, "wrong console token")
        }
    }
}

/// POST /console/logout: the session ends and its cookie is cleared.
pub(super) async fn logout(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    if let Some(id) = session_cookie(&headers) {
        console.sessions.close(&id);
    }
    let cookie = format!(
        "{COOKIE}=; Max-Age=0; {}",
        cookie_attributes(&console, &headers)
    );
    (
        [(header::SET_COOKIE, cookie)],
        Redirect::to(&format!("{BASE}/login")),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_are_bounded_and_close() {
        let sessions = Sessions::new(SESSION_TTL, 3);
        let ids: Vec<String> = (0..4).map(|_| sessions.open()).collect();
        assert!(!sessions.valid(&ids[0]), "the oldest was evicted");
        assert!(ids[1..].iter().all(|id| sessions.valid(id)));
        assert!(!sessions.valid(&random_token()), "a forged id");
        sessions.close(&ids[1]);
        assert!(!sessions.valid(&ids[1]), "closed");
        assert!(ids[1..].iter().all(|id| id.len() == 64));

        let expired = Sessions::new(Duration::ZERO, 3);
        let id = expired.open();
        assert!(!expired.valid(&id), "expired");
        assert!(expired.open.lock().unwrap().is_empty());
    }

    #[test]
    fn the_throttle_refuses_after_the_failures_and_forgets_after_the_window() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let throttle = Throttle::new(THROTTLE_WINDOW);
        for _ in 0..MAX_FAILURES {
            assert!(throttle.check(a).is_ok());
            throttle.fail(a);
        }
        let wait = throttle.check(a).expect_err("throttled");
        assert!((1..=60).contains(&wait));
        assert!(throttle.check(b).is_ok(), "another peer is not");

        let short = Throttle::new(Duration::ZERO);
        for _ in 0..MAX_FAILURES {
            short.fail(a);
        }
        assert!(short.check(a).is_ok(), "the window is over");

        let many = Throttle::new(THROTTLE_WINDOW);
        for i in 0..(MAX_THROTTLED_PEERS as u32 + 10) {
            many.fail(IpAddr::V4(i.into()));
        }
        assert!(many.len() <= MAX_THROTTLED_PEERS);
    }
}
