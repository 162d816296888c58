//! `einmal serve --backend aws`: the four Lambdas' own handlers in one process, on the
//! DynamoDB tables, SQS queues and SSM parameter the functions' environment variables
//! name (`AWS_ENDPOINT_URL`, region and credentials as the SDK resolves them).
//!
//! Each function is built by its crate's own start-up call, the one its `main.rs`
//! makes ([`receiver::Receiver::new`], [`processor::engine_from_env`], [`sweeper::Sweep::new`],
//! [`reconciler::Reconcile::new`]); this module only stands in for what AWS does
//! around them: API Gateway ([`gateway`]), the SQS event source mapping
//! ([`event_source`]) and the EventBridge schedules ([`schedule`]).

pub mod checks;
pub mod event_source;
pub mod gateway;
pub mod schedule;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use einmal::adapters::aws::{AwsNames, AwsStore, CONFIG_ENV, CONFIG_PARAMETER_ENV};
use einmal::config::Config;
use einmal::domain::payment_view::PaymentView;
use einmal::domain::Domain;

use crate::error::CliError;
use crate::serve_args::ServeArgs;

pub use crate::serve_args::{
    AwsServeArgs, ServeBackend, DEFAULT_BATCHING_WINDOW_SECS, DEFAULT_BATCH_SIZE,
    DEFAULT_POLL_WAIT_SECS, DEFAULT_RECONCILE_EVERY_SECS, DEFAULT_SWEEP_EVERY_SECS,
};

/// `einmal serve --backend aws` with `domain` deciding and, when given, `view` for the
/// scheduled reconciler (without one the reconciler is not scheduled).
pub async fn run(
    args: ServeArgs,
    domain: Arc<dyn Domain>,
    view: Option<Arc<dyn PaymentView>>,
) -> Result<ExitCode, CliError> {
    einmal::telemetry::init_json_logs();
    // The names first: a missing variable fails before any AWS call.
    let names = AwsNames::from_env().map_err(|e| CliError::Usage(e.to_string()))?;
    provide_config(&args)?;
    let sdk_config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    crate::aws_credentials::check(&sdk_config).await?;
    let found = checks::check(&sdk_config, &names).await?;
    let store = Arc::new(AwsStore::from_sdk_config(&sdk_config, names));
    let emf = args.aws.emf;
    let failed = |what: &str, e: &dyn std::fmt::Display| CliError::Failure(format!("{what}: {e}"));

    let receiver = receiver::Receiver::new(&sdk_config, store.clone())
        .await
        .map_err(|e| failed("receiver", &e))?
        .with_emf(emf);
    let engine = processor::engine_from_env(domain, &sdk_config, store.clone())
        .await
        .map_err(|e| failed("processor", &e))?;
    let sweep = sweeper::Sweep::new(&sdk_config, store.clone())
        .await
        .map_err(|e| failed("sweeper", &e))?
        .with_emf(emf);
    let reconcile = match (view, args.aws.reconcile_every_secs) {
        (Some(view), secs) if secs > 0 => Some(
            reconciler::Reconcile::new(view, &sdk_config, store.clone())
                .await
                .map_err(|e| failed("reconciler", &e))?
                .with_emf(emf),
        ),
        _ => None,
    };

    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| CliError::Failure(format!("cannot listen on {}: {e}", args.addr)))?;
    let tenants = receiver.ingestor().config().tenants().count();
    eprintln!(
        "einmal: listening on http://{}/webhooks/{{provider}}/{{tenant}} ({tenants} tenants, AWS: inbox table {}, queue {}, {} poller(s))",
        args.addr,
        store.names().table,
        store.names().queue_url,
        args.aws.pollers
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let source = event_source::EventSource {
        sqs: store.sqs().clone(),
        queue_url: store.names().queue_url,
        queue_arn: found.queue_arn,
        region: sdk_config
            .region()
            .map(|r| r.to_string())
            .unwrap_or_default(),
        batch_size: args.aws.batch_size,
        batching_window: Duration::from_secs(args.aws.batching_window_secs),
        poll_wait_secs: args.aws.poll_wait_secs,
        idle_pause: Duration::from_millis(args.aws.poll_idle_ms),
        emf,
        deployment: einmal::telemetry::emf::deployment_from_env(),
    };
    let engine = Arc::new(engine);
    let pollers: Vec<_> = (0..args.aws.pollers)
        .map(|n| {
            let source = source.clone();
            let engine = engine.clone();
            let stop = stop_rx.clone();
            tokio::spawn(async move { source.run(n, &engine, stop).await })
        })
        .collect();
    let schedules = schedule::spawn(
        sweep,
        Duration::from_secs(args.aws.sweep_every_secs),
        reconcile.map(|r| (r, Duration::from_secs(args.aws.reconcile_every_secs))),
        stop_rx.clone(),
    );

    let bodies = crate::serve_http::BodyBudget::new(&args.limits);
    let app = gateway::router(Arc::new(receiver), bodies);
    // SIGTERM or Ctrl-C: the listener drains, the pollers stop receiving and finish
    // the batch in hand, a scheduled run in progress completes.
    crate::serve_http::serve(
        listener,
        app,
        &args.limits,
        crate::serve_http::shutdown_signal(),
    )
    .await;
    let _ = stop_tx.send(true);
    let mut batches = 0u64;
    let mut messages = 0u64;
    for poller in pollers {
        if let Ok(done) = poller.await {
            batches += done.batches;
            messages += done.messages;
        }
    }
    for task in schedules {
        let _ = task.await;
    }
    eprintln!("einmal: stopped; processor: {batches} batches, {messages} messages");
    Ok(ExitCode::SUCCESS)
}

/// The functions read their tenant configuration from EINMAL_CONFIG_PARAMETER or
/// EINMAL_CONFIG; with neither set, --config's file is checked and handed to them as
/// EINMAL_CONFIG, so every function reads it the way it reads the inline variable.
fn provide_config(args: &ServeArgs) -> Result<(), CliError> {
    let set = |name: &str| {
        std::env::var(name)
            .ok()
            .is_some_and(|v| !v.trim().is_empty())
    };
    if set(CONFIG_PARAMETER_ENV) || set(CONFIG_ENV) {
        return Ok(());
    }
    // As the embedded `serve`: an unreadable or invalid file is a failure (exit 4).
    let text = std::fs::read_to_string(&args.config).map_err(|e| {
        CliError::Failure(format!(
            "no tenant configuration: {CONFIG_PARAMETER_ENV} and {CONFIG_ENV} are not set and --config {} cannot be read: {e}",
            args.config.display()
        ))
    })?;
    Config::from_toml(&text)
        .map_err(|e| CliError::Usage(format!("--config {}: {e}", args.config.display())))?;
    // Before any function starts and before any task reads the environment.
    std::env::set_var(CONFIG_ENV, text);
    Ok(())
}
