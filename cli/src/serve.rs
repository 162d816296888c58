//! `einmal serve`: the receiver over HTTP on loopback, embedded store.
//!
//! Metrics: no EMF on stdout here (one line per request would flood the terminal).
//! Every minute with activity, and once at shutdown, one `metrics` log line carries
//! the intake counters (since start) and the worker's tally since the last line
//! (counts, retries by cause, processing time and effect lag as avg/max, the payment
//! SLI share); the final intake counters are also printed at shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use clap::Args;
use einmal::adapters::embedded::{EmbeddedOptions, EmbeddedStore};
use einmal::adapters::embedded_state::EmbeddedStateStore;
use einmal::config::Config;
use einmal::domain::reference::ReferenceDomain;
use einmal::lookup::HttpLookup;
use einmal::pipeline::ingest::{IngestResponse, Ingestor};
use einmal::pipeline::process::{ProcessSettings, Processor};
use einmal::pipeline::sweep::Sweeper;
use einmal::request::WebhookRequest;
use einmal::telemetry::emf::{Samples, WorkerTally};
use einmal::telemetry::IngestCounts;

/// How often the local sweeper runs.
const SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);
/// How often the figures are logged (when something happened).
const METRICS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Directory of the embedded store (created if missing).
    #[arg(long, default_value = ".einmal")]
    pub data_dir: PathBuf,
    /// Tenant configuration (TOML).
    #[arg(long, default_value_os_t = crate::default_config_path())]
    pub config: PathBuf,
}

pub async fn run(args: ServeArgs) -> Result<ExitCode, String> {
    einmal::telemetry::init_json_logs();
    let config = Config::load(&args.config).map_err(|e| e.to_string())?;
    // The log redaction masks the tenants' secrets and API credentials.
    einmal::telemetry::redact::register_config(&config);
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
    let state = Arc::new(EmbeddedStateStore::open(&args.data_dir).map_err(|e| {
        format!(
            "cannot open the state store in {}: {e}",
            args.data_dir.display()
        )
    })?);
    let settings = ProcessSettings {
        max_receive_count: EmbeddedOptions::default().max_receive_count,
        ..ProcessSettings::default()
    };
    let config = Arc::new(config);
    // Thin webhooks (Mollie classic, GoPay, Klarna push) are fetched from the provider.
    let lookup = HttpLookup::new();
    let processor = Processor::new(
        store.clone(),
        store.clone(),
        store.clone(),
        state,
        Arc::new(ReferenceDomain::new()),
    )
    .with_settings(settings)
    .with_sli_threshold_ms(
        einmal::telemetry::emf::sli_threshold_ms_from_env().map_err(|e| e.to_string())?,
    )
    .with_lookup(Arc::new(lookup), config.clone());
    let worker_metrics = processor.metrics().clone();
    let sweeper = Sweeper::new(store.clone(), store.clone(), store.clone(), store.clone());
    let ingestor = Arc::new(Ingestor::new(config, store.clone(), store));
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
    let (figures_stop_tx, mut figures_stop) = tokio::sync::watch::channel(false);
    let figures = {
        let intake = metrics.clone();
        tokio::spawn(async move {
            let mut last = intake.snapshot();
            loop {
                let stopping = tokio::select! {
                    _ = figures_stop.wait_for(|stopped| *stopped) => true,
                    _ = tokio::time::sleep(METRICS_INTERVAL) => false,
                };
                let now = intake.snapshot();
                let worker = worker_metrics.drain();
                if now != last || worker != WorkerTally::default() {
                    log_figures(&now, &worker);
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
            .await;
    });
    // The sweeper: stuck items, dead leases, dead letters, backlog figures.
    let sweep = tokio::spawn(async move {
        sweeper
            .run_local(SWEEP_INTERVAL, async move {
                let _ = sweep_stop.wait_for(|stopped| *stopped).await;
            })
            .await;
    });
    let served = axum::serve(listener, router(ingestor))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| e.to_string());
    let _ = stop_tx.send(true);
    let _ = worker.await;
    let _ = sweep.await;
    // The last figures, after the worker finished its batch.
    let _ = figures_stop_tx.send(true);
    let _ = figures.await;
    served?;
    eprintln!(
        "einmal: stopped; {}",
        serde_json::to_string(&metrics.snapshot()).unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}

/// One log line with the intake counters (since start) and the worker's tally (since
/// the last line).
fn log_figures(intake: &IngestCounts, worker: &WorkerTally) {
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
        unavailable = intake.unavailable,
        completed = worker.completed,
        ignored = worker.ignored,
        dead_letters = worker.dead_letters,
        retries = retries.join(","),
        processing_ms_avg = avg(&worker.processing_ms),
        processing_ms_max = round(worker.processing_ms.max),
        effect_lag_ms_avg = avg(&worker.effect_lag_ms),
        effect_lag_ms_max = worker.effect_lag_ms.max,
        payment_events = worker.payment_within_slo.count,
        payment_within_slo = avg(&worker.payment_within_slo),
        "metrics"
    );
}

pub fn router(ingestor: Arc<Ingestor>) -> Router {
    Router::new()
        .route("/webhooks/{provider}/{tenant}", any(webhook))
        .route(
            "/webhooks/{provider}/{tenant}/{token}",
            any(webhook_with_token),
        )
        .route("/healthz", get(|| async { "ok" }))
        .fallback(|| async { respond(&IngestResponse::not_found()) })
        .with_state(ingestor)
}

async fn webhook(
    State(ingestor): State<Arc<Ingestor>>,
    Path((provider, tenant)): Path<(String, String)>,
    method: Method,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Body,
) -> Response {
    receive(
        ingestor, provider, tenant, None, method, headers, query, body,
    )
    .await
}

async fn webhook_with_token(
    State(ingestor): State<Arc<Ingestor>>,
    Path((provider, tenant, token)): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Body,
) -> Response {
    receive(
        ingestor,
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
    ingestor: Arc<Ingestor>,
    provider: String,
    tenant: String,
    path_token: Option<String>,
    method: Method,
    headers: HeaderMap,
    query: Option<String>,
    body: Body,
) -> Response {
    // Read one byte past the limit so the ingest path itself reports 413 with the
    // same rules as on Lambda; anything larger is refused without buffering it.
    let limit = ingestor.config().ingest.max_body_bytes;
    let Ok(body) = axum::body::to_bytes(body, limit.saturating_add(1)).await else {
        return respond(&ingestor.oversize(limit));
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

fn respond(response: &IngestResponse) -> Response {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let (content_type, body) = response.render();
    (
        status,
        [(axum::http::header::CONTENT_TYPE, content_type)],
        body,
    )
        .into_response()
}
