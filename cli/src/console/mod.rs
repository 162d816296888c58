//! `einmal console`: a local web console over the inbox, the dead letters, the audit
//! log and the reconciliation runs, served by `einmal serve` at `/console` and by
//! `einmal console` on its own (any backend: on AWS it reads the user's own tables
//! and queues with the user's credentials, so a deployment gets a console with no
//! public surface).
//!
//! Server-rendered HTML (`maud`: markup checked at compile time, every value escaped
//! by construction) and plain HTML forms: no JavaScript, no front-end build, nothing
//! fetched from a CDN; the binary holds the whole console. Replays go through the
//! same audited [`Replayer`] as `einmal replay`.
//!
//! Access ([`auth`]): loopback binds need no token; any other bind needs one
//! (header `Authorization: Bearer …`, or the session the login form opens, its id in
//! a cookie). Every POST carries the per-process CSRF token. Before any of it, the
//! [`guard`] refuses unknown Host names (DNS rebinding) and cross-site writes, and
//! sets the security headers on every answer.

mod auth;
mod deliveries;
mod guard;
mod page;
mod pages;
mod view;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::routing::{get, post};
use axum::Router;
use einmal::audit::AuditLog;
use einmal::pipeline::replay::Replayer;
use einmal::ports::InboxStore;

use crate::metrics::ServeMetrics;

pub use auth::TokenError;
pub use guard::{check_host_names, HostNameError};

/// Samples of the terminal count kept for the drain rate (one per overview view,
/// at least [`SAMPLE_EVERY_MS`] apart): a fixed bound, whatever the traffic.
const MAX_SAMPLES: usize = 120;
const SAMPLE_EVERY_MS: i64 = 5_000;

/// What the console reads and acts on.
pub struct ConsoleStores {
    pub inbox: Arc<dyn InboxStore>,
    /// The same audited replay path as `einmal replay`.
    pub replayer: Replayer,
    pub audit: Arc<dyn AuditLog>,
    /// The receiver's and processor's figures when they run in this process
    /// (`einmal serve`): read through `/metrics`' own drain, so neither loses counts.
    pub figures: Option<Arc<ServeMetrics>>,
    /// Shown in the header: `embedded (.einmal)`, `aws`.
    pub backend: String,
}

/// How the console is reached: its token, the host names it answers to behind a
/// proxy, the cookie's `Secure`, the form body's deadline.
#[derive(Debug, Clone)]
pub struct ConsoleOptions {
    /// `None`: no token asked for (a loopback bind without one).
    pub token: Option<String>,
    /// `--console-host`: names beyond the bound address (checked with
    /// [`check_host_names`]).
    pub hosts: Vec<String>,
    /// `--console-secure-cookie`: the session cookie is `Secure` (the console is
    /// behind a TLS proxy).
    pub secure_cookie: bool,
    pub body_timeout: std::time::Duration,
}

pub(crate) struct Console {
    stores: ConsoleStores,
    /// `None`: no token asked for (a loopback bind without one).
    token: Option<String>,
    sessions: auth::Sessions,
    throttle: auth::Throttle,
    secure_cookie: bool,
    /// The per-process CSRF token every form carries.
    csrf: String,
    /// (at_ms, events in a terminal state): the drain rate's samples.
    samples: Mutex<VecDeque<(i64, u64)>>,
}

/// Where the console is mounted.
pub const BASE: &str = "/console";

/// The console's routes at [`BASE`] (and `BASE/`), behind the [`guard`], for a
/// console listening on `bound`: merge them into the server's router.
pub fn app(stores: ConsoleStores, options: ConsoleOptions, bound: SocketAddr) -> Router {
    let console = Arc::new(Console {
        stores,
        token: options.token,
        sessions: auth::Sessions::new(auth::SESSION_TTL, auth::MAX_SESSIONS),
        throttle: auth::Throttle::new(auth::THROTTLE_WINDOW),
        secure_cookie: options.secure_cookie,
        csrf: auth::random_token(),
        samples: Mutex::new(VecDeque::with_capacity(MAX_SAMPLES)),
    });
    let protected = Router::new()
        .route("/", get(pages::overview))
        .route("/events", get(pages::events))
        .route("/event", get(pages::event))
        .route("/dead-letters", get(pages::dead_letters))
        .route("/deliveries", get(deliveries::deliveries))
        .route("/deliveries/replay", post(deliveries::replay))
        .route("/replay", post(pages::replay_one))
        .route("/replay-bulk", post(pages::replay_bulk))
        .route("/audit", get(pages::audit))
        .route("/reconcile", get(pages::reconcile))
        .route_layer(axum::middleware::from_fn_with_state(
            console.clone(),
            auth::require_token,
        ));
    let inner = Router::new()
        .merge(protected)
        .route("/login", get(auth::login_form).post(auth::login))
        .route("/logout", post(auth::logout))
        .fallback(pages::not_found)
        .with_state(console);
    let guard = Arc::new(guard::Guard {
        hosts: guard::Hosts::new(bound, &options.hosts),
        body_timeout: options.body_timeout,
    });
    Router::new()
        .nest(BASE, inner)
        // `/console/` is the overview too (issue 24).
        .route(
            "/console/",
            get(|| async { axum::response::Redirect::to(BASE) }),
        )
        .layer(axum::middleware::from_fn_with_state(guard, guard::guard))
}

/// The console of `einmal serve`, before it is mounted (the figures come from the
/// receiver and processor built after it).
pub struct ServeConsole {
    stores: ConsoleStores,
    options: ConsoleOptions,
}

impl ServeConsole {
    pub fn with_figures(mut self, figures: Arc<ServeMetrics>) -> Self {
        self.stores.figures = Some(figures);
        self
    }

    /// The console's routes for `einmal serve` listening on `bound` (see [`app`]).
    pub fn app(self, bound: SocketAddr) -> Router {
        app(self.stores, self.options, bound)
    }
}

/// `einmal serve`'s console on its store and the audit log in `data_dir`; `None`
/// (with a line saying why) on a non-loopback address without a token.
pub fn for_serve(
    store: Arc<einmal::adapters::embedded::EmbeddedStore>,
    data_dir: &std::path::Path,
    addr: &SocketAddr,
    options: ConsoleOptions,
) -> Result<Option<ServeConsole>, String> {
    check_host_names(&options.hosts).map_err(|e| e.to_string())?;
    match check_access(addr, options.token.as_deref()) {
        Ok(()) => {}
        Err(e @ TokenError::Required(_)) => {
            eprintln!("einmal: console off: {e}");
            return Ok(None);
        }
        Err(e) => return Err(e.to_string()),
    }
    let audit: Arc<dyn AuditLog> = Arc::new(
        einmal::adapters::embedded::EmbeddedAuditLog::open(data_dir)
            .map_err(|e| format!("cannot open the audit log in {}: {e}", data_dir.display()))?,
    );
    let inbox: Arc<dyn InboxStore> = store;
    Ok(Some(ServeConsole {
        stores: ConsoleStores {
            replayer: Replayer::from_store(inbox.clone(), audit.clone()),
            inbox,
            audit,
            figures: None,
            backend: format!("embedded, {}", data_dir.display()),
        },
        options,
    }))
}

/// The token rule: a loopback address may go without one; any other needs one (an
/// empty token is none).
pub fn check_access(addr: &SocketAddr, token: Option<&str>) -> Result<(), TokenError> {
    match token {
        Some(t) if t.trim().is_empty() => Err(TokenError::Empty),
        Some(t) if t.len() < auth::MIN_TOKEN_LEN => Err(TokenError::TooShort),
        Some(_) => Ok(()),
        None if addr.ip().is_loopback() => Ok(()),
        None => Err(TokenError::Required(*addr)),
    }
}

/// `einmal console` on its own: serve the console at `addr` with `limits` (the
/// bounds of `einmal serve`: header timeout, connections in all and per peer) until
/// Ctrl-C / SIGTERM, then drain (bounded by [`crate::serve_http::SHUTDOWN_DRAIN`]).
pub async fn serve(
    stores: ConsoleStores,
    addr: SocketAddr,
    options: ConsoleOptions,
    limits: &crate::serve_http::ClientLimits,
) -> Result<(), String> {
    check_access(&addr, options.token.as_deref()).map_err(|e| e.to_string())?;
    check_host_names(&options.hosts).map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    // The store's detail is for the terminal; the pages show it after the login.
    eprintln!(
        "einmal: console on http://{local}{BASE} ({}{})",
        stores.backend,
        if options.token.is_some() {
            ", token required"
        } else {
            ""
        }
    );
    let app = app(stores, options, local)
        .route("/", get(|| async { axum::response::Redirect::to(BASE) }));
    crate::serve_http::serve(listener, app, limits, crate::serve_http::shutdown_signal()).await;
    Ok(())
}
