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
//! Access ([`auth`]): loopback binds need nothing; any other bind needs a token
//! (header `Authorization: Bearer …` or the cookie the login form sets, compared in
//! constant time). Every POST carries the per-process CSRF token.

mod auth;
mod deliveries;
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

pub(crate) struct Console {
    stores: ConsoleStores,
    /// `None`: no token asked for (a loopback bind without one).
    token: Option<String>,
    /// The per-process CSRF token every form carries.
    csrf: String,
    /// (at_ms, events in a terminal state): the drain rate's samples.
    samples: Mutex<VecDeque<(i64, u64)>>,
}

/// Where the console is mounted.
pub const BASE: &str = "/console";

/// The console's routes (to nest at [`BASE`]). `token`: see [`check_access`].
pub fn router(stores: ConsoleStores, token: Option<String>) -> Router {
    let console = Arc::new(Console {
        stores,
        token,
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
    Router::new()
        .merge(protected)
        .route("/login", get(auth::login_form).post(auth::login))
        .fallback(pages::not_found)
        .with_state(console)
}

/// The console of `einmal serve`, before it is mounted (the figures come from the
/// receiver and processor built after it).
pub struct ServeConsole {
    stores: ConsoleStores,
    token: Option<String>,
}

impl ServeConsole {
    pub fn with_figures(mut self, figures: Arc<ServeMetrics>) -> Self {
        self.stores.figures = Some(figures);
        self
    }

    pub fn router(self) -> Router {
        router(self.stores, self.token)
    }
}

/// `einmal serve`'s console on its store and the audit log in `data_dir`; `None`
/// (with a line saying why) on a non-loopback address without a token.
pub fn for_serve(
    store: Arc<einmal::adapters::embedded::EmbeddedStore>,
    data_dir: &std::path::Path,
    addr: &SocketAddr,
    token: Option<String>,
) -> Result<Option<ServeConsole>, String> {
    match check_access(addr, token.as_deref()) {
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
        token,
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

/// `einmal console` on its own: serve the console at `addr` until Ctrl-C / SIGTERM.
pub async fn serve(
    stores: ConsoleStores,
    addr: SocketAddr,
    token: Option<String>,
) -> Result<(), String> {
    check_access(&addr, token.as_deref()).map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    eprintln!(
        "einmal: console on http://{local}{BASE} ({}{})",
        stores.backend,
        if token.is_some() {
            ", token required"
        } else {
            ""
        }
    );
    let app = Router::new()
        .nest(BASE, router(stores, token))
        .route("/", get(|| async { axum::response::Redirect::to(BASE) }))
        .route(
            "/console/",
            get(|| async { axum::response::Redirect::to(BASE) }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(crate::serve_http::shutdown_signal())
        .await
        .map_err(|e| format!("console server: {e}"))
}
