//! `einmal serve`: the receiver over HTTP on loopback, embedded store.
//!
//! Metrics: no EMF on stdout here (one line per request would flood the terminal).
//! Every minute with activity, and once at shutdown, one `metrics` log line carries
//! the intake counters (since start) and the worker's tally since the last line
//! (counts, retries by cause, processing time and effect lag as avg/max, the payment
//! SLI share); the final intake counters are also printed at shutdown.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use einmal::adapters::embedded::EmbeddedStateStore;
use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
use einmal::config::Config;
use einmal::config_source::ConfigSource;
use einmal::domain::Domain;
use einmal::https::HttpsClient;
use einmal::lookup::HttpLookup;
use einmal::pipeline::ingest::{IngestResponse, Ingestor};
use einmal::pipeline::process::{ProcessSettings, Processor};
use einmal::pipeline::relay::RelayTally;
use einmal::pipeline::sweep::Sweeper;
use einmal::providers::paypal::{self, PayPalVerifier};
use einmal::request::WebhookRequest;
use einmal::telemetry::emf::{Samples, WorkerTally};
use einmal::telemetry::IngestCounts;

use crate::serve_http::{self, BodyBudget};

/// How often the local sweeper runs.
const SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);
/// How often the figures are logged (when something happened).
const METRICS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

pub use crate::serve_args::ServeArgs;

/// `einmal serve` with `domain` deciding: a user's binary passes its own domain. The
/// `--config` file is read again on SIGHUP: tenants, secrets and destinations move to
/// the new configuration together; an invalid one keeps the last good (logged).
pub async fn run(args: ServeArgs, domain: Arc<dyn Domain>) -> Result<ExitCode, String> {
    if args.aws.is_aws() {
        // No payment view here: the reconciler is not scheduled (`einmal reconcile`).
        return crate::serve_aws::run(args, domain, None)
            .await
            .map_err(|e| e.to_string());
    }
    let config = crate::config_file::load(&args.config).await?;
    let loader = Arc::new(FileLoader(args.config.clone()));
    run_with_source(args, ConfigSource::on_demand(config, loader), None, domain).await
}

/// Reads the `--config` file again (SIGHUP).
struct FileLoader(PathBuf);

#[async_trait::async_trait]
impl einmal::config_source::ConfigLoader for FileLoader {
    async fn load(&self) -> Result<Config, String> {
        crate::config_file::load(&self.0).await
    }
}

/// `einmal serve` on a configuration already loaded (and possibly extended, as
/// `einmal listen` does), with an optional wrapper around each destination's sink.
pub async fn run_with(
    args: ServeArgs,
    config: Config,
    wrap: Option<crate::relay::SinkWrap>,
    domain: Arc<dyn Domain>,
) -> Result<ExitCode, String> {
    run_with_source(args, ConfigSource::fixed(Arc::new(config)), wrap, domain).await
}

/// `einmal serve` on `source`; a source with a loader reloads on SIGHUP.
pub async fn run_with_source(
    args: ServeArgs,
    source: ConfigSource,
    wrap: Option<crate::relay::SinkWrap>,
    domain: Arc<dyn Domain>,
) -> Result<ExitCode, String> {
    einmal::telemetry::init_json_logs();
    if let Some(token) = &args.metrics_token {
        crate::metrics::check_token(token).map_err(|e| e.to_string())?;
    }
    let config = source.snapshot();
    // The log redaction masks the tenants' secrets and API credentials.
    einmal::telemetry::redact::register_config(&config);
    std::fs::create_dir_all(&args.data_dir)
        .map_err(|e| format!("cannot create {}: {e}", args.data_dir.display()))?;
    // Held until the process ends: `einmal restore` refuses a directory in use.
    let _serving = crate::store_cmd::lock_serving(&args.data_dir)?;
    let store = Arc::new(
        EmbeddedStore::open(&args.data_dir, EmbeddedOptions::default())
            .map_err(|e| format!("cannot open the store in {}: {e}", args.data_dir.display()))?,
    );
    // Before any request: what a killed `einmal serve` stored but never enqueued goes
    // to the queue now, not at the sweeper's threshold.
    let recovered = store
        .enqueue_unsent()
        .await
        .map_err(|e| format!("cannot re-enqueue unsent events: {e}"))?;
    if recovered > 0 {
        tracing::warn!(
            recovered,
            "re-enqueued events stored but never enqueued by a previous run"
        );
    }
    // The business records share the store's file and writer: the processor's
    // commits share group commits with the receiver's and its own queue writes.
    let state = Arc::new(EmbeddedStateStore::new(store.clone()));
    let settings = ProcessSettings {
        max_receive_count: EmbeddedOptions::default().max_receive_count,
        ..ProcessSettings::default()
    };
    // One HTTPS client (one pool) for PayPal's certificates and the thin webhooks'
    // lookups (Mollie classic, GoPay, Klarna push fetch from the provider).
    let https = HttpsClient::new();
    if paypal::install(PayPalVerifier::production(https.clone())).is_err() {
        tracing::debug!("the PayPal verifier was already in use: it keeps its own client");
    }
    // PayPal's certificates that verified a delivery are kept in the store: a restart
    // needs no fetch for them (and no fetch budget).
    if !paypal::persist_verified_to(store.clone()) {
        tracing::debug!("the PayPal verifier already keeps its certificates elsewhere");
    }
    // Every destination's sink is tried before anything is served: a misconfigured
    // one stops the start with its name; one that cannot be reached now (a database
    // that is down) is logged and retried, and never holds back intake.
    let relay = crate::relay::build(store.clone(), source.clone(), https.clone(), wrap).await?;
    let lookup = HttpLookup::with_client(https);
    let processor = Processor::from_store(store.clone(), state, domain)
        .with_settings(settings)
        .with_sli_threshold_ms(
            einmal::telemetry::emf::sli_threshold_ms_from_env().map_err(|e| e.to_string())?,
        )
        .with_lookup_source(Arc::new(lookup), source.clone())
        .with_relay(relay.clone());
    let relay = Some(relay);
    let worker_metrics = processor.metrics().clone();
    let sweeper = Sweeper::from_store(store.clone());
    let purge_settings = args.purge.settings(config.ingest.retention_days);
    let purge_store = store.clone();
    let store_for_metrics = store.clone();
    let store_figures = store.clone();
    let commit_stats = store.clone();
    let console = crate::console::for_serve(
        store.clone(),
        &args.data_dir,
        &args.addr,
        crate::console::ConsoleOptions {
            token: args.console_token.clone(),
            hosts: args.console_hosts.clone(),
            secure_cookie: args.console_secure_cookie,
            body_timeout: args.limits.body_timeout(),
        },
    )?;
    let ingestor = Arc::new(Ingestor::from_store(source.clone(), store));
    // Registered before the first request, so a SIGHUP never finds the default action
    // (which ends the process).
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| format!("cannot listen for SIGHUP: {e}"))?;
    let reloads = tokio::spawn(reload_on_hangup(source, hangups));
    // Bound before the webhook listener, so `/metrics` answers once `--addr` does.
    let metrics_listener = match args.metrics_addr {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr} (--metrics-addr): {e}"))?,
        ),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.addr))?;
    let tenants = ingestor.config().tenants().count();
    tracing::info!(addr = %args.addr, data_dir = %args.data_dir.display(), tenants, "einmal serve listening");
    eprintln!(
        "einmal: listening on http://{}/webhooks/{{provider}}/{{tenant}} ({tenants} tenants, store in {})",
        args.addr,
        args.data_dir.display()
    );
    let metrics = ingestor.metrics().clone();
    // `/metrics` and the minute log line drain the same tallies.
    let serve_metrics = Arc::new(
        crate::metrics::ServeMetrics::new(
            metrics.clone(),
            worker_metrics,
            relay.clone(),
            store_for_metrics,
            ingestor
                .config()
                .destinations()
                .iter()
                .map(|d| d.name.clone())
                .collect(),
        )
        .with_embedded_store(store_figures),
    );
    let (figures_stop_tx, mut figures_stop) = tokio::sync::watch::channel(false);
    let figures = {
        let intake = metrics.clone();
        let tallies = serve_metrics.clone();
        tokio::spawn(async move {
            let mut last = intake.snapshot();
            loop {
                let stopping = tokio::select! {
                    _ = figures_stop.wait_for(|stopped| *stopped) => true,
                    _ = tokio::time::sleep(METRICS_INTERVAL) => false,
                };
                let now = intake.snapshot();
                let (worker, delivered) = tallies.take_since_log();
                if now != last
                    || worker != WorkerTally::default()
                    || delivered != RelayTally::default()
                {
                    log_figures(&now, &worker, &delivered);
                    last = now;
                }
                if stopping {
                    return;
                }
            }
        })
    };
    // The processor loop runs beside the HTTP server and stops with it.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut sweep_stop = stop_rx.clone();
    let worker = tokio::spawn(async move {
        let mut stop = stop_rx;
        processor
            .run_local("serve", async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            })
            .await
    });
    // The relay's retries (pending deliveries, the next events of ordered objects).
    let relay_loop = relay.clone().map(|relay| {
        let mut stop = stop_tx.subscribe();
        tokio::spawn(async move {
            crate::relay::run_loop(relay, async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            })
            .await;
        })
    });
    // The sweeper: stuck items, dead leases, dead letters, backlog figures.
    let sweep = tokio::spawn(async move {
        sweeper
            .run_local(SWEEP_INTERVAL, async move {
                let _ = sweep_stop.wait_for(|stopped| *stopped).await;
            })
            .await;
    });
    // Retention: expired inbox items, stale cursors, old dead letters.
    let mut purge_stop = stop_tx.subscribe();
    let purge = tokio::spawn(einmal::adapters::embedded::run_purge_loop(
        purge_store,
        purge_settings,
        async move {
            let _ = purge_stop.wait_for(|stopped| *stopped).await;
        },
    ));
    let bodies = BodyBudget::new(&args.limits);
    let mut app = router(ingestor, args.limits.body_timeout(), bodies);
    // `/metrics`: on its own listener; else on `--addr` with the token, or without one
    // on loopback only (the console's rule): never open to the network.
    let (metrics_stop_tx, mut metrics_stop) = tokio::sync::watch::channel(false);
    let metrics_server = match metrics_listener {
        Some(metrics_listener) => {
            let routes = crate::metrics::routes(serve_metrics.clone(), args.metrics_token.clone());
            let limits = args.limits.side_listener();
            eprintln!(
                "einmal: metrics on http://{}/metrics{}",
                args.metrics_addr.expect("bound above"),
                if args.metrics_token.is_some() {
                    " (token required)"
                } else {
                    ""
                }
            );
            Some(tokio::spawn(async move {
                serve_http::serve(metrics_listener, routes, &limits, async move {
                    let _ = metrics_stop.wait_for(|stopped| *stopped).await;
                })
                .await;
            }))
        }
        None => {
            if args.metrics_token.is_some() || args.addr.ip().is_loopback() {
                app = app.merge(crate::metrics::routes(
                    serve_metrics.clone(),
                    args.metrics_token.clone(),
                ));
            } else {
                eprintln!(
                    "einmal: /metrics off on {}: give --metrics-token or --metrics-addr",
                    args.addr
                );
            }
            None
        }
    };
    // The console answers to the address actually bound (`--addr` may say port 0).
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {}: {e}", args.addr))?;
    let app = match console {
        Some(console) => app.merge(console.with_figures(serve_metrics).app(bound)),
        None => app,
    };
    // SIGTERM (systemd, containers) stops like Ctrl-C: drain, then the final figures.
    serve_http::serve(listener, app, &args.limits, serve_http::shutdown_signal()).await;
    let _ = metrics_stop_tx.send(true);
    if let Some(metrics_server) = metrics_server {
        let _ = metrics_server.await;
    }
    let _ = stop_tx.send(true);
    let processed = worker.await.unwrap_or_default();
    let _ = sweep.await;
    let _ = purge.await;
    if let Some(relay_loop) = relay_loop {
        let _ = relay_loop.await;
    }
    // The last figures, after the worker finished its batch.
    let _ = figures_stop_tx.send(true);
    let _ = figures.await;
    reloads.abort();
    eprintln!(
        "einmal: stopped; {}",
        serde_json::to_string(&metrics.snapshot()).unwrap_or_default()
    );
    // The group-commit figures (`bench/end-to-end.sh` reads this line).
    let commits = commit_stats.commit_stats();
    eprintln!(
        "einmal: store: {} commits, {} fsynced, {} fsynced with business commits; processor: {} batches, {} messages",
        commits.commits,
        commits.fsynced,
        commits.fsynced_effects,
        processed.batches,
        processed.messages
    );
    Ok(ExitCode::SUCCESS)
}

/// Reload the configuration on each SIGHUP (`systemctl reload`, `kill -HUP`).
async fn reload_on_hangup(source: ConfigSource, mut hangups: tokio::signal::unix::Signal) {
    while hangups.recv().await.is_some() {
        if source.reload().await {
            let config = source.snapshot();
            einmal::telemetry::redact::register_config(&config);
            let destinations = config.destinations().len();
            tracing::info!(destinations, "SIGHUP: configuration reloaded");
        }
    }
}

/// One log line with the intake counters (since start) and the worker's tally (since
/// the last line).
fn log_figures(intake: &IngestCounts, worker: &WorkerTally, relay: &RelayTally) {
    let (delivered, delivery_retries, deliveries_dead, superseded) =
        crate::relay::tally_fields(relay);
    let round = |v: f64| (v * 1000.0).round() / 1000.0;
    let avg = |s: &Samples| {
        if s.count == 0 {
            0.0
        } else {
            round(s.sum / s.count as f64)
        }
    };
    let retries: Vec<String> = worker
        .retries
        .iter()
        .map(|(cause, n)| format!("{}={n}", cause.as_str()))
        .collect();
    tracing::info!(
        accepted = intake.accepted,
        duplicates = intake.duplicates,
        // Not `signature_failures`: field names with `signature` are masked in logs.
        unverified = intake.signature_failures,
        rejected = intake.malformed + intake.not_found + intake.oversize,
        rate_limited = intake.rate_limited,
        unavailable = intake.unavailable,
        completed = worker.completed,
        ignored = worker.ignored,
        dead_letters = worker.dead_letters,
        conflicts = worker.conflicts,
        retries = retries.join(","),
        processing_ms_avg = avg(&worker.processing_ms),
        processing_ms_max = round(worker.processing_ms.max),
        effect_lag_ms_avg = avg(&worker.effect_lag_ms),
        effect_lag_ms_max = worker.effect_lag_ms.max,
        payment_events = worker.payment_within_slo.count,
        payment_within_slo = avg(&worker.payment_within_slo),
        delivered,
        delivery_retries,
        deliveries_dead,
        superseded,
        "metrics"
    );
}

/// What the handlers share: the ingest pipeline, the body deadline and the memory
/// budget of bodies in flight.
#[derive(Clone)]
pub struct Serving {
    ingestor: Arc<Ingestor>,
    body_timeout: std::time::Duration,
    bodies: BodyBudget,
}

pub fn router(
    ingestor: Arc<Ingestor>,
    body_timeout: std::time::Duration,
    bodies: BodyBudget,
) -> Router {
    Router::new()
        .route("/webhooks/{provider}/{tenant}", any(webhook))
        .route(
            "/webhooks/{provider}/{tenant}/{token}",
            any(webhook_with_token),
        )
        .route(
            "/healthz",
            get(|| async { "ok" }).fallback(|| async {
                client_error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "method_not_allowed",
                    "method not allowed",
                )
            }),
        )
        .fallback(|| async { respond(&IngestResponse::not_found()) })
        .with_state(Serving {
            ingestor,
            body_timeout,
            bodies,
        })
}

/// A JSON error answered by the transport itself (the ingest path has its own).
fn client_error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "error": code, "message": message }).to_string();
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// A path segment that is not valid UTF-8 once percent-decoded names no provider or
/// tenant: 400 in JSON, like every other error.
fn bad_path(rejection: &PathRejection) -> Response {
    tracing::info!(reason = %rejection.body_text(), "webhook rejected: bad path");
    client_error(
        StatusCode::BAD_REQUEST,
        "malformed_request",
        "the request path is not valid UTF-8",
    )
}

/// The most bytes of a path token segment (`/webhooks/{provider}/{tenant}/{token}`).
const MAX_TOKEN_SEGMENT: usize = 256;

/// Whether the raw (not decoded) path names a provider and a tenant as configuration
/// spells them: no percent-encoding (`/webhooks/str%69pe/demo` is no alias of
/// `stripe`), at most 128 bytes each (`config::is_valid_name`), and a token segment of
/// at most [`MAX_TOKEN_SEGMENT`] bytes.
fn literal_names(uri: &Uri) -> bool {
    let Some(rest) = uri.path().strip_prefix("/webhooks/") else {
        return false;
    };
    let mut segments = rest.split('/');
    let names = (segments.next(), segments.next());
    let token_ok = segments
        .next()
        .is_none_or(|token| token.len() <= MAX_TOKEN_SEGMENT);
    matches!(names, (Some(p), Some(t)) if einmal::config::is_valid_name(p) && einmal::config::is_valid_name(t))
        && token_ok
        && segments.next().is_none()
}

/// The answer for a path that is no literal provider/tenant pair: the one 404 of
/// unknown tenants, nothing read or stored; the log has the path's length, not the path.
fn not_literal(uri: &Uri) -> Response {
    tracing::info!(
        path_bytes = uri.path().len(),
        "webhook rejected: the path does not name a provider and a tenant literally"
    );
    respond(&IngestResponse::not_found())
}

async fn webhook(
    State(serving): State<Serving>,
    uri: Uri,
    path: Result<Path<(String, String)>, PathRejection>,
    method: Method,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Body,
) -> Response {
    let Path((provider, tenant)) = match path {
        Ok(path) => path,
        Err(rejection) => return bad_path(&rejection),
    };
    if !literal_names(&uri) {
        return not_literal(&uri);
    }
    receive(
        serving, provider, tenant, None, method, headers, query, body,
    )
    .await
}

async fn webhook_with_token(
    State(serving): State<Serving>,
    uri: Uri,
    path: Result<Path<(String, String, String)>, PathRejection>,
    method: Method,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Body,
) -> Response {
    let Path((provider, tenant, token)) = match path {
        Ok(path) => path,
        Err(rejection) => return bad_path(&rejection),
    };
    if !literal_names(&uri) {
        return not_literal(&uri);
    }
    receive(
        serving,
        provider,
        tenant,
        Some(token),
        method,
        headers,
        query,
        body,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn receive(
    serving: Serving,
    provider: String,
    tenant: String,
    path_token: Option<String>,
    method: Method,
    headers: HeaderMap,
    query: Option<String>,
    body: Body,
) -> Response {
    let ingestor = serving.ingestor;
    let limit = ingestor.config().ingest.max_body_bytes;
    // A declared length over the limit is refused before a byte of the body is read.
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return respond(&ingestor.oversize(limit));
    }
    // The body's memory is reserved before it is read and held until it is answered;
    // without a declared length, the most it may take.
    let Some(_reserved) = serving
        .bodies
        .try_reserve(declared.unwrap_or(limit as u64 + 1))
    else {
        tracing::warn!("webhook refused: the memory budget of bodies in flight is spent");
        let mut busy = client_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "too many request bodies in flight; please retry",
        );
        busy.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            serve_http::BODY_BUDGET_RETRY_AFTER_SECS.into(),
        );
        return busy;
    };
    // Read one byte past the limit so the ingest path itself reports 413 with the
    // same rules as on Lambda; anything larger is refused without buffering it.
    let read = axum::body::to_bytes(body, limit.saturating_add(1));
    let body = match tokio::time::timeout(serving.body_timeout, read).await {
        Ok(Ok(body)) => body,
        Ok(Err(e)) if is_length_limit(&e) => return respond(&ingestor.oversize(limit)),
        Ok(Err(_)) => {
            return client_error(
                StatusCode::BAD_REQUEST,
                "malformed_request",
                "the request body is not valid HTTP/1.1 framing",
            )
        }
        Err(_) => {
            return client_error(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the request body did not arrive in time",
            )
        }
    };
    let request = WebhookRequest {
        method,
        headers,
        query,
        body,
        path_token,
    };
    respond(&ingestor.ingest(&provider, &tenant, &request).await)
}

/// Whether reading the body stopped at the size limit (not a framing error).
fn is_length_limit(err: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = e.source();
    }
    false
}

fn respond(response: &IngestResponse) -> Response {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let (content_type, body) = response.render();
    let mut response_out = (
        status,
        [(axum::http::header::CONTENT_TYPE, content_type)],
        body,
    )
        .into_response();
    if let Some(secs) = response.retry_after_secs {
        response_out
            .headers_mut()
            .insert(axum::http::header::RETRY_AFTER, secs.into());
    }
    response_out
}
